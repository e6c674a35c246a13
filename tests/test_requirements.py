"""A test that needs more of the machine than the repository (tests/support/requirements.py) skips with
its reason on a developer's machine and fails under `CI=true`, where it must run."""

from __future__ import annotations

import os

import pytest
from support.requirements import require_root


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_root_only_test_skips_without_root_and_fails_under_ci(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome) as caught:
        require_root("mounting a size-limited tmpfs")
    assert caught.type is outcome  # Failed is not a Skipped, nor the reverse
    reason = "mounting a size-limited tmpfs needs root (euid 1000)"
    assert caught.value.msg == (f"CI must run this test, but {reason}" if ci else reason)


def test_root_runs_a_root_only_test(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    require_root("mounting a size-limited tmpfs")  # neither skips nor fails
