"""The README's first command, as a new user runs it: `distillery run examples/local-addition.yaml`
ends with a report in which the student's held-out accuracy rose by a clear margin.

Real everything: the prepared task, Ray, the vLLM rollout engine, the teacher as a loopback vLLM
teacher server, the trainer. Several minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The first test of the session prepares the task (minutes; many more on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]


def test_local_addition_example_improves_held_out_accuracy(prepared_task, tmp_path):
    env = {
        **os.environ,
        "DISTILLERY_CACHE": str(prepared_task.parent.parent),
    }  # reuse the session's preparation
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "distillery_cli", "run", str(ROOT / "examples" / "local-addition.yaml"), "-o", str(out), "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    start, final = evals[0], evals[-1]
    print("held-out accuracy by step:", [(e["step"], e["eval_accuracy"]) for e in evals])  # shown with -rP
    assert start["step"] == 0 and final["step"] == 80
    manifest = json.loads((prepared_task / "manifest.json").read_text())
    assert start["eval_accuracy"] == pytest.approx(
        manifest["student"]["eval_accuracy"], abs=0.03
    )  # vLLM == HF
    assert final["eval_accuracy"] >= start["eval_accuracy"] + 0.25, evals
    report = (out / "report.md").read_text()
    assert "Held-out accuracy" in report and f"{final['eval_accuracy']:.1%}" in report
