import dataclasses

import pytest
import torch

from trinity import algorithms as A
from trinity.algorithm_table import Preset, RowInput

_REGISTRIES = {
    "advantage": A.ADVANTAGES,
    "policy_loss": A.POLICY_LOSSES,
    "entropy_term": A.ENTROPY_TERMS,
    "value_loss": A.VALUE_LOSSES,
}


def built(p: Preset, kind: str, **overrides: object) -> A.BoundFn:
    """The preset's function of `kind` bound with its arguments (and `overrides`)."""
    name, args = p.functions()[kind]  # type: ignore[index]
    return _REGISTRIES[kind].build(name, **{**args, **overrides})


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
    for kind in p.functions():
        built(p, kind)
    A.kl(p.kl_loss)
    A.kl(p.kl_penalty)
    assert p.data_kind in ("rollout", "sft", "preference")


def _advantage_params(name: str) -> dict[str, object]:
    return dict(built(A.preset(name), "advantage").params)


def test_default_hyperparameters_match_trinity_rft() -> None:
    ppo = built(A.preset("ppo"), "policy_loss").params
    assert (ppo["clip_range"], ppo["clip_ratio_c"], ppo["loss_agg_mode"]) == (0.2, 3.0, "token-mean")
    gspo = built(A.preset("gspo"), "policy_loss").params
    assert (gspo["clip_range_low"], gspo["clip_range_high"], gspo["loss_agg_mode"]) == (
        3e-4,
        4e-4,
        "seq-mean-token-mean",
    )
    cispo = built(A.preset("cispo"), "policy_loss").params
    assert (cispo["clip_range_low"], cispo["clip_range_high"]) == (1.0, 0.28)
    assert built(A.preset("dpo"), "policy_loss").params["beta"] == 0.1
    sapo = built(A.preset("sapo"), "policy_loss").params
    assert (sapo["tau_pos"], sapo["tau_neg"]) == (1.0, 1.05)
    assert built(A.preset("topr"), "policy_loss").params["advantage_threshold"] == 0.0
    assert _advantage_params("grpo") == {"epsilon": 1e-6, "std_normalize": True}
    gae = _advantage_params("ppo")
    assert (gae["gamma"], gae["lam"]) == (1.0, 1.0)
    assert built(A.preset("m2po"), "policy_loss").params == {
        "m2_threshold": 0.04, "loss_agg_mode": "token-mean", "norm_constant": None
    }  # fmt: skip
    mix = built(A.preset("mix"), "policy_loss").params
    assert (mix["mu"], mix["clip_range"], mix["sft_loss_agg_mode"]) == (0.1, 0.2, "seq-mean-token-mean")
    assert _advantage_params("multi_step_grpo") == {
        "epsilon": 1e-6,
        "enable_step_norm": False,
        "std_cal_level": "group",
    }
    assert _advantage_params("opmd") == {"opmd_baseline": "mean", "tau": 1.0}
    assert built(A.preset("opmd"), "policy_loss").params["tau"] == 1.0
    repeat = {
        n: A.preset(n).repeat_times for n in ("grpo", "opmd", "is_ppo", "m2po", "multi_step_grpo", "mix", "remax")
    }
    assert repeat == {"grpo": 2, "opmd": 2, "is_ppo": 2, "m2po": 8, "multi_step_grpo": 8, "mix": 8, "remax": 1}


def test_dapo_preset_declares_clip_higher_dynamic_sampling_and_no_kl() -> None:
    dapo = A.preset("dapo")
    params = built(dapo, "policy_loss").params
    assert (params["clip_range_low"], params["clip_range_high"], params["loss_agg_mode"]) == (
        0.2,
        0.28,
        "token-mean",
    )
    assert dapo.operators == ("overlong_reward_penalty", "reward_std_filter")
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
    assert {n: A.preset(n).requires for n in TRINITY_TABLE if A.preset(n).requires} == {
        "remax": {RowInput.REWARD_BASELINES},
        "multi_step_grpo": {RowInput.EPISODE_IDS},
        "gigpo": {RowInput.EPISODE_IDS, RowInput.STATE_KEYS, RowInput.STEP_REWARDS},
        "mix": {RowInput.EXPERT_MASK},
        "mix_chord": {RowInput.EXPERT_MASK},
    }
    assert {n: A.preset(n).operators for n in TRINITY_TABLE if A.preset(n).operators} == {
        "dapo": ("overlong_reward_penalty", "reward_std_filter"),
        "raft": ("reward_filter",),
    }
    assert {n for n in TRINITY_TABLE if not A.preset(n).online} == {"sft", "dpo"}
    assert {n for n in TRINITY_TABLE if A.preset(n).greedy_baseline} == {"remax"}
    assert {n for n in TRINITY_TABLE if A.preset(n).advantage is None} == {"sft", "dpo", "raft"}
    assert A.preset("is_ppo").policy_loss == "importance_sampling" and A.preset("is_ppo").needs_reference
    assert A.preset("remax").advantage == "remax" and A.preset("multi_step_grpo").advantage == "step_wise_grpo"


