"""The replica decision of a shared teacher (`distillery.plan.teachers.scaling`): bounds first, scale from
zero on a job, one step up while the queue per replica is over the target, down to the floor only after
the idle time, never below minReplicas."""

from __future__ import annotations

import pytest

from distillery.plan.teachers.scaling import (
    ReplicaLoad,
    ScalingDecision,
    ScalingPolicy,
    ScalingReason,
    decide_replicas,
    floor_replicas,
)

POLICY = ScalingPolicy(min_replicas=0, max_replicas=3, target_waiting_per_replica=4, idle_seconds=300)
IDLE = ReplicaLoad(waiting=0, running=0)


def decide(
    current: int,
    loads: list[ReplicaLoad],
    *,
    jobs: int = 1,
    idle_for: float = 0.0,
    policy: ScalingPolicy = POLICY,
) -> ScalingDecision:
    return decide_replicas(
        current=current, policy=policy, loads=loads, active_jobs=jobs, idle_for_seconds=idle_for
    )


def test_zero_replicas_start_one_when_an_active_job_references_the_teacher() -> None:
    decision = decide(0, [], jobs=2)
    assert (decision.replicas, decision.reason, decision.changed) == (1, ScalingReason.SCALED_FROM_ZERO, True)
    assert "2 active jobs" in decision.message


def test_zero_replicas_stay_at_zero_without_an_active_job() -> None:
    decision = decide(0, [], jobs=0, idle_for=10_000)
    assert (decision.replicas, decision.reason, decision.changed) == (0, ScalingReason.UNUSED, False)


def test_a_queue_over_the_target_adds_one_replica() -> None:
    decision = decide(1, [ReplicaLoad(waiting=5, running=32)])
    assert (decision.replicas, decision.reason, decision.changed) == (
        2,
        ScalingReason.QUEUE_ABOVE_TARGET,
        True,
    )
    assert "5 requests waiting over 1 replicas" in decision.message


def test_the_queue_is_per_desired_replica_so_one_still_loading_counts() -> None:
    # 10 waiting on the one replica that answers, 2 desired: 5 per replica, over 4 -> a third.
    assert decide(2, [ReplicaLoad(waiting=10, running=8)]).replicas == 3
    # 8 waiting over 2 desired replicas is 4 per replica: at the target, not over it.
    at_target = decide(2, [ReplicaLoad(waiting=8, running=8)])
    assert (at_target.replicas, at_target.reason) == (2, ScalingReason.BUSY)


def test_scale_up_is_one_step_at_a_time_even_under_a_long_queue() -> None:
    assert decide(1, [ReplicaLoad(waiting=1000, running=32)]).replicas == 2


def test_scale_up_stops_at_max_replicas() -> None:
    decision = decide(3, [ReplicaLoad(waiting=100)] * 3)
    assert (decision.replicas, decision.reason, decision.changed) == (3, ScalingReason.AT_MAXIMUM, False)


def test_a_target_of_zero_scales_up_on_any_waiting_request() -> None:
    policy = ScalingPolicy(min_replicas=1, max_replicas=4, target_waiting_per_replica=0, idle_seconds=60)
    assert decide(1, [ReplicaLoad(waiting=1)], policy=policy).replicas == 2
    assert decide(1, [ReplicaLoad(running=30)], policy=policy).replicas == 1


def test_a_busy_teacher_keeps_its_replicas_however_long_ago_it_was_idle() -> None:
    decision = decide(3, [ReplicaLoad(running=1), IDLE, IDLE], idle_for=10_000)
    assert (decision.replicas, decision.reason) == (3, ScalingReason.BUSY)


def test_an_idle_teacher_waits_for_the_idle_time_before_scaling_down() -> None:
    early = decide(3, [IDLE] * 3, jobs=1, idle_for=299)
    assert (early.replicas, early.reason, early.changed) == (3, ScalingReason.WAITING_FOR_IDLE_TIME, False)
    late = decide(3, [IDLE] * 3, jobs=1, idle_for=300)
    assert (late.replicas, late.reason, late.changed) == (1, ScalingReason.IDLE, True)


def test_idle_without_active_jobs_and_min_zero_goes_to_zero() -> None:
    decision = decide(2, [IDLE, IDLE], jobs=0, idle_for=301)
    assert (decision.replicas, decision.reason) == (0, ScalingReason.IDLE)


