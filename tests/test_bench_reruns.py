"""Every bench/*.py runs again from the same checkout and always ends with its JSON line.

Each bench's entry point goes through `bench/_common.py`'s `json_main`, which ends stdout with the bench's
own summary or `{"bench": ..., "error": ...}`; a bench that starts jobs writes to a folder of its own per run
(`run_folder`). The benches whose quick form is cheap (well under a minute of a 2-core host: tiny models,
a few processes) run twice in a row here, the second into the same output folder as the first, and both
runs must end with a parseable JSON line that reports no error (`QUICK`):

- loss_memory (`--quick` at a small size: five fresh processes that import torch);
- gpu_sync (`--device cpu --smoke`, one round: 64 MB between two processes through shared memory).

The rest, and why not:

- quick forms of minutes, each a real `distillery run` or more: e2e_vs_trl (a few minutes of steps per
  system, twice), examples (a bundled example's whole run), lora (four runs, A B B A), quality (~15 min),
  shared_teacher (~6 min), startup (two runs a round), student_base (two runs with vLLM engines);
- a vLLM engine or teacher server started per case (its start alone ~30-60 s here): cpu_teacher_engines,
  rollout_engines, rollout_sync, teacher_scoring, gpu_breakdown (its CPU form runs the vLLM rollout engine;
  tests/runtime/test_gpu_breakdown_bench.py runs that part);
- steps of real-size models: trainer_attention (an 11.5M student over eight widths; two widths used a minute
  of CPU here without finishing), trainer_logits (a 151,936-row vocabulary: 48 s a step here),
  length_groups (an 11.5M student and a 37M teacher), scale and host_memory (110M and 203M students on 2
  and 4 gloo ranks: GBs and minutes);
- gpu_scale (`--device cpu --tiny`: two cases, each a fresh process with a one-rank gloo FSDP2 group): one
  run took over the test's 300 s on this 2-core host beside other work (2026-12-08);
- gpu_check: its CPU form runs every check once (tests/runtime/test_gpu_check.py, ~a minute or more
  beside the suite); twice more here would double that;
- operator_scale (--quick: 50 jobs and a 35 s idle window, per side);
- ray_idle and ray_startup: no output folder of their own, so a rerun here would write
  bench/results/<bench>/DATE.json into the checkout.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.bench_runs import LOSS_MEMORY_QUICK, BenchRun, run_bench

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
BENCHES = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


@pytest.fixture(scope="module")
def common():
    sys.path.insert(0, str(BENCH))
    try:
        import _common
    finally:
        sys.path.remove(str(BENCH))
    return _common


def last_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "no output"
    summary = json.loads(lines[-1])
    assert isinstance(summary, dict)
    return summary


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.stem)
def test_every_bench_ends_through_json_main(bench: Path) -> None:
    text = bench.read_text()
    assert re.search(
        rf'\nif __name__ == "__main__":\n    raise SystemExit\(json_main\("{bench.stem}", main[,)]', text
    ), f"{bench.name}: its entry point is not `raise SystemExit(json_main({bench.stem!r}, main))`"
    # "wrote PATH" goes to stderr: on stdout it would follow the summary
    assert not re.search(r'print\(f"wrote \{\w+\}"\)', text), "a last line that is not JSON"


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake_bench.py"
    path.write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "from _common import json_main\n"
        f"def main():\n{body}\n"
        'if __name__ == "__main__":\n    raise SystemExit(json_main("fake", main))\n'
    )
    return path


@pytest.mark.parametrize(
    ("body", "code", "error"),
    [
        ('    print("table")\n    print(json.dumps({"bench": "fake", "x": 1}))\n    return 0', 0, None),
        ('    print("table")\n    raise RuntimeError("the shared setup failed")', 1, "RuntimeError: the shared setup failed"),
        ('    print(json.dumps({"bench": "fake", "x": 1}))\n    return 2', 2, "exited 2"),
        ('    print("wrote results/x.json")\n    return 0', 1, "ended without its JSON summary"),
        ('    sys.exit("no model here")', 1, "exited 1: no model here"),
    ],
    ids=["summary", "exception", "nonzero-after-summary", "no-summary", "exit-message"],
)  # fmt: skip
def test_json_main_always_ends_with_a_json_line(tmp_path, body, code, error) -> None:
    proc = subprocess.run(
        [sys.executable, str(_script(tmp_path, body))], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == code, proc.stderr
    summary = last_json(proc.stdout)
    assert summary["bench"] == "fake" and summary.get("error") == error
    if '"x": 1' in body:
        assert summary["x"] == 1  # what was measured before the failure is kept


def test_each_run_gets_a_folder_of_its_own(common, tmp_path) -> None:
    first = common.run_folder(tmp_path / "bench-x")
    time.sleep(1.1)
    second = common.run_folder(tmp_path / "bench-x")
    assert first != second and first.is_dir() and second.is_dir()
    assert (tmp_path / "bench-x" / "latest").resolve() == second.resolve()


QUICK: dict[str, tuple[str, ...]] = {
    # bench -> its quick arguments ("{out}": the output folder both runs write into)
    "loss_memory": LOSS_MEMORY_QUICK,
    "gpu_sync": ("--device", "cpu", "--smoke", "--rounds", "1", "--output", "{out}"),
}


@pytest.mark.slow
@pytest.mark.parametrize("bench", sorted(QUICK))
def test_a_quick_bench_runs_twice_in_a_row(bench: str, quick_bench_runs: BenchRun, tmp_path: Path) -> None:
    args = tuple(arg.replace("{out}", str(tmp_path / "out")) for arg in QUICK[bench])
    # loss_memory's first run is the session's (tests/losses/test_losses_bench.py checks it too); the second,
    # and both runs of the others, here
    first = quick_bench_runs if bench == "loss_memory" else run_bench
    for attempt, run in ((1, first), (2, run_bench)):
        proc = run(bench, args)
        summary = last_json(proc.stdout)
        assert proc.returncode == 0 and "error" not in summary, (attempt, summary, proc.stderr[-2000:])
        assert summary["bench"] == bench


@pytest.fixture(scope="module")
def shared_teacher():
    sys.path.insert(0, str(BENCH))
    try:
        import shared_teacher
    finally:
        sys.path.remove(str(BENCH))
    return shared_teacher


def test_shared_teacher_says_why_a_missed_target_cannot_hold_beside_other_work(shared_teacher) -> None:
    def use(others: float) -> dict[str, float]:
        return {"busy_cores": 2.0, "own_cores": 2.0 - others, "others_cores": others}

    busy = shared_teacher.why_not_met(
        {"shared": [use(0.9)], "dedicated": [use(0.1)]}, 0.71, {"job-a": 1.16, "job-b": 1.23}
    )
    assert busy.startswith("replica-s per step ratio 0.71 > 0.6, run beside other work")
    assert "shared: 2.00 of" in busy and "0.90 by other processes" in busy
    idle = shared_teacher.why_not_met(
        {"shared": [use(0.0)], "dedicated": [use(0.0)]}, 0.7, {"job-a": 1.0, "job-b": 1.4}
    )
    assert idle.startswith(
        "replica-s per step ratio 0.70 > 0.6; job-b step time 1.40x > 1.3x with no other work"
    )


def test_shared_teacher_measures_the_machine_over_a_window(shared_teacher) -> None:
    meter = shared_teacher.CpuMeter()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass
    result = meter.result()
    assert set(result) == {"seconds", "busy_cores", "own_cores", "others_cores", "load_start", "load_end"}
    assert result["own_cores"] > 0 and result["busy_cores"] >= 0 and result["others_cores"] >= 0
