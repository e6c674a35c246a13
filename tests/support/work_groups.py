"""How the suite is split between its two pytest-xdist workers (the default: `-n 2`, pyproject.toml's addopts).

Most of the suite's time is spent waiting on servers, pods and training runs, so two workers fill the cores
one leaves idle. What must not be split: the tests that share an expensive session fixture (the node, the
control plane, the vLLM server, the prepared addition task) run on one worker, so each starts once, and
the tests of a module stay together (its module fixtures start once too). Each such set is a work unit;
the longest are handed out first, so none is left to run alone at the end.

What must not run at once: the node's scenarios (a cluster's pods) beside a local run (a Ray cluster and its
vLLM engines, tests marked `local_run`). On the 24 GB host the two together ran out of memory: Ray's monitor
killed a local run's workers at 22.1 of 23.5 GB. So the scheduler never hands a worker a unit that would run
beside one it clashes with on another worker; that worker takes the next unit that does not clash, or waits.

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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from distillery.plan.env.threads import sleeping_threads_env

GROUPS_KEY = "distillery_work_groups"
"""The key of each worker's input that names the file of units (`FILE`, in the session's base temp folder)."""
FILE = "work-units.json"

LOCAL_RUN = "local_run"
"""The marker of a test that starts a local run: it holds several GiB for minutes."""
NODE_UNIT = "node"

# A test that uses one of these session fixtures runs in the fixture's unit (the first that matches).
SHARED_FIXTURE_UNITS = {
    "node_cluster": NODE_UNIT,
    "control_plane": "control-plane",
    "vllm_server": "vllm",
    "prepared_task": "addition-task",
    "quick_bench_runs": "quick-benches",
}
# The units handed out first, longest first (minutes each in `--durations`). The node's scenarios (~27 minutes)
# start at once: the other worker meanwhile runs what may run beside them (a local run may not), the
# control plane's and the vLLM server's tests and the rest. Then the local runs, the two task builds first.
FIRST_UNITS = (
    NODE_UNIT,
    # The worked-sum build (~28 minutes from an empty cache on a loaded 2-core machine; one process, one
    # thread): beside the node's scenarios, where no local run may go.
    "tests/tasks/test_worked_sum_prepared.py",
    "tests/tasks/test_fibonacci_prepared.py",
    "tests/tasks/test_chat_math_prepared.py",
    # The tools build (~3 minutes on 2 idle cores, one process, one thread; not a local run).
    "tests/tasks/test_tools_task.py",
    "control-plane",
    "vllm",
    "addition-task",
    "tests/runtime/test_run.py",
)


def work_unit(item: pytest.Item) -> str:
    """The unit a test runs in: its shared fixture's, else its module's. A local run against the session's
    vLLM server is its module's: it waits for the node's scenarios to end, and the server's other tests
    need not wait with it."""
    names = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker(LOCAL_RUN):
        names.discard("vllm_server")
    shared = [unit for fixture, unit in SHARED_FIXTURE_UNITS.items() if fixture in names]
    return shared[0] if shared else module_of(item.nodeid)


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def clash(unit: str, other: str, local_runs: frozenset[str]) -> bool:
    """Whether two units must not run at once: the node's beside a local run."""
    pair = {unit, other}
    return NODE_UNIT in pair and bool(pair & local_runs)


