"""Fallback engine: Hugging Face `generate`, log-probs from the processed scores of each step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from trinity.config.explorer import DType, TransformersEngineOptions
from trinity.explorer.engines.base import Engine, GenerationRequest, LoadRefused, Sample, truncate_at_stop
from trinity.explorer.engines.registry import ENGINES
from trinity.models.attention import attention_options


class TransformersEngineConfig(TransformersEngineOptions):
    """What `TransformersEngine` is built from: a run's `explorer.engine_options` plus the model and the seed."""

    model_path: str
    dtype: DType = "float32"
    seed: int = 0


@ENGINES.register("transformers")
class TransformersEngine(Engine):
    """`AutoModelForCausalLM.generate`, one request at a time (`n` samples batched).

    Log-probs are `log_softmax` of the scores `generate` sampled from (after temperature, top-k,
    top-p), matching vLLM's `processed_logprobs`; greedy decoding reports the raw distribution.
    Seeded once through a private `torch.Generator` state swapped in around each call.
    """

    def __init__(self, config: TransformersEngineConfig | None = None, **kwargs: Any) -> None:
        super().__init__()
        cfg = config or TransformersEngineConfig(**kwargs)
        self.config = cfg
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # Any: transformers types decode() as `str | list[str]` whatever the input.
        self._tokenizer: Any = AutoTokenizer.from_pretrained(cfg.model_path)
        # Any: transformers' generate() overloads do not type-check against the auto class.
        load: Any = AutoModelForCausalLM.from_pretrained
        self._model: Any = (
            load(cfg.model_path, dtype=getattr(torch, cfg.dtype), **attention_options(cfg.model_path))
            .to(cfg.device)
            .eval()
        )
        # generate() samples from the global RNG; keep our own stream so other code does not shift it.
        self._rng_state = torch.Generator().manual_seed(cfg.seed).get_state()

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def device(self) -> torch.device:
        return torch.device(self._model.device)

    def _generate(self, prompts: list[list[int]], requests: list[GenerationRequest]) -> list[list[Sample]]:
        saved = torch.get_rng_state()
        torch.set_rng_state(self._rng_state)
        try:
            return [self._sample(p, r) for p, r in zip(prompts, requests, strict=True)]
        finally:
            self._rng_state = torch.get_rng_state()
            torch.set_rng_state(saved)

    @torch.no_grad()
    def _sample(self, prompt: list[int], request: GenerationRequest) -> list[Sample]:
        s = request.sampling
        greedy = s.temperature <= 0
        eos_ids = _eos_ids(self._model, self._tokenizer)
        kwargs: dict[str, Any] = {
            "max_new_tokens": s.max_tokens,
            "num_return_sequences": request.n,
            "do_sample": not greedy,
            "output_scores": True,
            "return_dict_in_generate": True,
            "pad_token_id": self._tokenizer.pad_token_id,
            "eos_token_id": eos_ids,
        }
        if not greedy:
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else None)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if s.stop:
            kwargs.update(stop_strings=list(s.stop), tokenizer=self._tokenizer)
        input_ids = torch.tensor([prompt], device=self._model.device)
        out = self._model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        new = out.sequences[:, len(prompt) :]  # [n, steps]
        # scores: one [n, vocab] tensor per step; -inf where top-k / top-p masked tokens out.
        logp = torch.stack([torch.log_softmax(x.float(), dim=-1) for x in out.scores], dim=1)  # [n, steps, vocab]
        picked = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [n, steps]
        samples = []
        for row, row_logp in zip(new.tolist(), picked.tolist(), strict=True):
            length = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
            ids = row[:length]
            text = self._tokenizer.decode(ids, skip_special_tokens=True)
            text, hit_stop = truncate_at_stop(text, s.stop)
            ended = (ids and ids[-1] in eos_ids) or hit_stop
            samples.append(
                Sample(
                    token_ids=ids,
                    logprobs=row_logp[:length],
                    text=text,
                    finish_reason="stop" if ended else "length",
                )
            )
        return samples

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self._model.named_parameters())
        unknown = []
        copied = 0
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in params:
                    # Tied heads are absent from named_parameters(); anything else is a real mismatch.
                    if not (name == "lm_head.weight" and self._model.config.tie_word_embeddings):
                        unknown.append(name)
                    continue
                params[name].copy_(tensor)
                copied += 1
        if unknown:
            # Nothing copied: the model is as it was; otherwise it holds part of the update (the engine is torn).
            refusal = LoadRefused if not copied else ValueError
            raise refusal(f"weights not in the model: {unknown[:4]} ({len(unknown)} in all)")

    def close(self) -> None:
        self._model = None


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
