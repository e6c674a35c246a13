"""How long a starting Ray node's raylet waits for its agents: for every Ray node we start, the embedded
Ray of a local run and the RayJob's head and workers.

At start-up the raylet waits for its dashboard agent (a Python process importing Ray's dashboard modules)
to write its ports, and aborts when that takes longer than `agent_register_timeout_ms`; Ray's Python side
then reports "The current node timed out during startup". On a loaded host the agent's imports take
longer: on the 2-core CI host beside a node scenario's pods, local runs failed so, and the RayJobs' head
and worker pods restarted 3-5 times each before they came up (CI, 2026-12-02). Ray's own window is meant
for an idle machine; two minutes costs nothing where the agent is quick. The caller's setting wins.
"""

from __future__ import annotations

from collections.abc import Mapping

AGENT_REGISTER_TIMEOUT_VAR = "RAY_agent_register_timeout_ms"
AGENT_REGISTER_TIMEOUT_MS = 120_000


def ray_startup_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a process that starts a Ray node (`ray.init` of an embedded Ray, `ray start` in a
    pod) gets, which its raylet inherits: the caller's agent registration timeout, else two minutes."""
    value = (environ or {}).get(AGENT_REGISTER_TIMEOUT_VAR, str(AGENT_REGISTER_TIMEOUT_MS))
    return {AGENT_REGISTER_TIMEOUT_VAR: value}
