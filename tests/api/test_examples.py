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


TEACHERS = sorted((EXAMPLES[0].parent / "teachers").glob("*.yaml"))


@pytest.mark.parametrize("path", TEACHERS, ids=[p.name for p in TEACHERS])
def test_teacher_example_validates_and_renders(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`distillery validate` and `render` take DistillationTeachers as they take jobs: render prints its
    NetworkPolicy, its clients Secret (no job's key digest yet), its Deployment (at minReplicas, where the
    operator makes it) and Service."""
    assert cli_main(["validate", str(path)]) == 0
    assert f"{path}: valid (" in capsys.readouterr().err
    assert cli_main(["render", str(path)]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    teacher = yaml.safe_load(path.read_text())
    assert [o["kind"] for o in objects] == ["NetworkPolicy", "Secret", "Deployment", "Service"]
    assert objects[2]["spec"]["replicas"] == teacher["spec"]["scaling"]["minReplicas"]


def test_a_bad_teacher_manifest_gets_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    teacher = yaml.safe_load(TEACHERS[0].read_text())
    teacher["spec"]["scaling"] = {"minReplicas": 3, "maxReplicas": 2}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(teacher))
    assert cli_main(["validate", str(bad)]) != 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"{bad}: spec.scaling.minReplicas: ") and "maxReplicas" in line
