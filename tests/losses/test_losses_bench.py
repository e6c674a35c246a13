"""bench/loss_memory.py runs end to end at a small size and its implementations agree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "loss_memory.py"


@pytest.mark.slow
def test_loss_memory_bench_small_run_agrees() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--tokens", "64", "--vocab", "3000", "--topk", "16", "--repeats", "1"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    header = lines[1].split()
    assert header[:2] == ["loss", "impl"] and header[-1] == "equal" and "extra/naive" in header
    summary = json.loads(lines[-1])
    assert summary["bench"] == "loss_memory" and summary["vocab"] == 3000
    cases = {k: v for k, v in summary.items() if isinstance(v, dict)}
    assert set(cases) == {
        "forward_kl_topk.ours",
        "forward_kl_topk.naive",
        "jsd.ours",
        "jsd.naive",
        "jsd.gather",
    }
    assert all(case["equal"] for case in cases.values())
    assert all(case["cpu_s"] > 0 and case["wall_s"] > 0 for case in cases.values())
