"""The start-up plan (what starts concurrently) and the start-up line `bench/startup.py` reads."""

from __future__ import annotations

import subprocess
import sys
import time

from distillery_runtime.run.startup import (
    PREFIX,
    StartupClock,
    StartupPlan,
    parse_line,
    startup_plan,
)


def test_local_runs_spawn_the_teachers_first_and_poll_often():
    assert startup_plan(in_cluster=False, sequential=False) == StartupPlan(
        teachers_first=True, poll_interval_s=0.25
    )


def test_in_a_cluster_there_are_no_teachers_to_spawn():
    assert not startup_plan(in_cluster=True, sequential=False).teachers_first


def test_marks_count_from_the_process_start_and_keep_the_first_time():
    clock = StartupClock(origin=time.time() - 10)
    first = clock.mark("ray")
    assert 10 <= first < 12
    clock.marks["job loaded"] = 4.25
    assert clock.mark("ray") == first  # a second mark does not move the first
    assert clock.line() == f"{PREFIX}job loaded 4.2 s, ray {first:.1f} s"


def test_the_origin_is_when_the_process_was_created():
    # A fresh process, so that the bounds are known: a test worker's own start can be hours back (a 78-min
    # CI run's worker was 64 min old when this read its origin against a 1-hour bound).
    before = time.time()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from distillery_runtime.run.startup import StartupClock; print(StartupClock().origin)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after = time.time()
    # The kernel keeps a process's start in clock ticks (10 ms), hence the slack on the low side.
    assert before - 0.05 <= float(out) <= after


def test_the_line_reads_back():
    clock = StartupClock(origin=0, marks={"job loaded": 3.0, "teachers ready": 30.5, "first step": 41.7})
    output = f"data: note\n{clock.line()}\nstep 1/1 ...\n"
    assert parse_line(output) == {"job loaded": 3.0, "teachers ready": 30.5, "first step": 41.7}
    assert parse_line("step 1/1\n") is None
