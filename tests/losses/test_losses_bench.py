"""bench/loss_memory.py runs end to end at a small size and its implementations agree."""

from __future__ import annotations

import json

import pytest
from support.bench_runs import LOSS_MEMORY_QUICK, BenchRun


@pytest.mark.slow
def test_loss_memory_bench_small_run_agrees(quick_bench_runs: BenchRun) -> None:
    # the session's one run of it, which tests/test_bench_reruns.py runs a second time
    proc = quick_bench_runs("loss_memory", LOSS_MEMORY_QUICK)
    assert proc.returncode == 0, proc.stderr[-3000:]
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
