"""Start-up of a run: in which order its parts start, and how long each took to be ready.

The first step waits for four things: the job (its data, tokenizers, checkpoint state), the teachers
(local runs: vLLM server subprocesses), Ray, and the components (the rollout engine and the trainer
ranks, Ray actors). `startup_plan` decides once how they overlap. Now (the default, local runs): the
teacher servers are spawned first, then the job loads while they boot, then Ray starts, then the actors
start while the teachers finish booting, and the teachers' health is polled every 0.25 s. Sequential
(`DISTILLERY_SEQUENTIAL_STARTUP=1`, kept so that `bench/startup.py` can measure both in one run): the job
loads, then the teachers are spawned, then Ray, polled every second, as before issue 18. In a cluster the
teachers are the operator's and Ray is joined after the job loads.

Ray starts after the job has loaded, not beside it: a job whose data, tokenizer, grader or folders are
wrong then fails with its one line in 13 s (22 s while a Ray start that was then shut down ran beside
it), and the teacher servers it spawned are stopped. The overlap saved nothing on 2 cores
(bench/README.md: every start-up phase is CPU-bound), and where cores are free a run with local teacher
servers still starts Ray while they boot, which is the longer wait.

`distillery run` prints one line when its first step is done, for people and for `bench/startup.py`:

    start-up: job loaded 4.1 s, ray 9.8 s, teachers ready 31.2 s, components ready 33.0 s, first step 41.7 s

Times count from the process's creation (what a user waits), not from when Python got to `main`, so
interpreter and import time are in them. Marks are printed in the order they happened.
"""

from __future__ import annotations

import os
import re
import time
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


def startup_plan(in_cluster: bool, *, sequential: bool) -> StartupPlan:
    """How a run starts (in a cluster the teachers are the operator's, already starting)."""
    if sequential:
        return StartupPlan(teachers_first=False, poll_interval_s=1.0)
    return StartupPlan(teachers_first=not in_cluster, poll_interval_s=0.25)


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
