"""`trinity run`'s progress line names the phase the run is in while no step has come yet, from the phases the
services announce (EVENT_KIND_SPAN), and the run's timeline is written beside the summary."""

from __future__ import annotations

import json
from pathlib import Path

from trinity.cli.monitor import RunMonitor, progress_description
from trinity.runtime.spans import running
from trinity.v1 import gateway_pb2


def _phase(source: str, phase: gateway_pb2.Phase, *, end: int = 0, **fields) -> gateway_pb2.RunEvent:
    span = gateway_pb2.Span(source=source, phase=phase, start_unix_ms=1_000, end_unix_ms=end, **fields)
    return gateway_pb2.RunEvent(kind=gateway_pb2.EVENT_KIND_SPAN, source=source, spans=[span])


def test_the_progress_line_names_each_phase_a_service_is_in():
    events = [
        _phase("explorer/e-0", gateway_pb2.PHASE_MODEL_CONVERT),
        _phase("explorer/e-0", gateway_pb2.PHASE_MODEL_CONVERT, end=2_000),
        _phase("explorer/e-0", gateway_pb2.PHASE_ENGINE_START, detail="vLLM"),
        _phase("trainer/t", gateway_pb2.PHASE_MODEL_LOAD),
    ]
    phases: dict = {}
    for event in events:
        phases = running(event.spans, phases)
    assert progress_description(phases) == "train (starting vLLM; loading the model)"


def test_an_evaluation_is_named_with_its_version_and_samples():
    phases = running(_phase("explorer/e-0", gateway_pb2.PHASE_EVALUATE, model_version=0, detail="160 samples").spans)
    assert progress_description(phases) == "train (evaluating v0: 160 samples)"


def test_two_explorers_in_the_same_phase_are_named_once():
    phases = running(
        [
            *_phase("explorer/a", gateway_pb2.PHASE_MODEL_CONVERT).spans,
            *_phase("explorer/b", gateway_pb2.PHASE_MODEL_CONVERT).spans,
        ]
    )
    assert progress_description(phases) == "train (converting the model)"


def test_once_every_phase_ended_the_line_is_plain_again(tmp_path: Path):
    monitor = RunMonitor(tmp_path, total_steps=16, show_progress=True)
    monitor.on_event(_phase("explorer/e-0", gateway_pb2.PHASE_ENGINE_START, detail="vLLM"))
    assert monitor._bar is not None and monitor._bar.desc == "train (starting vLLM)"
    monitor.on_event(_phase("explorer/e-0", gateway_pb2.PHASE_ENGINE_START, end=3_000, detail="vLLM"))
    assert monitor._bar.desc == "train"
    monitor.close(None, {}, spans=[gateway_pb2.Span(phase=gateway_pb2.PHASE_LEASE, source="explorer/e-0", step=1)])
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    assert [(s["phase"], s["step"]) for s in timeline["spans"]] == [("lease", 1)]