def test_idle_goes_down_to_min_replicas_and_never_below() -> None:
    policy = ScalingPolicy(min_replicas=2, max_replicas=5, target_waiting_per_replica=1, idle_seconds=10)
    assert decide(5, [IDLE] * 5, jobs=0, idle_for=11, policy=policy).replicas == 2
    at_min = decide(2, [IDLE] * 2, jobs=0, idle_for=10_000, policy=policy)
    assert (at_min.replicas, at_min.reason, at_min.changed) == (2, ScalingReason.AT_FLOOR, False)


def test_the_floor_is_one_replica_while_jobs_reference_a_min_zero_teacher() -> None:
    assert floor_replicas(POLICY, active_jobs=1) == 1
    assert floor_replicas(POLICY, active_jobs=0) == 0
    held = decide(1, [IDLE], jobs=1, idle_for=10_000)
    assert (held.replicas, held.reason) == (1, ScalingReason.AT_FLOOR)


def test_replicas_below_min_come_up_to_min_whatever_the_load() -> None:
    policy = ScalingPolicy(min_replicas=2, max_replicas=4, target_waiting_per_replica=1, idle_seconds=10)
    decision = decide(0, [], jobs=0, policy=policy)
    assert (decision.replicas, decision.reason, decision.changed) == (2, ScalingReason.BELOW_MINIMUM, True)


def test_replicas_above_max_come_down_to_max() -> None:
    decision = decide(7, [ReplicaLoad(waiting=100)] * 7)
    assert (decision.replicas, decision.reason, decision.changed) == (3, ScalingReason.ABOVE_MAXIMUM, True)


def test_without_metrics_a_used_teacher_is_kept_and_nothing_scales_up() -> None:
    decision = decide(2, [], jobs=1, idle_for=10_000)
    assert (decision.replicas, decision.reason, decision.changed) == (2, ScalingReason.NO_METRICS, False)


def test_without_metrics_an_unused_teacher_still_goes_down_after_the_idle_time() -> None:
    assert decide(2, [], jobs=0, idle_for=10).reason == ScalingReason.NO_METRICS
    decision = decide(2, [], jobs=0, idle_for=300)
    assert (decision.replicas, decision.reason) == (0, ScalingReason.IDLE)


def test_a_max_of_zero_never_starts_a_replica() -> None:
    policy = ScalingPolicy(min_replicas=0, max_replicas=0, target_waiting_per_replica=1, idle_seconds=10)
    assert decide(0, [], jobs=3, policy=policy).replicas == 0


def test_min_above_max_is_refused() -> None:
    policy = ScalingPolicy(min_replicas=3, max_replicas=2, target_waiting_per_replica=1, idle_seconds=10)
    with pytest.raises(ValueError, match="minReplicas 3 > maxReplicas 2"):
        decide(2, [], policy=policy)


@pytest.mark.parametrize("current", range(0, 5))
@pytest.mark.parametrize("jobs", [0, 1, 3])
@pytest.mark.parametrize("waiting", [0, 3, 50])
@pytest.mark.parametrize("idle_for", [0, 1_000])
def test_every_decision_stays_within_bounds_and_moves_up_by_at_most_one(
    current: int, jobs: int, waiting: int, idle_for: int
) -> None:
    policy = ScalingPolicy(min_replicas=1, max_replicas=3, target_waiting_per_replica=2, idle_seconds=100)
    loads = [ReplicaLoad(waiting=waiting, running=1 if waiting else 0)] * current
    decision = decide(current, loads, jobs=jobs, idle_for=idle_for, policy=policy)
    assert policy.min_replicas <= decision.replicas <= policy.max_replicas
    assert decision.changed == (decision.replicas != current)
    if policy.min_replicas <= current <= policy.max_replicas:
        assert decision.replicas <= current + 1
        if decision.replicas < current:
            assert decision.reason == ScalingReason.IDLE and idle_for >= policy.idle_seconds


def test_no_replica_is_added_while_one_asked_for_is_still_loading() -> None:
    busy = [ReplicaLoad(waiting=20, running=8)]
    loading = decide_replicas(
        current=2, policy=POLICY, loads=busy, active_jobs=2, idle_for_seconds=0, ready=1
    )
    assert (loading.replicas, loading.reason, loading.changed) == (2, ScalingReason.STARTING, False)
    assert "1 replica(s) still loading" in loading.message
    # Once it is ready, the queue that persists adds the next.
    ready = decide_replicas(
        current=2, policy=POLICY, loads=busy * 2, active_jobs=2, idle_for_seconds=0, ready=2
    )
    assert (ready.replicas, ready.reason) == (3, ScalingReason.QUEUE_ABOVE_TARGET)
