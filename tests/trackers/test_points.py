"""What the trackers plot: every kind's metrics on the train-step axis, under `<kind>/<metric>`; the config as dotted
parameters."""

from __future__ import annotations

import pytest

from trinity.trackers.points import flat_params, points, seq_order
from trinity.v1 import gateway_pb2


def _event(kind: gateway_pb2.EventKind, **fields: object) -> gateway_pb2.RunEvent:
    return gateway_pb2.RunEvent(kind=kind, step=5, model_version=3, metrics={"m": 1.5}, unix_ms=7, **fields)


@pytest.mark.parametrize(
    ("kind", "namespace", "x"),
    [
        (gateway_pb2.EVENT_KIND_TRAIN, "train", 5),  # its step
        (gateway_pb2.EVENT_KIND_EXPLORE, "explore", 5),  # its step: the train step it feeds
        (gateway_pb2.EVENT_KIND_EVAL, "eval", 3),  # the version evaluated: the weights after train step 3
        (gateway_pb2.EVENT_KIND_STEER, "steer", 5),  # the train step the gateway recorded the change at
    ],
)
def test_each_kind_is_plotted_at_the_train_step_it_belongs_to(kind, namespace, x):
    point = points(_event(kind))
    assert point is not None
    assert (point.namespace, point.step, point.values, point.unix_ms) == (namespace, x, {f"{namespace}/m": 1.5}, 7)


@pytest.mark.parametrize(
    "kind", [gateway_pb2.EVENT_KIND_STATE, gateway_pb2.EVENT_KIND_LOG, gateway_pb2.EVENT_KIND_WEIGHTS]
)
def test_events_that_are_no_series_give_no_points(kind):
    assert points(_event(kind)) is None


def test_a_series_event_without_metrics_gives_no_points():
    assert points(gateway_pb2.RunEvent(kind=gateway_pb2.EVENT_KIND_TRAIN, step=1)) is None


def test_the_config_becomes_dotted_parameters_with_json_values():
    config = {"name": "r", "model": {"path": "m", "dtype": None}, "buffer": {"taskset": {"epochs": 2}}, "stages": []}
    assert flat_params(config) == {
        "name": "r",
        "model.path": "m",
        "model.dtype": "null",
        "buffer.taskset.epochs": "2",
        "stages": "[]",
    }


def test_event_seqs_order_as_the_log_does():
    assert sorted(["10-1", "9-5", "", "10-0"], key=seq_order) == ["", "9-5", "10-0", "10-1"]
