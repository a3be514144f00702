"""No stranger in a sync group: with the generation's secret, members sign what they write to the rendezvous store
and prove membership before any weight travels; bucket checksums are authenticated. Real TCPStore and gloo on
loopback, receivers in spawned processes."""

from __future__ import annotations

import random
import secrets
import socket
import threading
import uuid
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from pydantic import SecretBytes

from tests.sync.conftest import Receivers
from tests.sync.test_collective import _assert_exact, _weights
from tests.sync.workers import results_by_rank, unpack
from trinity.sync import Rendezvous, SyncError, SyncGroupSpec, WeightSender, reserve_rendezvous
from trinity.sync.checksum import BucketChecksums, checksum_bytes
from trinity.sync.collective import verdict
from trinity.sync.cuda_ipc import IpcSender
from trinity.sync.membership import MembershipRefused, SignedStore, allgather_exchange, prove_membership
from trinity.sync.protocol import STATUS_CHECKSUM, ChunkLayout
from trinity.sync.transport import open_store


def _spec(explorers: int, **fields: object) -> SyncGroupSpec:
    names = [f"explorer-{i}" for i in range(explorers)]
    # Joining waits for spawned receivers to import torch (slow on a busy machine); updates get 3 s.
    defaults: dict[str, object] = {"timeout_s": 3.0, "join_timeout_s": 120.0, "bucket_mb": 0.001}
    defaults.update(fields)
    return SyncGroupSpec.for_members(f"t{uuid.uuid4().hex[:8]}", 0, names, **defaults)


def _secret() -> bytes:
    return secrets.token_bytes(32)


def test_a_group_with_a_secret_forms_and_serves_exact_weights(receivers: Receivers) -> None:
    rendezvous = reserve_rendezvous(_spec(2, secret=_secret()))
    receivers.spawn(rendezvous.spec, {1: ["ok", "ok"], 2: ["ok", "ok"]})
    sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
    sender.init()
    sent = {3: _weights(3), 7: _weights(7)}
    reports = [sender.publish(version, weights.items()) for version, weights in sent.items()]
    sender.close()

    assert all(r.accepted_by_all for r in reports)
    for rank, items in results_by_rank(receivers.results, 4).items():
        assert [item[3] for item in items] == [3, 7], rank
        for _, _, outcome, version, packed, sums in items:
            assert outcome == "ok"
            _assert_exact(unpack(packed), sums, sent[version])


@pytest.mark.parametrize("stranger", ["a wrong secret", "no secret"])
def test_a_process_without_the_secret_is_refused_and_the_next_generation_forms(
    receivers: Receivers, stranger: str
) -> None:
    rendezvous = reserve_rendezvous(_spec(1, secret=_secret()))
    strangers = Receivers()  # a queue of their own: killing a process that writes to a queue may break it
    try:
        if stranger == "a wrong secret":
            strangers.spawn(rendezvous.spec, {1: ["ok"]}, secret=_secret())
        else:
            strangers.spawn(rendezvous.spec.model_copy(update={"secret": None}), {1: ["ok"]})
        sender = WeightSender(rendezvous.spec, rendezvous=rendezvous)
        with pytest.raises(SyncError, match="refused by rank 0") as refused:
            sender.init()
        sender.close()
        if stranger == "a wrong secret":  # the refusal is mutual: the stranger does not take the trainer's values
            rank, step, error, *_ = strangers.results.get(timeout=60)
            assert (rank, step) == (1, "crash")
            assert "claiming rank 0, that fails authentication" in error
    finally:
        for process in strangers.processes:
            process.kill()
    problem = "claiming rank 1, that fails authentication" if stranger == "a wrong secret" else "not signed"
    assert problem in str(refused.value)

    spec = rendezvous.next_generation(["explorer-0"], secret=_secret())
    receivers.spawn(spec, {1: ["ok"]})
    _assert_one_version_served_exactly(spec, rendezvous, receivers)


def test_garbage_on_the_rendezvous_port_while_a_group_forms_does_not_break_it(receivers: Receivers) -> None:
    rendezvous = reserve_rendezvous(_spec(1, secret=_secret()))
    rng = random.Random(0)
    connections = []

    def spray(count: int) -> None:
        for _ in range(count):
            connection = socket.create_connection(("127.0.0.1", rendezvous.port))
            connection.sendall(rng.randbytes(rng.randrange(1, 4096)))
            connections.append(connection)  # kept open while the group forms

    spray(20)  # before the receiver joins
    receivers.spawn(rendezvous.spec, {1: ["ok"]})
    spray(20)  # while it joins
    _assert_one_version_served_exactly(rendezvous.spec, rendezvous, receivers)
    for connection in connections:
        connection.close()


@pytest.mark.parametrize("backend", ["gloo", "cuda_ipc"])
def test_an_altered_bucket_fails_authentication_and_the_next_version_is_served(
    receivers: Receivers, backend: str
) -> None:
    # On cuda_ipc every message in the store is signed too (host memory stands in for the GPU's).
    sizes = {"backend": "cuda_ipc", "bucket_mb": 1000 / 2**20} if backend == "cuda_ipc" else {}
    rendezvous = reserve_rendezvous(_spec(1, secret=_secret(), **sizes))
    receivers.spawn(rendezvous.spec, {1: ["corrupt", "ok"]})  # its first bucket flipped on arrival
    make = IpcSender if backend == "cuda_ipc" else WeightSender
    sender = make(rendezvous.spec, rendezvous=rendezvous, device="cpu")
    sender.init()
    refused = sender.publish(1, _weights(1).items())
    served = sender.publish(2, _weights(2).items())
    sender.close()

    assert refused.refused == {1: "checksum_mismatch"}
    assert served.accepted_by_all
    first, second = results_by_rank(receivers.results, 2)[1]
    assert first[2] == "checksum_mismatch"
    assert "version 1: chunk 0 bucket 0 failed authentication (altered or forged); refused" in first[5]["error"]
    assert second[2] == "ok"
    _assert_exact(unpack(second[4]), second[5], _weights(2))


