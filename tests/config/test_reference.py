"""docs/config.md is the schema's reference page: generated, complete, and never stale."""

from __future__ import annotations

from pathlib import Path

from trinity.config.reference import COMMAND, render, sections

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_docs_config_md_matches_the_schema():
    assert PAGE.read_text() == render(), f"docs/config.md is stale; regenerate it: {COMMAND}"


def test_every_key_has_a_one_line_meaning():
    missing = [
        f"{s.path or '(top level)'}.{name}"
        for s in sections()
        for name, field in s.model.model_fields.items()
        if not field.description or "\n" in field.description
    ]
    assert missing == [], "add Field(description=...) (one line) to these keys"


def test_a_key_row_gives_type_default_and_meaning():
    row = next(line for line in render().splitlines() if line.startswith("| `claim_idle_ms` |"))
    assert row == (
        "| `claim_idle_ms` | int | `600000` | pending entries idle this long are reclaimed by the next reader |"
    )
