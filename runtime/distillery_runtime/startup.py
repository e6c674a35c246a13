"""Start-up of a run: in which order its parts start, and how long each took to be ready.

The first step waits for four things: the job (its data, tokenizers, checkpoint state), the teachers
(local runs: vLLM server subprocesses), Ray, and the components (the rollout engine and the trainer
ranks, Ray actors). `startup_plan` decides once how they overlap. Now (the default, local runs): the
teacher servers are spawned first, then the job loads (in a thread) while Ray starts (in the main thread:
Ray installs signal handlers), then the actors start while the teachers finish booting, and the
teachers' health is polled every 0.25 s. Sequential (`DISTILLERY_SEQUENTIAL_STARTUP=1`, kept so that
`bench/startup.py` can measure both in one run): the job loads, then the teachers are spawned, then Ray,
polled every second, as before issue 18. In a cluster the teachers are the operator's and Ray is joined,
not started, after the job loads.

A job whose data or checkpoint folder is wrong still fails with its one line and nothing else
(tests/runtime/test_run.py). The one line the embedded Ray writes while it starts (a warning that token
authentication is on by default) is held (`held_logs`) and printed once the job has loaded. On a failure
Ray is shut down and the teacher servers stopped (they write only to their logs), so nothing is left
running; the failure comes once Ray's start is over (a few seconds) rather than before it. Naming the
mode (`RAY_AUTH_MODE=token`) would silence the warning, but fails where no token was saved before: Ray
generates one only when the mode is left unset.

On 2 cores this order measured no faster than the sequential one (bench/README.md): every start-up phase
is CPU-bound. It shortens start-up where cores are free.

`distillery run` prints one line when its first step is done, for people and for `bench/startup.py`:

    start-up: job loaded 4.1 s, ray 9.8 s, teachers ready 31.2 s, components ready 33.0 s, first step 41.7 s

Times count from the process's creation (what a user waits), not from when Python got to `main`, so
interpreter and import time are in them. Marks are printed in the order they happened.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

PREFIX = "start-up: "
SEQUENTIAL_ENV = "DISTILLERY_SEQUENTIAL_STARTUP"
_ITEM = re.compile(r"([a-z][a-z -]*?) (\d+(?:\.\d+)?) s")


@dataclass(frozen=True)
class StartupPlan:
    teachers_first: bool
    """Spawn the local teacher servers before loading the job (they boot for tens of seconds)."""
    poll_interval_s: float
    """How often the teachers' health endpoints are polled: a ready teacher waits at most this long."""
    ray_while_loading: bool = False
    """Start the embedded Ray cluster while the job loads (and shut it down if the job fails to load)."""


def startup_plan(in_cluster: bool, *, sequential: bool) -> StartupPlan:
    """How a run starts (in a cluster the teachers are the operator's, already starting)."""
    if sequential:
        return StartupPlan(teachers_first=False, poll_interval_s=1.0)
    return StartupPlan(teachers_first=not in_cluster, poll_interval_s=0.25, ray_while_loading=not in_cluster)


RAY_START_LOGGER = "ray._private.authentication.authentication_token_setup"
"""The logger of what Ray prints while it starts. Held by name: `ray.init` resets the handlers of the
`ray` logger itself, so a holder placed there is gone before the warning is logged."""


class _Holder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def held_logs(name: str) -> Iterator[list[logging.LogRecord]]:
    """Hold what logger `name` logs inside the block instead of printing it; the records are yielded for
    the caller to `replay` or drop."""
    logger = logging.getLogger(name)
    holder = _Holder()
    handlers, propagate = logger.handlers[:], logger.propagate
    logger.handlers[:] = [holder]
    logger.propagate = False  # else its parents' handlers (or logging's last resort) print them
    try:
        yield holder.records
    finally:
        logger.handlers[:] = handlers
        logger.propagate = propagate


def replay(records: list[logging.LogRecord]) -> None:
    """Hand held records to their loggers now, as if they were logged at this point."""
    for record in records:
        logging.getLogger(record.name).handle(record)


def process_started() -> float:
    """The wall-clock time this process was created, to the kernel's clock tick.

    Linux: /proc/self/stat's start time (ticks since boot) against CLOCK_BOOTTIME. psutil's create_time
    adds those ticks to the boot time, which the kernel gives in whole seconds, so it read up to a second
    early (0.9 s here); a start-up line's marks would carry that. Elsewhere psutil, or now.
    """
    try:
        with open("/proc/self/stat") as stat:
            # The fields after the command's closing parenthesis start at the third (state); the start
            # time is the 22nd.
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # an unusual platform: fall back to "since the clock was made"
        return time.time()


@dataclass
class StartupClock:
    """Named marks, in seconds since the process started."""

    origin: float = field(default_factory=process_started)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> float:
        """Record `name` now (the first time only: a mark is when a thing first became ready)."""
        return self.marks.setdefault(name, round(time.time() - self.origin, 1))

    def line(self) -> str:
        ordered = sorted(self.marks.items(), key=lambda item: item[1])
        return PREFIX + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in ordered)


def parse_line(text: str) -> dict[str, float] | None:
    """The marks of the first start-up line in `text` (a run's output), or None if it has none."""
    for line in text.splitlines():
        if line.startswith(PREFIX):
            return {name: float(seconds) for name, seconds in _ITEM.findall(line[len(PREFIX) :])}
    return None
