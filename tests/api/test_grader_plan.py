"""The grader half of the resolved plan (`distillery.plan.grader`): which grader a job uses, `auto` decided,
and the regex check that `distillery validate` makes beyond the API's rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from api.corpus import mutated
from distillery_cli.main import main as cli_main

from distillery.api import GraderName
from distillery.plan import GraderKind, GraderPlan, resolve
from distillery.plan.grader import pattern_refusal, synthetic_task
from distillery.validation import parse_job


def grader_of(base: dict[str, Any], **data: Any) -> GraderPlan:
    return resolve(parse_job(mutated(base, {f"spec.data.{k}": v for k, v in data.items()})).spec).grader


@pytest.mark.parametrize(
    ("train", "kind", "name"),
    [
        ("synthetic://addition/train", GraderKind.TASK, "addition"),
        ("synthetic://fibonacci/train", GraderKind.TASK, "fibonacci"),
        ("/data/gsm8k/train.parquet", GraderKind.EXACT, "exact"),
        ("s3://bucket/train.jsonl", GraderKind.EXACT, "exact"),
    ],
)
def test_auto_is_the_synthetic_tasks_grader_else_exact(
    base_manifest: dict[str, Any], train: str, kind: GraderKind, name: str
) -> None:
    plan = grader_of(base_manifest, train={"path": train})
    assert (plan.kind, plan.name) == (kind, name)


def test_a_named_grader_is_used_as_named_even_on_synthetic_data(base_manifest: dict[str, Any]) -> None:
    plan = grader_of(base_manifest, train={"path": "synthetic://addition/train"}, grader={"name": "gsm8k"})
    assert plan == GraderPlan(GraderKind.GSM8K)
    assert plan.name == "gsm8k"


def test_regex_and_module_carry_their_settings(base_manifest: dict[str, Any]) -> None:
    regex = grader_of(base_manifest, grader={"name": "regex", "pattern": "answer: (-?[0-9]+)"})
    assert regex == GraderPlan(GraderKind.REGEX, pattern="answer: (-?[0-9]+)")
    module = grader_of(base_manifest, grader={"name": "module", "function": "my_graders:grade"})
    assert module == GraderPlan(GraderKind.MODULE, function="my_graders:grade")


def test_every_named_grader_but_auto_has_a_kind() -> None:
    # The plan's kinds mirror the API's names: a name added to the API without a kind would fail here.
    assert {n.value for n in GraderName} - {"auto"} == {k.value for k in GraderKind} - {"task"}


def test_synthetic_task() -> None:
    assert synthetic_task("synthetic://addition/eval") == "addition"
    assert synthetic_task("/data/synthetic://x") is None


def test_pattern_refusal_is_pythons_re() -> None:
    assert pattern_refusal(GraderPlan(GraderKind.REGEX, pattern="answer: (\\d+")) == (
        "not a Python regular expression: missing ), unterminated subpattern at position 8"
    )
    # A look-ahead is Python's (RE2 has none): the API server could not have judged it.
    assert pattern_refusal(GraderPlan(GraderKind.REGEX, pattern="(?<=answer: )\\d+")) is None
    assert pattern_refusal(GraderPlan(GraderKind.EXACT)) is None


def test_validate_refuses_a_pattern_python_cannot_compile(
    tmp_path: Path, base_manifest: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = mutated(base_manifest, {"spec.data.grader": {"name": "regex", "pattern": "(unclosed"}})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert cli_main(["validate", str(path)]) == 1
    assert capsys.readouterr().out.strip() == (
        f"{path}: spec.data.grader.pattern: not a Python regular expression: "
        "missing ), unterminated subpattern at position 0"
    )
