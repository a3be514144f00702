r"""The `reasoning_gym` reward: a generated task scored by its reasoning-gym generator's own `score_answer`.

The buffer writes what made each row of a `source: reasoning_gym` task set into the task's payload
(`reasoning_gym: {generator, config, index}`). The reward makes that generator again (cached) and its entry
`index`: the exact entry, with the Python types (ints, tuples) that the payload's JSON form does not keep and some
generators compare against. An entry whose question is not the task's means the buffer and the explorer run
different reasoning-gym versions: the reward fails rather than score against the wrong entry.

The answer is reasoning-gym's convention, the last `<answer>...</answer>` of the response, else its last
`\boxed{}`; with neither the score is the generator's for no answer (0). An answer the generator cannot even
read (its `score_answer` raises) scores 0 too.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Any

from google.protobuf import json_format

from trinity.config.buffer import whole_numbers_to_ints
from trinity.explorer.rewards.base import REWARDS
from trinity.explorer.rewards.math import extract_boxed
from trinity.v1 import common_pb2


def response_answer(response_text: str) -> str | None:
    r"""The last `<answer>...</answer>` (reasoning-gym's `extract_answer`), else the last `\boxed{}`, else None."""
    from reasoning_gym.utils import extract_answer

    answer = extract_answer(response_text)
    return answer if answer is not None else extract_boxed(response_text)


@lru_cache(maxsize=64)
def _generator(name: str, kwargs_json: str) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, **json.loads(kwargs_json))


@lru_cache(maxsize=1024)  # the repeats of one task are scored one after another
def _entry(name: str, kwargs_json: str, index: int) -> dict[str, Any]:
    return _generator(name, kwargs_json)[index]  # type: ignore[no-any-return]


def task_entry(task: common_pb2.Task) -> tuple[Any, dict[str, Any]]:
    """(the generator, the entry) that made `task`, from its payload's `reasoning_gym` part."""
    fields = task.payload.fields
    if "reasoning_gym" not in fields:
        raise ValueError(
            f"task {task.id!r} has no payload.reasoning_gym: the reasoning_gym reward scores the tasks of a task set "
            "with source reasoning_gym"
        )
    made_by = whole_numbers_to_ints(json_format.MessageToDict(fields["reasoning_gym"].struct_value))
    name, kwargs_json = str(made_by["generator"]), json.dumps(made_by["config"], sort_keys=True)
    entry = copy.deepcopy(_entry(name, kwargs_json, int(made_by["index"])))
    question = fields["question"].string_value if "question" in fields else entry["question"]
    if entry["question"] != question:
        raise ValueError(
            f"task {task.id!r}: {name} made another question for row {made_by['index']} here than in the buffer; "
            "run the same reasoning-gym version in both (constraints.txt pins it)"
        )
    return _generator(name, kwargs_json), entry


@REWARDS.register("reasoning_gym")
def reasoning_gym_reward(response_text: str, task: common_pb2.Task) -> float:
    """The task's generator's `score_answer` of the response's answer (reasoning-gym scores lie in [0, 1])."""
    generator, entry = task_entry(task)
    try:
        return float(generator.score_answer(response_answer(response_text), entry))
    except Exception:  # noqa: BLE001 - an answer the generator cannot read is a wrong answer, not a failed sample
        return 0.0
