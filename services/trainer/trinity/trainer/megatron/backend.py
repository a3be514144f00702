"""`MegatronBackend`: the `TrainerBackend` the Trainer service sees, registered as "megatron".

It lives in the trainer service process and owns no model: the TP x PP x DP worker processes do (see
`launcher.py`, `worker.py`, `engine.py`). Every method is one command to the workers.
"""

from __future__ import annotations

import json
import shutil
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from trinity.config import MegatronTrainerConfig, RunConfig
from trinity.trainer.backend import SteeringUnsupported, backend_section, register_backend
from trinity.trainer.megatron.engine import check_resumable
from trinity.trainer.megatron.hf_mapping import check_parallelism, shape_from_hf_config
from trinity.trainer.megatron.launcher import WorkerGroup
from trinity.trainer.metrics import CHECKPOINT_SECONDS
from trinity.trainer.timeline import CHECKPOINT_KEY
from trinity.v1 import common_pb2


class MegatronBackend:
    """See `TrainerBackend`. `config.trainer` is a `MegatronTrainerConfig` and `config.model.path` a model
    directory; checkpoints go to `checkpoint_dir`. `algorithm_factory` (picklable, e.g. a module-level
    function) replaces the preset named by `config.algorithm`; it runs in every worker."""

    def __init__(
        self,
        config: RunConfig,
        checkpoint_dir: Path | None = None,
        algorithm_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.trainer = backend_section(config, MegatronTrainerConfig, "MegatronBackend", checkpoint_dir)
        self.config = config
        self.checkpoint_dir = checkpoint_dir
        self.model_dir = Path(config.model.path)
        shape = shape_from_hf_config(json.loads((self.model_dir / "config.json").read_text()))
        check_parallelism(shape, self.trainer.tensor_parallel_size, self.trainer.pipeline_parallel_size)
        check_devices(self.trainer, torch.cuda.device_count() if torch.cuda.is_available() else 0)
        self._version = 0
        self._step = 0
        self._workers = WorkerGroup(config, algorithm_factory)
        # Stop the workers when the backend is dropped without close() (they would idle until exit).
        self._finalizer = weakref.finalize(self, self._workers.close)

    @property
    def model_version(self) -> int:
        return self._version

    @property
    def step(self) -> int:
        return self._step

    def train_step(self, experiences: Sequence[common_pb2.Experience]) -> dict[str, float]:
        metrics: dict[str, float] = self._workers.call("train_step", [e.SerializeToString() for e in experiences])
        if "model_version" in metrics:
            self._version = int(metrics["model_version"])
            self._step = int(metrics["step"])
        interval = self.trainer.save_interval
        if interval and "model_version" in metrics and self._step % interval == 0:
            started = time.perf_counter()
            self.save_checkpoint()
            metrics[CHECKPOINT_KEY] = time.perf_counter() - started
        return metrics

    def score(self, experiences: Sequence[common_pb2.Experience]) -> torch.Tensor:
        """Policy log-probs `[rows, max_resp]` of the response tokens (rows as the trainer collates them)."""
        result: torch.Tensor = self._workers.call("score", [e.SerializeToString() for e in experiences])
        return result

    @CHECKPOINT_SECONDS.time()
    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        root = path or self.checkpoint_dir
        if root is None:
            raise ValueError("no checkpoint path given and the backend has no checkpoint directory")
        return Path(self._workers.call("save_checkpoint", str(root), self.trainer.keep_checkpoints))

    def load_checkpoint(self, path: str | Path) -> None:
        ckpt = check_resumable(path, self.trainer)
        self._version = int(self._workers.call("load_checkpoint", str(ckpt)))
        self._step = json.loads((ckpt / "state.json").read_text())["step"]

    def continue_versions_after(self, version: int) -> None:
        self._version = int(self._workers.call("continue_versions_after", version))

    def warm_up(self) -> None:
        """Nothing: the TP x PP x DP workers pay their first step's costs in it."""

    # Megatron's optimizer param groups and scheduler live in the TP x PP x DP workers, with their own
    # learning-rate bookkeeping; steering them is not wired (docs/console.md, "Steering").
    _NO_LR_STEERING = (
        "trainer.backend megatron: the learning rate of a live run cannot be changed (its optimizer runs in the "
        "Megatron workers); restart from a checkpoint with trainer.optimizer.lr set, or use trainer.backend torch"
    )

    @property
    def learning_rate(self) -> float:
        raise SteeringUnsupported(self._NO_LR_STEERING)

    def set_learning_rate(self, lr: float) -> None:
        raise SteeringUnsupported(self._NO_LR_STEERING)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named tensors, TP shards gathered and PP stages joined, streamed one at a time."""
        return self._workers.stream("named_weights")

    def save_hf(self, out_dir: str | Path) -> Path:
        """The policy as a Hugging Face directory (config and tokenizer files copied from the input)."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        config = AutoConfig.from_pretrained(self.model_dir)
        state = dict(self.named_weights())
        model = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise RuntimeError(f"exported weights do not match the model: {missing=} {unexpected=}")
        model.save_pretrained(out, safe_serialization=True)
        AutoTokenizer.from_pretrained(self.model_dir).save_pretrained(out)
        for extra in ("generation_config.json",):
            if (self.model_dir / extra).is_file() and not (out / extra).exists():
                shutil.copy(self.model_dir / extra, out / extra)
        return out

    def close(self) -> None:
        """Stop the worker processes (also done at interpreter exit: they are daemons)."""
        self._finalizer()

    def __enter__(self) -> MegatronBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_devices(trainer: MegatronTrainerConfig, gpus: int) -> None:
    """Raise with the fix when this host cannot run the workers (`gpus` visible CUDA devices), before any starts."""
    layout = (
        f"tensor_parallel_size={trainer.tensor_parallel_size} x pipeline_parallel_size="
        f"{trainer.pipeline_parallel_size} x data_parallel_size={trainer.data_parallel_size}"
    )
    if trainer.distributed_backend == "nccl" and gpus == 0:
        raise ValueError("trainer.distributed_backend='nccl' needs a GPU per worker and none is visible; use 'gloo'")
    if gpus and trainer.distributed_backend != "gloo" and trainer.world_size > gpus:
        # NCCL cannot put two ranks of one group on one device.
        raise ValueError(f"{layout} = {trainer.world_size} workers, one GPU each, but {gpus} GPU(s) are visible")


@register_backend("megatron")
def _build(config: RunConfig, checkpoint_dir: Path | None) -> MegatronBackend:
    return MegatronBackend(config, checkpoint_dir)


__all__ = ["MegatronBackend"]
