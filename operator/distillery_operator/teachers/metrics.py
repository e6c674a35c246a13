"""A shared teacher replica's load, read from the Prometheus text its server serves at /metrics.

vLLM names its metrics with a colon (`vllm:num_requests_waiting{model_name="..."}`), which the Prometheus
text format allows; a server may report several series of one gauge (one per engine or served model), and
the replica's load is their sum.

Our teacher server admits each job's requests into vLLM by fair share (`teachers/serving/fair_share.py`), so most of
what waits, waits in its queue, not vLLM's. A gauge of that queue, read every few seconds, would mostly
miss a burst of scoring that lasts a fraction of a second; so the queue is read as its mean length since the
previous read instead: the growth of the total time requests waited
(`distillery_teacher_queue_wait_seconds_sum`, over jobs) divided by the time between the reads (Little's
law). What waits is vLLM's queue now plus that mean. The numbers feed `distillery.plan.teachers.scaling`.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from distillery.plan.teachers.scaling import ReplicaLoad

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
QUEUED = "distillery_teacher_waiting_sequences"
"""Our teacher server's queue now (used where there is no previous read to take a mean over)."""
QUEUE_WAIT = "distillery_teacher_queue_wait_seconds"
"""The histogram of each request's wait in our server's queue; its `_sum` is the total time waited."""


@dataclass(frozen=True)
class ReplicaSample:
    """One read of a replica's /metrics."""

    waiting: float
    """vLLM's queue now."""
    running: float
    queued: float
    """Our server's queue now."""
    waited_seconds: float | None
    """The total time requests have waited in our server's queue (None: not our server)."""


def parse_replica_sample(text: str) -> ReplicaSample:
    """The numbers of one replica's /metrics page.

    Raises ValueError on text that is not the Prometheus format, or that has neither of vLLM's gauges (not
    a vLLM server: counting it as idle would scale a busy teacher down).
    """
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (WAITING, RUNNING, QUEUED):
            wanted = family.name
        elif family.name == QUEUE_WAIT:
            wanted = QUEUE_WAIT + "_sum"
        else:
            continue
        for sample in family.samples:
            if sample.name == wanted:
                totals[wanted] = totals.get(wanted, 0.0) + sample.value
    if WAITING not in totals and RUNNING not in totals:
        raise ValueError(f"neither {WAITING} nor {RUNNING} in the metrics")
    return ReplicaSample(
        waiting=totals.get(WAITING, 0.0),
        running=totals.get(RUNNING, 0.0),
        queued=totals.get(QUEUED, 0.0),
        waited_seconds=totals.get(QUEUE_WAIT + "_sum"),
    )


def replica_load(sample: ReplicaSample, previous: tuple[float, float] | None, now: float) -> ReplicaLoad:
    """A replica's load from this read and the previous one's (total seconds waited, time), if any: vLLM's
    queue plus the mean length of our server's queue since then (its queue now, without a previous read
    or after a restart reset the total)."""
    queued = sample.queued
    if previous is not None and sample.waited_seconds is not None:
        waited_before, then = previous
        if now > then and sample.waited_seconds >= waited_before:
            queued = max(queued, (sample.waited_seconds - waited_before) / (now - then))
    return ReplicaLoad(waiting=sample.waiting + queued, running=sample.running)
