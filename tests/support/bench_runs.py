"""Quick runs of the benches (bench/*.py) that more than one test checks.

`bench/loss_memory.py --quick` at a small size is checked twice: its implementations agree
(tests/losses/test_losses_bench.py) and it runs twice in a row from the same checkout
(tests/test_bench_reruns.py). Its time is five fresh Python processes that import torch (~12 s on
2 idle cores, 147 s beside the node's scenarios), so the session runs it once for both: the
`quick_bench_runs` fixture (tests/conftest.py) keeps the first run of each bench with its arguments, and
the rerun test runs the second itself. The two tests then share a work unit
(`support.work_groups.SHARED_FIXTURE_UNITS`), so the run is shared on one worker.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

LOSS_MEMORY_QUICK = ("--quick", "--tokens", "64", "--vocab", "3000", "--topk", "16", "--repeats", "1")
"""bench/loss_memory.py's small CI run: every case, a vocabulary of 3,000, one repeat."""

BenchRun = Callable[[str, Sequence[str]], subprocess.CompletedProcess[str]]


def run_bench(bench: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """One fresh run of bench/`bench`.py with `args`, from the repository root (never raises on its exit
    status: the caller asserts on it)."""
    return subprocess.run(
        [sys.executable, str(BENCH / f"{bench}.py"), *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip


def first_runs() -> BenchRun:
    """`run(bench, args)`: the first run of bench/`bench`.py with `args` in this process, run on the first
    call and returned again on the later ones."""
    runs: dict[tuple[str, tuple[str, ...]], subprocess.CompletedProcess[str]] = {}

    def run(bench: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        key = (bench, tuple(args))
        if key not in runs:
            runs[key] = run_bench(bench, args)
        return runs[key]

    return run
