"""One rank's share of training: the Megatron policy, its optimizer, and what the shared train step asks of it.

Every rank runs the same code on the same batch (the command is broadcast by rank 0). The step is
`trinity.trainer.step.train_step`, the PyTorch backend's own: this engine is its `StepBackend`. Each data-parallel
replica trains its share of every mini-batch, dealt as the PyTorch backend deals it (`parallel.deal`), and the
pipeline schedule decides what each stage of the replica computes: the step's `micro_loss` runs inside the
schedule's loss function on the last stage, on the log-probs of that stage's logits.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trinity.config import MegatronTrainerConfig, RunConfig
from trinity.trainer.algorithm import AlgorithmParts
from trinity.trainer.batch import (
    Sample,
    TokenBatch,
    Tokenizer,
    TokenSequence,
    collate,
    max_seq_len,
    plan_micro_batches,
    to_samples,
)
from trinity.trainer.checkpoint import TrainState, publish, resolve
from trinity.trainer.kl_control import KLCoefficient
from trinity.trainer.logprobs import gather_positions, sampling_temperature
from trinity.trainer.megatron import model as mmodel
from trinity.trainer.megatron.hf_mapping import megatron_to_hf, stage_layers
from trinity.trainer.megatron.logprobs import vocab_parallel_logprobs
from trinity.trainer.optim import SCHEDULES
from trinity.trainer.parallel import Ranks, deal, merge_weighted
from trinity.trainer.step import ForwardModel, MicroLoss, train_step
from trinity.v1 import common_pb2

MODEL_FILE = "model_optim_rng.pt"  # Megatron's legacy name, one per model-parallel shard
TRAINER_FILE = "trainer.pt"


@dataclass
class _Micro:
    """One micro-batch as the schedule consumes it: its tensors and what to do with the output."""

    batch: TokenBatch
    on_logprobs: Callable[[TokenBatch, torch.Tensor, torch.Tensor], torch.Tensor]


class MegatronEngine:
    """The per-rank training state. Collective: every method must be called on all ranks in order."""

    def __init__(self, config: RunConfig, algorithm: AlgorithmParts) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import finalize_model_grads

        from trinity.trainer.models import load_tokenizer

        assert isinstance(config.trainer, MegatronTrainerConfig)
        self.config, self.trainer, self.algorithm = config, config.trainer, algorithm
        if algorithm.needs_critic:
            raise ValueError("the Megatron backend has no critic yet; use backend 'torch' for PPO with a value model")
        if algorithm.needs_teacher or config.algorithm.kl_controller != "fixed":
            raise ValueError("the Megatron backend has no teacher and no adaptive KL yet; use backend 'torch'")
        self.max_seq_len = max_seq_len(config.model)
        self.temperature = sampling_temperature(config.explorer)
        model_dir, dtype = config.model.path, config.model.dtype
        self.generator = torch.Generator().manual_seed(config.seed)
        self.hf_tokenizer = load_tokenizer(model_dir)
        self.tokenizer = Tokenizer(self.hf_tokenizer)
        self.pad_id = int(self.hf_tokenizer.pad_token_id)
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        self.tp, self.pp = self.trainer.tensor_parallel_size, self.trainer.pipeline_parallel_size
        self.dp = self.trainer.data_parallel_size
        self.tp_rank, self.pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        self.dp_rank = ps.get_data_parallel_rank()
        # Megatron numbers ranks TP fastest, then DP, then PP ("tp-cp-ep-dp-pp", CP = EP = 1).
        assert dist.get_rank() == (self.pp_rank * self.dp + self.dp_rank) * self.tp + self.tp_rank
        assert ps.get_data_parallel_world_size() == self.dp
        # The one rank per data-parallel replica whose loss-function results (log-probs, metrics) count.
        self.reports = ps.is_pipeline_last_stage() and self.tp_rank == 0

        self.shape = mmodel.read_shape(model_dir)
        self.mconfig = mmodel.transformer_config(self.shape, dtype, self.tp, self.pp, torch.cuda.is_available())
        policy = mmodel.build_gpt(self.shape, self.mconfig)
        mmodel.load_hf_weights(policy, model_dir, self.shape)
        self.model = mmodel.wrap_ddp(policy, self.mconfig, self.trainer.use_distributed_optimizer)
        self.reference: torch.nn.Module | None = None
        if algorithm.needs_reference:
            self.reference = mmodel.build_gpt(self.shape, self.mconfig)
            mmodel.load_hf_weights(self.reference, model_dir, self.shape)
            self.reference.eval().requires_grad_(False)
        opt = self.trainer.optimizer
        self.optimizer = mmodel.build_optimizer(self.model, opt, dtype, self.trainer.use_distributed_optimizer)
        self.mconfig.grad_scale_func = self.optimizer.scale_loss
        # The step's micro_loss already weights each micro-batch by its share of the mini-batch (see step.py),
        # so the per-token division Megatron would do here is switched off.
        self.mconfig.finalize_model_grads_func = lambda models, num_tokens, **kw: finalize_model_grads(
            models, None, **kw
        )
        self.schedule_factor = SCHEDULES.get(opt.schedule)(opt, config.buffer.total_steps)
        self.updates = 0
        self.kl = KLCoefficient(algorithm, config.algorithm)
        self.state = TrainState()
        self.consumed: set[str] = set()

    # ----------------------------------------------------------------------------- forward passes
    def _replica_plan(self, units: Sequence[Sample]) -> list[list[int]]:
        """This data-parallel replica's micro-batches (indices into `units`): its dealt share of them,
        planned under the token budget. Each micro-batch loss is scaled by its share of the whole
        mini-batch, so the replicas' gradients, summed, are the single-process gradient."""
        share = deal(units, self.dp, share_prompts=False)[self.dp_rank]
        local = plan_micro_batches([units[i] for i in share], self.trainer.micro_batch_tokens)
        return [[share[j] for j in mb] for mb in local]

    def _run_schedule(self, micros: list[_Micro], model: torch.nn.Module, forward_only: bool) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if not micros:
            # A replica dealt no samples (fewer than replicas) still joins the gradient all-reduce at the
            # end of the schedule: with one zero-loss pass, whose gradient is exactly zero.
            micros = [_Micro(collate([TokenSequence([self.pad_id], [self.pad_id], [False])], self.pad_id), _zero_loss)]

        def forward_step(data: Iterator[_Micro], chunk: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
            micro = next(data)
            ids = micro.batch.input_ids.to(self.device)
            pos = torch.arange(ids.shape[1], device=self.device).unsqueeze(0).expand_as(ids)
            # Right padding and a causal mask: real tokens never attend to the padding after them.
            return chunk(ids, pos, None), partial(self._loss, micro)

        first = micros[0].batch.input_ids
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micros),
            model=[model],
            num_microbatches=len(micros),
            seq_length=first.shape[1],
            micro_batch_size=first.shape[0],
            forward_only=forward_only,
        )

    def _loss(self, micro: _Micro, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Last stage: logits `[rows, seq, vocab/tp]` -> the micro-batch's scaled loss."""
        mb = micro.batch.to(self.device)
        logp, entropy = vocab_parallel_logprobs(
            gather_positions(logits, mb.response_index),
            mb.targets,
            temperature=self.temperature,
        )
        # The objective's other inputs (advantages, old log-probs) live on the CPU; `[rows, resp]` is small.
        loss = micro.on_logprobs(mb, logp.cpu(), entropy.cpu())
        # Back on the logits' device: the schedule scales it by the optimizer's (device) loss scale.
        return loss.to(logits.device), torch.ones((), dtype=torch.int), {}

    def forward_rows(self, rows: list[TokenSequence], which: ForwardModel = "policy") -> torch.Tensor:
        """Log-probs `[rows, max_resp]` of `rows` under the policy or the reference (no grad), on every rank."""
        if which == "critic":
            raise ValueError("the Megatron backend has no critic")
        width = max(max(len(r.response) for r in rows), 1)
        out = torch.zeros((len(rows), width), dtype=torch.float32)
        plan = self._replica_plan([Sample(id="", chosen=r) for r in rows])

        def store(idx: list[int], mb: TokenBatch, logp: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
            out[idx, : mb.mask.shape[1]] = logp.detach().float().cpu()
            return _zero_loss(mb, logp, entropy)

        micros = [_Micro(collate([rows[i] for i in idx], self.pad_id), partial(store, idx)) for idx in plan]
        model = self.model if which == "policy" else self.reference
        assert model is not None
        with torch.no_grad():
            self._run_schedule(micros, model, forward_only=True)
        # Each reporting rank holds its replica's rows and zeros elsewhere: a sum gives every rank all rows.
        if not self.reports:
            out.zero_()
        dist.all_reduce(out, group=_control_group())
        return out

    def score(self, experiences: Sequence[common_pb2.Experience]) -> torch.Tensor:
        """Policy log-probs `[rows, max_resp]` of the experiences' response tokens (no update)."""
        samples = to_samples(experiences, self.tokenizer, max_seq_len=self.max_seq_len)
        return self.forward_rows([seq for s in samples for seq in s.sequences])

    # ----------------------------------------------------------------------------- the step
    def train_step(self, experiences: Sequence[common_pb2.Experience]) -> dict[str, float]:
        return train_step(self, experiences)

    def backward(self, samples: list[Sample], mini: list[int], loss: MicroLoss, with_entropy: bool | str) -> None:
        """This replica's micro-batches of the mini-batch (planned as the PyTorch backend plans them) through the
        pipeline schedule, whose loss function calls `loss` on the last stage (the entropy comes with the log-probs
        there, whatever `with_entropy` asks)."""
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        micros = []
        for local in self._replica_plan([samples[i] for i in mini]):
            micro = [mini[j] for j in local]
            rows = [seq for i in micro for seq in samples[i].sequences]
            micros.append(_Micro(collate(rows, self.pad_id), partial(_train_loss, loss, micro)))
        self._run_schedule(micros, self.model, forward_only=False)

    def current_lr(self) -> float:
        return self.trainer.optimizer.lr * self.schedule_factor(self.updates)

    def clip_and_step(self) -> float:
        """Megatron's optimizer clips (`trainer.optimizer.max_grad_norm`) inside its step."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.current_lr()
        _, grad_norm, _ = self.optimizer.step()
        self.updates += 1
        return float(grad_norm) if grad_norm is not None else 0.0

    def merge_metrics(self, sums: dict[str, float], weights: dict[str, float]) -> dict[str, float]:
        """Every rank joins the gather; the reporting rank of each replica brings that replica's sums."""
        mine: tuple[dict[str, float], dict[str, float]] = (sums, weights) if self.reports else ({}, {})
        return merge_weighted(*mine, Ranks.current())

    # ----------------------------------------------------------------------------- weights
    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named tensors, yielded on global rank 0 only (other ranks yield nothing).

        Only data-parallel replica 0 takes part (the replicas hold the same weights). Each of its stages
        all-gathers its TP shards; stage 0 converts its own, later stages' TP rank 0 convert theirs and
        send them to rank 0, one parameter at a time (peak extra memory: one full tensor).
        """
        from megatron.core import parallel_state as ps

        if self.dp_rank != 0:
            return
        tp_group = ps.get_tensor_model_parallel_group()
        offset = stage_layers(self.shape, self.pp, self.pp_rank)[0]
        rank = dist.get_rank()
        control = _control_group()
        for stage in range(self.pp):
            if stage == self.pp_rank:
                for name, param in self.model.module.named_parameters():
                    shards = [param.detach()]
                    if getattr(param, "tensor_model_parallel", False) and self.tp > 1:
                        shards = [torch.empty_like(param) for _ in range(self.tp)]
                        dist.all_gather(shards, param.detach().contiguous(), group=tp_group)
                    if self.tp_rank != 0:
                        continue
                    converted = [(n, t.cpu().clone()) for n, t in megatron_to_hf(name, shards, self.shape, offset)]
                    if rank == 0:
                        yield from converted
                    elif converted:
                        dist.send_object_list([converted], dst=0, group=control)
                if rank != 0 and self.tp_rank == 0:
                    dist.send_object_list([None], dst=0, group=control)
            elif rank == 0:
                src = stage * self.dp * self.tp  # (TP 0, DP 0) of that stage
                while True:
                    box: list[Any] = [None]
                    dist.recv_object_list(box, src=src, group=control)
                    if box[0] is None:
                        break
                    yield from box[0]

    # ----------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, root: str | Path, keep: int | None) -> Path:
        """Megatron's legacy layout: `step_<n>/mp_rank_<tp>_<pp>/model_optim_rng.pt` per model-parallel rank
        of data-parallel replica 0 (the replicas are equal), with the distributed optimizer one
        `optim_dp_<d>.pt` beside it per replica (its shard), and `state.json` and `trainer.pt` (schedule
        position, mini-batch generator) from rank 0."""
        root = Path(root)
        final = root / f"step_{self.state.step}"
        tmp = root / f".step_{self.state.step}.tmp"
        rank = dist.get_rank()
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier(group=_control_group())
        shard = tmp / shard_name(self.tp_rank, self.pp_rank)
        shard.mkdir(exist_ok=True)
        if self.dp_rank == 0:
            torch.save(
                {
                    "model": self.model.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "rng": _rng_state(),
                },
                shard / MODEL_FILE,
            )
        if self.trainer.use_distributed_optimizer:
            torch.save(mmodel.replica_optimizer_state(self.optimizer), shard / replica_optimizer_file(self.dp_rank))
        if rank == 0:
            torch.save(
                {"generator": self.generator.get_state(), "updates": self.updates, "data_parallel_size": self.dp},
                tmp / TRAINER_FILE,
            )
            (tmp / "state.json").write_text(json.dumps(asdict(self.state)))
        dist.barrier(group=_control_group())
        if rank == 0:
            publish(tmp, final, keep)
        dist.barrier(group=_control_group())
        return final

    def load_checkpoint(self, path: str | Path) -> None:
        """Every replica reads the same model-parallel shard (`check_resumable` has vetted the layout)."""
        ckpt = resolve(path)
        shard = ckpt / shard_name(self.tp_rank, self.pp_rank)
        blob = torch.load(shard / MODEL_FILE, weights_only=False, map_location="cpu")
        self.model.module.load_state_dict(blob["model"], strict=True)
        self.optimizer.load_state_dict(blob["optimizer"])
        if self.trainer.use_distributed_optimizer:
            saved = torch.load(shard / replica_optimizer_file(self.dp_rank), weights_only=False, map_location="cpu")
            mmodel.load_replica_optimizer_state(self.optimizer, saved)
        _set_rng_state(blob["rng"])
        trainer = torch.load(ckpt / TRAINER_FILE, weights_only=False)
        self.generator.set_state(trainer["generator"])
        self.updates = int(trainer["updates"])
        self.state = TrainState(**json.loads((ckpt / "state.json").read_text()))
        self.consumed = set(self.state.consumed_ids)


def shard_name(tp_rank: int, pp_rank: int) -> str:
    return f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def replica_optimizer_file(dp_rank: int) -> str:
    return f"optim_dp_{dp_rank:03d}.pt"


def check_resumable(path: str | Path, trainer: MegatronTrainerConfig) -> Path:
    """The resolved checkpoint directory, or a ValueError saying why `trainer` cannot resume from it.

    The plain optimizer's state is the same on every data-parallel replica, so one saved with any
    `data_parallel_size` resumes with any other; the distributed optimizer's is saved as each replica's
    shard, so it resumes only onto as many replicas.
    """
    ckpt = resolve(path)
    tp, pp = trainer.tensor_parallel_size, trainer.pipeline_parallel_size
    expected = {shard_name(t, p) for t in range(tp) for p in range(pp)}
    found = {d.name for d in ckpt.glob("mp_rank_*") if (d / MODEL_FILE).is_file()}
    if found != expected:
        raise ValueError(
            f"{ckpt} holds {len(found)} model-parallel shard(s), not the {len(expected)} of tensor_parallel_size x "
            f"pipeline_parallel_size = {tp} x {pp}: resume with the layout it was written with"
        )
    sharded = (ckpt / shard_name(0, 0) / replica_optimizer_file(0)).is_file()
    if sharded != trainer.use_distributed_optimizer:
        raise ValueError(f"{ckpt} was written with use_distributed_optimizer={sharded}; resume with the same setting")
    if sharded:
        saved_dp = int(torch.load(ckpt / TRAINER_FILE, weights_only=False)["data_parallel_size"])
        if saved_dp != trainer.data_parallel_size:
            raise ValueError(
                f"{ckpt} holds distributed-optimizer state sharded over {saved_dp} data-parallel ranks; resume "
                f"with data_parallel_size={saved_dp} (now {trainer.data_parallel_size})"
            )
    return ckpt


def _rng_state() -> dict[str, Any]:
    from megatron.core import tensor_parallel

    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


_CONTROL: dict[str, Any] = {}


def set_control_group(group: Any) -> None:
    """The gloo group for Python objects (commands, metrics, exported tensors), set once by the worker."""
    _CONTROL["group"] = group


def _control_group() -> Any:
    return _CONTROL.get("group")


def _train_loss(
    loss: MicroLoss, micro: list[int], mb: TokenBatch, logp: torch.Tensor, entropy: torch.Tensor
) -> torch.Tensor:
    return loss(micro, mb, logp, entropy, None)


def _zero_loss(mb: TokenBatch, logp: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    return logp.sum() * 0.0
