"""Masking and reduction of per-token losses [B, T] to the scalar that is back-propagated."""

from __future__ import annotations

import torch


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values where mask, else 0 (a where, not a product: masked NaN/inf cannot leak)."""
    return torch.where(mask, values, torch.zeros_like(values))


def reduce_tokens(values: torch.Tensor, mask: torch.Tensor, reduction: str) -> torch.Tensor:
    """Reduce per-token values [B, T] over the tokens where mask [B, T] is True.

    token_mean (default, as verl's token-mean and TRL): sum / number of valid tokens;
    sequence_mean: mean over sequences with >= 1 valid token of each one's token mean (verl
    seq-mean-token-mean); sum: the plain sum. No valid token at all gives 0, still differentiable.
    """
    v = masked(values, mask)
    if reduction == "token_mean":
        return v.sum() / mask.sum().clamp_min(1)
    if reduction == "sequence_mean":
        per_seq_tokens = mask.sum(dim=-1)
        per_seq = v.sum(dim=-1) / per_seq_tokens.clamp_min(1)
        has = per_seq_tokens > 0
        return masked(per_seq, has).sum() / has.sum().clamp_min(1)
    if reduction == "sum":
        return v.sum()
    raise ValueError(f"unknown reduction {reduction!r}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of values over mask as a Python float (0.0 when nothing is valid), for metrics."""
    n = int(mask.sum())
    return float(masked(values.detach(), mask).sum()) / n if n else 0.0
