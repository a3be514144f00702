"""Loading the policy, the frozen reference and the PPO critic from a Hugging Face directory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trinity.config import TorchTrainerConfig
from trinity.trainer.attention import SDPA_FP32
from trinity.trainer.batch import TokenBatch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_causal_lm(
    path: str | Path, dtype: str | torch.dtype = "float32", device: torch.device | str = "cpu"
) -> PreTrainedModel:
    """A causal LM from `path` (config + safetensors), in `dtype`, on `device`, in train mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_dtype(dtype))
    model.to(device)  # type: ignore[arg-type]  # transformers' stubs type `to` for dtypes only
    model.train()
    return model


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    return DTYPES[dtype] if isinstance(dtype, str) else dtype


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def apply_lora(model: nn.Module, trainer: TorchTrainerConfig) -> nn.Module:
    """Wrap `model` with peft LoRA adapters of rank `trainer.lora_rank`; only the adapters stay trainable.

    The exported weights are always merged, full-rank tensors (`weights.named_weights`).
    """
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=trainer.lora_rank,
        lora_alpha=trainer.lora_alpha if trainer.lora_alpha is not None else 2 * trainer.lora_rank,
        lora_dropout=trainer.lora_dropout,
        target_modules=list(trainer.lora_target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def causal_lm(model: nn.Module) -> PreTrainedModel:
    """The underlying `*ForCausalLM` module (peft wraps it as `base_model.model`)."""
    from peft import PeftModel
    from transformers import PreTrainedModel

    lm = model.get_submodule("base_model.model") if isinstance(model, PeftModel) else model
    if not isinstance(lm, PreTrainedModel):
        raise TypeError(f"expected a Hugging Face causal LM, got {type(lm).__name__}")
    return lm


def load_teacher(
    path: str | Path, student: nn.Module, dtype: str | torch.dtype, device: torch.device | str
) -> PreTrainedModel:
    """The frozen teacher of distillation from `path` (`algorithm.teacher_model`). Its log-probs are read at
    the student's token ids, so it must have the student's vocabulary."""
    if not Path(path).is_dir():
        raise ValueError(f"algorithm.teacher_model: {str(path)!r} is not a model directory")
    teacher = load_causal_lm(path, dtype, device)
    mine, theirs = causal_lm(student).config.vocab_size, teacher.config.vocab_size
    if mine != theirs:
        raise ValueError(
            f"algorithm.teacher_model: {str(path)!r} has a vocabulary of {theirs} tokens, the policy {mine}; "
            "distillation needs the same tokenizer"
        )
    return freeze(teacher)  # type: ignore[return-value]  # freeze returns its argument


def freeze(model: nn.Module) -> nn.Module:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class TokenLogprobs(nn.Module):
    """A causal LM as one module whose forward is a whole log-prob pass over a batch's response tokens.

    Under FSDP2 this wrapper is the root unit: its forward hooks gather the embeddings, the final norm and
    the LM head (which `response_hidden` calls outside the LM's own forward) and reduce their gradients.
    """

    def __init__(self, lm: nn.Module, chunk_size: int, temperature: float) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.temperature = temperature

    def forward(self, batch: TokenBatch, with_entropy: bool | str = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy `[rows, resp]` (float32) of `batch`'s response tokens."""
        from trinity.trainer.logprobs import chunked_logprobs

        hidden, head = response_hidden(self.lm, batch)
        return chunked_logprobs(
            head, hidden, batch.targets, chunk_size=self.chunk_size, temperature=self.temperature,
            with_entropy=with_entropy,
        )  # fmt: skip


class ReferencePolicy:
    """The frozen policy that KL penalties and DPO compare against.

    With LoRA the reference is the policy with its adapters switched off (no second copy of the
    weights); otherwise a frozen copy (`copy`, loaded from the same directory).
    """

    def __init__(self, policy: TokenLogprobs, copy: TokenLogprobs | None) -> None:
        self._policy = policy
        self._copy = copy

    @contextmanager
    def active(self) -> Iterator[TokenLogprobs]:
        from peft import PeftModel

        if self._copy is not None:
            yield self._copy
            return
        assert isinstance(self._policy.lm, PeftModel)  # no copy: the policy carries LoRA adapters
        with self._policy.lm.disable_adapter():
            yield self._policy


class ValueModel(nn.Module):
    """PPO critic: the base transformer (no lm_head) plus a scalar head, initialised at zero value."""

    def __init__(
        self, model_path: str | Path, dtype: str | torch.dtype = "float32", device: torch.device | str = "cpu"
    ) -> None:
        super().__init__()
        from transformers import AutoModel

        self.backbone = AutoModel.from_pretrained(str(model_path), dtype=_dtype(dtype)).to(device)
        hidden = self.backbone.config.hidden_size
        self.head = nn.Linear(hidden, 1, dtype=_dtype(dtype), device=device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, batch: TokenBatch) -> torch.Tensor:
        """Values `[n, resp]` of the states before each response token of each sequence."""
        from trinity.trainer.logprobs import gather_positions

        hidden = decode(self.backbone, batch)
        values = self.head(gather_positions(hidden, batch.response_index, batch.response_row)).squeeze(-1)
        return values.to(torch.float32, copy=True)  # not a view: FSDP2 hooks the output for backward


def decode(decoder: nn.Module, batch: TokenBatch) -> torch.Tensor:
    """Last hidden states `[rows, seq, hidden]` of a decoder stack (`model.model`, not the LM head).

    A shared-prompt block mask goes to SDPA (either dtype, `attention.py`) as booleans; eager attention adds
    its mask to the scores, so it gets the additive form.
    """
    mask = batch.attention_mask
    if mask.dim() == 4 and getattr(decoder.config, "_attn_implementation", "sdpa") not in ("sdpa", SDPA_FP32):
        dtype = next(decoder.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return decoder(input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids).last_hidden_state


def response_hidden(model: nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, nn.Module]:
    """Final hidden states `[n, resp, hidden]` at response positions, and the lm_head to apply.

    Calling the decoder directly (not `model(...)`) avoids the `[batch, seq, vocab]` logits of the whole
    sequence; the caller applies the head in chunks to the response positions only.
    """
    from trinity.trainer.logprobs import gather_positions

    lm = causal_lm(model)
    hidden = decode(lm.get_submodule("model"), batch)
    return gather_positions(hidden, batch.response_index, batch.response_row), lm.get_submodule("lm_head")


def maybe_no_grad(enabled: bool) -> Any:
    return nullcontext() if enabled else torch.no_grad()
