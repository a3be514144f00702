"""The bearer token as every service and client reads it."""

from __future__ import annotations

from trinity.runtime.settings import ServiceSettings, auth_token


def test_a_token_read_from_a_file_with_a_trailing_newline_still_matches(monkeypatch):
    monkeypatch.setenv("TRINITY_AUTH_TOKEN", "s3cret\n")
    assert auth_token() == "s3cret"
    assert ServiceSettings.from_env("gateway").auth_token == "s3cret"


def test_an_explicit_token_wins_and_an_empty_one_means_none(monkeypatch):
    monkeypatch.setenv("TRINITY_AUTH_TOKEN", "from-env")
    assert auth_token(" given ") == "given"
    assert auth_token("") is None
    monkeypatch.delenv("TRINITY_AUTH_TOKEN")
    assert auth_token() is None
