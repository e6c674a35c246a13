"""Every example a user may copy is valid for the CLI and for the generated CRD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from distillery_cli.main import main as cli_main
from support.openapi import validate as crd_validate

from distillery.validation import load_jobs

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"standalone-teacher", "multi-teacher", "external-teacher", "colocated-teacher", "gkd"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_valid(path: Path, crd_schema: dict[str, Any]) -> None:
    assert cli_main(["validate", "-q", str(path)]) == 0
    jobs = load_jobs(path)
    assert jobs
    for document in yaml.safe_load_all(path.read_text()):
        assert crd_validate({"metadata": document["metadata"], "spec": document["spec"]}, crd_schema) == []


def test_examples_are_commented() -> None:
    for path in EXAMPLES:
        assert path.read_text().lstrip().startswith("#"), (
            f"{path.name} should open with a comment for new users"
        )
