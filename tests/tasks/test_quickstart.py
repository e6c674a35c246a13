"""The README's first command, as a new user runs it: `distillery run examples/local-addition.yaml`
ends with a report in which the student's held-out accuracy rose by a clear margin.

Real everything: the prepared task, Ray, the rollout engine and the teacher engine the plan picks for a
CPU run of a 0.5M-parameter student (the transformers decode loop, the teacher's forward in the run), the
trainer. Several minutes on 2 cores.
"""

from __future__ import annotations

import json

import pytest

from tests.tasks.prepared_checks import run_example

# The first test of the session prepares the task (minutes; many more on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.local_run, pytest.mark.timeout(2400)]


def test_local_addition_example_improves_held_out_accuracy(prepared_task, tmp_path):
    evals = run_example("local-addition.yaml", prepared_task, tmp_path / "run")
    start, final = evals[0], evals[-1]
    assert start["step"] == 0 and final["step"] == 80
    manifest = json.loads((prepared_task / "manifest.json").read_text())
    assert start["eval_accuracy"] == pytest.approx(
        manifest["student"]["eval_accuracy"], abs=0.03
    )  # the run's greedy eval == the task build's HF eval
    assert final["eval_accuracy"] >= start["eval_accuracy"] + 0.25, evals
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Held-out addition accuracy" in report and f"{final['eval_accuracy']:.1%}" in report
