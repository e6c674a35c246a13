"""The CRD, the rendered objects and the local launch plans equal the golden copy taken before the
refactor of issue 15 (tests/golden/snapshot.py says how it was made)."""

from __future__ import annotations

import difflib

import pytest
from golden.snapshot import GOLDEN, snapshot

CURRENT = snapshot()


def test_golden_files_are_exactly_the_snapshot() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.yaml")) == sorted(CURRENT)


@pytest.mark.parametrize("name", sorted(CURRENT))
def test_output_is_byte_identical(name: str) -> None:
    golden = (GOLDEN / name).read_text()
    diff = "".join(
        difflib.unified_diff(golden.splitlines(True), CURRENT[name].splitlines(True), name, "now", n=2)
    )
    assert CURRENT[name] == golden, f"{name} changed:\n{diff[:4000]}"
