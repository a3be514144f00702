"""The built-in names of every extension point and the module that registers each (plain data, no imports).

The config validates names against this table (plus installed plugins) without importing the
services; a registry imports a name's module the first time the name is looked up. Adding a built-in
means registering it with the decorator in its module and adding one line here;
tests/registry/test_registry.py checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class Kind(NamedTuple):
    group: str  # the entry-point group through which a package adds names of this kind
    builtins: Mapping[str, str]  # name -> module that registers it


def _same(module: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, module)


_ALG = "trinity.algorithms"
_LOSSES = f"{_ALG}.policy_losses"
_WORKFLOWS = "trinity.explorer.workflows"
_REWARDS = "trinity.explorer.rewards"
_ENGINES = "trinity.explorer.engines"

KINDS: Mapping[str, Kind] = {
    # algorithm library (trinity.algorithms): `algorithm` is a preset, the `algorithm_type` of a config
    "algorithm": Kind(
        "trinity.algorithms",
        _same(
            f"{_ALG}.presets",
            *("asymre", "cispo", "dapo", "dpo", "gigpo", "grpo", "gspo", "jsd", "mix_chord", "on_policy_distill"),
            *("ppo", "rec", "reinforceplusplus", "rloo", "sapo", "sft", "sppo", "topr"),
            *("is_ppo", "m2po", "mix", "multi_step_grpo", "opmd", "raft", "remax"),
        ),
    ),
    "advantage": Kind(
        "trinity.advantages",
        _same(
            f"{_ALG}.advantages",
            *("asymre", "gae", "gigpo", "grpo", "jsd", "on_policy_distill", "opmd", "ppo", "rec", "reinforce"),
            *("reinforceplusplus", "remax", "rloo", "step_wise_grpo"),
        ),
    ),
    "policy_loss": Kind(
        "trinity.policy_losses",
        {
            **_same(f"{_LOSSES}.clipped", "ppo", "gspo", "cispo", "sapo", "sppo"),
            **_same(f"{_LOSSES}.reinforce", "topr", "opmd", "rec"),
            **_same(f"{_LOSSES}.offline", "sft", "sft_phi", "dpo"),
            **_same(f"{_LOSSES}.chord", "mix_chord", "mix"),
            **_same(f"{_LOSSES}.unclipped", "importance_sampling", "m2po"),
        },
    ),
    "kl_estimator": Kind("trinity.kl_estimators", _same(f"{_ALG}.kl", "k1", "k2", "k3", "low_var_kl", "abs", "none")),
    "entropy_term": Kind("trinity.entropy_terms", _same(f"{_ALG}.entropy", "none", "default", "mix")),
    "value_loss": Kind("trinity.value_losses", _same(f"{_ALG}.value_losses", "clipped", "mse")),
    "loss_agg_mode": Kind(
        "trinity.loss_agg_modes",
        _same(
            f"{_ALG}.aggregation", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
        ),
    ),
    # explorer
    "workflow": Kind(
        "trinity.workflows",
        {
            **_same(f"{_WORKFLOWS}.single_turn", "math", "countdown"),
            "multi_turn": f"{_WORKFLOWS}.multi_turn",
            "multi_step": f"{_WORKFLOWS}.multi_step",
            "frozen_lake": f"{_WORKFLOWS}.frozen_lake",
        },
    ),
    "step_environment": Kind("trinity.step_environments", {"frozen_lake": f"{_WORKFLOWS}.frozen_lake"}),
    "chat_environment": Kind("trinity.chat_environments", {"guess_number": f"{_WORKFLOWS}.multi_turn"}),
    "reward": Kind(
        "trinity.rewards",
        {
            **_same(f"{_REWARDS}.math", "accuracy", "math"),
            "countdown": f"{_REWARDS}.countdown",
            "format": f"{_REWARDS}.format",
            "math_format": f"{_REWARDS}.composite",
            **_same(f"{_REWARDS}.judge", "judge_ruler", "judge_rubric"),
        },
    ),
    "engine": Kind(
        "trinity.engines",
        {
            "vllm": f"{_ENGINES}.vllm_engine",
            "transformers": f"{_ENGINES}.hf_engine",
            "scripted": f"{_ENGINES}.scripted",
        },
    ),
    # buffer
    "operator": Kind(
        "trinity.operators",
        _same(
            "trinity.buffer.operators.builtin",
            *(
                "reward_filter",
                "invalid_reward_filter",
                "reward_std_filter",
                "overlong_reward_penalty",
                "reward_shaping",
            ),
        ),
    ),
    "selector": Kind(
        "trinity.selectors", _same("trinity.buffer.tasksets.selectors", "sequential", "shuffle", "random")
    ),
    # trainer
    "trainer_backend": Kind(
        "trinity.trainer_backends",
        {"torch": "trinity.trainer.torch_backend", "megatron": "trinity.trainer.megatron.backend"},
    ),
    "lr_schedule": Kind("trinity.lr_schedules", _same("trinity.trainer.optim", "constant", "warmup", "cosine")),
    # weight sync
    "sync_backend": Kind(
        "trinity.sync_backends",
        {
            **_same("trinity.sync.collective", "gloo", "nccl"),
            "cuda_ipc": "trinity.sync.cuda_ipc",
            "checkpoint": "trinity.sync.checkpoint",
        },
    ),
    "checksum": Kind("trinity.checksums", _same("trinity.sync.checksum", "xxh3_64", "crc32")),
}
