"""Failpoints: inert unless armed, and an armed one stops exactly one process, once."""

from __future__ import annotations

import os

import pytest

from trinity.runtime import failpoints


def test_a_failpoint_without_the_directory_setting_does_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.arm(tmp_path, "x.y")
    failpoints.failpoint("x.y")
    assert (tmp_path / "x.y").exists()  # still armed: nobody looked


def test_an_armed_failpoint_is_reached_once_and_names_the_process(monkeypatch, tmp_path):
    monkeypatch.setenv(failpoints.ENV, str(tmp_path))
    failpoints.arm(tmp_path, "x.y", pause_s=0)
    failpoints.failpoint("x.y")
    assert failpoints.reached_by(tmp_path, "x.y", timeout=1) == os.getpid()
    assert not (tmp_path / "x.y").exists()  # disarmed: a replacement with the same settings passes through
    failpoints.failpoint("x.y")


def test_waiting_for_a_failpoint_nobody_reaches_ends_with_its_name(tmp_path):
    with pytest.raises(TimeoutError, match=r"failpoint x\.y"):
        failpoints.reached_by(tmp_path, "x.y", timeout=0)
