"""How the suite is split between two pytest-xdist workers (`pytest -n 2 --dist loadscope --no-loadscope-reorder`).

Most of the suite's time is spent waiting on servers, pods and training runs, so two workers fill the cores
one leaves idle. What must not be split: the tests that share an expensive session fixture (the node, the
control plane, the vLLM server, the prepared addition task) run on one worker, so each starts once, and
the tests of a module stay together (its module fixtures start once too). Each such set is a work unit;
the longest are handed out first, so none is left to run alone at the end.

A unit needs the tests' fixtures, which only the workers see (they collect; the controller that hands out
the work gets node ids). So every worker writes its collection's units to a file the controller names
(`GROUPS_KEY` in each worker's input), and the controller's scheduler reads them. xdist's own
`--dist loadgroup` suffixes node ids with a group name, which pytest 9.2's structured node ids no longer
allow.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from distillery.plan.host_threads import sleeping_threads_env

GROUPS_KEY = "distillery_work_groups"
"""The key of each worker's input that names the file of units (`FILE`, in the session's base temp folder)."""
FILE = "work-units.json"

# A test that uses one of these session fixtures runs in the fixture's unit (the first that matches).
SHARED_FIXTURE_UNITS = {
    "node_cluster": "node",
    "control_plane": "control-plane",
    "vllm_server": "vllm",
    "prepared_task": "addition-task",
}
# The units handed out first, longest first (minutes each in `--durations`): the two task builds, the vLLM
# server's and the control plane's tests, then the node's scenarios (~20 minutes), late enough that the
# image build started at collection (niced: it takes the cores the tests leave idle) is done by then.
FIRST_UNITS = (
    "tests/tasks/test_fibonacci_prepared.py",
    "tests/tasks/test_chat_math_prepared.py",
    "vllm",
    "control-plane",
    "node",
    "addition-task",
    "tests/runtime/test_run.py",
)


def work_unit(item: pytest.Item) -> str:
    """The unit a test runs in: its shared fixture's, else its module's."""
    names = set(getattr(item, "fixturenames", ()))
    shared = [unit for fixture, unit in SHARED_FIXTURE_UNITS.items() if fixture in names]
    return shared[0] if shared else module_of(item.nodeid)


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_configure(config: pytest.Config) -> None:
    """With workers: OpenMP threads that sleep once their region ends, in every process the session starts.
    torch's default keeps them spinning for a while, and two workers that train at once (the task builds)
    each ran 5x slower beside the other's spinning threads (two processes of small matmuls on the two
    cores: 1.6 s alone, 8.6 s each side by side, 2.7 s each with PASSIVE). Set before the workers start,
    which inherit it; the caller's own setting wins."""
    if getattr(config.option, "numprocesses", None):
        os.environ.update(sleeping_threads_env(os.environ))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """The controller: where each worker writes the work units of its collection."""
    node.workerinput[GROUPS_KEY] = str(node.config._tmp_path_factory.getbasetemp() / FILE)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A worker, after every other reordering: the items in the order their units are handed out, and the
    units written where the controller reads them (every worker collects, orders and writes the same). In
    one process the order stays as collected (the image build hides behind the earlier tests)."""
    if not hasattr(config, "workerinput"):
        return
    units = {item.nodeid: work_unit(item) for item in items}
    rank = {unit: index for index, unit in enumerate(FIRST_UNITS)}
    items.sort(key=lambda item: rank.get(units[item.nodeid], len(FIRST_UNITS)))
    path = Path(config.workerinput[GROUPS_KEY])
    # aside, then renamed: the controller never reads a half-written file
    handle, aside = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(handle, "w") as out:
        json.dump(units, out)
    os.replace(aside, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The controller: xdist's load-scope scheduler with the workers' units as its scopes."""
    from xdist.scheduler import LoadScopeScheduling

    path = config._tmp_path_factory.getbasetemp() / FILE  # type: ignore[attr-defined]

    class WorkUnitScheduling(LoadScopeScheduling):
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                # read once every worker has collected: scopes are first asked for when scheduling starts
                self.units = json.loads(path.read_text())
            return self.units.get(nodeid) or module_of(nodeid)

    return WorkUnitScheduling(config, log)
