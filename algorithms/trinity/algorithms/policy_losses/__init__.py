"""Policy losses: ``(logprobs, old_logprobs, advantages, mask, ...) -> (loss, metrics)``.

Importing this package registers every built-in loss. See ``common.py`` for the call convention.
"""

from . import chord, clipped, offline, reinforce
from .chord import chord_mu_schedule
from .clipped import ppo_surrogate
from .common import PolicyLossOutput

__all__ = [
    "PolicyLossOutput",
    "chord",
    "chord_mu_schedule",
    "clipped",
    "offline",
    "ppo_surrogate",
    "reinforce",
]
