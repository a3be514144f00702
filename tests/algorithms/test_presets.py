import dataclasses

import pytest
import torch

from trinity import algorithms as A

# The Trinity-RFT family as issue 15 lists it, written out here rather than read from the registry, so that a
# preset that disappears (or one nobody asked for) fails this test.
TRINITY_TABLE = {
    "ppo", "grpo", "dapo", "gspo", "rloo", "reinforceplusplus", "remax", "opmd", "asymre", "sppo", "rec",
    "topr", "cispo", "sapo", "m2po", "is_ppo", "multi_step_grpo", "gigpo", "mix", "mix_chord",
    "on_policy_distill", "jsd", "sft", "raft", "dpo",
}  # fmt: skip


def test_every_algorithm_type_of_the_trinity_family_has_a_preset() -> None:
    assert len(TRINITY_TABLE) == 25
    assert set(A.available()["presets"]) == TRINITY_TABLE


@pytest.mark.parametrize("name", sorted(TRINITY_TABLE))
def test_every_preset_component_resolves_in_the_registries(name: str) -> None:
    p = A.preset(name)
    assert p.name == name
    assert p.policy_loss in A.POLICY_LOSSES
    assert p.advantage is None or p.advantage in A.ADVANTAGES
    assert p.entropy in A.ENTROPY_TERMS
    assert p.value_loss is None or p.value_loss in A.VALUE_LOSSES
    assert p.kl_loss in A.KL_ESTIMATORS and p.kl_penalty in A.KL_ESTIMATORS
    # the preset's argument overrides are accepted by the functions they target
    p.build_policy_loss()
    p.build_advantage()
    p.build_entropy()
    p.build_value_loss()
    p.build_kl_loss()
    p.build_kl_penalty()
    assert p.data_kind in ("rollout", "sft", "preference")


def _advantage_params(name: str) -> dict[str, object]:
    built = A.preset(name).build_advantage()
    assert built is not None
    return dict(built.params)


def test_default_hyperparameters_match_trinity_rft() -> None:
    ppo = A.preset("ppo").build_policy_loss().params
    assert (ppo["clip_range"], ppo["clip_ratio_c"], ppo["loss_agg_mode"]) == (0.2, 3.0, "token-mean")
    gspo = A.preset("gspo").build_policy_loss().params
    assert (gspo["clip_range_low"], gspo["clip_range_high"], gspo["loss_agg_mode"]) == (
        3e-4,
        4e-4,
        "seq-mean-token-mean",
    )
    cispo = A.preset("cispo").build_policy_loss().params
    assert (cispo["clip_range_low"], cispo["clip_range_high"]) == (1.0, 0.28)
    assert A.preset("dpo").build_policy_loss().params["beta"] == 0.1
    sapo = A.preset("sapo").build_policy_loss().params
    assert (sapo["tau_pos"], sapo["tau_neg"]) == (1.0, 1.05)
    assert A.preset("topr").build_policy_loss().params["advantage_threshold"] == 0.0
    assert _advantage_params("grpo") == {"epsilon": 1e-6, "std_normalize": True}
    gae = _advantage_params("ppo")
    assert (gae["gamma"], gae["lam"]) == (1.0, 1.0)
    assert A.preset("m2po").build_policy_loss().params == {
        "m2_threshold": 0.04, "loss_agg_mode": "token-mean", "norm_constant": None
    }  # fmt: skip
    mix = A.preset("mix").build_policy_loss().params
    assert (mix["mu"], mix["clip_range"], mix["sft_loss_agg_mode"]) == (0.1, 0.2, "seq-mean-token-mean")
    assert _advantage_params("multi_step_grpo") == {
        "epsilon": 1e-6,
        "enable_step_norm": False,
        "std_cal_level": "group",
    }
    assert _advantage_params("opmd") == {"opmd_baseline": "mean", "tau": 1.0}
    assert A.preset("opmd").build_policy_loss().params["tau"] == 1.0
    repeat = {
        n: A.preset(n).repeat_times for n in ("grpo", "opmd", "is_ppo", "m2po", "multi_step_grpo", "mix", "remax")
    }
    assert repeat == {"grpo": 2, "opmd": 2, "is_ppo": 2, "m2po": 8, "multi_step_grpo": 8, "mix": 8, "remax": 1}


def test_dapo_preset_declares_clip_higher_dynamic_sampling_and_no_kl() -> None:
    dapo = A.preset("dapo")
    params = dapo.build_policy_loss().params
    assert (params["clip_range_low"], params["clip_range_high"], params["loss_agg_mode"]) == (
        0.2,
        0.28,
        "token-mean",
    )
    assert dapo.required_buffer_operators == ("reward_std_filter",)
    assert dapo.reward_shaping == ("overlong_reward_penalty",)
    assert dapo.kl_loss == "none" and not dapo.needs_reference
    assert dapo.advantage == "grpo"


