"""The trackers a run config names (`monitor.tensorboard`, `monitor.mlflow`, `monitor.wandb`), one object per run and
tracker, each behind the same five calls:

    open(run) -> Resume    where it left off: the last event seq written, and whether the run was finished there
    write(points)          metrics at their train step (trinity.trackers.points)
    commit(seq)            everything up to event `seq` is written: flushed, and the place remembered
    finish(summary)        the run ended: its summary and final model path kept, the tracker's run closed
    close()                the sink stops mid-run: flushed and let go, to be opened again later

A tracker keeps its own place, where its data is: MLflow in its run's tags (so a sink without a volume, writing to
a tracking server, resumes from the server); TensorBoard and W&B in a cursor file beside their files. The place is
saved after the points before it are flushed, so a restarted sink neither writes a point twice nor skips one (W&B
hands points to its own writer process: one killed with SIGKILL may lose its last points, never repeat them).

The libraries are imported when a run first needs them: the sink starts in a second, whatever is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from trinity.trackers.points import NAMESPACES, Points, flat_params

CURSOR_FILE = "trinity-cursor.json"
RUN_ID_TAG, SEQ_TAG, DONE_TAG = "trinity.run_id", "trinity.seq", "trinity.done"


@dataclass(frozen=True)
class RunRecord:
    """What a tracker opens a run with: the gateway's run id and name, `monitor.project`, the run config."""

    run_id: str
    name: str
    project: str
    config: dict[str, Any]


@dataclass(frozen=True)
class Resume:
    seq: str = ""  # the last event written ("": none yet)
    done: bool = False  # the run was finished in this tracker: nothing left to write


class FileCursor:
    """A tracker's place in a file beside its output, replaced whole (write, then rename) so it is never torn."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Resume:
        try:
            saved = json.loads(self.path.read_text())
        except FileNotFoundError:
            return Resume()
        return Resume(str(saved.get("seq", "")), bool(saved.get("done", False)))

    def save(self, seq: str, done: bool = False) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps({"seq": seq, "done": done}))
        os.replace(partial, self.path)


class Tracker(ABC):
    name: ClassVar[str]

    def __init__(self, root: Path) -> None:
        self.root = root  # the sink's directory (TRINITY_TRACKERS_DIR): <root>/tensorboard, <root>/mlruns, ...
        self.seq = ""

    @abstractmethod
    def open(self, run: RunRecord) -> Resume: ...

    @abstractmethod
    def write(self, points: Sequence[Points]) -> None: ...

    @abstractmethod
    def commit(self, seq: str) -> None: ...

    @abstractmethod
    def finish(self, summary: dict[str, Any]) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class TensorBoard(Tracker):
    """Event files under <root>/tensorboard/<run id>/ (`tensorboard --logdir <root>/tensorboard` shows every run),
    written with TensorBoard's own writer: no torch, no TensorFlow. The config and the summary are text summaries."""

    name = "tensorboard"

    def open(self, run: RunRecord) -> Resume:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        directory = self.root / "tensorboard" / run.run_id
        self.cursor = FileCursor(directory / CURSOR_FILE)
        resume = self.cursor.load()
        if resume.done:
            return resume
        self.writer = EventFileWriter(str(directory))
        self.seq = resume.seq
        if not resume.seq:
            self._text("config", "```\n" + json.dumps(run.config, indent=2) + "\n```", step=0)
        return resume

    def _event(self, step: int, summary: Any, unix_ms: int = 0) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        wall_time = unix_ms / 1000 if unix_ms else time.time()
        self.writer.add_event(Event(wall_time=wall_time, step=step, summary=summary))

    def _text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb

        self._event(step, text_pb(tag, text))

    def write(self, points: Sequence[Points]) -> None:
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        for point in points:
            for key, value in point.values.items():
                self._event(point.step, scalar_pb(key, value), point.unix_ms)

    def commit(self, seq: str) -> None:
        self.writer.flush()
        self.cursor.save(seq)
        self.seq = seq

    def finish(self, summary: dict[str, Any]) -> None:
        self._text("summary", "```\n" + json.dumps(summary, indent=2) + "\n```", step=int(summary["train_step"]))
        self.writer.close()
        self.cursor.save(self.seq, done=True)

    def close(self) -> None:
        self.writer.close()


