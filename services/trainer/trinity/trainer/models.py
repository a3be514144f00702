"""Loading the policy, the frozen reference and the PPO critic from a Hugging Face directory."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trinity.config import TorchTrainerConfig
from trinity.models.attention import attention_options
from trinity.runtime.logging import get_logger
from trinity.trainer.attention import SDPA_FP32
from trinity.trainer.batch import TokenBatch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = get_logger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_causal_lm(
    path: str | Path, dtype: str | torch.dtype = "float32", device: torch.device | str = "cpu"
) -> PreTrainedModel:
    """A causal LM from `path` (config + safetensors), in `dtype`, on `device`, in train mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_dtype(dtype), **attention_options(path))
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
        target_modules=lora_targets(model, trainer.lora_target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


# Projections some families fuse into one Linear where others keep one per part (Phi-3's `qkv_proj` and
# `gate_up_proj`): asking for a part adapts the fused module that holds it.
FUSED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def lora_targets(model: nn.Module, requested: Sequence[str]) -> list[str]:
    """The Linear module names of `model` that `requested` (`trainer.lora_target_modules`) resolve to.

    A requested name the model does not have is left out (an MoE's experts are not Linear modules, so the
    default list adapts its attention only); none resolving at all is an error naming the model's Linears.
    """
    linears = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    targets = [name for name in requested if name in linears]
    targets += [
        fused
        for fused, parts in FUSED_PROJECTIONS.items()
        if fused in linears and fused not in targets and any(part in requested for part in parts)
    ]
    covered = set(targets).union(*(FUSED_PROJECTIONS.get(t, ()) for t in targets))
    if not targets:
        raise ValueError(
            f"trainer.lora_target_modules: none of {list(requested)} is a Linear module of this "
            f"{type(model).__name__}; its Linear modules are {sorted(linears)}"
        )
    log.info("lora.targets", targets=targets, not_in_model=[n for n in requested if n not in covered])
    return targets


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

        self.backbone = AutoModel.from_pretrained(
            str(model_path), dtype=_dtype(dtype), **attention_options(model_path)
        ).to(device)
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
    mask: torch.Tensor | dict[str, torch.Tensor] = batch.attention_mask
    if batch.attention_mask.dim() == 4:
        assert batch.position_ids is not None  # shared-prompt rows always carry them
        mask = sliding_window_masks(decoder.config, batch.attention_mask, batch.position_ids)
        if getattr(decoder.config, "_attn_implementation", "sdpa") not in ("sdpa", SDPA_FP32):
            dtype = next(decoder.parameters()).dtype
            mask = (
                _additive(mask, dtype)
                if isinstance(mask, torch.Tensor)
                else {k: _additive(m, dtype) for k, m in mask.items()}
            )
    return decoder(input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids).last_hidden_state


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def sliding_window_masks(
    config: Any, mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor | dict[str, torch.Tensor]:
    """A shared-prompt block mask `[rows, 1, seq, seq]` (True = may attend) with the model's sliding window in it.

    transformers uses a 4-D mask as it is given, so the window it builds into its own masks must be built in
    here: a query attends to keys fewer than `sliding_window` positions back (`position_ids` count along each
    sequence, as the sampler counts). Models that name each layer's attention (`layer_types`) take one mask per
    kind; the others apply their window to every layer. Measured without it on the tiny Gemma 2 of tests/models
    (window 16, 60-token sequences): log-probs 0.53 off the same rows unshared.
    """
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    if not window or (kinds is not None and "sliding_attention" not in kinds):
        return mask
    near = (position_ids[:, None, :, None] - position_ids[:, None, None, :]) < window
    return {"full_attention": mask, "sliding_attention": mask & near} if kinds is not None else mask & near


def response_hidden(model: nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, nn.Module]:
    """Final hidden states `[n, resp, hidden]` at response positions, and the lm_head to apply.

    Calling the decoder directly (not `model(...)`) avoids the `[batch, seq, vocab]` logits of the whole
    sequence; the caller applies the head in chunks to the response positions only.
    """
    from trinity.trainer.logprobs import gather_positions

    lm = causal_lm(model)
    hidden = decode(lm.get_submodule("model"), batch)
    head = lm.get_submodule("lm_head")
    cap = getattr(lm.config, "final_logit_softcapping", None)
    if cap:
        head = SoftcappedHead(head, float(cap))
    return gather_positions(hidden, batch.response_index, batch.response_row), head


class SoftcappedHead(nn.Module):
    """The LM head followed by `cap * tanh(logits / cap)` (Gemma 2's `final_logit_softcapping`), which the
    model's own forward applies after its head and the sampler before its temperature."""

    def __init__(self, head: nn.Module, cap: float) -> None:
        super().__init__()
        self.head = head
        self.cap = cap

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(hidden) / self.cap) * self.cap


def maybe_no_grad(enabled: bool) -> Any:
    return nullcontext() if enabled else torch.no_grad()
