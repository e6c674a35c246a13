"""Training metrics that come with each loss: top-k masses, top-k overlap, KL estimates."""

from __future__ import annotations

import torch

from .reduction import masked_mean
from .terms.estimators import k3

# The overlap needs the student's own top-k over V, which costs more than the log-softmax
# of that token; it is measured on up to this many counted tokens per call, evenly spaced
# (a mean of ratios in [0, 1]: standard error <= 0.0625 at 64; the trainer averages over
# micro-batches and steps).
OVERLAP_SAMPLE_TOKENS = 64


def overlap_sample(counted: torch.Tensor, limit: int = OVERLAP_SAMPLE_TOKENS) -> torch.Tensor:
    """Bool mask of the tokens the overlap is measured on: all counted ones up to `limit`,
    else `limit` of them evenly spaced."""
    flat = counted.flatten()
    where = flat.nonzero().squeeze(-1)
    if where.numel() <= limit:
        return counted
    pick = where[torch.linspace(0, where.numel() - 1, limit, device=where.device).long()]
    chosen = torch.zeros_like(flat)
    chosen[pick] = True
    return chosen.view_as(counted)


def topk_metrics(
    student_topk: torch.Tensor,
    teacher_topk: torch.Tensor,
    valid: torch.Tensor,
    teacher_ids: torch.Tensor,
    student_top_ids: torch.Tensor,
    mask: torch.Tensor,
    overlap_mask: torch.Tensor | None = None,
) -> dict[str, float]:
    """Means over masked tokens of: teacher and student probability mass on the teacher's top-k,
    and (over overlap_mask, default mask) overlap = |teacher top-k ∩ student top-k| / (valid teacher entries)."""
    zero = torch.zeros((), dtype=student_topk.dtype, device=student_topk.device)
    s_mass = torch.where(valid, student_topk.detach().exp(), zero).sum(-1)
    t_mass = torch.where(valid, teacher_topk.to(student_topk.dtype).exp(), zero).sum(-1)
    # Membership by binary search in the sorted student ids: O(K log K) memory-free per token,
    # instead of a [.., K, K] comparison (134 MB at 32k tokens and K = 64).
    student_sorted = student_top_ids.sort(dim=-1).values
    pos = torch.searchsorted(student_sorted, teacher_ids.long().contiguous()).clamp_max(
        student_sorted.shape[-1] - 1
    )
    hits = (student_sorted.gather(-1, pos) == teacher_ids) & valid
    overlap = hits.sum(-1).to(s_mass.dtype) / valid.sum(-1).clamp_min(1).to(s_mass.dtype)
    return {
        "distill/student_topk_mass": masked_mean(s_mass, mask),
        "distill/teacher_topk_mass": masked_mean(t_mass, mask),
        "distill/topk_overlap": masked_mean(overlap, mask if overlap_mask is None else overlap_mask),
    }


def sampled_kl_metrics(
    student_token: torch.Tensor, teacher_token: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """k1 (unbiased) and k3 (low-variance) estimates of KL(student || teacher) on the sampled tokens."""
    ok = mask & torch.isfinite(teacher_token)
    s = student_token.detach()
    t = torch.where(ok, teacher_token.to(s.dtype), s)
    return {"distill/kl_k1": masked_mean(s - t, ok), "distill/kl_k3": masked_mean(k3(s, t), ok)}


def token_loss_metrics(
    token_loss: torch.Tensor, mask: torch.Tensor, dropped: torch.Tensor
) -> dict[str, float]:
    """Mean/min/max per-token loss over counted tokens, their number, and response tokens dropped
    because the teacher had nothing for them (pad rows)."""
    n = int(mask.sum())
    values = token_loss.detach()[mask]
    return {
        "distill/token_loss_mean": masked_mean(token_loss, mask),
        "distill/token_loss_min": float(values.min()) if n else 0.0,
        "distill/token_loss_max": float(values.max()) if n else 0.0,
        "distill/tokens": float(n),
        "distill/teacher_pad_tokens": float(dropped.sum()),
    }


def logprob_gap_metrics(
    student_token: torch.Tensor, rollout_token: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Mean and max |trainer log-prob - rollout engine log-prob| of the sampled tokens over mask.

    Both are the same policy's log-probs of the same tokens, so the gap is rounding (bf16 vs float32
    kernels) unless something differs between the two copies of the student: weights a sync missed or
    loaded wrongly, another chat template or tokenization, another dtype; with schedule.oneStepOff it also
    holds the one optimizer step the samples are stale by."""
    gap = (student_token.detach() - rollout_token.to(student_token.dtype)).abs()
    n = int(mask.sum())
    return {
        "distill/logprob_gap_mean": masked_mean(gap, mask),
        "distill/logprob_gap_max": float(gap[mask].max()) if n else 0.0,
    }