def test_presets_are_frozen() -> None:
    p = A.preset("grpo")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.policy_loss = "sft"  # type: ignore[misc]
    with pytest.raises(TypeError):
        A.preset("dapo").policy_loss_args["clip_range_high"] = 1.0  # type: ignore[index]


def test_derived_facts_follow_the_functions() -> None:
    assert Preset(name="x", description="", policy_loss="ppo", kl_loss="k2").needs_reference
    assert Preset(name="x", description="", policy_loss="ppo", value_loss="clipped").needs_critic
    assert not Preset(name="x", description="", policy_loss="ppo").needs_reference
    with pytest.raises(ValueError, match="not a valid RowInput"):
        Preset(name="x", description="", policy_loss="ppo", requires=frozenset({"state_keys"}))  # type: ignore[arg-type]


def test_preset_overrides_reach_the_built_function() -> None:
    loss_fn = built(A.preset("dapo"), "policy_loss", clip_range_high=0.3)
    assert loss_fn.params["clip_range_high"] == 0.3 and loss_fn.params["clip_range_low"] == 0.2


def test_grpo_preset_end_to_end_step() -> None:
    # one GRPO step on tiny tensors: advantages, policy loss, KL loss, entropy, backward
    p = A.preset("grpo")
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False], [True, True, False]])
    adv, _ = built(p, "advantage")(
        rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), mask=mask, group_ids=torch.tensor([0, 0, 1, 1])
    )
    lp = torch.full((4, 3), -1.0, requires_grad=True)
    loss, metrics = built(p, "policy_loss")(logprobs=lp, old_logprobs=lp.detach(), advantages=adv, mask=mask)
    kl_per_token = A.kl(p.kl_loss)(lp, torch.full((4, 3), -1.2))
    total = (
        loss + p.kl_loss_coef * A.agg_loss(kl_per_token, mask) + built(p, "entropy_term")(entropies=-lp, mask=mask)[0]
    )
    total.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    assert metrics["pg_clipfrac"] == 0.0
    # group 1 has equal rewards -> zero advantage -> its tokens get only the KL gradient
    assert torch.allclose(lp.grad[2:][mask[2:]], lp.grad[2, 0].expand(int(mask[2:].sum())))


def test_a_preset_name_is_registered_once() -> None:
    with pytest.raises(A.DuplicateNameError, match="already registered"):
        A.register_preset(dataclasses.replace(A.preset("grpo"), description="a second grpo"))


def _step_inputs() -> dict[str, torch.Tensor]:
    """Tensors for one tiny step: two groups of two rows, with every input some function reads."""
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False], [True, True, False]])
    return {
        "rewards": torch.tensor([1.0, 0.0, 0.0, 1.0]),
        "group_ids": torch.tensor([0, 0, 1, 1]),
        "mask": mask,
        "old_logprobs": torch.full((4, 3), -1.1),
        "ref_logprobs": torch.full((4, 3), -1.2),
        "values": torch.zeros(4, 3),
        "expert_mask": torch.tensor([False, False, True, False]),
        "teacher_logprobs": torch.full((4, 3), -0.5),
        "reward_baselines": torch.tensor([0.5, 0.5, 0.5, 0.5]),
        "episode_ids": torch.tensor([0, 1, 2, 3]),
        "step_group_ids": torch.tensor([0, 0, 1, 1]),
        "step_rewards": torch.tensor([1.0, 0.0, 0.0, 1.0]),
    }


@pytest.mark.parametrize("name", sorted(TRINITY_TABLE))
def test_every_preset_runs_one_step_with_exactly_the_inputs_it_declares(name: str) -> None:
    p = A.preset(name)
    inputs = _step_inputs()
    adv = torch.zeros(4, 3)
    if p.advantage is not None:
        advantage = built(p, "advantage")
        adv = advantage(**advantage.given(inputs))[0]
    assert torch.isfinite(adv).all()
    lp = torch.full((4, 3), -1.0, requires_grad=True)
    loss_fn = built(p, "policy_loss")
    loss, metrics = loss_fn(**loss_fn.given({**inputs, "advantages": adv, "logprobs": lp}))
    loss.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    assert lp.grad[inputs["mask"]].abs().sum() > 0, f"{name}: no gradient reaches the trained tokens"
    assert torch.all(lp.grad[~inputs["mask"]] == 0), f"{name}: gradient leaks into padding"
    assert all(isinstance(v, float) for v in metrics.values())
