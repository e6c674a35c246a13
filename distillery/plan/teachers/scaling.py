"""How many replicas a shared teacher (a DistillationTeacher) should run: a pure function of its load.

The operator reads vLLM's own queue gauges from each replica's /metrics (`vllm:num_requests_waiting`,
`vllm:num_requests_running`), counts the active jobs that reference the teacher and tracks when it was
last busy; this module turns those numbers into the desired replica count and the reason, which the
operator applies and records as an Event. No HPA or metrics adapter is involved.

The rules, in order:
- the bounds hold first: never below minReplicas, never above maxReplicas;
- a teacher at zero starts one replica as soon as an active job references it;
- while the waiting requests per replica exceed the target, one more replica (up to maxReplicas), one
  step per decision, and none while a replica already asked for is still loading (a teacher takes
  minutes to load, and the queue it was added for would otherwise add another at every look);
- once the teacher has been idle (nothing waiting or running) for the idle time, it goes down to
  minReplicas, or to one replica while jobs still reference it, or to zero when none does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's queue, as its vLLM server reports it."""

    waiting: float = 0.0
    """`vllm:num_requests_waiting`: requests queued for a free slot of the engine."""
    running: float = 0.0
    """`vllm:num_requests_running`: requests in the engine's running batch."""

    @property
    def busy(self) -> bool:
        return self.waiting > 0 or self.running > 0


@dataclass(frozen=True)
class ScalingPolicy:
    """A DistillationTeacher's spec.scaling, as numbers."""

    min_replicas: int
    max_replicas: int
    target_waiting_per_replica: float
    idle_seconds: float


class ScalingReason(StrEnum):
    """Why the replicas are what they are: the Event reason when they change."""

    BELOW_MINIMUM = "BelowMinimum"
    ABOVE_MAXIMUM = "AboveMaximum"
    SCALED_FROM_ZERO = "ScaledFromZero"
    QUEUE_ABOVE_TARGET = "QueueAboveTarget"
    IDLE = "Idle"
    # The decisions that keep the count:
    AT_MAXIMUM = "AtMaximum"
    STARTING = "ReplicaStarting"
    NO_METRICS = "NoMetrics"
    BUSY = "Busy"
    WAITING_FOR_IDLE_TIME = "WaitingForIdleTime"
    UNUSED = "Unused"
    BY_HPA = "ScaledByHPA"
    """The chart hands the count to an HPA (sharedTeachers.scaling: hpa): the operator keeps what it finds."""
    AT_FLOOR = "AtFloor"


@dataclass(frozen=True)
class ScalingDecision:
    replicas: int
    """The desired replica count."""
    reason: ScalingReason
    message: str
    """The Event's message: the numbers the decision was made from."""
    changed: bool
    """Whether `replicas` differs from the current count (an Event is due)."""


def floor_replicas(policy: ScalingPolicy, active_jobs: int) -> int:
    """The fewest replicas the teacher may run: minReplicas, and one while any active job references it
    (scaling to zero under a running job would only start a replica again at its next request)."""
    return min(policy.max_replicas, max(policy.min_replicas, 1 if active_jobs > 0 else 0))


def decide_replicas(
    *,
    current: int,
    policy: ScalingPolicy,
    loads: Sequence[ReplicaLoad],
    active_jobs: int,
    idle_for_seconds: float,
    ready: int | None = None,
) -> ScalingDecision:
    """The replicas a shared teacher should run now.

    `current`: the Deployment's desired replicas (not the ready ones: a replica still loading counts, so
    a queue that persists while it loads does not ask for another at every decision); `loads`: one entry
    per replica whose /metrics answered (empty: none did); `active_jobs`: jobs referencing the teacher that
    are neither finished nor suspended; `idle_for_seconds`: how long no replica has had a request waiting
    or running (the caller keeps the time it last saw one busy); `ready`: the Deployment's ready replicas
    (None: all of `current`).
    """
    if policy.min_replicas > policy.max_replicas:
        raise ValueError(f"minReplicas {policy.min_replicas} > maxReplicas {policy.max_replicas}")

    def to(replicas: int, reason: ScalingReason, message: str) -> ScalingDecision:
        return ScalingDecision(replicas, reason, message, replicas != current)

    if current < policy.min_replicas:
        return to(policy.min_replicas, ScalingReason.BELOW_MINIMUM, f"minReplicas is {policy.min_replicas}")
    if current > policy.max_replicas:
        return to(policy.max_replicas, ScalingReason.ABOVE_MAXIMUM, f"maxReplicas is {policy.max_replicas}")
    floor = floor_replicas(policy, active_jobs)
    if current == 0:
        if active_jobs > 0 and policy.max_replicas > 0:
            return to(1, ScalingReason.SCALED_FROM_ZERO, f"{_jobs(active_jobs)} referencing the teacher")
        return to(0, ScalingReason.UNUSED, "no active job references the teacher")
    if not loads:
        # No replica answered: the queue is unknown, so nothing scales up, and a teacher that jobs use is
        # kept (it may be loading its model); one nobody uses still goes down after the idle time.
        if active_jobs == 0 and idle_for_seconds >= policy.idle_seconds and current > floor:
            return to(floor, ScalingReason.IDLE, _idle_message(idle_for_seconds, active_jobs))
        return to(current, ScalingReason.NO_METRICS, "no replica's /metrics answered")
    waiting = sum(load.waiting for load in loads)
    per_replica = waiting / current
    queue = (
        f"{waiting:g} requests waiting over {current} replicas ({per_replica:g} per replica, "
        f"target {policy.target_waiting_per_replica:g})"
    )
    if per_replica > policy.target_waiting_per_replica:
        if ready is not None and ready < current:
            return to(current, ScalingReason.STARTING, f"{queue}; {current - ready} replica(s) still loading")
        if current < policy.max_replicas:
            return to(current + 1, ScalingReason.QUEUE_ABOVE_TARGET, queue)
        return to(current, ScalingReason.AT_MAXIMUM, f"{queue}; maxReplicas is {policy.max_replicas}")
    if any(load.busy for load in loads):
        return to(current, ScalingReason.BUSY, queue)
    if current <= floor:
        return to(current, ScalingReason.AT_FLOOR, f"{current} replicas is the floor")
    if idle_for_seconds >= policy.idle_seconds:
        return to(floor, ScalingReason.IDLE, _idle_message(idle_for_seconds, active_jobs))
    return to(
        current,
        ScalingReason.WAITING_FOR_IDLE_TIME,
        f"idle for {idle_for_seconds:g}s of {policy.idle_seconds:g}s",
    )


def _jobs(count: int) -> str:
    return f"{count} active job{'s' if count != 1 else ''}"


def _idle_message(idle_for_seconds: float, active_jobs: int) -> str:
    return f"no request waiting or running for {idle_for_seconds:g}s; {_jobs(active_jobs)}"
