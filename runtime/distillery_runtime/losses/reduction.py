"""Which tokens count, and the reduction of per-token losses [B, T] to the scalar that is back-propagated.

`reduction_units` is the one owner of a reduction's denominator (verl's `agg_loss` is the shape): a
micro-batch's own reduction, its share of the training step and the step's normaliser over all ranks'
samples are all read from it, so that the shares over micro-batches and ranks add up to the whole step's
reduction (trainer.py). `counted_tokens` is the one owner of which tokens enter a loss.
"""

from __future__ import annotations

import torch

from distillery.api.spec import Reduction
from distillery.plan.loss import LossConfig

from .targets import TeacherTargets


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values where mask, else 0 (a where, not a product: masked NaN/inf cannot leak)."""
    return torch.where(mask, values, torch.zeros_like(values))


def counted_tokens(mask: torch.Tensor, teacher: TeacherTargets, config: LossConfig) -> torch.Tensor:
    """The positions of mask [.., T] that enter the loss: those the teacher has a finite target for (the
    sampled token's log-prob for the sampled-token modes, at least one top-k entry for the top-k modes)."""
    if config.uses_topk:
        if teacher.topk_ids is None or teacher.topk_logprobs is None:
            raise ValueError(f"loss mode {config.mode.value!r} needs teacher topk_ids and topk_logprobs")
        has_target = torch.isfinite(teacher.topk_logprobs).any(dim=-1)
    else:
        if teacher.token_logprobs is None:
            raise ValueError(f"loss mode {config.mode.value!r} needs the teacher's token_logprobs")
        has_target = torch.isfinite(teacher.token_logprobs)
    return mask.bool() & has_target


def reduction_units(tokens_per_sequence: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """What a reduction divides the summed loss by, for sequences with these counted tokens (int [B]):
    token_mean: the counted tokens; sequence_mean: the sequences with at least one; sum: 1. A 0-dim int64
    tensor on their device; 0 when nothing counts (the callers clamp at 1)."""
    if reduction == Reduction.TOKEN_MEAN:
        return tokens_per_sequence.sum()
    if reduction == Reduction.SEQUENCE_MEAN:
        return (tokens_per_sequence > 0).sum()
    if reduction == Reduction.SUM:
        return torch.ones((), dtype=torch.long, device=tokens_per_sequence.device)
    raise ValueError(f"unknown reduction {reduction!r}")


def reduce_tokens(values: torch.Tensor, mask: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Reduce per-token values [B, T] over the tokens where mask [B, T] is True.

    token_mean (default, as verl's token-mean and TRL): sum / number of valid tokens;
    sequence_mean: mean over sequences with >= 1 valid token of each one's token mean (verl
    seq-mean-token-mean); sum: the plain sum. No valid token at all gives 0, still differentiable.
    """
    v = masked(values, mask)
    per_seq_tokens = mask.sum(dim=-1)
    units = reduction_units(per_seq_tokens, reduction).clamp_min(1)
    if reduction == Reduction.SEQUENCE_MEAN:
        per_seq = v.sum(dim=-1) / per_seq_tokens.clamp_min(1)
        return masked(per_seq, per_seq_tokens > 0).sum() / units
    return v.sum() / units


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of values over mask as a Python float (0.0 when nothing is valid), for metrics."""
    n = int(mask.sum())
    return float(masked(values.detach(), mask).sum()) / n if n else 0.0
