"""The built-in names of every extension point and the module that registers each (plain data).

The config validates names against this table (plus installed plugins) without importing the
services; a registry imports a name's module the first time the name is looked up. Adding a built-in
means registering it with the decorator in its module and adding one line here;
tests/registry/test_registry.py checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from trinity import algorithm_table


class Kind(NamedTuple):
    group: str  # the entry-point group through which a package adds names of this kind
    builtins: Mapping[str, str]  # name -> module that registers it


def _same(module: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, module)


_ALG = "trinity.algorithms"
_WORKFLOWS = "trinity.explorer.workflows"
_REWARDS = "trinity.explorer.rewards"
_ENGINES = "trinity.explorer.engines"

KINDS: Mapping[str, Kind] = {
    # algorithm library: presets (`algorithm_type`) and functions, from the algorithm table
    "algorithm": Kind("trinity.algorithms", dict.fromkeys(algorithm_table.PRESETS, "trinity.config.algorithm")),
    **{
        kind: Kind(f"trinity.{group}", algorithm_table.function_names(kind))
        for kind, group in (
            ("advantage", "advantages"),
            ("policy_loss", "policy_losses"),
            ("kl_estimator", "kl_estimators"),
            ("entropy_term", "entropy_terms"),
            ("value_loss", "value_losses"),
        )
    },
    "loss_agg_mode": Kind(
        "trinity.loss_agg_modes",
        _same(
            f"{_ALG}.aggregation",
            *("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "pair-mean"),
        ),
    ),
    # explorer
    "workflow": Kind(
        "trinity.workflows",
        {
            **_same(f"{_WORKFLOWS}.single_turn", "math", "countdown"),
            "multi_turn": f"{_WORKFLOWS}.multi_turn",
            "react": f"{_WORKFLOWS}.react",
            "agentscope": f"{_WORKFLOWS}.agentscope",
            "multi_step": f"{_WORKFLOWS}.multi_step",
            "frozen_lake": f"{_WORKFLOWS}.frozen_lake",
            "textworld": f"{_WORKFLOWS}.textworld",
            "scienceworld": f"{_WORKFLOWS}.scienceworld",
        },
    ),
    "step_environment": Kind(
        "trinity.step_environments",
        {
            "frozen_lake": f"{_WORKFLOWS}.frozen_lake",
            "textworld": f"{_WORKFLOWS}.textworld",
            "scienceworld": f"{_WORKFLOWS}.scienceworld",
        },
    ),
    "chat_environment": Kind("trinity.chat_environments", {"guess_number": f"{_WORKFLOWS}.multi_turn"}),
    "tool": Kind("trinity.tools", {"calculator": "trinity.explorer.tools.builtin"}),
    "agent": Kind("trinity.agents", {"react": f"{_WORKFLOWS}.agentscope"}),
    "reward": Kind(
        "trinity.rewards",
        {
            **_same(f"{_REWARDS}.math", "accuracy", "math"),
            "countdown": f"{_REWARDS}.countdown",
            "format": f"{_REWARDS}.format",
            **_same(f"{_REWARDS}.composite", "math_format", "math_verify_format"),
            **_same(f"{_REWARDS}.judge", "judge_ruler", "judge_rubric"),
            **_same(f"{_REWARDS}.math_verify", "math_verify", "final_answer"),
            "reasoning_gym": f"{_REWARDS}.reasoning_gym",
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
