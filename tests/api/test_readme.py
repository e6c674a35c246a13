"""The spec reference (docs/reference/spec.md) is the one the models generate, and the README's set-up
commands are what CI runs."""

from __future__ import annotations

from pathlib import Path

from distillery.api.reference import START, splice

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "reference" / "spec.md"


def test_spec_reference_is_current() -> None:
    text = SPEC.read_text()
    assert START in text, "docs/reference/spec.md lost its spec-reference markers"
    assert splice(text) == text, (
        "the spec reference is stale: run `python -m distillery.api.reference docs/reference/spec.md`"
    )
    assert "`spec.loss.topK`" in text and "`spec.teachers[].placement`" in text


def test_readme_links_the_spec_reference_instead_of_holding_it() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "spec-reference:start" not in readme
    assert "(docs/reference/spec.md)" in readme


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "./scripts/setup.sh --dev && .venv/bin/pytest"
    assert command in readme and command in ci


def test_readme_has_exactly_the_two_setup_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    setups = [line for line in readme.splitlines() if line.startswith("./scripts/setup.sh")]
    assert setups == [
        "./scripts/setup.sh && .venv/bin/distillery run examples/local-addition.yaml",
        "./scripts/setup.sh --dev && .venv/bin/pytest",
    ]
