"""Every figure the docs publish is a recorded run (issue 62, item 4).

`bench/results/headlines.yaml` names, for each headline figure README.md, docs/ and bench/README.md quote,
the results file it comes from and the JSON path of each of its numbers. Here: every results file parses as
its extension says, each row's numbers are in its file and, as the doc formats them, in the doc's text, and
each results file's provenance names a commit this checkout has. The last tests hand the same checks tmp
files that break each rule (a results file that is not JSON, a figure missing from its file, a number that
differs from the doc's, an unknown commit), so CI sees each check fail where it should.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.published import (
    REGISTRY,
    Headline,
    headline_problems,
    load_registry,
    results_files,
    unknown_commits,
    unparsable,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ROWS = load_registry(ROOT / REGISTRY).headlines


def in_git_checkout() -> bool:
    try:
        proc = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True)
    except OSError:
        return False
    return proc.returncode == 0


def commit_exists(commit: str) -> bool:
    proc = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    return proc.returncode == 0


def test_every_results_file_parses() -> None:
    assert len(list(results_files(RESULTS))) > 10, "bench/results/ lost its files?"
    assert unparsable(RESULTS) == []


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.doc}:{r.quote[:40]}")
def test_each_headline_is_in_its_results_file_and_its_doc(row: Headline) -> None:
    assert headline_problems(row, ROOT) == []


def test_the_registry_covers_each_doc_that_quotes_results() -> None:
    # The docs named in the issue each have rows; a registry that lost them would pass every row's test.
    assert {"README.md", "docs/guide/examples.md", "bench/README.md"} <= {row.doc for row in ROWS}


def test_each_results_file_names_a_commit_that_exists() -> None:
    if not in_git_checkout():
        pytest.skip("NOT CHECKED: not a git checkout, so no commit can be looked up (a source tarball?)")
    assert unknown_commits(RESULTS, commit_exists) == []


# The checks fail where they should, on tmp files that break one rule each.


def test_a_results_file_that_is_not_json_fails(tmp_path: Path) -> None:
    (tmp_path / "good.json").write_text('{"bench": "x"}')
    (tmp_path / "rows.jsonl").write_text('{"step": 0}\n\n{"step": 1}\n')
    assert unparsable(tmp_path) == []
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "bad.json").write_text("done\n")  # what e2e_vs_trl's de2567b file held
    (tmp_path / "bad.jsonl").write_text('{"step": 0}\n{"step": 1\n')
    problems = unparsable(tmp_path)
    assert len(problems) == 2, problems
    assert "bad.json: not JSON" in problems[1] and "bad.jsonl: not JSONL" in problems[0]


def _row(tmp_path: Path, doc: str, record: dict, **row: object) -> Headline:
    (tmp_path / "README.md").write_text(doc)
    (tmp_path / "run.json").write_text(json.dumps(record))
    return Headline.model_validate({"doc": "README.md", "file": "run.json", **row})


def test_a_headline_found_in_its_file_and_doc_passes(tmp_path: Path) -> None:
    doc = "held-out accuracy went from 24.4% to\n85.0% in 80 steps, 0.045 (94 KB)."
    record = {"start": 0.244140625, "curve": [[0, 0.244], [80, 0.8496]], "bytes": 94208, "r": 0.04452}
    numbers = [
        {"path": "start", "format": "{:.1%}"},
        {"path": "curve.1.1", "format": "{:.1%}"},
        {"path": "bytes", "format": "{:.0f} KB", "scale": 1e-3},
        {"path": "r", "format": "{:.3f}"},
    ]
    quote = "24.4% to 85.0% in 80 steps, 0.045 (94 KB)"  # the doc's line break is a space
    assert headline_problems(_row(tmp_path, doc, record, quote=quote, numbers=numbers), tmp_path) == []


def test_a_headline_missing_from_its_file_fails(tmp_path: Path) -> None:
    row = _row(
        tmp_path, "went to 85.0%", {"start_accuracy": 0.24}, quote="went to 85.0%",
        numbers=[{"path": "end_accuracy", "format": "{:.1%}"}],
    )  # fmt: skip
    (problem,) = headline_problems(row, tmp_path)
    assert "run.json has no end_accuracy" in problem


def test_a_headline_whose_number_differs_from_its_file_fails(tmp_path: Path) -> None:
    row = _row(
        tmp_path, "went to 85.0%", {"end_accuracy": 0.8125}, quote="went to 85.0%",
        numbers=[{"path": "end_accuracy", "format": "{:.1%}"}],
    )  # fmt: skip
    (problem,) = headline_problems(row, tmp_path)
    assert "'81.2%', not in the quote" in problem


def test_a_headline_the_doc_no_longer_says_fails(tmp_path: Path) -> None:
    row = _row(
        tmp_path, "went to 90.0%", {"end_accuracy": 0.85}, quote="went to 85.0%",
        numbers=[{"path": "end_accuracy", "format": "{:.1%}"}],
    )  # fmt: skip
    (problem,) = headline_problems(row, tmp_path)
    assert "not in README.md as quoted" in problem


def test_a_headline_whose_file_is_gone_or_not_json_fails(tmp_path: Path) -> None:
    row = _row(tmp_path, "went to 85.0%", {}, quote="went to 85.0%", numbers=[{"path": "end_accuracy"}])
    (tmp_path / "run.json").write_text("done\n")
    assert "does not parse" in headline_problems(row, tmp_path)[0]
    (tmp_path / "run.json").unlink()
    assert "does not exist" in headline_problems(row, tmp_path)[0]


def test_a_results_file_naming_an_unknown_commit_fails(tmp_path: Path) -> None:
    known = {"f0678df"}
    (tmp_path / "a.json").write_text(json.dumps({"commit": "f0678df+dirty", "machine": {}}))
    (tmp_path / "old.json").write_text(json.dumps({"bench": "x"}))  # no provenance: nothing to check
    assert unknown_commits(tmp_path, known.__contains__) == []
    (tmp_path / "b.json").write_text(json.dumps({"commit": "c839a43", "machine": {}}))
    (tmp_path / "c.json").write_text(json.dumps({"commit": None, "machine": {}}))  # outside git
    problems = unknown_commits(tmp_path, known.__contains__)
    assert len(problems) == 2, problems
    assert "c839a43 is in no history" in problems[0] and "without a commit" in problems[1]
