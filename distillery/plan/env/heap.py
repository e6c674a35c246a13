"""glibc's heap settings of a local run's processes, which take turns on one host's cores.

Each of a local run's compute processes (the rollout engine, the teacher's forward, the trainer) frees most of
what it allocated when its turn ends, and glibc hands the freed heap back to the kernel: the top of the heap
once it passes the trim threshold, and whole heaps of a thread's arena (Ray runs an async actor's calls on
its event loop's thread, whose arena is not the main heap). The next turn then allocates the same sizes again
and touches every page afresh: a minor fault and a zeroed page each, ~2 µs apiece on the 2-core VM (100 MB
of fresh pages took 48-53 ms against 0.7 ms reused). Counted in `distillery run` of the e2e bench's small
bfloat16 job (20 s of steady steps, /proc/PID/stat): the teacher's actor 290,000-333,000 minor faults, the
trainer's 178,000-378,000; with the settings below, ~900 and under 400. Three alternating runs of 24 steps
each (`bench/README.md`): the trainer's step 0.80 / 0.82 / 0.84 s by default, 0.78 / 0.78 / 0.80 s with
them; the peak RSS of the run's processes 5.9-6.1 GiB, 6.0-6.2 GiB.

So every process keeps its freed heap for its next turn: one arena (the event loop's thread allocates from
the main heap), no trimming, and a fixed mmap threshold at glibc's own maximum (32 MiB), so that the blocks
of a step's activations come from the heap instead of fresh mappings. Blocks above it are mapped and
unmapped as before (a large model's weights are not held twice). In a cluster a pod's processes do not take
turns like this, and nothing is set. What the caller's environment sets for any of the three wins.
"""

from __future__ import annotations

from collections.abc import Mapping

ARENA_MAX_VAR = "MALLOC_ARENA_MAX"
TRIM_THRESHOLD_VAR = "MALLOC_TRIM_THRESHOLD_"
MMAP_THRESHOLD_VAR = "MALLOC_MMAP_THRESHOLD_"
GLIBC_MAX_MMAP_THRESHOLD = 32 << 20
"""glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts: the largest threshold its dynamic rule reaches."""
NEVER_TRIM = 1 << 40


def kept_heap_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of a local run's compute processes: freed heap kept for the next turn, unless the caller
    sets any of them (then the caller's own settings stand alone)."""
    environ = environ or {}
    callers = {
        var: environ[var] for var in (ARENA_MAX_VAR, TRIM_THRESHOLD_VAR, MMAP_THRESHOLD_VAR) if var in environ
    }
    return callers or {
        ARENA_MAX_VAR: "1",
        TRIM_THRESHOLD_VAR: str(NEVER_TRIM),
        MMAP_THRESHOLD_VAR: str(GLIBC_MAX_MMAP_THRESHOLD),
    }