def pytest_configure(config: pytest.Config) -> None:
    """With workers: OpenMP threads that sleep once their region ends, in every process the session starts.
    torch's default keeps them spinning for a while, and two workers that train at once (the task builds)
    each ran 5x slower beside the other's spinning threads (two processes of small matmuls on the two
    cores: 1.6 s alone, 8.6 s each side by side, 2.7 s each with PASSIVE). Set before the workers start,
    which inherit it; the caller's own setting wins. The local runs the workers start inherit it too, in
    place of a local run's short spin (`distillery.plan.env.threads`): two of them may run side by side,
    where a spin of any length steals the other's cores."""
    config.addinivalue_line(
        "markers", f"{LOCAL_RUN}: starts a local run; never runs beside the node's scenarios"
    )
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
    local_runs = sorted({units[item.nodeid] for item in items if item.get_closest_marker(LOCAL_RUN)})
    rank = {unit: index for index, unit in enumerate(FIRST_UNITS)}
    items.sort(key=lambda item: rank.get(units[item.nodeid], len(FIRST_UNITS)))
    path = Path(config.workerinput[GROUPS_KEY])
    # aside, then renamed: the controller never reads a half-written file
    handle, aside = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(handle, "w") as out:
        json.dump({"units": units, "local_runs": local_runs}, out)
    os.replace(aside, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The controller: xdist's load-scope scheduler with the workers' units as its scopes, which hands a
    worker the first unit in order that clashes with none still pending on another worker."""
    from xdist.scheduler import LoadScopeScheduling

    path = config._tmp_path_factory.getbasetemp() / FILE  # type: ignore[attr-defined]

    class WorkUnitScheduling(LoadScopeScheduling):
        units: dict[str, str] | None = None
        local_runs: frozenset[str] = frozenset()
        timeline = UnitTimeline()

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                # read once every worker has collected: scopes are first asked for when scheduling starts
                written = json.loads(path.read_text())
                self.units, self.local_runs = written["units"], frozenset(written["local_runs"])
            return self.units.get(nodeid) or module_of(nodeid)

        def _clashes(self, node: Any, unit: str) -> bool:
            return any(
                clash(unit, other, self.local_runs) and not all(tests.values())
                for worker, workload in self.assigned_work.items() if worker is not node
                for other, tests in workload.items()
            )  # fmt: skip

        def _assign_work_unit(self, node: Any) -> None:
            unit = next((unit for unit in self.workqueue if not self._clashes(node, unit)), None)
            if unit is None:
                return  # every unit left clashes: this worker waits until the other's ends
            tests = self.workqueue.pop(unit)
            self.assigned_work.setdefault(node, {})[unit] = tests
            self.timeline.started(unit, node.gateway.id)
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in tests.items() if not done])

        def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
            super().mark_test_complete(node, item_index, duration)
            for unit, tests in self.assigned_work.get(node, {}).items():
                if all(tests.values()):
                    self.timeline.ended(unit)
            # a unit that ends may free a waiting worker (or, with the queue empty, let it shut down)
            for other in self.nodes:
                if other is not node:
                    self._reschedule(other)

    config.stash[TIMELINE] = WorkUnitScheduling.timeline
    return WorkUnitScheduling(config, log)


@dataclass
class UnitTimeline:
    """When each unit was handed to its worker and when its last test ended (seconds since the first unit
    was handed out): what CI's log shows of where its time went, at the very end, where a truncated log
    still has it."""

    spans: dict[str, tuple[str, float, float | None]] = field(default_factory=dict)
    origin: float | None = None

    def started(self, unit: str, worker: str) -> None:
        now = time.monotonic()
        self.origin = now if self.origin is None else self.origin
        self.spans[unit] = (worker, now - self.origin, None)

    def ended(self, unit: str) -> None:
        worker, start, end = self.spans[unit]
        if end is None:
            self.spans[unit] = (worker, start, time.monotonic() - (self.origin or 0.0))

    def lines(self, longest: int = 12) -> list[str]:
        """Per worker: its busy minutes and the minutes it waited with nothing to run (a unit that clashed
        with the other's, or none left); then the longest units, in the order they ran."""
        runs: list[tuple[str, str, float, float]] = []  # worker, unit, start, end
        for worker in sorted({w for w, _, _ in self.spans.values()}):
            handed = sorted((a, b, u) for u, (w, a, b) in self.spans.items() if w == worker and b is not None)
            previous = 0.0
            for assigned, end, unit in handed:
                # A worker is handed its next unit while its last tests run; it starts once those end.
                start = max(assigned, previous)
                runs.append((worker, unit, start, end))
                previous = end
        if not runs:
            return []
        total = max(end for *_, end in runs)
        out = []
        for worker in sorted({w for w, *_ in runs}):
            busy = sum(end - start for w, _, start, end in runs if w == worker)
            out.append(
                f"{worker}: ran units {busy / 60:.1f} min, waited {(total - busy) / 60:.1f} of {total / 60:.1f}"
            )
        top = sorted(runs, key=lambda run: run[3] - run[2], reverse=True)[:longest]
        for worker, unit, start, end in sorted(top, key=lambda run: run[2]):
            out.append(f"{worker} {start / 60:5.1f}-{end / 60:5.1f} min  {unit}")
        return out


TIMELINE = pytest.StashKey[UnitTimeline]()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The controller, last of the summaries: the work units' timeline."""
    timeline = config.stash.get(TIMELINE, None)
    if timeline is not None and (lines := timeline.lines()):
        terminalreporter.write_sep("=", "work units (tests/support/work_groups.py)")
        for line in lines:
            terminalreporter.write_line(line)
