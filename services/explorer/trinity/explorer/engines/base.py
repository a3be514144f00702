"""The rollout-engine contract: requests in, sampled tokens with their log-probs out.

Every engine (vLLM, transformers, scripted) implements `_generate` and `_load_weights`; this base
class owns what must hold for all of them: a call never sees two weight versions, versions are
monotonic, prompts are tokenized one way (chat templates included), checkpoints load one way.

Concurrency: `generate` and `stream` may be called from many threads. An engine with continuous
batching (`concurrent = True`, vLLM) runs them together; the others run one call at a time. A weight
load waits until the calls in flight have finished and holds new ones back meanwhile (`VersionGate`),
so every result is produced by exactly one version and no call in flight is dropped.

Time limits: inside `with deadline(seconds):` a call that has not finished in time raises
`GenerationTimeout`; engines that can abort a request (vLLM) stop its work at the deadline.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

from trinity.runtime.failpoints import failpoint

T = TypeVar("T")


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


@dataclass
class SampleDelta:
    """What sample `index` produced since its last delta; `finish_reason` is set on its last one."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None = None


class GenerationTimeout(TimeoutError):
    """A call ran past its `deadline`."""


class EngineFailed(RuntimeError):
    """The engine itself is gone (not one request's fault): no further call can succeed."""


class LoadRefused(ValueError):
    """A weight load refused before it changed the model (the engine still serves what it served)."""


class WeightsTorn(RuntimeError):
    """A weight update failed part-way: the model holds a mix of two versions and serves nothing until a whole
    version has loaded (the trainer publishes again after a failed update)."""


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("engine_deadline", default=None)


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Engine calls made inside (in this thread) must finish within `seconds` from now; None = no limit."""
    token = _DEADLINE.set(None if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def current_deadline() -> float | None:
    """The `time.monotonic()` by which the calls of this thread must finish, if any."""
    return _DEADLINE.get()


def check_deadline() -> None:
    limit = _DEADLINE.get()
    if limit is not None and time.monotonic() >= limit:
        raise GenerationTimeout("the rollout's time limit passed before the engine call finished")


class VersionGate:
    """Many calls at once, or one weight load alone; a waiting load holds new calls back (no starvation)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls = 0
        self._loading = False
        self._loads_waiting = 0

    def enter_call(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._loading and not self._loads_waiting)
            self._calls += 1

    def leave_call(self) -> None:
        with self._cond:
            self._calls -= 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def load(self) -> Iterator[None]:
        with self._cond:
            self._loads_waiting += 1
            self._cond.wait_for(lambda: not self._loading and not self._calls)
            self._loads_waiting -= 1
            self._loading = True
        try:
            yield
        finally:
            with self._cond:
                self._loading = False
                self._cond.notify_all()

    @property
    def calls_in_flight(self) -> int:
        with self._cond:
            return self._calls


class GenerationStream:
    """One request's samples as they are produced: iterate for `SampleDelta`s, then `result()`.

    `model_version` and `prompt_token_ids` are known before the first delta. `close()` gives up the
    request (a client that went away): the engine stops working on it where it can.
    """

    def __init__(
        self,
        prompt_token_ids: list[int],
        prompt_text: str,
        model_version: int,
        deltas: Iterator[SampleDelta],
        n: int,
        abort: Callable[[], None] = lambda: None,
    ) -> None:
        self.prompt_token_ids = prompt_token_ids
        self.prompt_text = prompt_text
        self.model_version = model_version
        self._deltas = deltas
        self._abort = abort
        self._samples = [Sample(token_ids=[], logprobs=[], text="", finish_reason="") for _ in range(n)]
        self._finished = 0
        self._n = n

    def __iter__(self) -> Iterator[SampleDelta]:
        for delta in self._deltas:
            sample = self._samples[delta.index]
            sample.token_ids += delta.token_ids
            sample.logprobs += delta.logprobs
            sample.text += delta.text
            if delta.finish_reason is not None:
                sample.finish_reason = delta.finish_reason
                self._finished += 1
            yield delta

    def result(self) -> GenerationResult:
        """The whole result; raises if the stream was not read to its end."""
        if self._finished < self._n:
            raise RuntimeError(f"the stream ended with {self._finished} of {self._n} samples finished")
        return GenerationResult(
            prompt_token_ids=self.prompt_token_ids,
            prompt_text=self.prompt_text,
            samples=self._samples,
            model_version=self.model_version,
        )

    def close(self) -> None:
        self._abort()


