"""The `algorithm` section and the algorithm a run resolves to, from `trinity.algorithm_table` (no torch).

`resolve_algorithm` is the one place where a preset, the functions' defaults and the config's overrides meet: the
trainer builds its functions from the result, and `trinity check` prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from trinity.algorithm_table import FUNCTIONS, FunctionKind, Preset
from trinity.algorithm_table import PRESETS as TABLE
from trinity.config.base import _Section
from trinity.config.registered import AlgorithmName, KLEstimatorName, LossOverrides
from trinity.registry import Registry

# The `algorithm_type` names: the table's presets, and those a package adds through the entry-point group
# `trinity.algorithms` (a `Preset` each).
PRESETS: Registry[Preset] = Registry("algorithm")
for _preset in TABLE.values():
    PRESETS.register(_preset.name)(_preset)

Overrides = dict[str, float | int | str | bool]
OVERRIDE_FIELDS: Mapping[FunctionKind, str] = MappingProxyType(
    {"advantage": "advantage", "policy_loss": "policy_loss", "entropy_term": "entropy", "value_loss": "value_loss"}
)
FIELD_KINDS: Mapping[str, FunctionKind] = MappingProxyType({field: kind for kind, field in OVERRIDE_FIELDS.items()})


def check_overrides(kind: FunctionKind, name: str, overrides: Mapping[str, Any]) -> None:
    """Refuse an override that is not a hyperparameter of the built-in function `name`, or of another type than
    its default. A plugin's function declares its hyperparameters where it registers; the trainer checks those."""
    spec = FUNCTIONS.get((kind, name))
    if spec is None:
        return
    for key, value in overrides.items():
        if key not in spec.params:
            accepted = ", ".join(sorted(spec.params)) or "(none)"
            raise ValueError(f"{kind.replace('_', ' ')} {name!r} has no hyperparameter {key!r}; accepted: {accepted}")
        default = spec.params[key]
        if default is not None and not _same_type(default, value):
            raise ValueError(f"{key}: {name!r} takes a {type(default).__name__} (default {default!r}), got {value!r}")


