"""Which way the top-k KL runs decides what a confidently wrong student learns on its own samples.

The worked-sum continuation (bench/README.md, "Past the SFT plateau") hinges on it: a student that copies
its wrong guess gives the teacher's digit almost no mass. Forward KL, sum_k p_T (log p_T - log p_S), pulls
that digit's logit up by about p_T whatever the student's own probability of it. Reverse KL over the top-k,
sum_k q_S (log q_S - log q_T), pushes the wrong token down but pulls the teacher's digit up only in
proportion to q_S of it, so the freed mass goes to whatever the student already favoured.
"""

from __future__ import annotations

import torch
from distillery_runtime.losses.terms.topk import forward_kl_topk, reverse_kl_topk

VOCAB, WRONG, RIGHT = 16, 3, 7


def logit_gradient(loss_fn) -> torch.Tensor:
    """d loss / d student logits at one position where the student is sure of WRONG and the teacher of RIGHT."""
    logits = torch.zeros(1, VOCAB)
    logits[0, WRONG] = 6.0  # p_S(WRONG) ~ 0.96, log p_S(RIGHT) ~ -6: above forward KL's -10 floor
    logits.requires_grad_(True)
    student = torch.log_softmax(logits, dim=-1)  # at the teacher's top-k ids: the whole vocabulary here
    teacher = torch.full((1, VOCAB), 0.002).index_fill_(1, torch.tensor([RIGHT]), 0.97)
    teacher = (teacher / teacher.sum()).log()
    valid = torch.ones(1, VOCAB, dtype=torch.bool)
    loss_fn(student, teacher, valid).sum().backward()
    assert logits.grad is not None
    return logits.grad[0]


def test_forward_kl_pulls_up_the_teachers_token_where_the_student_gives_it_no_mass():
    grad = logit_gradient(forward_kl_topk)
    assert -grad[RIGHT] > 0.9  # about p_T(RIGHT) - p_S(RIGHT)
    assert grad[WRONG] > 0.9  # and pushes the copied token down as hard
    assert int(grad.argmin()) == RIGHT


def test_reverse_kl_pushes_the_wrong_token_down_but_barely_pulls_the_teachers_up():
    grad = logit_gradient(reverse_kl_topk)
    assert grad[WRONG] > 0.1  # the copied token goes down
    assert -grad[RIGHT] < 0.05  # q_S(RIGHT) ~ 0.0024 scales the pull on the right token
    forward = logit_gradient(forward_kl_topk)
    assert -grad[RIGHT] < -forward[RIGHT] / 20
    # Most of the mass taken from the copied token goes to the other wrong ones, not to the teacher's.
    others = [v for v in range(VOCAB) if v not in (WRONG, RIGHT)]
    assert (grad[others] < 0).all() and -grad[RIGHT] < -grad[others].sum() / 4
