"""The train-vs-rollout consistency probe: its formulas, where a step reads it (the weights before its first update,
no pass of its own), quiet on on-policy data, flagged when the sampler's log-probs come from other weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from trainer_helpers import grouped_rollouts, run_config

from trinity.clients import BufferClient
from trinity.clients.gateway import RunReporter
from trinity.config import MonitorConfig, StreamConfig, naming
from trinity.config.consistency import ConsistencyConfig
from trinity.models.tiny import build_tiny_llama
from trinity.trainer.consistency import DIFF_MAX, DIFF_MEAN, K3_KL, OUTSIDE, VERSION_LAG_MAX, ProbeSums, breaches
from trinity.trainer.logprobs import naive_logprobs
from trinity.trainer.parallel import Ranks, merge_weighted
from trinity.trainer.runner import ConsistencyStop, TrainerRunner
from trinity.trainer.torch_backend import TorchBackend
from trinity.v1 import common_pb2, gateway_pb2

PROBE = (DIFF_MEAN, DIFF_MAX, K3_KL, OUTSIDE)


def test_the_probe_metrics_are_the_hand_computed_values() -> None:
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, 0.0]])
    sampler = torch.tensor([[-1.0, -1.5, -0.9], [-3.2, -0.1, -7.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])  # the masked-out tokens differ wildly
    d = [0.0, -0.5, 0.2, 0.0]  # trainer - sampler of the four sampled tokens

    metrics = ProbeSums.of(trainer, sampler, mask).metrics()

    assert metrics[DIFF_MEAN] == pytest.approx(0.7 / 4)
    assert metrics[DIFF_MAX] == pytest.approx(0.5)
    assert metrics[K3_KL] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 4)  # (0.10653 + 0.02140) / 4
    assert metrics[OUTSIDE] == pytest.approx(1 / 4)  # exp(-0.5) = 0.61 < 0.8; exp(0.2) = 1.22 is inside
    assert ProbeSums.of(trainer, sampler, mask, band=(0.9, 1.1)).metrics()[OUTSIDE] == pytest.approx(2 / 4)


def test_micro_batches_add_up_to_the_whole_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    trainer, sampler = torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)
    mask = torch.rand(6, 5, generator=gen) > 0.3
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):
        ProbeSums.of(trainer[rows], sampler[rows], mask[rows]).add_to(sums, weights)

    merged = merge_weighted(sums, weights, Ranks.current())

    whole = ProbeSums.of(trainer, sampler, mask).metrics()
    assert merged.keys() == whole.keys() == set(PROBE)
    for key in PROBE:
        assert merged[key] == pytest.approx(whole[key]), key


def test_a_limit_passed_names_the_metric_its_value_and_the_config_field() -> None:
    limits = ConsistencyConfig(max_k3_kl=0.01, max_ratio_outside_share=0.5)
    assert breaches({K3_KL: 0.02, OUTSIDE: 0.1, DIFF_MEAN: 9.0}, limits) == [
        "consistency/k3_kl 0.02 exceeds monitor.consistency.max_k3_kl 0.01"
    ]
    assert breaches({K3_KL: 0.005}, limits) == []
    with pytest.raises(ValueError, match="ratio_band"):
        ConsistencyConfig(ratio_band=(1.1, 1.25))


# ------------------------------------------------------------------------------------------ through a train step


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Other random weights of the same shape as `tiny_model`: a sampler that did not load the trainer's."""
    return build_tiny_llama(tmp_path_factory.mktemp("other") / "model", vocab_size=272, seed=1)


