"""The cuda_ipc protocol on CPU: host shared memory stands in for GPU memory; everything but the CUDA calls runs.

The sender is in the test process, receivers are spawned children (tests/sync/workers.py) joining through the
trainer's rendezvous store, as explorers sharing the trainer's GPU would.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import uuid
from collections.abc import Iterator
from multiprocessing.queues import Queue

import pytest
import torch

from tests.sync.conftest import Receivers
from tests.sync.test_collective import _assert_exact, _weights
from tests.sync.workers import results_by_rank, unpack
from trinity.sync import NoUpdateYet, SyncError, SyncGroupSpec, reserve_rendezvous
from trinity.sync.cuda_ipc import SHM, SHM_PREFIX, IpcReceiver, IpcSender, check, decode_cuda_handle, encode_cuda_handle


def _spec(explorers: int, **fields: object) -> SyncGroupSpec:
    names = [f"explorer-{i}" for i in range(explorers)]
    defaults: dict[str, object] = {
        "backend": "cuda_ipc",
        "timeout_s": 3.0,
        "join_timeout_s": 120.0,
        "bucket_mb": 1000 / 2**20,
    }
    defaults.update(fields)
    return SyncGroupSpec.for_members(f"t{uuid.uuid4().hex[:8]}", 0, names, **defaults)


def _shared_files() -> set[str]:
    return {p.name for p in SHM.glob(f"{SHM_PREFIX}*")}


def test_two_receivers_copy_exact_tensors_out_of_the_shared_buffers(receivers: Receivers) -> None:
    before = _shared_files()
    rendezvous = reserve_rendezvous(_spec(2))  # ~1 KB buckets: many chunks through the two alternating buffers
    receivers.spawn(rendezvous.spec, {1: ["ok", "ok"], 2: ["ok", "ok"]})
    sender = IpcSender(rendezvous.spec, rendezvous=rendezvous, device="cpu")
    sender.init()
    sent = {3: _weights(3), 7: _weights(7)}
    reports = [sender.publish(version, weights.items()) for version, weights in sent.items()]
    assert len(_shared_files() - before) == 2  # two buffers, allocated once, reused across chunks and versions
    prefix = rendezvous.spec.store_prefix
    store = rendezvous.store
    assert store is not None
    # A version's keys are deleted once every status is in; the join keys stay.
    assert store.check([f"{prefix}/ipc/sender", f"{prefix}/ipc/joined/2"])
    assert not any(store.check([f"{prefix}/{key}"]) for key in ("update/2", "u2/msg/0", "u2/done/0/1", "u2/status/1"))
    sender.close()

    assert all(r.accepted_by_all for r in reports) and [r.version for r in reports] == [3, 7]
    assert reports[0].bytes == 11456 and reports[0].buckets == 14  # the same chunks and buckets as gloo
    for rank, items in results_by_rank(receivers.results, 4).items():
        assert [item[3] for item in items] == [3, 7], rank
        for _, _, outcome, version, packed, sums in items:
            assert outcome == "ok"
            _assert_exact(unpack(packed), sums, sent[version])
    assert _shared_files() == before  # close() frees what it shared


def test_a_corrupted_copy_is_refused_and_the_group_serves_the_next_version(receivers: Receivers) -> None:
    rendezvous = reserve_rendezvous(_spec(2))
    receivers.spawn(rendezvous.spec, {1: ["corrupt", "ok"], 2: ["ok", "ok"]})
    sender = IpcSender(rendezvous.spec, rendezvous=rendezvous, device="cpu")
    sender.init()
    first = sender.publish(1, _weights(1).items())
    second = sender.publish(2, _weights(2).items())
    sender.close()

    assert first.refused == {1: "checksum_mismatch"} and second.accepted_by_all
    results = results_by_rank(receivers.results, 4)
    assert [(item[2], item[3]) for item in results[1]] == [("checksum_mismatch", None), ("ok", 2)]
    assert "version 1: checksum mismatch in chunk 0 bucket 0" in results[1][0][5]["error"]
    assert [(item[2], item[3]) for item in results[2]] == [("ok", 1), ("ok", 2)]
    _assert_exact(unpack(results[1][1][4]), results[1][1][5], _weights(2))


def test_a_receiver_killed_mid_update_fails_the_sender_and_aborts_the_others_then_a_new_generation_works(
    receivers: Receivers,
) -> None:
    rendezvous = reserve_rendezvous(_spec(2, timeout_s=3.0))
    receivers.spawn(rendezvous.spec, {1: ["die"], 2: ["fail_then_rejoin", "ok"]})
    sender = IpcSender(rendezvous.spec, rendezvous=rendezvous, device="cpu")
    sender.init()
    started = time.monotonic()
    with pytest.raises(SyncError, match="copying chunk"):
        sender.publish(1, _weights(1).items())
    assert time.monotonic() - started < 10  # the sender's wait for the dead rank is bounded by timeout_s
    with pytest.raises(SyncError, match="broken"):
        sender.start(2)
    sender.close()
    survivor = results_by_rank(receivers.results, 1)[2][0]
    assert survivor[2] == "sync_error" and survivor[5]["seconds"] < 10  # the abort, or its own timeout

    spec = rendezvous.next_generation(["explorer-1"])
    receivers.control.put((spec.model_dump_json(), spec.rank_of("explorer-1")))
    sender = IpcSender(spec, rendezvous=rendezvous, device="cpu")
    sender.init()
    report = sender.publish(2, _weights(2).items())
    sender.close()
    assert report.accepted_by_all
    (item,) = results_by_rank(receivers.results, 1)[1]
    assert (item[2], item[3]) == ("ok", 2)
    _assert_exact(unpack(item[4]), item[5], _weights(2))


def test_a_failing_source_aborts_the_version_on_every_receiver_at_once(receivers: Receivers) -> None:
    rendezvous = reserve_rendezvous(_spec(1, timeout_s=60.0))  # far above the bound asserted below
    receivers.spawn(rendezvous.spec, {1: ["ok"]})
    sender = IpcSender(rendezvous.spec, rendezvous=rendezvous, device="cpu")
    sender.init()

    def gather_fails_after_two_tensors() -> Iterator[tuple[str, torch.Tensor]]:
        yield from list(_weights(1).items())[:2]
        raise RuntimeError("the trainer's all-gather failed")

    with pytest.raises(RuntimeError, match="all-gather"):
        sender.publish(1, gather_fails_after_two_tensors())
    with pytest.raises(SyncError, match="broken"):
        sender.start(2)
    sender.close()
    (item,) = results_by_rank(receivers.results, 1)[1]
    assert item[2] == "sync_error" and "abandoned" in item[5]["error"] and item[5]["seconds"] < 30


def test_a_member_on_another_device_is_refused_at_join_and_the_trainer_learns_at_once() -> None:
    rendezvous = reserve_rendezvous(_spec(1, join_timeout_s=60.0))
    sender = IpcSender(rendezvous.spec, rendezvous=rendezvous, device="cpu")
    outcome: dict[str, object] = {}

    def join() -> None:
        try:
            sender.init()
        except SyncError as err:
            outcome["error"] = err

    trainer = threading.Thread(target=join, daemon=True)
    started = time.monotonic()
    trainer.start()
    # The meta device stands in for "a GPU other than the trainer's": its identity differs from the sender's.
    receiver = IpcReceiver(rendezvous.spec, 1, device="meta")
    with pytest.raises(SyncError, match="cuda_ipc needs the trainer's GPU"):
        receiver.init()
    trainer.join(timeout=30)
    assert "could not join" in str(outcome["error"]) and time.monotonic() - started < 30
    sender.close()


def _sender_that_exits_after_one_chunk(spec_json: str, out: Queue) -> None:
    spec = SyncGroupSpec.model_validate_json(spec_json)
    rendezvous = reserve_rendezvous(spec)
    out.put(rendezvous.spec.model_dump_json())
    sender = IpcSender(rendezvous.spec, rendezvous=rendezvous, device="cpu")
    sender.init()
    sender.start(1)
    sender.update([("w", torch.ones(8))])
    sender.store.wait(["u1/done/0/1"])  # the receiver has copied chunk 0 and waits for the next message
    os._exit(0)  # the store (and the trainer) vanish mid-version


def test_a_store_failure_mid_version_is_a_sync_error() -> None:
    before = _shared_files()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(
        target=_sender_that_exits_after_one_chunk, args=(_spec(1, timeout_s=30.0).model_dump_json(), out)
    )
    child.start()
    try:
        spec = SyncGroupSpec.model_validate_json(out.get(timeout=60))
        receiver = IpcReceiver(spec, 1, device="cpu")
        receiver.init()
        started = time.monotonic()
        with pytest.raises(SyncError) as failure:
            receiver.receive(idle_timeout_s=60)
        assert not isinstance(failure.value, NoUpdateYet)  # the update had begun: this is a failed one
        assert "message 1 of version 1 failed" in str(failure.value) and time.monotonic() - started < 30
        with pytest.raises(SyncError, match="broken"):
            receiver.receive(idle_timeout_s=1)
        receiver.close()
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
        for name in _shared_files() - before:  # a crashed sender cannot free its host buffers (GPU memory it can)
            (SHM / name).unlink(missing_ok=True)


def test_a_cuda_handle_travels_as_json_and_rebuilds_with_the_same_fields() -> None:
    args = (
        torch.Tensor,
        torch.Size([4096]),
        (1,),
        128,
        torch.storage.TypedStorage,
        torch.uint8,
        0,
        b"\x00\x01handle\xff",
        1 << 20,
        4096,
        False,
        b"counter",
        16,
        b"event\x00",
        True,
    )
    import json

    encoded = json.loads(json.dumps(encode_cuda_handle(args)))
    assert decode_cuda_handle(encoded, 0) == args
    # The same GPU may have another index in the receiver's numbering: the receiver's own index is used.
    assert decode_cuda_handle(encoded, 3) == (*args[:6], 3, *args[7:])
    with pytest.raises(SyncError, match="fields"):
        encode_cuda_handle(args[:-1])


def test_a_cuda_device_that_is_not_there_is_a_sync_error() -> None:
    rendezvous = reserve_rendezvous(_spec(0))
    # Naming the trainer's GPU is a CUDA call; on this CPU-only torch it raises inside init.
    sender = IpcSender(rendezvous.spec, rendezvous=rendezvous, device="cuda:0")
    with pytest.raises(SyncError, match="join"):
        sender.init()


def test_the_gpu_check_runs_on_cpu_through_host_shared_memory() -> None:
    summary = check(megabytes=2.0, rounds=2, device="cpu", bucket_mb=0.5)
    assert summary["checksums_match"] and not summary["refused"] and not summary["receiver_errors"]
    assert summary["bytes"] >= 2 * 2**20 and summary["gb_per_s"] > 0