class Engine(ABC):
    """A rollout engine; thread-safe (see the module docstring)."""

    concurrent: ClassVar[bool] = False  # calls from many threads are batched together by the backend

    def __init__(self) -> None:
        self._gate = VersionGate()
        self._serial = threading.Lock()  # engines without continuous batching run one call at a time
        self._model_version = 0
        self._torn: str | None = None

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

    def _stream(
        self, prompt: list[int], request: GenerationRequest, finished: Callable[[], None]
    ) -> tuple[Iterator[SampleDelta], Callable[[], None]]:
        """Deltas of one request and how to abort it; `finished()` once the backend's work on it is over.

        This default samples the whole request at once and replays it as one delta per sample; engines
        that produce tokens incrementally override it.
        """
        try:
            samples = self._run_generate([prompt], [request])[0]
        finally:
            finished()
        deltas = (
            SampleDelta(index=i, token_ids=s.token_ids, logprobs=s.logprobs, text=s.text, finish_reason=s.finish_reason)
            for i, s in enumerate(samples)
        )
        return deltas, lambda: None

    def close(self) -> None:  # noqa: B027 - backends without resources need nothing
        """Release the backend's resources."""

    @property
    def sync_ranks(self) -> int:
        """Ranks the engine takes in the weight-sync group: 1 (this process receives), or one per worker of an engine
        whose workers receive themselves (vLLM split across workers)."""
        return 1

    @property
    def device(self) -> torch.device | None:
        """Where the model's weights live, which a GPU weight-sync backend receives into; None: the current CUDA
        device (an engine that places its model itself)."""
        return None

    # --- the contract ---------------------------------------------------------------------------
    @property
    def model_version(self) -> int:
        return self._model_version

    @property
    def calls_in_flight(self) -> int:
        return self._gate.calls_in_flight

    @property
    def torn(self) -> str | None:
        """Why the model holds part of an update (calls raise `WeightsTorn`); None when it holds one version."""
        return self._torn

    def _enter_call(self) -> None:
        self._gate.enter_call()
        if self._torn is not None:
            self._gate.leave_call()
            raise WeightsTorn(self._torn)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Sample every request; the results are in request order and share one weight version."""
        requests = list(requests)
        prompts = [self.encode_prompt(r) for r in requests]
        check_deadline()
        self._enter_call()
        try:
            version = self._model_version
            samples = self._run_generate(prompts, requests) if requests else []
        finally:
            self._gate.leave_call()
        decode = self.tokenizer.decode
        return [
            GenerationResult(prompt_token_ids=list(p), prompt_text=decode(p), samples=s, model_version=version)
            for p, s in zip(prompts, samples, strict=True)
        ]

    def stream(self, request: GenerationRequest) -> GenerationStream:
        """Sample one request, its tokens delivered as they come (see `GenerationStream`)."""
        prompt = self.encode_prompt(request)
        check_deadline()
        self._enter_call()
        released = threading.Event()

        def finished() -> None:  # the gate counts the backend's work, not the reader's: a slow reader holds no load
            if not released.is_set():
                released.set()
                self._gate.leave_call()

        version = self._model_version
        try:
            deltas, abort = self._stream(prompt, request, finished)
        except BaseException:
            finished()
            raise
        return GenerationStream(prompt, self.tokenizer.decode(prompt), version, deltas, request.n, abort)

    def _run_generate(self, prompts: list[list[int]], requests: list[GenerationRequest]) -> list[list[Sample]]:
        if self.concurrent:
            return self._generate(prompts, requests)
        with self._serial:
            check_deadline()
            return self._generate(prompts, requests)

    def load_weights(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Swap in new weights (Hugging Face names) between generate calls and record `version`.

        Versions never go back (DESIGN.md, monotonic weights); reloading the current version is
        allowed so a failed sync can be retried. `named_tensors` may arrive as they are received (a streamed
        sync): calls wait until it is exhausted. If loading raises, the model may hold a mix of old and new
        tensors: the version is left unchanged and the engine is `torn` (calls raise `WeightsTorn`) until a
        whole version has loaded.
        """
        self._load_version(version, lambda: self._load_weights(named_tensors))

    def _load_version(self, version: int, load: Callable[[], T]) -> T:
        """Run `load` (which changes the weights to `version`) with calls held off; versions never go back, and a
        `load` that raises leaves the engine torn."""
        with self._gate.load():
            if version < self._model_version:
                raise ValueError(f"weight version {version} is older than the served version {self._model_version}")
            failpoint("weights.load")  # received and verified, generation held off, the engine not yet changed
            try:
                result = load()
            except LoadRefused:
                raise
            except BaseException as err:
                self._torn = (
                    f"the update to weight version {version} failed part-way ({err!r}); the engine serves again "
                    f"once a whole version has loaded (it served version {self._model_version})"
                )
                raise
            self._model_version, self._torn = version, None
            return result

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
