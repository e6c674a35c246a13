"""A shared teacher replica's load, read from the Prometheus text its vLLM server serves at /metrics.

vLLM names its metrics with a colon (`vllm:num_requests_waiting{model_name="..."}`), which the Prometheus
text format allows; a server may report several series of one gauge (one per engine or served model), and
the replica's load is their sum. Our teacher server queues a job's requests before vLLM's engine (fair admission by job), so what waits is
vLLM's queue plus ours (`distillery_teacher_waiting_sequences`). The numbers feed
`distillery.plan.teacher_scaling`.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from distillery.plan.teacher_scaling import ReplicaLoad

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
QUEUED = "distillery_teacher_waiting_sequences"
"""Our teacher server's own queue, in front of vLLM's (its fair admission by job holds requests there)."""


def parse_replica_load(text: str) -> ReplicaLoad:
    """The waiting and running requests of one replica from its /metrics page.

    Raises ValueError on text that is not the Prometheus format, or that has neither gauge (not a vLLM
    server: counting it as idle would scale a busy teacher down).
    """
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (WAITING, RUNNING, QUEUED):
            for sample in family.samples:
                if sample.name == family.name:
                    totals[family.name] = totals.get(family.name, 0.0) + sample.value
    if not totals:
        raise ValueError(f"neither {WAITING} nor {RUNNING} in the metrics")
    waiting = totals.get(WAITING, 0.0) + totals.get(QUEUED, 0.0)
    return ReplicaLoad(waiting=waiting, running=totals.get(RUNNING, 0.0))
