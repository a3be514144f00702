"""SampleExperiences: a read-only, bounded look at a stream's newest entries (the console's experience browser)."""

from __future__ import annotations

import grpc
import pytest

from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.v1 import common_pb2


def _experience(i: int) -> common_pb2.Experience:
    return common_pb2.Experience(id=f"e{i}", reward=float(i), model_version=i % 2, response_token_ids=[1],
                                 logprobs=[0.0])  # fmt: skip


def test_sampling_neither_delivers_nor_hides_entries_from_the_trainer(buffer_service, unique):
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=unique))
        buffer.put(unique, [_experience(i) for i in range(4)])
        sampled = buffer.sample(unique, 3, min_reward=1.0)
        assert [i.experience.id for i in sampled.items] == ["e3", "e2", "e1"]
        assert [i.experience.id for i in buffer.sample(unique, model_version=0).items] == ["e2", "e0"]
        stats = buffer.stream(unique).stats
        assert (stats.delivered, stats.pending) == (0, 0)
        assert sorted(e.id for e in buffer.read(unique, "trainer", 8).experiences) == ["e0", "e1", "e2", "e3"]


@pytest.mark.parametrize(("field", "kwargs"), [("limit", {"limit": 501}), ("min_reward", {"min_reward": float("nan")})])
def test_a_bad_filter_is_invalid_argument_naming_it(buffer_service, unique, field, kwargs):
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=unique))
        with pytest.raises(grpc.RpcError) as err:
            buffer.sample(unique, **kwargs)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(field)