def sampled_by(model: Path, experiences: list[common_pb2.Experience]) -> list[common_pb2.Experience]:
    """`experiences` with the log-probs `model` (fp32, full forward) gives their responses, as its sampler would."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    out = []
    for exp in experiences:
        ids = torch.tensor([list(exp.prompt_token_ids) + list(exp.response_token_ids)])
        with torch.no_grad():
            logits = lm(ids).logits[0, len(exp.prompt_token_ids) - 1 : -1]
        logprobs, _ = naive_logprobs(logits, torch.tensor(list(exp.response_token_ids)))
        copy = common_pb2.Experience()
        copy.CopyFrom(exp)
        copy.logprobs[:] = logprobs.tolist()
        out.append(copy)
    return out


# Where the trainer's log-probs of the weights before the update come from: the first update's own forward (the
# sampler's old log-probs; the update's own), or the old log-probs' pass before the update (several updates).
SOURCES = {
    "sampler, one update": {},
    "sampler, 2 epochs of 2 mini-batches": {"mini_batch_size": 4, "ppo_epochs": 2},
    "own, one update": {"recompute_old_logprobs": True},
    "policy, 2 epochs of 2 mini-batches": {"recompute_old_logprobs": True, "mini_batch_size": 4, "ppo_epochs": 2},
}


def _backend(model: Path, **trainer: object) -> tuple[TorchBackend, list[str]]:
    """A GRPO backend with a large learning rate (an update moves the log-probs visibly); its extra passes."""
    config = run_config(model, kl_coef=0.0, optimizer={"lr": 0.05}, **trainer)
    backend = TorchBackend(config)
    passes: list[str] = []
    run_rows = backend.forward_rows

    def recorded(rows, which):  # type: ignore[no-untyped-def]
        passes.append(which)
        return run_rows(rows, which)

    backend.forward_rows = recorded  # type: ignore[method-assign]
    return backend, passes


@pytest.mark.parametrize("trainer", SOURCES.values(), ids=SOURCES.keys())
def test_on_policy_fp32_rollouts_read_as_consistent_before_the_update(tiny_model: Path, trainer: dict) -> None:
    backend, passes = _backend(tiny_model, **trainer)
    on_policy = sampled_by(tiny_model, grouped_rollouts(2, 4, seed=3))

    metrics = backend.train_step(on_policy)

    assert metrics[DIFF_MEAN] < 1e-5 and metrics[DIFF_MAX] < 1e-4
    assert abs(metrics[K3_KL]) < 1e-8 and metrics[OUTSIDE] == 0.0
    assert metrics[VERSION_LAG_MAX] == 0.0
    assert passes.count("policy") == (1 if trainer.get("ppo_epochs") and trainer.get("recompute_old_logprobs") else 0)
    strict = ConsistencyConfig(max_logprob_diff_mean=1e-3, max_k3_kl=1e-5, max_ratio_outside_share=0.0)
    assert breaches(metrics, strict) == []
    # after the update the same log-probs are off: the probe did read the weights of before it
    after = backend.train_step(sampled_by(tiny_model, grouped_rollouts(2, 4, seed=4)))
    assert after[DIFF_MEAN] > 100 * metrics[DIFF_MEAN] + 1e-4


@pytest.mark.parametrize("trainer", SOURCES.values(), ids=SOURCES.keys())
def test_rollouts_sampled_by_other_weights_are_flagged(tiny_model: Path, other_model: Path, trainer: dict) -> None:
    backend, _ = _backend(tiny_model, **trainer)
    mismatched = sampled_by(other_model, grouped_rollouts(2, 4, seed=3))

    metrics = backend.train_step(mismatched)

    assert metrics[DIFF_MEAN] > 0.05 and metrics[K3_KL] > 1e-3 and metrics[OUTSIDE] > 0.05
    limits = ConsistencyConfig(max_logprob_diff_mean=0.02, max_k3_kl=5e-4)
    assert [line.split(" ")[0] for line in breaches(metrics, limits)] == [DIFF_MEAN, K3_KL]


def test_the_version_lag_is_the_trainer_version_against_the_oldest_sampler_version(tiny_model: Path) -> None:
    backend, _ = _backend(tiny_model)
    backend.state.model_version = 5
    rollouts = sampled_by(tiny_model, grouped_rollouts(2, 4, seed=3))
    for i, exp in enumerate(rollouts):
        exp.model_version = 5 - i % 3
    assert backend.train_step(rollouts)[VERSION_LAG_MAX] == 2.0


# ------------------------------------------------------------------------------------------ the trainer's verdict


class _Events(RunReporter):
    """A reporter that keeps what it is given (spans aside) instead of sending it to a gateway."""

    def __init__(self) -> None:
        super().__init__(None, "run", "trainer/trainer-1", 0)  # type: ignore[arg-type]
        self.events: list[tuple[int, str]] = []

    def report(self, kind: int, *, message: str = "", **_: object) -> bool:  # type: ignore[override]
        if kind != gateway_pb2.EVENT_KIND_SPAN:
            self.events.append((kind, message))
        return True


def _runner(tiny_model: Path, **limits: object) -> tuple[TrainerRunner, _Events]:
    config = run_config(tiny_model)
    config = config.model_copy(update={"monitor": MonitorConfig(consistency=ConsistencyConfig(**limits))})
    runner = TrainerRunner(
        run_id="run",
        stage=0,
        config=config,
        instance_id="trainer-1",
        buffer_address="127.0.0.1:1",
        gateway_address="127.0.0.1:1",
        advertise_host="127.0.0.1",
    )
    events = _Events()
    runner.reporter = events  # type: ignore[assignment]
    return runner, events


def test_a_limit_passed_warns_once_until_the_metric_is_back_within_it(tiny_model: Path) -> None:
    runner, events = _runner(tiny_model, max_k3_kl=0.01)
    for k3 in (0.02, 0.03, 0.001, 0.02):
        runner._check_consistency({K3_KL: k3})
    warnings = [message for kind, message in events.events if kind == gateway_pb2.EVENT_KIND_WARNING]
    assert len(warnings) == 2
    assert "consistency/k3_kl 0.02 exceeds monitor.consistency.max_k3_kl 0.01" in warnings[0]


def test_a_limit_passed_with_action_stop_fails_the_step_with_one_line(tiny_model: Path) -> None:
    runner, events = _runner(tiny_model, max_logprob_diff_mean=0.05, action="stop")
    runner._check_consistency({DIFF_MEAN: 0.01})
    with pytest.raises(ConsistencyStop) as stopped:
        runner._check_consistency({DIFF_MEAN: 0.2})
    assert str(stopped.value) == (
        "train step 0: consistency/logprob_diff_mean 0.2 exceeds monitor.consistency.max_logprob_diff_mean 0.05 "
        "(monitor.consistency.action: stop)"
    )
    assert events.events == []


@pytest.mark.system  # the trainer's whole loop with a real buffer: make test-system
def test_a_run_fed_rollouts_of_other_weights_fails_at_its_first_step_naming_the_limit(
    buffer_service, tiny_model: Path, other_model: Path, tmp_path: Path, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the trainer's loop: rollouts read from the buffer, a train step, its `train` event, the verdict."""
    monkeypatch.setenv("TRINITY_OUTAGE_SECONDS", "0.5")  # no gateway here: the runner's own calls give up soon
    stream = naming.experience_stream(unique, 0, "experiences")
    with BufferClient(buffer_service.address) as buffer:
        buffer.create_stream(StreamConfig(name=stream))
        buffer.put(stream, sampled_by(other_model, grouped_rollouts(2, 4, seed=3)))
    runner, events = _runner(tiny_model, max_k3_kl=1e-3, action="stop")
    runner.config = runner.config.model_copy(
        update={
            "checkpoint_dir": str(tmp_path),
            "algorithm": runner.config.algorithm.model_copy(update={"repeat_times": 8}),
            "buffer": runner.config.buffer.model_copy(update={"batch_size": 1}),
        }
    )
    runner.buffer = BufferClient(buffer_service.address, timeout=120)
    runner.stream = stream
    runner.start()
    runner.join(timeout=120)

    assert runner.state == "failed" and runner.step == 1
    kinds = [kind for kind, _ in events.events]
    assert kinds == [gateway_pb2.EVENT_KIND_TRAIN, gateway_pb2.EVENT_KIND_ERROR]
    error = events.events[-1][1]
    assert error.startswith("ConsistencyStop: train step 1: consistency/k3_kl ")
    assert error.endswith("exceeds monitor.consistency.max_k3_kl 0.001 (monitor.consistency.action: stop)")
