"""`receive_streamed` over a real group (gloo, and cuda_ipc through host shared memory): each chunk is handed over
once verified and freed before the next arrives; a chunk that fails its checksums stops the hand-over, the version
is refused and the group goes on; a consumer that stops part-way is reported as an error, and the group goes on.

The sender is in the test process, receivers are spawned children (tests/sync/workers.py, `stream_version`).
"""

from __future__ import annotations

import uuid

import pytest

from tests.sync.conftest import Receivers
from tests.sync.test_collective import _assert_exact, _weights
from tests.sync.workers import results_by_rank, unpack
from trinity.sync import SyncGroupSpec, SyncSender, open_sender, reserve_rendezvous

BACKENDS = ["gloo", "cuda_ipc"]


def _group(backend: str, receivers: Receivers, plans: dict[int, list[str]]) -> SyncSender:
    # ~1 KB buckets: every tensor of `_weights` is a chunk of its own (six chunks), the larger ones several buckets.
    spec = SyncGroupSpec.for_members(
        f"t{uuid.uuid4().hex[:8]}",
        0,
        ["explorer-0", "explorer-1"],
        backend=backend,
        timeout_s=3.0,
        join_timeout_s=120.0,
        bucket_mb=1000 / 2**20,
    )
    rendezvous = reserve_rendezvous(spec)
    receivers.spawn(rendezvous.spec, plans)
    options = {"device": "cpu"} if backend == "cuda_ipc" else {}
    sender = open_sender(rendezvous.spec, rendezvous=rendezvous, **options)
    sender.init()
    return sender


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_streamed_receive_hands_each_chunk_over_verified_and_holds_one_chunk(
    receivers: Receivers, backend: str
) -> None:
    sender = _group(backend, receivers, {1: ["stream", "stream"], 2: ["ok", "stream"]})
    reports = [sender.publish(1, _weights(1).items()), sender.publish(2, _weights(2).items())]
    sender.close()

    assert all(report.accepted_by_all for report in reports)
    results = results_by_rank(receivers.results, 4)
    for rank, steps in results.items():
        for item, version in zip(steps, (1, 2), strict=True):
            assert (item[2], item[3]) == ("ok", version), (rank, item)
            _assert_exact(unpack(item[4]), {n: item[5][n] for n in _weights(version)}, _weights(version))
    # A staged receive holds all six chunks until the version is whole; the streamed one frees each before the next.
    assert [item[5]["most_chunks_alive"] for item in results[1]] == [1, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_streamed_receive_stops_at_a_bad_chunk_refuses_the_version_and_the_group_goes_on(
    receivers: Receivers, backend: str
) -> None:
    sender = _group(backend, receivers, {1: ["stream_corrupt", "stream"], 2: ["stream_abandon", "stream"]})
    first = sender.publish(1, _weights(1).items())
    second = sender.publish(2, _weights(2).items())
    sender.close()

    assert first.refused == {1: "checksum_mismatch", 2: "error"}
    assert second.accepted_by_all
    results = results_by_rank(receivers.results, 4)
    corrupt, abandoned = results[1][0], results[2][0]
    assert corrupt[2] == "checksum_mismatch"
    assert "version 1: checksum mismatch in chunk 1 bucket 0" in corrupt[5]["error"]
    assert corrupt[5]["handed"] == list(_weights(1))[:1]  # chunk 0 was verified and handed over, chunk 1 was not
    assert abandoned[2] == "abandoned"
    assert "the engine stopped loading it part-way" in abandoned[5]["error"]
    assert abandoned[5]["handed"] == list(_weights(1))[:1]
    for rank in (1, 2):
        item = results[rank][1]
        assert (item[2], item[3]) == ("ok", 2)
        _assert_exact(unpack(item[4]), {n: item[5][n] for n in _weights(2)}, _weights(2))
