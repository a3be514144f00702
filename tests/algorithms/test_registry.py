import pytest
import torch

from trinity import algorithms as A
from trinity.algorithm_table import FUNCTIONS
from trinity.algorithms.registry import FunctionRegistry


@pytest.mark.parametrize(
    ("builder", "known"),
    [
        (A.policy_loss, ["ppo", "gspo", "dpo"]),
        (A.advantage, ["grpo", "gae", "gigpo"]),
        (A.kl, ["k1", "k2", "k3", "low_var_kl", "abs"]),
        (A.entropy, ["none", "default"]),
        (A.value_loss, ["clipped"]),
        (A.preset, ["grpo", "dapo", "mix_chord"]),
    ],
)
def test_unknown_name_raises_key_error_listing_known_names(builder, known) -> None:
    with pytest.raises(KeyError) as err:
        builder("no_such_algorithm")
    assert isinstance(err.value, A.UnknownNameError)
    message = str(err.value)
    assert "no_such_algorithm" in message
    for name in known:
        assert name in message


def test_unknown_override_raises_and_lists_accepted_hyperparameters() -> None:
    with pytest.raises(A.UnknownOverrideError) as err:
        A.policy_loss("ppo", clip_rnage=0.1)
    assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)
    assert "clip_rnage" in str(err.value) and "clip_range_high" in str(err.value)


def test_unknown_override_on_function_without_hyperparameters() -> None:
    with pytest.raises(A.UnknownOverrideError, match=r"\(none\)"):
        A.kl("k1", scale=2.0)


def test_overrides_are_merged_with_defaults_and_read_only() -> None:
    loss_fn = A.policy_loss("ppo", clip_range_high=0.28)
    assert loss_fn.params["clip_range"] == 0.2
    assert loss_fn.params["clip_range_high"] == 0.28
    with pytest.raises(TypeError):
        loss_fn.params["clip_range"] = 0.3  # type: ignore[index]


def test_hyperparameter_passed_at_call_time_is_rejected() -> None:
    loss_fn = A.policy_loss("sft")
    with pytest.raises(TypeError, match="hyperparameters fixed"):
        loss_fn(logprobs=torch.zeros(1, 1), mask=torch.ones(1, 1, dtype=torch.bool), loss_agg_mode="token-mean")


def test_researcher_adds_a_policy_loss_with_one_function() -> None:
    losses = FunctionRegistry("policy_loss")  # the same class as A.POLICY_LOSSES, left untouched

    @losses.register("test_vanilla_pg", scale=1.0)
    def vanilla_pg(*, logprobs, advantages, mask, scale):
        loss = A.agg_loss(-scale * advantages * logprobs, mask, "token-mean")
        return loss, {"pg_loss": loss.item()}

    assert "test_vanilla_pg" in losses.names()
    loss_fn = losses.build("test_vanilla_pg", scale=2.0)
    assert dict(loss_fn.inputs) == {"logprobs": True, "advantages": True, "mask": True}
    available = {
        "logprobs": torch.tensor([[-1.0, -2.0]]),
        "old_logprobs": torch.zeros(1, 2),  # not read: the trainer does not hand it
        "advantages": torch.tensor([[1.0, 1.0]]),
        "mask": torch.tensor([[True, True]]),
    }
    loss, metrics = loss_fn(**loss_fn.given(available))
    # -2 * 1 * (-1) = 2 and -2 * 1 * (-2) = 4 -> mean 3
    assert loss.item() == pytest.approx(3.0)
    assert metrics == {"pg_loss": pytest.approx(3.0)}


def test_duplicate_registration_is_refused() -> None:
    with pytest.raises(A.DuplicateNameError, match="already registered"):
        A.register_policy_loss("ppo")(lambda *, logprobs, mask: None)


def test_declared_hyperparameter_missing_from_signature_fails_at_registration() -> None:
    registry = FunctionRegistry("thing")

    def fn(*, x):
        return x

    with pytest.raises(TypeError, match="not keyword parameters"):
        registry.register("bad", y=1)(fn)
    assert "bad" not in registry


def test_a_function_that_swallows_unknown_inputs_is_refused() -> None:
    registry = FunctionRegistry("policy_loss")

    def swallows(*, logprobs, mask, **_):
        return logprobs

    with pytest.raises(TypeError, match=r"takes \*\*kwargs"):
        registry.register("swallows")(swallows)
    assert "swallows" not in registry


def test_a_missing_input_is_named_not_ignored() -> None:
    gigpo = A.advantage("gigpo")
    assert dict(gigpo.inputs) == {
        "rewards": True, "mask": True, "group_ids": True,
        "episode_ids": False, "step_group_ids": False, "step_rewards": False,
    }  # fmt: skip
    with pytest.raises(ValueError, match="advantage 'gigpo' needs group_ids"):
        gigpo.given({"rewards": torch.zeros(2), "mask": torch.ones(2, 1, dtype=torch.bool)})


def test_a_built_in_takes_its_hyperparameters_from_the_algorithm_table() -> None:
    registry = FunctionRegistry("policy_loss")
    with pytest.raises(TypeError, match="algorithm table"):
        registry.register("ppo", clip_range=0.3)(lambda *, logprobs, mask, clip_range: None)
    assert A.POLICY_LOSSES.defaults("ppo") == FUNCTIONS[("policy_loss", "ppo")].params


def test_available_lists_every_registry() -> None:
    names = A.available()
    assert set(names) == {"advantages", "policy_losses", "kl", "entropy", "value_losses", "presets"}
    assert names["kl"] == ["abs", "k1", "k2", "k3", "low_var_kl", "none"]
    assert {"ppo", "gspo", "cispo", "sapo", "topr", "sppo", "rec", "opmd", "dpo", "sft", "mix_chord"} <= set(
        names["policy_losses"]
    )