def _client(master: dist.TCPStore, rank: int) -> dist.Store:
    """Rank 0 uses the master; every other rank its own connection (one client cannot wait for two threads)."""
    return master if rank == 0 else dist.TCPStore("127.0.0.1", master.port, None, False, timedelta(seconds=60))


def test_a_member_that_fails_the_proof_is_named_by_every_other_rank() -> None:
    """Three ranks of a real gloo group (threads), the third with another secret: each refuses the others."""
    master = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    shared, other = _secret(), _secret()
    outcome: dict[int, list[int] | str] = {}

    def member(rank: int) -> None:
        group = dist.ProcessGroupGloo(dist.PrefixStore("proof", _client(master, rank)), rank, 3, timedelta(seconds=60))
        exchange = allgather_exchange(group, 3, torch.device("cpu"), timedelta(seconds=60))
        try:
            prove_membership(exchange, other if rank == 2 else shared, "the test group", rank)
            outcome[rank] = "passed"
        except MembershipRefused as refused:
            outcome[rank] = refused.ranks

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcome == {0: [2], 1: [2], 2: [0, 1]}


def test_members_with_the_same_secret_pass_the_proof() -> None:
    master = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    secret = _secret()
    outcome: dict[int, str] = {}

    def member(rank: int) -> None:
        store = SignedStore(dist.PrefixStore("proof", _client(master, rank)), secret, "the test group", rank)
        group = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=60))
        prove_membership(allgather_exchange(group, 2, torch.device("cpu"), timedelta(seconds=60)), secret, "g", rank)
        outcome[rank] = "passed"

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcome == {0: "passed", 1: "passed"}


def _layout(names: list[str]) -> ChunkLayout:
    return ChunkLayout.plan([(name, torch.zeros(16)) for name in names], 32)


def test_authenticated_checksums_are_keyed_and_bound_to_their_place() -> None:
    spec = _spec(1, secret=_secret())
    bucket = torch.arange(32, dtype=torch.uint8)
    layout = _layout(["a", "b"])

    def checksum(of: SyncGroupSpec = spec, version: int = 1, chunk: int = 0, index: int = 0, at: ChunkLayout = layout):
        return BucketChecksums(of).of_chunk(version, chunk, at)(index, bucket)

    same = checksum()
    assert same == checksum() and same.bit_length() > 64  # 128 bits kept
    assert same != checksum(of=spec.model_copy(update={"secret": SecretBytes(_secret())}))  # a stranger's key
    assert same != checksum(of=spec.next_generation(["explorer-0"], secret=spec.secret))  # another generation
    assert same != checksum(version=2)
    assert same != checksum(chunk=1)
    assert same != checksum(index=1)
    assert same != checksum(at=_layout(["b", "a"]))  # a tampered layout


def test_a_receiver_whose_checksums_differ_under_a_key_refuses_the_version_as_unauthenticated() -> None:
    spec = _spec(1, secret=_secret())
    bucket = torch.arange(32, dtype=torch.uint8)
    sent = [[BucketChecksums(spec).of_chunk(1, 0, _layout(["a"]))(0, bucket)]]
    with_another_key = spec.model_copy(update={"secret": SecretBytes(_secret())})
    received = [[BucketChecksums(with_another_key).of_chunk(1, 0, _layout(["a"]))(0, bucket)]]
    status, problem = verdict(1, 1, received, sent, None, authenticated=True)
    assert status == STATUS_CHECKSUM
    assert problem == "version 1: chunk 0 bucket 0 failed authentication (altered or forged); refused"


def test_without_a_secret_checksums_and_store_are_as_before() -> None:
    spec = _spec(1)
    bucket = torch.arange(32, dtype=torch.uint8)
    checksums = BucketChecksums(spec)
    assert not checksums.authenticated
    assert checksums.of_chunk(1, 0, _layout(["a"]))(0, bucket) == checksum_bytes("xxh3_64", bucket)
    rendezvous = reserve_rendezvous(spec)
    _, store = open_store(rendezvous.spec, 0, rendezvous.store)
    store.set("plain", "1")
    assert not isinstance(store, SignedStore)
    assert rendezvous.store is not None
    assert rendezvous.store.get(f"{spec.store_prefix}/plain") == b"1"


def test_the_secret_is_never_printed_serialized_or_carried_to_the_next_generation() -> None:
    secret = _secret()
    spec = _spec(1, secret=secret)
    assert spec.secret_bytes == secret
    for text in (repr(spec), str(spec), spec.model_dump_json(), str(spec.model_dump())):
        assert secret.hex() not in text and repr(secret) not in text and "secret" not in text
    assert spec.next_generation(["explorer-0"]).secret is None


def _assert_one_version_served_exactly(spec: SyncGroupSpec, rendezvous: Rendezvous, receivers: Receivers) -> None:
    """The trainer publishes version 1 into `spec`'s group; its one receiver accepts it with every byte as sent."""
    sender = WeightSender(spec, rendezvous=rendezvous)
    sender.init()
    report = sender.publish(1, _weights(1).items())
    sender.close()
    assert report.accepted_by_all
    ((_, _, outcome, _, packed, sums),) = results_by_rank(receivers.results, 1)[1]
    assert outcome == "ok"
    _assert_exact(unpack(packed), sums, _weights(1))
