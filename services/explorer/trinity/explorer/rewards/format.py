"""The `format` reward: does the response follow the required layout (tags or a regex)?"""

from __future__ import annotations

import re

from trinity.explorer.rewards.base import REWARDS
from trinity.v1 import common_pb2

# The R1-style layout: reasoning in <think>, final answer in <answer>, nothing else around them.
DEFAULT_FORMAT = r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$"


@REWARDS.register("format")
def format_reward(response_text: str, task: common_pb2.Task) -> float:
    """1.0 if the whole response matches the task's `payload.format_pattern` (default: think/answer tags)."""
    pattern = DEFAULT_FORMAT
    if "format_pattern" in task.payload.fields:
        pattern = task.payload.fields["format_pattern"].string_value
    return 1.0 if re.fullmatch(pattern, response_text, flags=re.DOTALL) else 0.0


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last `<tag>...</tag>` in `text`, or None."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None
