"""The loss pass's generation diagnostics: the student's entropy from the chunked vocabulary pass (no second
forward) and the gap between the rollout engine's and the trainer's log-probs of the sampled tokens."""

from __future__ import annotations

import pytest
import torch
from distillery_runtime.losses import TeacherTargets, distillation_loss
from distillery_runtime.losses.terms.chunked import gather_log_softmax_and_entropy

from distillery.api.spec import LossMode
from distillery.plan.loss import LossConfig


def _entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    p = torch.softmax(logits.double() / temperature, -1)
    return -torch.special.xlogy(p, p).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_of_the_chunked_pass_matches_the_full_softmax(temperature: float) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 50, generator=g) * 3
    logits[1, 2, :10] = float("-inf")  # a masked vocabulary slice: 0 x -inf must not make a NaN
    ids = torch.randint(0, 50, (2, 7, 1), generator=g)
    ids[1, 2] = 20
    _, _, ent = gather_log_softmax_and_entropy(logits, ids, temperature, chunk_tokens=3)
    torch.testing.assert_close(ent.double(), _entropy(logits, temperature), rtol=1e-5, atol=1e-5)
    assert bool(torch.isfinite(ent).all())


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    b, t, v = 3, 5, 40
    logits = torch.randn(b, t, v, generator=g) * 2
    response = torch.randint(0, v, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[2, 3:] = False  # padding
    teacher_logp = torch.log_softmax(torch.randn(b, t, v, generator=g), -1)
    targets = TeacherTargets(None, None, teacher_logp.gather(-1, response[..., None])[..., 0])
    return logits, response, mask, targets


@pytest.mark.parametrize("mode", [LossMode.K3, LossMode.K2])
def test_loss_reports_the_students_mean_entropy_over_response_tokens(mode: LossMode) -> None:
    logits, response, mask, targets = _batch()
    out = distillation_loss(logits, response, mask, targets, LossConfig(mode=mode, chunk_tokens=2))
    expected = float(_entropy(logits)[mask].mean())
    assert out.metrics["distill/entropy"] == pytest.approx(expected, rel=1e-5)


def test_logprob_gap_is_zero_for_the_same_policy_and_shows_one_wrong_token() -> None:
    logits, response, mask, targets = _batch()
    own = torch.log_softmax(logits, -1).gather(-1, response[..., None])[..., 0]
    config = LossConfig(mode=LossMode.K3)
    same = distillation_loss(logits, response, mask, targets, config, old_logprobs=own.clone())
    assert same.metrics["distill/logprob_gap_mean"] < 1e-6
    assert same.metrics["distill/logprob_gap_max"] < 1e-6
    off = own.clone()
    off[0, 1] += 0.5  # one token the engine scored differently (a stale or wrongly loaded weight)
    off[2, 4] += 9.0  # padding: not a response token, not counted
    out = distillation_loss(logits, response, mask, targets, config, old_logprobs=off)
    assert out.metrics["distill/logprob_gap_max"] == pytest.approx(0.5, abs=1e-5)
    assert out.metrics["distill/logprob_gap_mean"] == pytest.approx(0.5 / int(mask.sum()), abs=1e-5)
    # Without rollout log-probs (dataset responses), or at another temperature, there is no gap to report.
    assert (
        "distill/logprob_gap_mean" not in distillation_loss(logits, response, mask, targets, config).metrics
    )
    tempered = LossConfig(mode=LossMode.K3, temperature=0.5)
    assert (
        "distill/logprob_gap_max"
        not in distillation_loss(logits, response, mask, targets, tempered, old_logprobs=own).metrics
    )
