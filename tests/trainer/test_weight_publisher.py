"""The publisher against a live gateway: forming a generation while membership changes, and what a publish reads."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from pydantic import SecretBytes

from tests.conftest import ServiceProcess
from tests.e2e.conftest import tiny_config
from trinity.clients import GatewayClient
from trinity.clients.gateway import sync_spec
from trinity.config import SynchronizerConfig
from trinity.config.sync import SyncMethod
from trinity.explorer.weight_feed import Staged, WeightFeed
from trinity.models.digest import weights_digest
from trinity.sdk import TrinityClient
from trinity.sync import SyncError, WeightReceiver
from trinity.sync.placement import host_id
from trinity.trainer.weight_publisher import FormingStopped, WeightPublisher
from trinity.trainer.weights import named_weights


def _wait_for_generation(gateway: GatewayClient, run_id: str, generation: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if gateway.sync_group(run_id).generation == generation:
                return
        except Exception:  # noqa: BLE001 - NOT_FOUND until the trainer opens the first generation
            pass
        time.sleep(0.05)
    raise AssertionError(f"generation {generation} never opened")


@contextmanager
def _gateway_with_run(redis_url: str, run_id: str, tmp_path: Path, token: str | None = None) -> Iterator[GatewayClient]:
    """A live gateway with a (pending: no services) run `run_id` to sync for. The run is cancelled on the way out:
    the tests share one Redis, and the gateway refuses new runs beyond its limit of pending ones."""
    env = {"TRINITY_REDIS_URL": redis_url, **({"TRINITY_AUTH_TOKEN": token} if token else {})}
    service = ServiceProcess("gateway", env=env).start()
    try:
        with TrinityClient(service.address, token=token) as client:
            run = client.create_run(tiny_config(tmp_path / "model"), run_id=run_id)
            try:
                with GatewayClient(service.address, token=token) as gateway:
                    yield gateway
            finally:
                run.cancel("test over")
    finally:
        service.stop()


@pytest.fixture
def gateway(redis_server, unique, tmp_path) -> Iterator[GatewayClient]:
    with _gateway_with_run(redis_server.url, unique, tmp_path) as gateway:
        yield gateway


def _publisher(
    gateway: GatewayClient,
    run_id: str,
    tmp_path: Path,
    stop: threading.Event | None = None,
    *,
    method: SyncMethod = "checkpoint",
    dtype: torch.dtype | None = None,
):
    return WeightPublisher(
        gateway,
        run_id=run_id,
        instance_id="trainer-0",
        explorers=1,
        config=SynchronizerConfig(method=method, timeout_seconds=60),
        host="127.0.0.1",
        checkpoint_dir=str(tmp_path),
        stop=stop,
        dtype=dtype,
    )


def test_a_stopped_run_ends_the_wait_for_members_at_once(gateway, unique, tmp_path):
    """A run failed or cancelled elsewhere must not leave the trainer busy for the whole sync timeout."""
    stop = threading.Event()
    publisher = _publisher(gateway, unique, tmp_path, stop)
    outcome: dict[str, object] = {}

    def form() -> None:
        started = time.monotonic()
        try:
            publisher.open()
        except FormingStopped as err:
            outcome["error"] = err
        outcome["seconds"] = time.monotonic() - started

    trainer = threading.Thread(target=form, daemon=True)
    trainer.start()
    _wait_for_generation(gateway, unique, 1)
    stop.set()
    trainer.join(timeout=10)
    assert isinstance(outcome.get("error"), FormingStopped) and float(outcome["seconds"]) < 10


def test_a_generation_closed_while_it_forms_is_replaced_by_the_next(gateway, unique, tmp_path):
    """A member of the previous generation declared lost after the trainer opened this one closes it (nobody
    can join it any more); the trainer must open the next one instead of waiting out its timeout."""
    publisher = _publisher(gateway, unique, tmp_path)
    opened: dict[str, float] = {}

    def form() -> None:
        started = time.monotonic()
        publisher.open()
        opened["seconds"] = time.monotonic() - started

    trainer = threading.Thread(target=form, daemon=True)
    trainer.start()
    _wait_for_generation(gateway, unique, 1)
    gateway.report_sync_failure(unique, 1, "explorer-lost", "declared lost while generation 1 formed")
    _wait_for_generation(gateway, unique, 2)
    gateway.join_sync_group(unique, "explorer-new", False)
    trainer.join(timeout=30)
    assert not trainer.is_alive(), "the trainer kept waiting on the closed generation"
    assert publisher.generation == 2 and opened["seconds"] < 60


def test_a_publish_reads_the_weights_once_and_reports_their_digest_and_placement(gateway, unique, tmp_path):
    """One pass over `named_weights()` per attempt: from a sharded trainer each pass is a gather on every rank."""
    weights = {"model.embed_tokens.weight": torch.randn(64, 8), "model.layers.0.mlp.up_proj.weight": torch.randn(8, 8)}
    passes = []

    def named_weights():
        passes.append(1)
        yield from weights.items()

    publisher = _publisher(gateway, unique, tmp_path)
    trainer = threading.Thread(target=publisher.open, daemon=True)
    trainer.start()
    _wait_for_generation(gateway, unique, 1)
    gateway.join_sync_group(unique, "explorer-a", False, host_id="elsewhere/1")
    trainer.join(timeout=30)
    metrics = publisher.publish(1, named_weights)
    publisher.close()

    assert len(passes) == 1
    assert metrics["weights_digest"] == float(weights_digest(weights.items()))
    members = gateway.sync_group(unique).members
    assert [(m.instance_id, m.host_id) for m in members] == [("trainer-0", host_id()), ("explorer-a", "elsewhere/1")]


def test_a_publish_after_the_membership_changed_goes_to_the_next_generation(gateway, unique, tmp_path):
    """The gateway closes the generation when an explorer joins or leaves the run (ScaleRun) or is lost; the next
    publish opens the next generation, with the members the run has then, before it announces its version, whether
    or not the trainer's reads noticed."""
    weights = {"model.embed_tokens.weight": torch.randn(64, 8)}
    publisher = _publisher(gateway, unique, tmp_path)
    trainer = threading.Thread(target=publisher.open, daemon=True)
    trainer.start()
    _wait_for_generation(gateway, unique, 1)
    gateway.join_sync_group(unique, "explorer-a", False)
    trainer.join(timeout=30)
    assert publisher.publish(1, weights.items)["sync_generation"] == 1

    gateway.report_sync_failure(unique, 1, "gateway", "membership changed")  # closes generation 1, as a change does
    published: dict[str, float] = {}
    trainer = threading.Thread(target=lambda: published.update(publisher.publish(2, weights.items)), daemon=True)
    trainer.start()
    _wait_for_generation(gateway, unique, 2)
    gateway.join_sync_group(unique, "explorer-b", False)
    trainer.join(timeout=30)
    publisher.close()

    assert published["sync_generation"] == 2 and published["sync_attempts"] == 1
    group = gateway.sync_group(unique)
    assert group.announced_version == 2 and [m.instance_id for m in group.members] == ["trainer-0", "explorer-b"]


