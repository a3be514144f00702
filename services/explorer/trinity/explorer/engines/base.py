"""The rollout-engine contract: requests in, sampled tokens with their log-probs out.

Every engine (vLLM, transformers, scripted) implements `_generate` and `_load_weights`; this base
class owns what must hold for all of them: one lock so a `generate` call never sees two weight
versions, monotonic versions, prompt tokenization (chat templates included) and checkpoint loading.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample one response. `temperature == 0` means greedy; `top_k <= 0` disables top-k."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 128
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt, sampled `n` times. Give exactly one of `prompt`, `messages`, `prompt_token_ids`.

    `prompt` is raw text (tokenized as is), `messages` a chat (rendered with the tokenizer's chat
    template plus the generation prompt), `prompt_token_ids` the exact tokens (multi-turn workflows
    use it to extend a token stream without re-tokenizing).
    """

    prompt: str | None = None
    messages: Sequence[dict[str, str]] | None = None
    prompt_token_ids: Sequence[int] | None = None
    n: int = 1
    sampling: SamplingSettings = field(default_factory=SamplingSettings)

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.prompt, self.messages, self.prompt_token_ids))
        if given != 1:
            raise ValueError("GenerationRequest needs exactly one of prompt, messages, prompt_token_ids")
        if self.n < 1:
            raise ValueError(f"GenerationRequest.n must be >= 1, got {self.n}")


@dataclass
class Sample:
    """One sampled response. `logprobs[i]` is the sampling log-prob of `token_ids[i]` ([resp_len])."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) | "length"


@dataclass
class GenerationResult:
    """The `n` samples of one request, all produced by weight version `model_version`."""

    prompt_token_ids: list[int]
    prompt_text: str
    samples: list[Sample]
    model_version: int


class Engine(ABC):
    """A rollout engine. Thread-safe: `generate` and `load_weights` serialize on one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._model_version = 0

    # --- what a backend implements -------------------------------------------------------------
    @property
    @abstractmethod
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer the engine samples with."""

    @abstractmethod
    def _generate(self, prompts: list[list[int]], requests: list[GenerationRequest]) -> list[list[Sample]]:
        """Sample every request; `prompts[i]` are the token ids of `requests[i]`. Called under the lock."""

    @abstractmethod
    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging-Face-named tensors into the model in place. Called under the lock."""

    def close(self) -> None:  # noqa: B027 - backends without resources need nothing
        """Release the backend's resources."""

    # --- the contract ---------------------------------------------------------------------------
    @property
    def model_version(self) -> int:
        return self._model_version

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Sample every request; the results are in request order and share one weight version."""
        requests = list(requests)
        prompts = [self.encode_prompt(r) for r in requests]
        with self._lock:
            version = self._model_version
            samples = self._generate(prompts, requests) if requests else []
        decode = self.tokenizer.decode
        return [
            GenerationResult(prompt_token_ids=list(p), prompt_text=decode(p), samples=s, model_version=version)
            for p, s in zip(prompts, samples, strict=True)
        ]

    def load_weights(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Swap in new weights (Hugging Face names) between generate calls and record `version`.

        Versions never go back (DESIGN.md, monotonic weights); reloading the current version is
        allowed so a failed sync can be retried. If loading raises, the model may hold a mix of old
        and new tensors: the version is left unchanged and the caller must retry or reload.
        """
        with self._lock:
            if version < self._model_version:
                raise ValueError(f"weight version {version} is older than the served version {self._model_version}")
            self._load_weights(named_tensors)
            self._model_version = version

    def load_weights_from_dir(self, version: int, path: str | Path) -> None:
        """The checkpoint fallback: load every `*.safetensors` file under `path` as version `version`."""
        self.load_weights(version, iter_safetensors_dir(path))

    def encode_prompt(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt; chats go through the tokenizer's chat template."""
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        tok = self.tokenizer
        if request.messages is not None:
            text = tok.apply_chat_template(list(request.messages), tokenize=False, add_generation_prompt=True)
            # The template already wrote any BOS it wants; adding specials again would double it.
            return list(tok.encode(text, add_special_tokens=False))
        assert request.prompt is not None
        return list(tok.encode(request.prompt))

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_safetensors_dir(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(name, tensor)` from every safetensors shard of a Hugging Face checkpoint directory."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}; save the checkpoint with safe_serialization")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` before the first stop string; returns the text and whether a stop string matched."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
