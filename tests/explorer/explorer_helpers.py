"""Test helpers: recompute log-probs with Hugging Face, build tasks."""

from __future__ import annotations

from typing import Any

import torch
from google.protobuf import struct_pb2

from trinity.v1 import common_pb2


@torch.no_grad()
def hf_logprobs(model: Any, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0) -> list[float]:
    """log p(response_ids[i] | prefix) under `model` with logits / temperature; [resp_len]."""
    ids = torch.tensor([prompt_ids + response_ids])
    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature  # [resp_len, vocab]
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, torch.tensor(response_ids).unsqueeze(-1)).squeeze(-1).tolist()


def make_task(
    prompt: str = "", answer: str = "", task_id: str = "set/0", reward_fn: str = "", **payload: Any
) -> common_pb2.Task:
    struct = struct_pb2.Struct()
    struct.update(payload)
    return common_pb2.Task(id=task_id, taskset="set", prompt=prompt, answer=answer, reward_fn=reward_fn, payload=struct)


def scripted_runner(config: Any, run_id: str, buffer: Any, gateway: Any, engine: Any, instance_id: str) -> Any:
    """An ExplorerRunner of `config` against real Buffer and Gateway processes, on an engine the test built."""
    from trinity.explorer.runner import ExplorerRunner

    return ExplorerRunner(
        run_id=run_id,
        stage=0,
        config=config,
        instance_id=instance_id,
        buffer_address=buffer.address,
        gateway_address=gateway.address,
        engine_factory=lambda cfg, path: engine,
    )
