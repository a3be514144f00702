import dataclasses

import pytest
import torch

from trinity import algorithms as A

TRINITY_TABLE = {
    "ppo", "grpo", "dapo", "gspo", "rloo", "reinforceplusplus", "sft", "dpo", "mix_chord", "rec", "topr",
    "sppo", "asymre", "cispo", "sapo", "on_policy_distill", "jsd", "gigpo",
}  # fmt: skip


def test_every_algorithm_type_of_the_trinity_table_has_a_preset() -> None:
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
    assert A.preset("grpo").build_advantage().params == {"epsilon": 1e-6, "std_normalize": True}
    gae = A.preset("ppo").build_advantage().params
    assert (gae["gamma"], gae["lam"]) == (1.0, 1.0)


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
    adv, _ = p.build_advantage()(
        rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), mask=mask, group_ids=torch.tensor([0, 0, 1, 1])
    )
    lp = torch.full((4, 3), -1.0, requires_grad=True)
    loss, metrics = p.build_policy_loss()(logprobs=lp, old_logprobs=lp.detach(), advantages=adv, mask=mask)
    kl_per_token = p.build_kl_loss()(lp, torch.full((4, 3), -1.2))
    total = loss + p.kl_loss_coef * A.agg_loss(kl_per_token, mask) + p.build_entropy()(entropies=-lp, mask=mask)[0]
    total.backward()
    assert torch.isfinite(lp.grad).all()
    assert metrics["pg_clipfrac"] == 0.0
    # group 1 has equal rewards -> zero advantage -> its tokens get only the KL gradient
    assert torch.allclose(lp.grad[2:][mask[2:]], lp.grad[2, 0].expand(int(mask[2:].sum())))


def test_a_preset_name_is_registered_once() -> None:
    with pytest.raises(A.DuplicateNameError, match="already registered"):
        A.register_preset(dataclasses.replace(A.preset("grpo"), description="a second grpo"))
