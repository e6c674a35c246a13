"""The teacher-consistency comparison (`distillery.plan.teachers.consistency`), pure: its tolerance at the
edge, top-k matched by id, and which replica is named."""

from __future__ import annotations

import math

import pytest

from distillery.plan.teachers.consistency import (
    TEACHER_CONSISTENCY_TOLERANCE,
    ProbeAnswer,
    disagreeing_replicas,
    probe_difference,
)

TOL = TEACHER_CONSISTENCY_TOLERANCE


def test_the_tolerance_is_below_the_distillation_signal_and_above_bf16_rounding() -> None:
    # The module docstring's reasons, as numbers: bf16 replicas differ by ~0.01 nats a token on average,
    # the signal is 0.1-0.5, and one bf16 ulp of a logit below 32 is 0.125 nats.
    assert 0.01 < TOL.mean_abs_nats <= 0.1 / 2
    assert 0.125 < TOL.max_abs_nats <= 1.0


def test_a_mean_difference_at_the_tolerance_passes_and_just_beyond_it_fails() -> None:
    reference = ProbeAnswer((0.0,) * 8)
    at_edge = probe_difference(reference, ProbeAnswer((-TOL.mean_abs_nats,) * 8))
    assert at_edge.mean_abs_nats == TOL.mean_abs_nats and not at_edge.beyond(TOL)
    beyond = probe_difference(reference, ProbeAnswer((-TOL.mean_abs_nats - 1e-4,) * 8))
    assert beyond.beyond(TOL) and beyond.max_abs_nats < TOL.max_abs_nats  # the mean alone refuses it


def test_one_token_at_the_largest_difference_passes_and_just_beyond_it_fails() -> None:
    # 40 positions, one of them off: the mean stays under its tolerance, the single token decides.
    reference = ProbeAnswer((0.0,) * 40)
    at_edge = probe_difference(reference, ProbeAnswer((0.0,) * 39 + (-TOL.max_abs_nats,)))
    assert at_edge.mean_abs_nats < TOL.mean_abs_nats and not at_edge.beyond(TOL)
    beyond = probe_difference(reference, ProbeAnswer((0.0,) * 39 + (-TOL.max_abs_nats - 1e-3,)))
    assert beyond.beyond(TOL) and beyond.position == 39 and beyond.mean_abs_nats < TOL.mean_abs_nats


def test_top_k_entries_are_matched_by_id_not_rank() -> None:
    # A near-tie ranked the other way round by a replica is no difference; an id only one holds is not compared.
    reference = ProbeAnswer((-1.0,), ({5: -1.0, 7: -1.001},))
    swapped = ProbeAnswer((-1.0,), ({7: -1.001, 5: -1.0, 9: -4.0},))
    difference = probe_difference(reference, swapped)
    assert difference.max_abs_nats == 0.0 and difference.compared == 3
    moved = probe_difference(reference, ProbeAnswer((-1.0,), ({5: -1.0, 7: -2.5},)))
    assert moved.beyond(TOL) and moved.max_abs_nats == pytest.approx(1.499)


def test_nan_and_different_lengths_are_beyond_any_tolerance() -> None:
    assert probe_difference(ProbeAnswer((-1.0, -2.0)), ProbeAnswer((-1.0, math.nan))).beyond(TOL)
    assert probe_difference(ProbeAnswer((-1.0, -2.0)), ProbeAnswer((-1.0,))).beyond(TOL)
    # Both sure a token is impossible: they agree.
    assert not probe_difference(ProbeAnswer((-math.inf,)), ProbeAnswer((-math.inf,))).beyond(TOL)


def test_the_odd_replica_is_named_against_the_majority() -> None:
    healthy, other = ProbeAnswer((-1.0, -2.0, -3.0)), ProbeAnswer((-2.0, -1.0, -3.5))
    for answers, odd in (([healthy, healthy, other], 2), ([other, healthy, healthy], 0)):
        (named,) = disagreeing_replicas(answers)
        assert named.replica == odd and named.reference != odd
    # Two replicas: the second is named against the first (neither is more likely right).
    (named,) = disagreeing_replicas([healthy, other])
    assert (named.replica, named.reference) == (1, 0)
    assert disagreeing_replicas([healthy, healthy]) == []
    assert disagreeing_replicas([other]) == []
