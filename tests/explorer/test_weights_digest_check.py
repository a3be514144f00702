"""The explorer holds the weights it loads against the trainer's digest of what it published: `digest_match` in its
`weights` event, a warning event when they differ, or with `monitor.consistency.action: stop` its failure."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from trinity.config import MonitorConfig, RunConfig
from trinity.config.consistency import ConsistencyConfig
from trinity.explorer.context import ExplorerContext, WeightsDigestMismatch
from trinity.explorer.weight_feed import Staged
from trinity.models.digest import weights_digest
from trinity.runtime.spans import SpanLog
from trinity.sync import SyncGroupSpec, open_receiver, open_sender
from trinity.v1 import gateway_pb2


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"model.embed_tokens.weight": torch.randn(16, 8, generator=g), "model.norm.weight": torch.ones(8)}


def _published(tmp_path: Path) -> Staged:
    """Version 1 published through the checkpoint backend and received as an explorer's weight feed stages it."""
    spec = SyncGroupSpec.for_members("digest", 0, ["explorer-0"], backend="checkpoint", checkpoint_dir=str(tmp_path))
    sender, receiver = open_sender(spec), open_receiver(spec, 1)
    sender.init()
    report = sender.publish(1, _weights().items())
    version, named = receiver.receive(idle_timeout_s=5)
    assert report.digest == receiver.published_digest == weights_digest(_weights().items())
    return Staged(version, list(named), receiver.published_digest)


class _Engine:
    model_version = 0

    def load_weights(self, version: int, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.model_version = version


class _Feed:
    def __init__(self, staged: Staged) -> None:
        self.staged: Staged | None = staged

    def take(self) -> Staged | None:
        staged, self.staged = self.staged, None
        return staged


class _Events:
    """A reporter that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str, dict[str, float]]] = []
        self.spans = SpanLog()

    def report(self, kind: int, *, message: str = "", metrics: dict | None = None, **_: Any) -> bool:
        self.events.append((kind, message, dict(metrics or {})))
        return True


def _context(staged: Staged, action: str = "warn") -> tuple[ExplorerContext, _Events]:
    config = RunConfig.model_validate(
        {"mode": "explore", "model": {"path": "unused"}, "buffer": {"taskset": {"name": "t", "path": "unused"}}}
    )
    config = config.model_copy(update={"monitor": MonitorConfig(consistency=ConsistencyConfig(action=action))})
    events = _Events()
    ctx = ExplorerContext(
        run_id="run",
        stage=0,
        config=config,
        instance_id="explorer-0",
        engine=_Engine(),  # type: ignore[arg-type]
        buffer=None,  # type: ignore[arg-type]
        gateway=None,  # type: ignore[arg-type]
        reporter=events,  # type: ignore[arg-type]
        stop=threading.Event(),
    )
    ctx.feed = _Feed(staged)  # type: ignore[assignment]
    return ctx, events


def test_weights_loaded_as_published_report_a_digest_match(tmp_path: Path) -> None:
    ctx, events = _context(_published(tmp_path))
    ctx.apply_staged_weights()
    [(kind, message, metrics)] = events.events
    assert (kind, message) == (gateway_pb2.EVENT_KIND_WEIGHTS, "serving version 1")
    assert metrics["digest_match"] == 1.0 and metrics["weights_digest"] == metrics["published_digest"]


def _perturbed(staged: Staged) -> Staged:
    """What a fault between the verified transfer and the engine would leave: one received value changed."""
    name, tensor = staged.tensors[0]
    tensor = tensor.clone()
    tensor.view(-1)[0] += 1.0
    return Staged(staged.version, [(name, tensor), *staged.tensors[1:]], staged.published_digest)


def test_weights_that_differ_from_the_published_ones_raise_a_warning_event(tmp_path: Path) -> None:
    ctx, events = _context(_perturbed(_published(tmp_path)))
    ctx.apply_staged_weights()
    [(weights, _, metrics), (warning, line, _)] = events.events
    assert (weights, warning) == (gateway_pb2.EVENT_KIND_WEIGHTS, gateway_pb2.EVENT_KIND_WARNING)
    assert metrics["digest_match"] == 0.0
    assert line.startswith("weights version 1: digest_match 0, the weights loaded (digest 0x")


def test_weights_that_differ_with_action_stop_fail_the_explorer_with_one_line(tmp_path: Path) -> None:
    ctx, events = _context(_perturbed(_published(tmp_path)), action="stop")
    with pytest.raises(WeightsDigestMismatch, match=r"monitor\.consistency\.action: stop\)$"):
        ctx.apply_staged_weights()
    assert [kind for kind, _, _ in events.events] == [gateway_pb2.EVENT_KIND_WEIGHTS]


def test_an_update_sent_without_publish_carries_no_digest_to_compare(tmp_path: Path) -> None:
    spec = SyncGroupSpec.for_members("plain", 0, ["explorer-0"], backend="checkpoint", checkpoint_dir=str(tmp_path))
    sender, receiver = open_sender(spec), open_receiver(spec, 1)
    sender.init()
    sender.start(1)
    sender.update(list(_weights().items()))
    assert sender.finish(1).digest is None
    receiver.receive(idle_timeout_s=5)
    assert receiver.published_digest is None
    ctx, events = _context(Staged(1, list(_weights().items()), None))
    ctx.apply_staged_weights()
    assert "digest_match" not in events.events[0][2]