class MLflow(Tracker):
    """One MLflow run per Trinity run, in the experiment `monitor.project`, on MLFLOW_TRACKING_URI or else the file
    store <root>/mlruns. Metrics are named by `mlflow_key`; the config is its parameters (dotted keys), the summary
    its artifact `summary.json`; tags carry the Trinity run id, the place (`trinity.seq`), final model path, state."""

    name = "mlflow"

    def open(self, run: RunRecord) -> Resume:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # mlflow-skinny has no database backend; its file store refuses to open unless this says it may.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (self.root / "mlruns").as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(run.project)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = self.client.create_experiment(run.project)
            except MlflowException:  # another run's follower made it meanwhile (or it is deleted: raise)
                made = self.client.get_experiment_by_name(run.project)
                if made is None:
                    raise
                experiment_id = made.experiment_id
        found = self.client.search_runs([experiment_id], f"tags.`{RUN_ID_TAG}` = '{run.run_id}'", max_results=1)
        self.pending: list[Any] = []
        if found:
            self.run_id = found[0].info.run_id
            tags = found[0].data.tags
            self.seq = tags.get(SEQ_TAG, "")
            return Resume(self.seq, tags.get(DONE_TAG) == "true")
        tags = {RUN_ID_TAG: run.run_id, "trinity.run_name": run.name}
        self.run_id = self.client.create_run(experiment_id, run_name=run.run_id, tags=tags).info.run_id
        params = [Param(key[-250:], value[:MAX_PARAM_VAL_LENGTH]) for key, value in flat_params(run.config).items()]
        for chunk in _chunks(params, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=chunk)
        return Resume()

    def write(self, points: Sequence[Points]) -> None:
        from mlflow.entities import Metric

        for point in points:
            for key, value in point.values.items():
                self.pending.append(Metric(mlflow_key(key), value, point.unix_ms, point.step))

    def commit(self, seq: str) -> None:
        from mlflow.entities import RunTag
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        chunks = _chunks(self.pending, MAX_METRICS_PER_BATCH) or [[]]
        for i, chunk in enumerate(chunks):  # the place rides on the last chunk: it moves once all are in
            tags = [RunTag(SEQ_TAG, seq)] if i == len(chunks) - 1 else []
            self.client.log_batch(self.run_id, metrics=chunk, tags=tags)
        self.pending.clear()
        self.seq = seq

    def finish(self, summary: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_text(self.run_id, json.dumps(summary, indent=2), "summary.json")
        tags = {"trinity.state": summary["state"], "trinity.final_model_path": summary["final_model_path"]}
        tags[DONE_TAG] = "true"
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        status = {"RUN_STATE_SUCCEEDED": "FINISHED", "RUN_STATE_CANCELLED": "KILLED"}.get(summary["state"], "FAILED")
        self.client.set_terminated(self.run_id, status)

    def close(self) -> None:
        pass  # nothing held: every commit went to the store


def _chunks(items: Sequence[Any], size: int) -> list[list[Any]]:
    """`items` in lists of at most `size` (MLflow's limits per log_batch call)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def mlflow_key(key: str) -> str:
    """The MLflow name of metric `<kind>/<metric>`: `/` inside the metric becomes `.` (`eval/accuracy.heldout`),
    since the file store keeps each metric in a file named by its path, and `eval/accuracy` beside
    `eval/accuracy/heldout` would be a file and a folder at once; characters MLflow refuses become `_`."""
    namespace, _, name = key.partition("/")
    return namespace + "/" + re.sub(r"[^\w\-.: ]", "_", name.replace("/", "."))


class Wandb(Tracker):
    """One W&B run per Trinity run (its id, in project `monitor.project`), under <root>/wandb: offline unless
    WANDB_MODE says otherwise or WANDB_API_KEY is set (then online; `wandb sync <root>/wandb` uploads offline runs).

    W&B's own `step` must only grow across all of a run's keys, and explore steps run ahead of train steps: a point
    logged at an older `step=` is dropped. So each kind gets its x-axis as W&B documents for this case
    (`define_metric("train/*", step_metric="train/step")`): every row carries `<kind>/step`, the train step
    (trinity.trackers.points), and W&B's `_step` only counts rows. The config is the run's config; the summary
    goes to the run's summary (`trinity/...` keys) and its files (`summary.json`)."""

    name = "wandb"

    def open(self, run: RunRecord) -> Resume:
        self.cursor = FileCursor(self.root / "wandb" / "trinity-cursors" / f"{run.run_id}.json")
        resume = self.cursor.load()
        if resume.done:
            return resume
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        settings = wandb.Settings(
            console="off",
            silent=True,
            save_code=False,
            disable_git=True,
            x_disable_stats=True,  # the sink's own CPU and memory are nobody's business
            x_disable_meta=True,
            x_save_requirements=False,
        )
        (self.root / "wandb").mkdir(parents=True, exist_ok=True)
        self._wait_for_a_fresh_folder(_wandb_id(run.run_id))
        self.run = wandb.init(
            dir=self.root,
            project=run.project,
            id=_wandb_id(run.run_id),
            name=run.run_id,
            config=run.config,
            mode=mode,  # type: ignore[arg-type]  # checked by wandb
            resume="allow",
            reinit="create_new",  # one W&B run per Trinity run, several at a time in this process
            settings=settings,
        )
        for namespace in NAMESPACES:
            self.run.define_metric(f"{namespace}/step")
            self.run.define_metric(f"{namespace}/*", step_metric=f"{namespace}/step")
        self.seq = resume.seq
        return resume

    def _wait_for_a_fresh_folder(self, wandb_id: str) -> None:
        """W&B names a run's folder by the second it starts (`offline-run-20260101_120000-<id>`, local time): the
        same run opened again within that second (a sink restarted at once) would write into the folder before."""
        while any((self.root / "wandb").glob(f"*run-{datetime.now().strftime('%Y%m%d_%H%M%S')}-{wandb_id}")):
            time.sleep(0.05)

    def write(self, points: Sequence[Points]) -> None:
        for point in points:
            self.run.log({**point.values, f"{point.namespace}/step": point.step})

    def commit(self, seq: str) -> None:
        self.cursor.save(seq)
        self.seq = seq

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({f"trinity/{k}": v for k, v in summary.items() if k != "latest_metrics"})
        path = Path(self.run.dir) / "summary.json"
        path.write_text(json.dumps(summary, indent=2))
        self.run.save(str(path), base_path=self.run.dir, policy="now")
        self.run.finish(exit_code=0 if summary["state"] == "RUN_STATE_SUCCEEDED" else 1)
        self.cursor.save(self.seq, done=True)

    def close(self) -> None:
        self.run.finish()


def _wandb_id(run_id: str) -> str:
    """W&B run ids are at most 64 characters; a longer Trinity run id keeps its start and a hash of the whole."""
    if len(run_id) <= 64:
        return run_id
    return f"{run_id[:55]}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"


TRACKERS: dict[str, type[Tracker]] = {t.name: t for t in (TensorBoard, MLflow, Wandb)}
