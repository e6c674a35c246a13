"""bench/gpu_check.py cannot rot between the sessions that are lent a GPU: its CPU form runs every check here
(the same runtime code with gloo for NCCL, float32 for bfloat16, shared memory where a GPU has CUDA IPC),
in a process of its own with Ray and vLLM blocked on import as on the lent machines; and whatever fails,
a check or the set-up, the one JSON line is still printed, naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = {
    "fsdp_step",
    "object_store_sync",
    "streamed_export",
    "sharded_checkpoint",
    "sharded_load",
    "ipc_sync",
    "losses",
    "lora_step",
}


def run_check(*args: str) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result.returncode, json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.slow
def test_every_check_passes_in_its_cpu_form(tmp_path: Path) -> None:
    code, summary, stderr = run_check("--device", "cpu", "--output", str(tmp_path / "summary.json"))
    assert code == 0 and summary["ok"], stderr[-4000:]
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    checks = summary["checks"]
    assert set(checks) == CHECKS and all(c["ok"] and c["seconds"] >= 0 for c in checks.values())
    assert summary["backend"] == checks["fsdp_step"]["backend"] == "gloo"
    for name in ("object_store_sync", "streamed_export", "sharded_checkpoint", "sharded_load", "ipc_sync"):
        assert checks[name]["exact"] is True, name
    assert checks["ipc_sync"]["chosen"] == "shm"  # CUDA IPC needs one GPU for both processes
    assert checks["sharded_load"]["chunks"] > 1  # several broadcasts, as a real load takes
    losses = checks["losses"]
    assert {"k1", "k2", "k3", "abs", "forward_kl_topk", "reverse_kl_topk", "jsd"} <= set(losses)
    assert losses["worst_relative_error"] < 1e-3


def test_a_set_up_that_fails_still_prints_the_line_with_its_error() -> None:
    code, summary, _ = run_check("--device", "cuda")  # this machine has no CUDA
    assert code == 1 and summary["ok"] is False
    assert summary["error"] and summary["checks"] == {}


def test_a_run_past_its_budget_still_prints_the_line_naming_it() -> None:
    code, summary, _ = run_check("--device", "cpu", "--budget-s", "0.5")  # torch alone takes longer to import
    assert code == 1 and summary["ok"] is False
    assert summary["error"] == "the run passed its 0.5 s budget"
    assert all(not c["ok"] for c in summary["checks"].values())


def test_a_failing_check_is_recorded_and_the_next_one_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import gpu_check

    def broken() -> dict[str, Any]:
        raise ValueError("the weights differ\nsecond line")

    results: dict[str, dict[str, Any]] = {}
    gpu_check.guarded(results, "broken", broken)
    gpu_check.guarded(results, "fine", lambda: {"figure": 1})
    assert results["broken"]["ok"] is False and results["broken"]["error"] == "ValueError: the weights differ"
    assert results["fine"] == {"ok": True, "figure": 1, "seconds": results["fine"]["seconds"]}


def test_docs_gpu_md_names_only_tests_and_scripts_that_exist() -> None:
    """docs/gpu.md's CPU twins and GPU scripts: each file it names exists, and each test function in it."""
    import re

    text = (ROOT / "docs" / "gpu.md").read_text()
    named = set(re.findall(r"`((?:tests|bench)/[\w/.-]+\.py)(?:::(\w+))?", text))
    assert len(named) > 10
    for path, function in named:
        assert (ROOT / path).exists(), path
        if function:
            assert f"def {function}(" in (ROOT / path).read_text(), f"{path}::{function}"
