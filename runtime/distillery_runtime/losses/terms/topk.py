"""Distribution losses over the teacher's top-k ids, per token.

Inputs, per token and over the last dim K: `student` = log p_S(v) at the teacher's top-k ids,
from the full-vocabulary softmax of the (temperature-scaled) student logits; `teacher` = the
teacher's log-probs at those ids; `valid` = False at padded entries (teacher log-prob -inf).
The temperature: the student logits are divided by it upstream; where the loss renormalises
over the top-k the teacher's log-probs are divided by it too (exact, since the normaliser
cancels, as GKD scales both); where it does not (verl's plain forward KL, the tail bucket) the
teacher's mass outside its top-k at another temperature is unknown, so they are used as given.
"""

from __future__ import annotations

import math

import torch

from .divergence import add_tail_bucket, generalized_jsd, kl, renormalize


def fold_out_of_vocab(
    ids: torch.Tensor, logprobs: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, log-probs, out_of_vocab) with the teacher's top-k entries at ids >= vocab_size (the student's
    embedding rows) made padding: id 0, log-prob -inf. A teacher whose vocabulary extends the student's
    (Qwen3's `<think>` over a smaller student) can rank ids the student has no logit for; their teacher
    mass then counts as outside the top-k, in the tail bucket (add_tail) or out of the renormalised
    top-k, like the rest of the mass the student is not shown. out_of_vocab: bool [.., K], the entries
    folded (finite ones only: padding stays padding)."""
    out_of_vocab = (ids >= vocab_size) & torch.isfinite(logprobs)
    folded_ids = torch.where(out_of_vocab, torch.zeros_like(ids), ids)
    return folded_ids, logprobs.masked_fill(out_of_vocab, -math.inf), out_of_vocab


def _floor(log_p: torch.Tensor, log_prob_min_clamp: float | None) -> torch.Tensor:
    return log_p if log_prob_min_clamp is None else log_p.clamp_min(log_prob_min_clamp)


def forward_kl_topk(
    student: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor,
    log_prob_min_clamp: float | None = -10.0,
    add_tail: bool = False,
) -> torch.Tensor:
    """Forward KL over the teacher's top-k, as verl: sum_k p_T(k) (log p_T(k) - log p_S(k)).

    log p_S is the full-vocabulary log-softmax (not renormalised); both sides are floored at
    log_prob_min_clamp and the result is clamped at >= 0 (a truncated KL can be negative).
    add_tail: adds the bucket (1 - sum p_T) (log(1 - sum p_T) - log(1 - sum p_S)) for the mass
    outside the top-k (TRL's loss_add_tail; verl's forward_kl_topk_tail), then no clamp at 0.
    """
    lt, ls = _floor(teacher, log_prob_min_clamp), _floor(student, log_prob_min_clamp)
    loss = kl(lt, ls, valid)
    if not add_tail:
        return loss.clamp_min(0.0)
    # Tail masses come from the unfloored log-probs (the floor is a guard, not a redistribution).
    t_tail, mask = add_tail_bucket(teacher, valid)
    s_tail, _ = add_tail_bucket(student, valid)
    return loss + kl(t_tail[..., -1:], s_tail[..., -1:], mask[..., -1:])


def forward_kl_topk_renormalized(
    student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Forward KL between both distributions renormalised over the top-k (ms-swift):
    sum_k q_T(k) (log q_T(k) - log q_S(k)), q_X(k) = p_X(k) / sum_j p_X(j)."""
    return kl(renormalize(teacher / temperature, valid), renormalize(student, valid), valid)


def reverse_kl_topk(
    student: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor,
    temperature: float = 1.0,
    add_tail: bool = False,
) -> torch.Tensor:
    """Reverse KL over the top-k: sum_k q_S(k) (log q_S(k) - log q_T(k)), both renormalised over
    the top-k; add_tail: over the K + 1 buckets (top-k ids and the tail) instead, unnormalised."""
    ls, lt, mask = _buckets(student, teacher, valid, temperature, add_tail)
    return kl(ls, lt, mask)


def jsd_topk(
    student: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor,
    beta: float,
    temperature: float = 1.0,
    add_tail: bool = False,
) -> torch.Tensor:
    """Generalized JSD(beta) over the top-k (ms-swift): beta KL(q_T || M) + (1 - beta) KL(q_S || M),
    M = beta q_T + (1 - beta) q_S, both renormalised over the top-k; beta = 0 is KL(q_T || q_S),
    beta = 1 is KL(q_S || q_T). add_tail: over the K + 1 buckets instead, unnormalised."""
    ls, lt, mask = _buckets(student, teacher, valid, temperature, add_tail)
    return generalized_jsd(lt, ls, beta, mask)


def _buckets(
    student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor, temperature: float, add_tail: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if add_tail:
        ls, mask = add_tail_bucket(student, valid)
        lt, _ = add_tail_bucket(teacher, valid)
        return ls, lt, mask
    return renormalize(student, valid), renormalize(teacher / temperature, valid), valid
