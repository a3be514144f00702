"""Policy losses: ``(logprobs, old_logprobs, advantages, mask, ...) -> (loss, metrics)``.

Each module registers its losses (``trinity.registry_names`` says which); see ``common.py`` for the
call convention.
"""

from .chord import chord_mu_schedule
from .clipped import ppo_surrogate
from .common import PolicyLossOutput

__all__ = [
    "PolicyLossOutput",
    "chord_mu_schedule",
    "ppo_surrogate",
]
