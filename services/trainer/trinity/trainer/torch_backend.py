"""The PyTorch training backend: one policy, one algorithm, AdamW; on one process or FSDP2 over N ranks.

The train step itself is `step.train_step`, shared with the Megatron backend; this file supplies what it asks for
(`StepBackend`): the models and their forward passes, the backward of this rank's micro-batches, the optimizer,
checkpoints and weights.

It reads the run config where it lands: `config.trainer` (a `TorchTrainerConfig`), `config.model`,
`config.algorithm`, and the run-wide seed, length, staleness bound and sampling temperature.

Data parallel: when the default process group is up (the ranks runtime starts it), every rank builds this
backend and makes the same calls; `parallel.py` says how a batch is split and the models sharded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trinity.config import RunConfig, TorchTrainerConfig
from trinity.runtime.logging import get_logger
from trinity.trainer import checkpoint as ckpt
from trinity.trainer.algorithm import AlgorithmParts, build_algorithm
from trinity.trainer.attention import use_fp32_attention
from trinity.trainer.backend import backend_section, register_backend
from trinity.trainer.batch import Sample, TokenBatch, Tokenizer, TokenSequence, collate, max_seq_len, to_samples
from trinity.trainer.kl_control import KLCoefficient
from trinity.trainer.logprobs import sampling_temperature
from trinity.trainer.models import (
    ReferencePolicy,
    TokenLogprobs,
    ValueModel,
    apply_lora,
    causal_lm,
    freeze,
    load_causal_lm,
    load_teacher,
    load_tokenizer,
)
from trinity.trainer.optim import build_optimizer
from trinity.trainer.parallel import (
    Ranks,
    decoder_layers,
    merge_weighted,
    rank_micro_batches,
    resolve_device,
    resolve_precision,
    scalar,
    shard,
    sum_across,
)
from trinity.trainer.step import ForwardModel, MicroLoss, entropy_mode, micro_loss, prepare, train_step
from trinity.trainer.timeline import CHECKPOINT_KEY
from trinity.trainer.weights import block_index, named_weights, save_hf
from trinity.v1 import common_pb2

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = get_logger(__name__)


class TorchBackend:
    """See `TrainerBackend`. `config.model.path` is a model directory (the runner resolves `smollm2`);
    checkpoints go to `checkpoint_dir`. `algorithm` may be given directly (tests, custom algorithms)."""

    def __init__(
        self, config: RunConfig, checkpoint_dir: Path | None = None, algorithm: AlgorithmParts | None = None
    ) -> None:
        self.trainer = backend_section(config, TorchTrainerConfig, "TorchBackend", checkpoint_dir)
        self.config = config
        self.checkpoint_dir = checkpoint_dir
        self.algorithm = replace(
            algorithm or build_algorithm(config.algorithm), value_loss_coef=self.trainer.value_loss_coef
        )
        self.max_seq_len = max_seq_len(config.model)
        self.ranks = Ranks.current()
        self.ranks.check(self.trainer)
        self.device = resolve_device(self.trainer.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL and FSDP2 use the current device of each rank
        self.precision = resolve_precision(self.trainer, config.model.dtype, self.device, self.ranks.sharded)
        log.info(
            "trainer.precision",
            rank=self.ranks.rank,
            device=str(self.device),
            weights=str(self.precision.load).removeprefix("torch."),
            compute=str(self.precision.compute or self.precision.load).removeprefix("torch."),
            autocast=self.precision.autocast,
        )
        torch.manual_seed(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)
        path = config.model.path
        self.hf_tokenizer = load_tokenizer(path)
        self.tokenizer = Tokenizer(self.hf_tokenizer)
        self._pad_id = int(self.hf_tokenizer.pad_token_id)

        model = self._load(path)
        if self.trainer.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        lora = self.trainer.lora_rank > 0
        self.policy: nn.Module = apply_lora(model, self.trainer) if lora else model
        self._blocks = decoder_layers(self.policy)
        self._policy_pass = self._sharded(self._pass(self.policy), self.policy)
        self.reference: ReferencePolicy | None = None
        if self.algorithm.needs_reference:
            copy = None if lora else freeze(self._load(path))
            self.reference = ReferencePolicy(
                self._policy_pass, self._sharded(self._pass(copy), copy) if copy is not None else None
            )
        self._teacher_pass: TokenLogprobs | None = None
        if self.algorithm.needs_teacher:
            teacher = load_teacher(config.algorithm.teacher_model, model, self.precision.load, self.device)
            use_fp32_attention(teacher, self.precision.autocast, self.device)
            self._teacher_pass = self._sharded(self._pass(teacher), teacher)
        self.kl = KLCoefficient(self.algorithm, config.algorithm)
        self.critic: ValueModel | None = None
        if self.algorithm.needs_critic:
            critic = ValueModel(path, self.precision.load, self.device)
            self.critic = self._sharded(critic, critic.backbone)

        opt = self.trainer.optimizer
        groups = [{"params": [p for p in self.policy.parameters() if p.requires_grad], "lr": opt.lr}]
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()), "lr": opt.critic_lr or opt.lr})
        self.optimizer, self.scheduler = build_optimizer(groups, opt, config.buffer.total_steps)
        self.state = ckpt.TrainState()
        self.consumed: set[str] = set()

    def _load(self, path: str) -> PreTrainedModel:
        """A causal LM whose log-probs run under this backend's autocast (the policy, its frozen copy), with the
        attention kernel that is fastest there (`attention.py`)."""
        lm = load_causal_lm(path, self.precision.load, self.device)
        use_fp32_attention(lm, self.precision.autocast, self.device)
        return lm

    def _pass(self, lm: nn.Module) -> TokenLogprobs:
        return TokenLogprobs(lm, self.trainer.logprob_chunk_size, sampling_temperature(self.config.explorer))

    def _sharded(self, root: nn.Module, model: nn.Module) -> Any:
        """`root` sharded over the ranks with one FSDP2 unit per decoder block of `model` (as is on one rank)."""
        if not self.ranks.sharded:
            return root
        return shard(root, decoder_layers(model), self.precision, self.device)

    # ----------------------------------------------------------------------------- protocol
    @property
    def model_version(self) -> int:
        return self.state.model_version

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def pack_budget(self) -> int | None:
        return self.trainer.micro_batch_tokens if self.trainer.share_prompts else None

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return named_weights(self.policy, self._unit_of if self.ranks.sharded else None)

    def save_hf(self, out_dir: str | Path) -> Path:
        unit_of = self._unit_of if self.ranks.sharded else None
        return save_hf(self.policy, self.hf_tokenizer, out_dir, unit_of, write=self.ranks.rank == 0)

    def _unit_of(self, hf_name: str) -> nn.Module:
        """The FSDP2 unit that holds a parameter: its decoder block, or the root for everything else."""
        index = block_index(hf_name)
        return self._policy_pass if index is None else self._blocks[index]

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        root = path or self.checkpoint_dir
        if root is None:
            raise ValueError("no checkpoint path given and the backend has no checkpoint directory")
        return ckpt.save(
            root,
            policy=self.policy,
            critic=self.critic,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            generator=self.generator,
            state=self.state,
            keep=self.trainer.keep_checkpoints,
            rank=self.ranks.rank,
        )

    def load_checkpoint(self, path: str | Path) -> None:
        self.state = ckpt.load(
            path,
            policy=self.policy,
            critic=self.critic,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            generator=self.generator,
        )
        self.consumed = set(self.state.consumed_ids)
        if self.state.kl_coef is not None:
            self.kl.value = self.state.kl_coef

    def continue_versions_after(self, version: int) -> None:
        self.state.continue_versions_after(version)

    def warm_up(self) -> None:
        """For a fresh optimizer: one update at learning rate 0 over zero gradients (its state made and its first
        fused call paid: 1.7 s of the quickstart's first step on its own), then that state reset to a fresh
        optimizer's zeros. The weights are bitwise unchanged (a 0 step, a weight decay factor of exactly 1), the
        gradients dropped, the schedule not stepped. A forward and backward warm-up measured nothing beside the
        first step's evaluation (docs/benchmarks.md), so there is none. One rank only: sharded ranks would all have to
        make the same call."""
        if self.ranks.sharded or any(self.optimizer.state.values()):  # a resumed optimizer's moments must not move
            return
        rates = [group["lr"] for group in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = 0.0
            for param in group["params"]:
                param.grad = torch.zeros_like(param)
        self.optimizer.step()
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        for state in self.optimizer.state.values():  # a fresh optimizer's: step 0, zero moments
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def learning_rate(self) -> float:
        return float(self.scheduler.base_lrs[0])

    def set_learning_rate(self, lr: float) -> None:
        # Every group (the critic's too) scales by the same ratio, keeping trainer.optimizer.critic_lr's proportion;
        # the scheduler's bases change with the groups' rates, so the schedule continues from the new base and a
        # checkpoint (the scheduler's state) keeps it.
        ratio = lr / self.learning_rate
        self.scheduler.base_lrs = [base * ratio for base in self.scheduler.base_lrs]
        factors = (fn(self.scheduler.last_epoch) for fn in self.scheduler.lr_lambdas)
        for group, base, factor in zip(self.optimizer.param_groups, self.scheduler.base_lrs, factors, strict=True):
            group["initial_lr"] = base
            group["lr"] = base * factor

    # ----------------------------------------------------------------------------- forward passes
    def logprobs(self, batch: TokenBatch, *, with_entropy: bool | str = False) -> tuple[torch.Tensor, torch.Tensor]:
        return self._token_logprobs(self._policy_pass, batch, with_entropy)

    @torch.no_grad()
    def forward_rows(self, rows: list[TokenSequence], model: ForwardModel) -> torch.Tensor:
        """Each rank computes its share of the rows; the zero-filled results are summed across ranks."""
        run = self._row_pass(model)
        width = max(max(len(r.response) for r in rows), 1)
        out = torch.zeros((len(rows), width), dtype=torch.float32, device=self.device)
        units = [Sample(id="", chosen=r) for r in rows]
        for idx in rank_micro_batches(units, self.ranks, self.trainer.micro_batch_tokens, self.trainer.share_prompts):
            mb = collate([rows[i] for i in idx or [0]], self.pad_id, self.pack_budget)
            values = run(mb)  # a padding pass (idx None) only keeps this rank in step with the others
            if idx is not None:
                out[idx, : mb.mask.shape[1]] = values.float()
        return sum_across(out, self.ranks).cpu()

    def _row_pass(self, model: ForwardModel) -> Callable[[TokenBatch], torch.Tensor]:
        """`[rows, resp]` of one micro-batch under `model`."""
        if model == "critic":
            critic = self.critic
            assert critic is not None
            return lambda mb: critic(mb.to(self.device))
        if model == "policy":
            return lambda mb: self._token_logprobs(self._policy_pass, mb, False)[0]
        if model == "teacher":
            teacher = self._teacher_pass
            assert teacher is not None
            return lambda mb: self._token_logprobs(teacher, mb, False)[0]
        assert self.reference is not None
        reference = self.reference

        def run(mb: TokenBatch) -> torch.Tensor:
            with reference.active() as ref:
                return self._token_logprobs(ref, mb, False)[0]

        return run

    def _token_logprobs(
        self, model: TokenLogprobs, batch: TokenBatch, with_entropy: bool | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy `[rows, resp]` of `batch`'s response tokens under `model`, on this rank's device.

        With bf16 autocast the matmuls run in bf16 while weights, optimizer state and the log-softmax stay
        in fp32 (the log-softmax upcasts its logits).
        """
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision.autocast):
            return model(batch.to(self.device), with_entropy)

    # ----------------------------------------------------------------------------- the step
    def train_step(self, experiences: Sequence[common_pb2.Experience]) -> dict[str, float]:
        metrics = train_step(self, experiences)
        interval = self.trainer.save_interval
        if "skipped" not in metrics and interval and self.step % interval == 0:
            started = time.perf_counter()
            self.save_checkpoint()
            metrics[CHECKPOINT_KEY] = time.perf_counter() - started
        return metrics

    def backward(self, samples: list[Sample], mini: list[int], loss: MicroLoss, with_entropy: bool | str) -> None:
        """Backward over this rank's token-budget micro-batches of one mini-batch; grads sum in `.grad` (across ranks
        too: FSDP2 reduce-scatters sums)."""
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        sub = [samples[i] for i in mini]
        for local in rank_micro_batches(sub, self.ranks, self.trainer.micro_batch_tokens, self.trainer.share_prompts):
            micro = [mini[j] for j in local or [0]]
            mb = collate([seq for i in micro for seq in samples[i].sequences], self.pad_id, self.pack_budget)
            logp, entropy = self._token_logprobs(self._policy_pass, mb, with_entropy)
            values = self.critic(mb.to(self.device)) if self.critic is not None else None
            if local is None:  # a padding pass: it enters the collectives, its gradient is zero, it reports nothing
                (logp.sum() * 0.0 + (values.sum() * 0.0 if values is not None else 0.0)).backward()
                continue
            loss(micro, mb, logp, entropy, values).backward()

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])  # the scheduled rate, a steered base included

    def merge_metrics(self, sums: dict[str, float], weights: dict[str, float]) -> dict[str, float]:
        return merge_weighted(sums, weights, self.ranks)

    def compute_gradients(self, experiences: Sequence[common_pb2.Experience]) -> dict[str, float]:
        """Leave the gradient of the whole batch's loss in `.grad` without an update (diagnostics, tests)."""
        samples = to_samples(experiences, self.tokenizer, max_seq_len=self.max_seq_len)
        everything = list(range(len(samples)))
        batch = prepare(self, self.algorithm, samples, [everything])
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        loss = partial(micro_loss, batch, self.algorithm, mini=everything, step=self.step, sums=sums, weights=weights)
        self.backward(samples, everything, loss, entropy_mode(self.algorithm))
        return self.merge_metrics(sums, weights)

    def clip_and_step(self) -> float:
        max_norm = self.trainer.optimizer.max_grad_norm
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        policy = [p for p in self.optimizer.param_groups[0]["params"] if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(policy, max_norm if max_norm is not None else float("inf"))
        if self.critic is not None and max_norm is not None:
            critic = [p for p in self.optimizer.param_groups[1]["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(critic, max_norm)
        if params:
            self.optimizer.step()
        self.scheduler.step()
        return scalar(norm)


@register_backend("torch")
def _build(config: RunConfig, checkpoint_dir: Path | None) -> TorchBackend:
    return TorchBackend(config, checkpoint_dir)


__all__ = ["TorchBackend", "causal_lm"]
