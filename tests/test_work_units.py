"""The suite's split between xdist workers (tests/support/work_groups.py), run on a suite of its own: the
tests that share an expensive session fixture all run on one worker, however many modules they are in,
a module's tests stay together, the node's scenarios never run beside a local run, and the workers' OpenMP
threads sleep when idle."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
from support.work_groups import (  # noqa: F401
    pytest_collection_modifyitems, pytest_configure, pytest_configure_node, pytest_terminal_summary,
    pytest_xdist_make_scheduler,
)

@pytest.fixture(scope="session")
def vllm_server():
    return "server"

@pytest.fixture(scope="session")
def node_cluster():
    return "node"

# each test's start and end: the node's tests and the local runs must never overlap
@pytest.fixture(autouse=True)
def _span(request):
    import json, time
    start = time.monotonic()
    yield
    with (request.config.rootpath / "spans.jsonl").open("a") as out:
        out.write(json.dumps([request.node.nodeid, start, time.monotonic()]) + "\\n")
"""


def test_tests_sharing_a_server_run_on_one_worker_and_modules_stay_together(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_node.py").write_text(
        "import time\n"
        + "".join(f"def test_scenario_{i}(node_cluster):\n    time.sleep(0.5)\n" for i in range(4))
    )
    for r in range(2):
        (tmp_path / f"test_local_{r}.py").write_text(
            "import time, pytest\npytestmark = pytest.mark.local_run\n"
            + "".join(f"def test_run_{r}_{i}():\n    time.sleep(0.2)\n" for i in range(2))
        )
    for m in range(6):
        # a short sleep each: the other worker is free to take work while one runs
        (tmp_path / f"test_m{m}.py").write_text(
            "import os, time\n"
            f"def test_served_{m}(vllm_server):\n    time.sleep(0.2)\n"
            "    assert os.environ['OMP_WAIT_POLICY'] == 'PASSIVE'\n"
            + "".join(f"def test_plain_{m}_{i}():\n    time.sleep(0.05)\n" for i in range(3))
        )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist", "-n", "2", "--dist", "loadscope",
         "--no-loadscope-reorder", "-v", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    worker = {test: gw for gw, test in re.findall(r"\[(gw\d)\] .*?PASSED (\S+)", result.stdout)}
    assert len(worker) == 32, result.stdout[-3000:]
    served = {gw for test, gw in worker.items() if "test_served_" in test}
    assert len(served) == 1, f"the server's tests ran on {sorted(served)}"
    for m in range(6):
        plain = {gw for test, gw in worker.items() if f"test_plain_{m}_" in test}
        assert len(plain) == 1, f"test_m{m}.py was split over {sorted(plain)}"
    assert len(set(worker.values())) == 2, "one worker ran everything: nothing was shared out"
    # the node's scenarios and the local runs: apart in time, though the local runs' modules came first
    spans = [json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    node = [(start, end) for test, start, end in spans if "test_scenario_" in test]
    local = [(start, end) for test, start, end in spans if "test_run_" in test]
    assert len(node) == 4 and len(local) == 4
    node_span = (min(s for s, _ in node), max(e for _, e in node))
    overlapping = [span for span in local if span[0] < node_span[1] and span[1] > node_span[0]]
    assert not overlapping, f"local runs {overlapping} ran beside the node's scenarios {node_span}"
    # The log ends with the units' timeline: each worker's time, then the units in the order they ran.
    summary = result.stdout.split("work units (tests/support/work_groups.py)", 1)[1].splitlines()[1:]
    assert summary[0].startswith("gw0: ran units ") and summary[1].startswith("gw1: ran units "), summary
    assert any(line.endswith("  node") for line in summary), summary


def test_the_timeline_starts_a_unit_when_its_worker_is_free_and_counts_the_waits() -> None:
    from support.work_groups import UnitTimeline

    timeline = UnitTimeline(
        spans={
            "node": ("gw0", 0.0, 1800.0),
            "a.py": ("gw1", 0.0, 600.0),
            # handed to gw1 while a.py ran (its last tests), so it ran from a.py's end
            "b.py": ("gw1", 590.0, 900.0),
            # gw1 waited: a local run may not start beside the node's scenarios
            "local.py": ("gw1", 1800.0, 2400.0),
            "unfinished.py": ("gw0", 1800.0, None),
        },
        origin=0.0,
    )
    assert timeline.lines(longest=3) == [
        "gw0: ran units 30.0 min, waited 10.0 of 40.0",
        "gw1: ran units 25.0 min, waited 15.0 of 40.0",
        "gw0   0.0- 30.0 min  node",
        "gw1   0.0- 10.0 min  a.py",
        "gw1  30.0- 40.0 min  local.py",
    ]
