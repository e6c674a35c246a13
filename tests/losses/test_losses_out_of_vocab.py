"""A teacher whose vocabulary extends the student's ranks ids the student has no logit for: the loss folds
them into its tail bucket (never an index error) and counts them in `distill/teacher_topk_out_of_vocab`."""

from __future__ import annotations

import math

import pytest
import torch
from distillery_runtime.losses import TeacherTargets, distillation_loss
from distillery_runtime.losses.terms.topk import fold_out_of_vocab
from distillery_runtime.training.trainer import COUNT_METRICS
from losses import reference as ref

from distillery.api.spec import LossMode
from distillery.plan.loss import LossConfig

STUDENT_V, TEACHER_V = 40, 48


def _batch(seed: int = 3):
    """Teacher targets over 48 ids, student logits over the first 40 (its embedding rows)."""
    logits, resp, mask, tids, tlp, ttok = ref.make_batch(v=TEACHER_V, k=8, seed=seed, pad_entries=1)
    # Some of the teacher's top-k at ids past the student's rows (counted positions: column 0 is prompt).
    tlp = tlp.clone()
    tids = tids.clone()
    tids[0, 1, 0], tids[1, 2, :3] = 45, torch.tensor([40, 41, 47])
    return logits[..., :STUDENT_V].contiguous(), resp % STUDENT_V, mask, tids, tlp, ttok


def test_fold_makes_out_of_vocab_entries_padding() -> None:
    ids = torch.tensor([[3, 41, 0, 39]])
    logprobs = torch.tensor([[-0.5, -1.0, -math.inf, -2.0]])
    folded, values, out = fold_out_of_vocab(ids, logprobs, 40)
    assert folded.tolist() == [[3, 0, 0, 39]] and out.tolist() == [[False, True, False, False]]
    assert values[0, 1] == -math.inf and values[0, 0] == -0.5


@pytest.mark.parametrize(
    "cfg",
    [
        LossConfig(mode=LossMode.FORWARD_KL_TOPK),
        LossConfig(mode=LossMode.FORWARD_KL_TOPK, renormalize=True),
        LossConfig(mode=LossMode.REVERSE_KL_TOPK, add_tail=True),
        LossConfig(mode=LossMode.JSD),
        LossConfig(mode=LossMode.JSD, add_tail=True),
    ],
    ids=lambda c: f"{c.mode}{'+tail' if c.add_tail else ''}{'+renorm' if c.renormalize else ''}",
)
def test_out_of_vocab_ids_are_counted_and_the_loss_stays_finite(cfg: LossConfig) -> None:
    logits, resp, mask, tids, tlp, ttok = _batch()
    beyond = (tids >= STUDENT_V) & torch.isfinite(tlp) & mask.unsqueeze(-1)
    assert int(beyond.sum()) >= 4  # the batch does reach past the student's rows
    student = logits.clone().requires_grad_(True)
    out = distillation_loss(student, resp, mask, TeacherTargets(tids, tlp, ttok), cfg)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(student.grad).all()
    assert out.metrics["distill/teacher_topk_out_of_vocab"] == int(beyond.sum())
    assert "distill/teacher_topk_out_of_vocab" in COUNT_METRICS  # summed over micro-batches and ranks
    # Same loss as a teacher that sent those entries as padding.
    padded_ids = torch.where(beyond, torch.zeros_like(tids), tids)
    padded = TeacherTargets(padded_ids, tlp.masked_fill(beyond, -math.inf), ttok)
    again = distillation_loss(logits, resp, mask, padded, cfg)
    torch.testing.assert_close(out.loss.detach(), again.loss, rtol=0, atol=0)
    assert again.metrics["distill/teacher_topk_out_of_vocab"] == 0


def test_out_of_vocab_mass_goes_to_the_tail_bucket() -> None:
    """Forward KL with the tail: the teacher's tail is 1 - its in-vocabulary top-k mass (the folded ids'
    mass included), the student's 1 - its mass at those in-vocabulary ids."""
    cfg = LossConfig(mode=LossMode.FORWARD_KL_TOPK, add_tail=True, log_prob_min_clamp=None)
    logits, resp, mask, tids, tlp, ttok = _batch()
    out = distillation_loss(logits, resp, mask, TeacherTargets(tids, tlp, ttok), cfg)
    logp_s = logits.log_softmax(-1)
    for i, j in [(0, 1), (1, 2), (1, 3)]:
        keep = (tids[i, j] < STUDENT_V) & torch.isfinite(tlp[i, j])
        p_t, ids = tlp[i, j][keep].exp(), tids[i, j][keep]
        p_s = logp_s[i, j, ids].exp()
        t_tail, s_tail = 1 - p_t.sum(), 1 - p_s.sum()
        want = (p_t * (p_t.log() - p_s.log())).sum() + t_tail * (t_tail.log() - s_tail.log())
        torch.testing.assert_close(out.token_loss[i, j], want, rtol=1e-9, atol=1e-9)