def _tiny_policy() -> torch.nn.Module:
    """A real (random) Llama whose every tensor is a multiple of 128 bytes in bf16: no alignment padding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def _publish_to_a_feed(
    gateway: GatewayClient, run_id: str, tmp_path: Path, model: torch.nn.Module, method: SyncMethod, dtype: torch.dtype
) -> tuple[dict[str, float], list[tuple[str, torch.Tensor]]]:
    """Publish version 1 of `model` to a real explorer `WeightFeed`; the metrics and what the feed staged."""
    publisher = _publisher(gateway, run_id, tmp_path, method=method, dtype=dtype)
    feed = WeightFeed(gateway, run_id, "explorer-0")
    trainer = threading.Thread(target=publisher.open, daemon=True)
    trainer.start()
    _wait_for_generation(gateway, run_id, 1)
    feed.start()
    trainer.join(timeout=60)
    metrics, staged = _publish_version_one(publisher, feed, model)
    assert staged is not None, f"the explorer never staged version 1 (feed error: {feed.error})"
    assert staged.version == 1
    assert staged.published_digest == metrics["weights_digest"]  # the trainer's digest travels with the version
    return metrics, staged.tensors


@pytest.mark.parametrize("method", ["gloo", "checkpoint"])
def test_a_bf16_explorer_receives_the_trainer_weights_cast_to_bf16(gateway, unique, tmp_path, method):
    """fp32 master weights bound for a bf16 engine travel as bf16, equal to the trainer's cast, and the trainer's
    digest is the digest of what the explorer received (the explorer reports `weights_digest` of the same)."""
    model = _tiny_policy()
    metrics, received = _publish_to_a_feed(gateway, unique, tmp_path, model, method, torch.bfloat16)
    sent = [(name, tensor.to(torch.bfloat16)) for name, tensor in named_weights(model)]

    assert [name for name, _ in received] == [name for name, _ in sent]
    for (name, got), (_, want) in zip(received, sent, strict=True):
        assert got.dtype == torch.bfloat16, name
        assert torch.equal(got, want), name
    assert metrics["weights_digest"] == float(weights_digest(received))
    assert metrics["weights_digest"] != float(weights_digest(named_weights(model)))


def test_a_bf16_explorer_halves_the_bytes_an_fp32_trainer_broadcasts(gateway, unique, tmp_path):
    model = _tiny_policy()
    fp32_bytes = sum(tensor.numel() * 4 for _, tensor in named_weights(model))

    metrics, _ = _publish_to_a_feed(gateway, unique, tmp_path, model, "gloo", torch.bfloat16)

    assert metrics["sync_bytes"] == fp32_bytes / 2


def test_an_fp32_explorer_receives_the_fp32_weights_unchanged(gateway, unique, tmp_path):
    model = _tiny_policy()
    fp32_bytes = sum(tensor.numel() * 4 for _, tensor in named_weights(model))

    metrics, received = _publish_to_a_feed(gateway, unique, tmp_path, model, "gloo", torch.float32)

    assert metrics["sync_bytes"] == fp32_bytes
    for (name, got), (_, want) in zip(received, named_weights(model), strict=True):
        assert got.dtype == torch.float32 and torch.equal(got, want), name


@pytest.fixture
def gateway_with_token(redis_server, unique, tmp_path) -> Iterator[GatewayClient]:
    """As `gateway`, with a token: it hands every sync generation a secret."""
    with _gateway_with_run(redis_server.url, unique, tmp_path, token=secrets.token_hex(16)) as gateway:
        yield gateway


def test_a_generation_with_a_member_that_fails_the_proof_is_closed_and_the_next_one_serves(
    gateway_with_token, unique, tmp_path
):
    """A member without the generation's secret (here: a wrong one) makes its forming fail on both sides; the
    trainer reports it, the gateway closes that generation, and the next one forms with the explorer and serves."""
    gateway, model = gateway_with_token, _tiny_policy()
    publisher = _publisher(gateway, unique, tmp_path, method="gloo")
    trainer = threading.Thread(target=publisher.open, daemon=True)
    trainer.start()
    _wait_for_generation(gateway, unique, 1)
    group = gateway.join_sync_group(unique, "stranger", has_gpu=False)
    assert group.ready and len(group.secret) == 32
    wrong = sync_spec(group).model_copy(update={"secret": SecretBytes(secrets.token_bytes(32))})
    with pytest.raises(SyncError, match="claiming rank 0, that fails authentication"):
        WeightReceiver(wrong, group.rank).init()
    feed = WeightFeed(gateway, unique, "explorer-0")
    feed.start()
    trainer.join(timeout=60)
    assert publisher.generation == 2
    metrics, staged = _publish_version_one(publisher, feed, model)
    assert staged is not None and staged.version == 1
    assert staged.published_digest == metrics["weights_digest"] == float(weights_digest(staged.tensors))


def _publish_version_one(
    publisher: WeightPublisher, feed: WeightFeed, model: Path
) -> tuple[dict[str, float], Staged | None]:
    """Publish version 1 of `model`, wait up to 30 s for `feed` to stage it, then close both; the publish's metrics
    and what was staged (None if nothing was)."""
    try:
        metrics = publisher.publish(1, lambda: named_weights(model))
        deadline = time.monotonic() + 30
        staged = feed.take()
        while staged is None and time.monotonic() < deadline:
            time.sleep(0.05)
            staged = feed.take()
    finally:
        feed.close()
        feed.join(timeout=30)  # before the trainer's store goes, so the feed leaves quietly
        publisher.close()
    return metrics, staged