def _same_type(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, int | float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


class AlgorithmConfig(_Section):
    """An algorithm preset (`trinity.algorithm_table`) by name, with keyword overrides of its functions."""

    algorithm_type: AlgorithmName = Field(default="grpo", description="the preset: advantage, policy loss, KL, entropy")
    repeat_times: int | None = Field(
        default=None, ge=1, le=1024, description="samples per task (the group size); None = the preset's"
    )
    advantage: Overrides = Field(default_factory=dict, description="keyword overrides of the preset's advantage")
    policy_loss: LossOverrides = Field(
        default_factory=dict, description="keyword overrides of the preset's policy loss"
    )
    entropy: LossOverrides = Field(default_factory=dict, description="keyword overrides of the preset's entropy term")
    value_loss: LossOverrides = Field(
        default_factory=dict, description="keyword overrides of the preset's value loss (critic presets)"
    )
    kl_coef: float | None = Field(default=None, ge=0, description="KL-loss weight; None = the preset's")
    entropy_coef: float | None = Field(default=None, description="entropy-term weight; None = the preset's")
    kl_penalty: KLEstimatorName | None = Field(
        default=None, description="KL estimator subtracted from the token rewards ('none' = off); None = the preset's"
    )
    kl_penalty_coef: float | None = Field(default=None, ge=0, description="KL-penalty weight; None = the preset's")
    kl_controller: Literal["fixed", "adaptive"] = Field(
        default="fixed",
        description="adaptive: the KL coefficient (the penalty's when on, else the loss's) follows kl_target",
    )
    kl_target: float = Field(default=0.1, gt=0, description="adaptive KL controller: the KL it steers toward")
    kl_horizon: int = Field(default=10000, ge=1, description="adaptive KL controller: samples over which it adapts")
    teacher_model: str = Field(
        default="",
        validate_default=True,  # a distilling preset refuses the default
        description="Hugging Face directory of the teacher (on_policy_distill, jsd); same vocabulary",
    )
    expert_data_ratio: float = Field(
        default=0.5, ge=0, lt=1, description="mode both, mix_chord: share of each train batch taken from offline_data"
    )

    @property
    def preset(self) -> Preset:
        return PRESETS.get(self.algorithm_type)

    @property
    def group_size(self) -> int:
        """Samples per task: `repeat_times` when set, else the preset's."""
        return self.repeat_times if self.repeat_times is not None else self.preset.repeat_times

    # Field validators (not one model validator), so that an error names its field: `algorithm.kl_penalty: ...`.
    # `algorithm_type` is declared first, so it is validated (or failed) before each of them runs.
    @field_validator("advantage", "policy_loss", "entropy", "value_loss")
    @classmethod
    def _overrides_fit_the_preset(cls, overrides: Overrides, info: ValidationInfo) -> Overrides:
        p = _preset_of(info)
        kind = FIELD_KINDS[str(info.field_name)]
        chosen = p.functions() if p is not None else {}
        if overrides and p is not None and kind not in chosen:
            raise ValueError(f"{p.name!r} has no {kind.replace('_', ' ')} to override")
        if overrides and kind in chosen:
            check_overrides(kind, chosen[kind][0], overrides)
        return overrides

    @field_validator("kl_penalty")
    @classmethod
    def _penalty_needs_rewards(cls, penalty: str | None, info: ValidationInfo) -> str | None:
        p = _preset_of(info)
        if penalty not in (None, "none") and p is not None and not p.online:
            raise ValueError(f"{p.name!r} trains on {p.data_kind} data, which has no rewards")
        return penalty

    @field_validator("teacher_model")
    @classmethod
    def _teacher_when_distilling(cls, teacher: str, info: ValidationInfo) -> str:
        p = _preset_of(info)
        if p is not None and p.needs_teacher and not teacher:
            raise ValueError(f"{p.name!r} distills from a teacher; give its model directory")
        return teacher


def _preset_of(info: ValidationInfo) -> Preset | None:
    """The preset named by the section being validated; None when its name failed (that error is reported)."""
    name = info.data.get("algorithm_type")
    return PRESETS.get(name) if name is not None else None


@dataclass(frozen=True)
class ResolvedAlgorithm:
    """What a run trains with: the preset's functions with their effective arguments (defaults, then the preset's,
    then the config's), its KL terms and coefficients, and whether a reference model runs."""

    preset: Preset
    functions: Mapping[FunctionKind, tuple[str, Mapping[str, Any]]]
    kl_loss: str | None
    kl_coef: float
    kl_penalty: str | None
    kl_penalty_coef: float
    needs_reference: bool
    group_size: int


def resolve_algorithm(config: AlgorithmConfig) -> ResolvedAlgorithm:
    p = config.preset
    functions: dict[FunctionKind, tuple[str, Mapping[str, Any]]] = {}
    for kind, (name, preset_args) in p.functions().items():
        spec = FUNCTIONS.get((kind, name))
        defaults = dict(spec.params) if spec is not None else {}
        args = {**defaults, **preset_args, **getattr(config, OVERRIDE_FIELDS[kind])}
        if kind == "entropy_term" and config.entropy_coef is not None:
            args["entropy_coef"] = config.entropy_coef
        functions[kind] = (name, MappingProxyType(args))
    kl_coef = float(p.kl_loss_coef if config.kl_coef is None else config.kl_coef) if p.kl_loss != "none" else 0.0
    penalty = p.kl_penalty if config.kl_penalty is None else config.kl_penalty
    # A zero KL weight makes the reference model dead weight (a whole extra forward pass); skip it.
    needs_reference = kl_coef > 0 or p.data_kind == "preference" or penalty != "none"
    return ResolvedAlgorithm(
        preset=p,
        functions=MappingProxyType(functions),
        kl_loss=p.kl_loss if p.kl_loss != "none" else None,
        kl_coef=kl_coef,
        kl_penalty=penalty if penalty != "none" else None,
        kl_penalty_coef=float(p.kl_penalty_coef if config.kl_penalty_coef is None else config.kl_penalty_coef),
        needs_reference=needs_reference,
        group_size=config.group_size,
    )
