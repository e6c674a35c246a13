"""The OpenMP wait settings of processes sharing a host's cores (`distillery.plan.env.threads`)."""

from __future__ import annotations

import pytest

from distillery.plan.env.threads import (
    LIBGOMP_SPIN,
    lone_process_env,
    shared_host_env,
    sleeping_threads_env,
    turn_taking_threads_env,
)


def test_processes_taking_turns_keep_libgomps_spin_and_those_computing_at_once_sleep() -> None:
    # set explicitly, so that a process a run starts keeps it whatever its parent's libgomp settings
    assert turn_taking_threads_env({}) == {"GOMP_SPINCOUNT": str(LIBGOMP_SPIN)} and LIBGOMP_SPIN == 300_000
    assert sleeping_threads_env({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    # a local run's actors: every core, and the spin
    assert shared_host_env(2, {}) == {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": str(LIBGOMP_SPIN)}
    assert lone_process_env({}) == turn_taking_threads_env({})


@pytest.mark.parametrize(
    "callers",
    [{"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"},
     {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "500"}],
)  # fmt: skip
def test_the_callers_wait_setting_wins_alone(callers: dict[str, str]) -> None:
    # libgomp lets an explicit spin count override the wait policy: adding ours to a caller's policy
    # (a test worker's PASSIVE) would undo it, so neither function adds a variable the caller lacks
    environ = {"PATH": "/bin", **callers}
    assert turn_taking_threads_env(environ) == callers
    assert sleeping_threads_env(environ) == callers
    assert lone_process_env(environ) == callers
    assert shared_host_env(2, {**environ, "OMP_NUM_THREADS": "1"}) == {"OMP_NUM_THREADS": "1", **callers}


def test_a_local_run_keeps_its_freed_heap_unless_the_caller_sets_glibc_s_own() -> None:
    from distillery.plan.env.heap import GLIBC_MAX_MMAP_THRESHOLD, kept_heap_env

    env = kept_heap_env({})
    assert env["MALLOC_ARENA_MAX"] == "1"
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 32
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(GLIBC_MAX_MMAP_THRESHOLD) == str(32 << 20)
    # Any one of them set by the caller: the caller's stand alone (none of ours mixed in).
    assert kept_heap_env({"MALLOC_ARENA_MAX": "4", "PATH": "/bin"}) == {"MALLOC_ARENA_MAX": "4"}
