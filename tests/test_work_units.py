"""The suite's split between xdist workers (tests/support/work_groups.py), run on a suite of its own: the
tests that share an expensive session fixture all run on one worker, however many modules they are in,
a module's tests stay together, and the workers' OpenMP threads sleep when idle."""

from __future__ import annotations

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
    pytest_collection_modifyitems, pytest_configure, pytest_configure_node, pytest_xdist_make_scheduler,
)

@pytest.fixture(scope="session")
def vllm_server():
    return "server"
"""


def test_tests_sharing_a_server_run_on_one_worker_and_modules_stay_together(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
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
    assert len(worker) == 24, result.stdout[-3000:]
    served = {gw for test, gw in worker.items() if "test_served_" in test}
    assert len(served) == 1, f"the server's tests ran on {sorted(served)}"
    for m in range(6):
        plain = {gw for test, gw in worker.items() if f"test_plain_{m}_" in test}
        assert len(plain) == 1, f"test_m{m}.py was split over {sorted(plain)}"
    assert len(set(worker.values())) == 2, "one worker ran everything: nothing was shared out"
