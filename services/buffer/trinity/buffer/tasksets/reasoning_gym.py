"""Rows made by reasoning-gym's generators (`source: reasoning_gym`), mixed by weight by its composite dataset.

Row i is composite entry i, JSON-safe (tuples become lists): `question`, `answer`, `metadata`, and `reasoning_gym`
= `{generator, config, index}`, what made it: the explorer's `reasoning_gym` reward makes the entry again from
those and scores the answer with that generator's own `score_answer`. The rows depend on seed and size only, so a
buffer that restarts makes the same ones again.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from trinity.buffer.rows import Row, select_rows
from trinity.config import TaskSetConfig
from trinity.config.buffer import ReasoningGymConfig
from trinity.runtime.errors import InvalidArgument

COMPOSITE = "composite"  # reasoning-gym's mixer is registered beside the generators; it is none itself


def generator_names() -> list[str]:
    """Every generator reasoning-gym has, sorted (imports reasoning-gym: about 2 s the first time)."""
    from reasoning_gym.factory import DATASETS

    return sorted(name for name in DATASETS if name != COMPOSITE)


def generator_kwargs(config: ReasoningGymConfig, position: int) -> dict[str, Any]:
    """What reasoning-gym's composite makes the generator at `position` with: its config, a seed, the size."""
    return {**config.generators[position].config, "seed": config.seed + position + 1, "size": config.size}


def generated_rows(taskset: TaskSetConfig, where: str = "") -> list[Row]:
    """The task set's rows, filtered and cut to its limit like a file's; `where` prefixes the field an error names."""
    assert taskset.reasoning_gym is not None  # TaskSetConfig checks: source reasoning_gym has the section
    rows = make_rows(taskset.reasoning_gym, f"{where}reasoning_gym.")
    return select_rows(rows, taskset.filters, taskset.limit, where)


def make_rows(config: ReasoningGymConfig, where: str = "") -> list[Row]:
    """`config.size` rows from the composite of `config.generators`; InvalidArgument names a bad name or config."""
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    check_generators(config, where)
    specs = [DatasetSpec(name=g.name, weight=g.weight, config=dict(g.config)) for g in config.generators]
    positions = {g.name: k for k, g in enumerate(config.generators)}
    try:
        composite = CompositeDataset(CompositeConfig(size=config.size, seed=config.seed, datasets=specs))
    except Exception as err:  # noqa: BLE001 - a generator refusing its config, in reasoning-gym's words
        raise InvalidArgument(f"{where}generators", f"reasoning-gym refused them: {_said(err)}") from None
    rows: list[Row] = []
    for index in range(config.size):
        try:
            entry = composite[index]
        except Exception as err:  # noqa: BLE001 - a generator that fails on this config
            raise InvalidArgument(f"{where}generators", f"reasoning-gym failed on row {index}: {_said(err)}") from None
        name = entry["metadata"]["source_dataset"]
        made_by = {"generator": name, "config": generator_kwargs(config, positions[name]), "index": index}
        row = {"question": entry["question"], "answer": entry["answer"], "metadata": entry["metadata"]}
        rows.append(json.loads(json.dumps({**row, "reasoning_gym": made_by}, default=str)))
    return rows


def check_generators(config: ReasoningGymConfig, where: str = "") -> None:
    """InvalidArgument naming the first generator that reasoning-gym lacks or whose config its dataclass refuses."""
    from reasoning_gym.factory import DATASETS

    for position, generator in enumerate(config.generators):
        field = f"{where}generators[{position}]"
        if generator.name == COMPOSITE or generator.name not in DATASETS:
            known = ", ".join(generator_names())
            raise InvalidArgument(
                f"{field}.name", f"unknown reasoning-gym generator {generator.name!r}; known: {known}"
            )
        config_class = DATASETS[generator.name][1]
        fields = sorted(f.name for f in dataclasses.fields(config_class) if f.name not in ("seed", "size"))
        unknown = sorted(set(generator.config) - set(fields))
        if unknown:
            raise InvalidArgument(
                f"{field}.config", f"{generator.name} has no field {unknown[0]!r}; its fields: {', '.join(fields)}"
            )
        try:
            made = config_class(**generator_kwargs(config, position))
            if callable(getattr(made, "validate", None)):
                made.validate()
        except Exception as err:  # noqa: BLE001 - the config's own checks are assertions, mostly
            raise InvalidArgument(f"{field}.config", f"{generator.name} refuses it: {_said(err)}") from None


def _said(err: Exception) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
