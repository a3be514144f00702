"""An algorithm is a preset: registered components composed under a new `algorithm_type` name.

`trinity.algorithm_table` imports no torch, so the gateway and the CLI validate a config naming it too.

A preset may also name components a plugin registers itself, e.g. a loss defined here with
`@register_policy_loss("my_loss", ...)` and declared under the entry-point group `trinity.policy_losses`.
"""

from __future__ import annotations

from trinity.algorithm_table import Preset

# GRPO without the reference model, each sequence weighing the same in the loss (not each token).
GRPO_SEQ_MEAN = Preset(
    name="grpo_seq_mean",  # the same as the entry point's name
    description="GRPO with seq-mean-token-mean loss aggregation and no KL term",
    policy_loss="ppo",
    advantage="grpo",
    entropy="default",
    policy_loss_args={"loss_agg_mode": "seq-mean-token-mean"},
    repeat_times=8,
)
