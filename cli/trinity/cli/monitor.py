"""What `trinity run` shows and keeps: a progress bar, `summary.json` and a reward-curve PNG, all from the run's event
stream. TensorBoard, MLflow and W&B are written by the trackers service the launcher starts beside the others
(trinity.trackers), as they are for a run submitted to a deployed gateway."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trinity.config.preset_operators import applied_by_preset
from trinity.config.run import RunConfig
from trinity.runtime.events import kind_name
from trinity.runtime.spans import describe, running, span_json
from trinity.sdk.metrics import RunMetrics
from trinity.v1 import gateway_pb2

# Events whose message is printed above the progress bar.
LINE_KINDS = (gateway_pb2.EVENT_KIND_ERROR, gateway_pb2.EVENT_KIND_STATE, gateway_pb2.EVENT_KIND_WARNING)


def progress_description(phases: dict[str, gateway_pb2.Span]) -> str:
    """The progress bar's label: `train`, and what the services are doing while one is in a long phase (start-up,
    an evaluation): "train (starting vLLM; loading the model)"."""
    doing = list(dict.fromkeys(describe(span) for _, span in sorted(phases.items())))
    return f"train ({'; '.join(doing)})" if doing else "train"


def preset_additions(stages: Sequence[RunConfig]) -> list[dict[str, Any]]:
    """Per stage, the data operators its algorithm preset added to the experience stream (none: left out)."""
    return [
        {
            "stage": index,
            "algorithm": stage.algorithm.algorithm_type,
            "data_operators": [op.model_dump(mode="json", exclude_defaults=True) for op in added],
        }
        for index, stage in enumerate(stages)
        if (added := applied_by_preset(stage))
    ]


class RunMonitor:
    def __init__(
        self,
        output: Path,
        total_steps: int,
        *,
        show_progress: bool = True,
        applied_by_preset: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.output = output
        self.applied_by_preset = list(applied_by_preset)
        self.metrics = RunMetrics()
        self.started = time.time()
        self.total_steps = total_steps
        output.mkdir(parents=True, exist_ok=True)
        self._bar = None
        if show_progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, unit="step", desc="train", dynamic_ncols=True)
        self._last_eval = ""
        self._phases: dict[str, gateway_pb2.Span] = {}  # by source: the long phase it is in (EVENT_KIND_SPAN)
        for stage in self.applied_by_preset:
            names = ", ".join(op["name"] for op in stage["data_operators"])
            self.note(f"stage {stage['stage']}: {stage['algorithm']} applies data operators {names}")

    def on_event(self, event: gateway_pb2.RunEvent) -> None:
        self.metrics.add(event)
        if self._bar is None:
            return
        if event.kind == gateway_pb2.EVENT_KIND_SPAN:
            self._phases = running(event.spans, self._phases)
            self._bar.set_description_str(progress_description(self._phases))
        elif event.kind == gateway_pb2.EVENT_KIND_TRAIN:
            self._bar.n = min(event.step, self.total_steps)
            reward = self.metrics.explore[-1].get("reward_mean") if self.metrics.explore else None
            postfix = {"loss": f"{event.metrics.get('loss/total', float('nan')):.4f}", "v": event.model_version}
            if reward is not None:
                postfix["reward"] = f"{reward:.3f}"
            if self._last_eval:
                postfix["eval_acc"] = self._last_eval
            self._bar.set_postfix(postfix)
            self._bar.refresh()
        elif event.kind == gateway_pb2.EVENT_KIND_EVAL:
            self._last_eval = f"{event.metrics.get('accuracy', 0.0):.3f}"
            self._bar.write(
                f"eval @ v{event.model_version}: accuracy {event.metrics.get('accuracy', 0.0):.3f}, "
                f"mean reward {event.metrics.get('mean_reward', 0.0):.3f}"
            )
        elif event.kind in LINE_KINDS and event.message:
            self._bar.write(f"[{kind_name(event.kind)}] {event.message}")

    def note(self, line: str) -> None:
        """A line for the user on stderr, printed above the progress bar (safe from any thread)."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(
        self,
        run: gateway_pb2.Run | None,
        experience_counts: dict[str, Any],
        *,
        run_id: str = "",
        error: str = "",
        spans: Sequence[gateway_pb2.Span] = (),
    ) -> dict[str, Any]:
        """Write summary.json, the reward curve and timeline.json (`spans`: the run's timeline, as the console
        draws it). Without the final `run` record (the gateway was lost), the summary holds what the events said:
        the last state seen, and `error`."""
        if self._bar is not None:
            self._bar.close()
        if run is not None:
            state = gateway_pb2.RunState.Name(run.state)
        else:
            state = self.metrics.states[-1]["state"] if self.metrics.states else "RUN_STATE_UNSPECIFIED"
        summary = {
            "run_id": run.id if run is not None else run_id,
            "name": run.name if run is not None else "",
            "state": state,
            "error": "; ".join(e for e in (run.error if run is not None else "", error) if e),
            "wall_seconds": time.time() - self.started,
            "final_model_path": run.final_model_path if run is not None else "",
            "train": self.metrics.train,
            "explore": self.metrics.explore,
            "eval": [
                {
                    "model_version": row["model_version"],
                    "step": row["step"],
                    "accuracy": row.get("accuracy"),
                    "mean_reward": row.get("mean_reward"),
                    **{k: v for k, v in row.items() if k not in ("model_version", "step")},
                }
                for row in self.metrics.eval
            ],
            "weight_versions": self.metrics.weights,
            "states": self.metrics.states,
            "warnings": self.metrics.warnings,
            "experience_counts": experience_counts,
            "applied_by_preset": self.applied_by_preset,
        }
        (self.output / "summary.json").write_text(json.dumps(summary, indent=2))
        (self.output / "timeline.json").write_text(json.dumps({"spans": [span_json(s) for s in spans]}, indent=1))
        plot_curves(self.metrics, self.output / "reward_curve.png")
        return summary


def plot_curves(metrics: RunMetrics, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    explore = metrics.series(gateway_pb2.EVENT_KIND_EXPLORE, "reward_mean")
    if explore:
        ax.plot([s for s, _ in explore], [v for _, v in explore], label="rollout reward (mean)", alpha=0.6)
    evals = metrics.series(gateway_pb2.EVENT_KIND_EVAL, "accuracy")
    if evals:
        ax.plot([s for s, _ in evals], [v for _, v in evals], marker="o", label="held-out accuracy (by version)")
    ax.set_xlabel("step / weight version")
    ax.set_ylabel("reward / accuracy")
    ax.grid(alpha=0.3)
    if explore or evals:  # a run lost before its first step has nothing to label
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
