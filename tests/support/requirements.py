"""What a test needs of the machine it runs on, beyond the repository: without it the test skips with
the reason; with `CI=true` it fails the run instead, as the control plane's and the node's fixtures do
(tests/cluster/conftest.py, tests/workloads/conftest.py): CI's machine provides all of it (it runs the
suite as root), so a test that cannot run there is a broken machine or a broken test, never a pass."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    """Skip with `reason`, or fail with it under `CI=true`."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test, but {reason}", pytrace=False)
    pytest.skip(reason)


def require_root(purpose: str) -> None:
    """Run on only as root (e.g. `purpose` = "mounting a size-limited tmpfs")."""
    if os.geteuid() != 0:
        unavailable(f"{purpose} needs root (euid {os.geteuid()})")
