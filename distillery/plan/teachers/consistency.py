"""Whether a teacher's replicas agree: the start-up probe's tolerance and the comparison, decided once.

Before step 1 every replica of a served teacher scores one fixed probe (`distillery_runtime.teachers.
consistency`), and a colocated teacher compares its answer after each wake with its first one. Replicas that
disagree by more than the distillation signal were found in a real deployment (SkyRL issue 2256: replicas
of one teacher, served differently, scored the same tokens differently); the student then learns the noise
of whichever replica each sample reached. Here: how far two answers to the probe may be apart, and which
replicas are out of line.

Why these numbers (nats, on the probe's log-probs: the sampled tokens', and the top-k entries both answers
hold for the same id at the same position):

- `mean_abs_nats` 0.05. Replicas of one checkpoint in bfloat16 on different GPUs or batch shapes differ
  by rounding only: a bf16 logit is exact to 2^-9 of itself (0.03 nats for a logit of 16), and reduction
  order moves the answers by about 0.01 nats per token on average. Real disagreement (another
  checkpoint or revision, another quantization, a wrong context or rope setting, weights lost in a
  wake-up, which reads -ln V everywhere) moves every token, by tenths of a nat to several. The
  distillation signal per token (the student's gap to its teacher that the loss closes) is 0.1-0.5 nats
  once the student is near its teacher, so a tolerance above half of that would hide what the check is
  for, and one near the rounding mean would refuse healthy replicas.
- `max_abs_nats` 1.0. One position may round further than the mean (a rare token's logit, an MoE routing
  flip), but a whole nat (a factor e in probability) at one token is a misaligned or different model, not
  rounding (one bf16 ulp of a logit below 32 is 0.125 nats).

The tiny test models (`init_std` 0.1) differ by about a nat a token between seeds and not at all between two
servers of one checkpoint on CPU, far on either side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ConsistencyTolerance:
    """How far two answers to the probe may be apart (nats)."""

    mean_abs_nats: float
    """Mean absolute difference over the compared log-probs."""
    max_abs_nats: float
    """Largest absolute difference at any one compared log-prob."""


TEACHER_CONSISTENCY_TOLERANCE = ConsistencyTolerance(mean_abs_nats=0.05, max_abs_nats=1.0)
"""The one tolerance of the start-up probe and of a colocated teacher's after-wake probe (module docstring)."""

PROBE_TEXT = "Distillery checks its teachers: 12+34=46, 7*8=56. The student asks, the teacher answers."
"""The probe, tokenized by the student (the ids every replica is sent): words, digits and arithmetic, which
every tokenizer of a task the student learns can spell."""
PROBE_TOKENS = 32
"""The probe's length at most (response tokens scored): one tiny request per replica at start-up."""
PROBE_TOP_K = 8
"""Top-k entries scored with the probe (fewer where the teacher allows fewer)."""


@dataclass(frozen=True)
class ProbeAnswer:
    """One answer to the probe: each response position's sampled-token log-prob and its top-k (id ->
    log-prob; empty where none was asked)."""

    token_logprobs: tuple[float, ...]
    topk: tuple[dict[int, float], ...] = ()


@dataclass(frozen=True)
class ProbeDifference:
    """How far one answer is from another."""

    mean_abs_nats: float
    max_abs_nats: float
    position: int
    """The response position of the largest difference."""
    compared: int
    """How many log-probs were compared."""

    def beyond(self, tolerance: ConsistencyTolerance) -> bool:
        """Whether it is more than `tolerance` allows (a value at the tolerance passes)."""
        return self.mean_abs_nats > tolerance.mean_abs_nats or self.max_abs_nats > tolerance.max_abs_nats


def probe_difference(reference: ProbeAnswer, other: ProbeAnswer) -> ProbeDifference:
    """The differences of `other` from `reference`: at each position the sampled token's log-prob, and the
    top-k log-probs of the ids both hold there (two replicas may rank near-ties differently, so entries are
    matched by id, not by rank). Answers of different lengths differ by infinity. Pure."""
    if len(reference.token_logprobs) != len(other.token_logprobs):
        return ProbeDifference(float("inf"), float("inf"), 0, 0)
    diffs = [
        (_gap(ours, theirs), position)
        for position, (ours, theirs) in enumerate(
            zip(reference.token_logprobs, other.token_logprobs, strict=True)
        )
    ]
    for position, (ours_k, theirs_k) in enumerate(zip(reference.topk, other.topk, strict=False)):
        diffs.extend(
            (_gap(ours_k[i], theirs_k[i]), position) for i in sorted(ours_k.keys() & theirs_k.keys())
        )
    if not diffs:
        return ProbeDifference(0.0, 0.0, 0, 0)
    largest, position = max(diffs)
    return ProbeDifference(math.fsum(d for d, _ in diffs) / len(diffs), largest, position, len(diffs))


def _gap(ours: float, theirs: float) -> float:
    """|ours - theirs|; 0 where both are the same infinity (both say impossible), infinite where either is
    NaN (a replica answering NaN is out of line, and NaN would compare as neither more nor less)."""
    if ours == theirs:
        return 0.0
    gap = abs(ours - theirs)
    return gap if gap == gap else float("inf")


@dataclass(frozen=True)
class ReplicaDisagreement:
    """A replica whose answer is beyond the tolerance from the reference replica's."""

    replica: int
    reference: int
    difference: ProbeDifference


def disagreeing_replicas(
    answers: Sequence[ProbeAnswer], tolerance: ConsistencyTolerance = TEACHER_CONSISTENCY_TOLERANCE
) -> list[ReplicaDisagreement]:
    """The replicas (indices into `answers`) out of line with the reference: the replica closest to all the
    others (least summed mean difference; the first among equals), so that with three or more replicas the
    odd one is named, not the healthy majority. Empty when all agree or there is one answer. Pure."""
    if len(answers) < 2:
        return []
    pairs = {
        (i, j): probe_difference(answers[i], answers[j])
        for i in range(len(answers))
        for j in range(len(answers))
        if i != j
    }
    reference = min(
        range(len(answers)),
        key=lambda i: sum(pairs[i, j].mean_abs_nats for j in range(len(answers)) if j != i),
    )
    return [
        ReplicaDisagreement(j, reference, pairs[reference, j])
        for j in range(len(answers))
        if j != reference and pairs[reference, j].beyond(tolerance)
    ]
