"""The README's spec reference is the one the models generate, and its set-up commands are what CI runs."""

from __future__ import annotations

from pathlib import Path

from distillery.api.reference import splice

ROOT = Path(__file__).resolve().parents[2]


def test_spec_reference_is_current() -> None:
    text = (ROOT / "README.md").read_text()
    assert splice(text) == text, (
        "README spec reference is stale: run `python -m distillery.api.reference README.md`"
    )
    assert "`spec.loss.topK`" in text and "`spec.teachers[].placement`" in text


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "./scripts/setup.sh --dev && .venv/bin/pytest"
    assert command in readme and command in ci
