"""The OpenMP settings of the compute processes that share one host's cores in a local run.

A local run puts the trainer, the rollout engine and the teacher servers on the same few cores, taking
turns: the rollout samples, the teacher scores, the trainer steps. OpenMP's default wait policy keeps a
finished parallel region's threads spinning on their cores for a while, so the process whose turn it is
runs beside the spinning threads of the one before. Measured on the 2-core machine (examples/local-addition
.yaml, 30 steps, medians): the rollout took 0.303 s a step with the default policy and 0.106 s with
`OMP_WAIT_POLICY=PASSIVE` (threads sleep when their region ends), the whole step 0.48 s and 0.34 s.
What the caller's environment (a shell, a pod) sets wins.
"""

from __future__ import annotations

from collections.abc import Mapping

WAIT_POLICY_VAR = "OMP_WAIT_POLICY"


def sleeping_threads_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """OpenMP threads that sleep, not spin, once their work is done (every local compute process)."""
    return {WAIT_POLICY_VAR: (environ or {}).get(WAIT_POLICY_VAR, "PASSIVE")}


def shared_host_env(threads: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The trainer and rollout actors of a local run: all `threads` of the host (they take turns; Ray would
    give each one), and sleeping threads. A teacher server keeps vLLM's own thread binding."""
    environ = environ or {}
    return {"OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS", str(threads)), **sleeping_threads_env(environ)}
