"""The OpenMP settings of the compute processes that share one host's cores.

Two regimes, measured on the 2-core machine with torch's libgomp (vLLM's CPU engine preloads the same one):

- **Taking turns** (a local run: the rollout samples, the teacher scores, the trainer steps, one after the
  other on the same few cores). Their threads keep libgomp's own spin (300,000 iterations) between kernels.
  A shorter spin (`GOMP_SPINCOUNT=10000`, the setting until 2026-12-04) sleeps between the kernels of a
  turn, and each wake-up leaves a core idle: each process computed on ~1.7 of the 2 cores in its turn
  (per-process CPU sampled every 0.1 s), against ~1.95 for the same forward with libgomp's spin.
  `distillery run` of the e2e bench's small job (vLLM rollout actor, teacher actor, trainer; 10 steps,
  medians, two alternating pairs): a step 12.05 / 11.31 s at 10,000 against 9.25 / 9.39 s at libgomp's
  spin, every phase faster (rollout 3.37 -> 2.53, teacher 4.08 -> 3.35, forward+backward 4.15 -> 3.27 s).
  The 10,000 had been chosen (2026-11-29) while a teacher scored each sample as it left the rollout, so
  processes interleaved at the grain of a decode step; since scoring waits for the rollout's end
  (`scoring_overlap`), a process's turn is seconds long and a spin of milliseconds after it costs nothing
  measurable.
- **Computing at once** (the test suite's two xdist workers, each with threads on both cores). Any spin
  then steals the other process's cores: two processes of small matmuls, 2 threads each, took 5.1 s each
  at PASSIVE, 18 s at libgomp's default and 43 s at `GOMP_SPINCOUNT=10000` (2.4-2.9 s alone). There
  threads must sleep at once.

What the caller's environment (a shell, a pod, a test worker) sets for either variable wins.
"""

from __future__ import annotations

from collections.abc import Mapping

WAIT_POLICY_VAR = "OMP_WAIT_POLICY"
SPIN_COUNT_VAR = "GOMP_SPINCOUNT"
LIBGOMP_SPIN = 300_000
"""libgomp's own spin count where neither variable is set, set explicitly so that a process a run starts
keeps it whatever its parent's libgomp settings."""


def _callers_wait(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's own wait settings, empty where it sets none (an explicit spin count overrides a wait
    policy in libgomp, so adding ours to the caller's policy would undo it)."""
    return {var: environ[var] for var in (WAIT_POLICY_VAR, SPIN_COUNT_VAR) if var in environ}


def sleeping_threads_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Processes that compute at the same time on shared cores: threads sleep once their region ends."""
    environ = environ or {}
    return _callers_wait(environ) or {WAIT_POLICY_VAR: "PASSIVE"}


def turn_taking_threads_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Processes that take turns on shared cores (a local run's actors and teacher servers): threads keep
    libgomp's spin between kernels (the module docstring)."""
    environ = environ or {}
    return _callers_wait(environ) or {SPIN_COUNT_VAR: str(LIBGOMP_SPIN)}


def lone_process_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The one process of a local run that computes (`placement.rollout.trainer_computes_alone`: the rollout
    and every teacher in the trainer's process): no other process waits for its cores, so its threads keep
    libgomp's spin between kernels, as the turn-takers' now do too. It was the first to (2026-12-01): the short
    spin slept between a tiny decode step's kernels there, `distillery run` of the e2e bench's tiny job (16
    steps, medians, two alternating runs each on the 2-core Intel host), a step 1.037 / 1.034 s at 10,000
    against 0.981 / 0.953 s at 300,000, the rollout 0.60 -> 0.52 s."""
    return turn_taking_threads_env(environ)


def shared_host_env(threads: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The trainer and rollout actors of a local run: all `threads` of the host (they take turns; Ray would
    give each one), and threads that keep libgomp's spin. A teacher server keeps vLLM's own thread binding."""
    environ = environ or {}
    return {
        "OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS", str(threads)),
        **turn_taking_threads_env(environ),
    }
