"""The OpenMP settings of the compute processes that share one host's cores.

Two regimes, measured on the 2-core machine with torch's libgomp (vLLM's CPU engine preloads the same one):

- **Taking turns** (a local run: the rollout samples, the teacher scores, the trainer steps, one after the
  other on the same few cores). libgomp's default keeps a finished region's threads spinning ~300,000
  iterations, so the process whose turn it is ran beside the spinning threads of the one before
  (examples/local-addition.yaml, 30 steps, medians: rollout 0.303 s a step by default, 0.106 s with
  `OMP_WAIT_POLICY=PASSIVE`). But PASSIVE threads sleep the moment a region ends, and every small kernel
  of a decode step then pays a futex wake-up: a tiny model's rollout took 0.815 s a step at PASSIVE, 0.572 s
  at ACTIVE and 0.542 s with `GOMP_SPINCOUNT=10000` (`bench/rollout_engines.py --scales tiny`, vLLM). A
  short spin keeps the threads awake between one kernel and the next and asleep microseconds after the
  process's turn ends. End to end, in an A/B on a steady host (`bench/README.md`): a tiny speed step 1.531
  -> 1.445 s, an addition step 0.192 -> 0.182 s, the trainer's forward+backward lower in both.
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
SHORT_SPIN = 10_000
"""libgomp spin iterations before a waiting thread sleeps (its default is 300,000): microseconds, longer
than the gap between two kernels of a decode step, far shorter than another process's turn."""


def _callers_wait(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's own wait settings, empty where it sets none (an explicit spin count overrides a wait
    policy in libgomp, so adding ours to the caller's policy would undo it)."""
    return {var: environ[var] for var in (WAIT_POLICY_VAR, SPIN_COUNT_VAR) if var in environ}


def sleeping_threads_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Processes that compute at the same time on shared cores: threads sleep once their region ends."""
    environ = environ or {}
    return _callers_wait(environ) or {WAIT_POLICY_VAR: "PASSIVE"}


def turn_taking_threads_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Processes that take turns on shared cores (a local run's actors and teacher servers): threads spin
    briefly between kernels, then sleep."""
    environ = environ or {}
    return _callers_wait(environ) or {SPIN_COUNT_VAR: str(SHORT_SPIN)}


LIBGOMP_SPIN = 300_000
"""libgomp's own spin count where neither variable is set: what the one compute process of a run keeps."""


def lone_process_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The one process of a local run that computes (`rollout_placement.trainer_computes_alone`: the rollout
    and every teacher in the trainer's process): no other process waits for its cores, so its threads keep
    libgomp's spin between kernels. The short spin of `turn_taking_threads_env` sleeps between a tiny decode
    step's kernels there: `distillery run` of the e2e bench's tiny job (16 steps, medians, two alternating
    runs each on the 2-core Intel host), a step 1.037 / 1.034 s at 10,000 against 0.981 / 0.953 s at
    300,000, the rollout 0.60 -> 0.52 s."""
    environ = environ or {}
    return _callers_wait(environ) or {SPIN_COUNT_VAR: str(LIBGOMP_SPIN)}


def shared_host_env(threads: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The trainer and rollout actors of a local run: all `threads` of the host (they take turns; Ray would
    give each one), and threads that spin briefly. A teacher server keeps vLLM's own thread binding."""
    environ = environ or {}
    return {
        "OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS", str(threads)),
        **turn_taking_threads_env(environ),
    }
