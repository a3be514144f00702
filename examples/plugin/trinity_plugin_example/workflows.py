"""A workflow subclasses Trinity's `Workflow` (here the built-in single-turn one) and registers itself.

The entry point names this module: importing it runs the decorator, which registers the class.
"""

from __future__ import annotations

from trinity.explorer.workflows import WORKFLOWS
from trinity.explorer.workflows.single_turn import MathWorkflow
from trinity.v1 import common_pb2


@WORKFLOWS.register("spell_backwards")
class SpellBackwardsWorkflow(MathWorkflow):
    """Asks for the task's word spelled backwards; scored by `exact_match` unless the task names a reward."""

    default_reward = "exact_match"

    def prompt_text(self, task: common_pb2.Task) -> str:
        return f"Spell the word {task.prompt!r} backwards. Reply with the reversed word only."