def test_requirement_flags() -> None:
    assert A.preset("ppo").needs_critic and A.preset("ppo").value_loss == "clipped"
    assert not any(A.preset(n).needs_critic for n in TRINITY_TABLE - {"ppo"})
    assert {n for n in TRINITY_TABLE if A.preset(n).needs_teacher} == {"on_policy_distill", "jsd"}
    assert A.preset("grpo").needs_reference and A.preset("dpo").needs_reference
    assert A.preset("sft").data_kind == "sft" and A.preset("sft").advantage is None
    assert A.preset("dpo").data_kind == "preference"
    assert A.preset("gigpo").advantage == "gigpo" and A.preset("mix_chord").entropy == "mix"
    assert {n for n in TRINITY_TABLE if A.preset(n).uses_expert_data} == {"mix", "mix_chord"}
    assert {n: A.preset(n).required_inputs for n in TRINITY_TABLE if A.preset(n).required_inputs} == {
        "remax": ("reward_baselines",),
        "multi_step_grpo": ("episode_ids",),
        "on_policy_distill": ("teacher_logprobs",),
        "jsd": ("teacher_logprobs",),
    }
    assert {
        n: A.preset(n).required_buffer_operators for n in TRINITY_TABLE if A.preset(n).required_buffer_operators
    } == {
        "dapo": ("reward_std_filter",),
        "raft": ("reward_filter",),
    }
    assert {n for n in TRINITY_TABLE if A.preset(n).advantage is None} == {"sft", "dpo", "raft"}
    assert A.preset("is_ppo").policy_loss == "importance_sampling" and A.preset("is_ppo").needs_reference
    assert A.preset("remax").advantage == "remax" and A.preset("multi_step_grpo").advantage == "step_wise_grpo"


def test_presets_are_frozen() -> None:
    p = A.preset("grpo")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.policy_loss = "sft"  # type: ignore[misc]
    with pytest.raises(TypeError):
        A.preset("dapo").policy_loss_args["clip_range_high"] = 1.0  # type: ignore[index]


def test_inconsistent_preset_is_rejected() -> None:
    with pytest.raises(ValueError, match="needs_reference"):
        A.AlgorithmPreset(name="x", description="", policy_loss="ppo", kl_loss="k2")
    with pytest.raises(ValueError, match="needs_critic"):
        A.AlgorithmPreset(name="x", description="", policy_loss="ppo", value_loss="clipped")
    with pytest.raises(ValueError, match="data_kind"):
        A.AlgorithmPreset(name="x", description="", policy_loss="sft", data_kind="video")  # type: ignore[arg-type]


def test_preset_overrides_reach_the_built_function() -> None:
    loss_fn = A.preset("dapo").build_policy_loss(clip_range_high=0.3)
    assert loss_fn.params["clip_range_high"] == 0.3 and loss_fn.params["clip_range_low"] == 0.2


def test_grpo_preset_end_to_end_step() -> None:
    # one GRPO step on tiny tensors: advantages, policy loss, KL loss, entropy, backward
    p = A.preset("grpo")
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False], [True, True, False]])
    advantage = p.build_advantage()
    assert advantage is not None
    adv, _ = advantage(rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), mask=mask, group_ids=torch.tensor([0, 0, 1, 1]))
    lp = torch.full((4, 3), -1.0, requires_grad=True)
    loss, metrics = p.build_policy_loss()(logprobs=lp, old_logprobs=lp.detach(), advantages=adv, mask=mask)
    kl_per_token = p.build_kl_loss()(lp, torch.full((4, 3), -1.2))
    total = loss + p.kl_loss_coef * A.agg_loss(kl_per_token, mask) + p.build_entropy()(entropies=-lp, mask=mask)[0]
    total.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    assert metrics["pg_clipfrac"] == 0.0
    # group 1 has equal rewards -> zero advantage -> its tokens get only the KL gradient
    assert torch.allclose(lp.grad[2:][mask[2:]], lp.grad[2, 0].expand(int(mask[2:].sum())))


def test_a_preset_name_is_registered_once() -> None:
    with pytest.raises(A.DuplicateNameError, match="already registered"):
        A.register_preset(dataclasses.replace(A.preset("grpo"), description="a second grpo"))


def _step_inputs(p: A.AlgorithmPreset) -> dict[str, torch.Tensor]:
    """Tensors for one tiny step of ``p``: two groups of two rows, with whatever ``p`` says it needs."""
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False], [True, True, False]])
    inputs = {
        "rewards": torch.tensor([1.0, 0.0, 0.0, 1.0]),
        "group_ids": torch.tensor([0, 0, 1, 1]),
        "mask": mask,
        "old_logprobs": torch.full((4, 3), -1.1),
        "ref_logprobs": torch.full((4, 3), -1.2),
        "values": torch.zeros(4, 3),
        "expert_mask": torch.tensor([False, False, True, False]),
    }
    extra = {
        "teacher_logprobs": torch.full((4, 3), -0.5),
        "reward_baselines": torch.tensor([0.5, 0.5, 0.5, 0.5]),
        "episode_ids": torch.tensor([0, 1, 2, 3]),
    }
    assert set(p.required_inputs) <= extra.keys(), "a new required input needs a value here"
    inputs.update({k: extra[k] for k in p.required_inputs})
    return inputs


@pytest.mark.parametrize("name", sorted(TRINITY_TABLE))
def test_every_preset_runs_one_step_with_the_inputs_it_declares(name: str) -> None:
    p = A.preset(name)
    inputs = _step_inputs(p)
    advantage = p.build_advantage()
    adv = advantage(**inputs)[0] if advantage is not None else torch.zeros(4, 3)
    assert torch.isfinite(adv).all()
    lp = torch.full((4, 3), -1.0, requires_grad=True)
    loss, metrics = p.build_policy_loss()(**{**inputs, "advantages": adv, "logprobs": lp})
    loss.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    assert lp.grad[inputs["mask"]].abs().sum() > 0, f"{name}: no gradient reaches the trained tokens"
    assert torch.all(lp.grad[~inputs["mask"]] == 0), f"{name}: gradient leaks into padding"
    assert all(isinstance(v, float) for v in metrics.values())
