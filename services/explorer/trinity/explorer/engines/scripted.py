"""An engine whose replies come from a Python function: for environment tests and dry runs.

It tokenizes the replies with a real tokenizer, so workflows see real token ids; log-probs are 0
(a deterministic policy). Weight loads only record the version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from trinity.explorer.engines.base import Engine, GenerationRequest, Sample, truncate_at_stop
from trinity.explorer.engines.registry import ENGINES

ReplyFn = Callable[[str], str]


@ENGINES.register("scripted")
class ScriptedEngine(Engine):
    """Replies `reply_fn(prompt_text)` to every sample; `tokenizer` may be a path or a tokenizer."""

    def __init__(self, tokenizer: Any, reply_fn: ReplyFn) -> None:
        super().__init__()
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self._tokenizer = tokenizer
        self._reply_fn = reply_fn

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _generate(self, prompts: list[list[int]], requests: list[GenerationRequest]) -> list[list[Sample]]:
        results = []
        for prompt, request in zip(prompts, requests, strict=True):
            prompt_text = self._tokenizer.decode(prompt)
            results.append([self._reply(prompt_text, request) for _ in range(request.n)])
        return results

    def _reply(self, prompt_text: str, request: GenerationRequest) -> Sample:
        text, hit_stop = truncate_at_stop(self._reply_fn(prompt_text), request.sampling.stop)
        ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        finish = "stop"
        if len(ids) >= request.sampling.max_tokens:
            ids, finish = ids[: request.sampling.max_tokens], "length"
            text = self._tokenizer.decode(ids)
        elif not hit_stop and self._tokenizer.eos_token_id is not None:
            ids.append(self._tokenizer.eos_token_id)
        return Sample(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason=finish)

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for _ in named_tensors:
            pass
