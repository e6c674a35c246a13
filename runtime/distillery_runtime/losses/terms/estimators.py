"""Sampled-token estimators of KL(student || teacher): k1, abs, k2, k3 (low_var_kl).

Notation: s = log pi_S(y_t), t = log pi_T(y_t) for the sampled token y_t, both [..] tensors.
Each function returns the per-token value, before the shared per-token clamp
(`clamp_token_loss`) and before masking. k3's own clamps are verl's.
"""

from __future__ import annotations

import torch

# verl core_algos kl_penalty(low_var_kl): exponent clamp and result clamp.
K3_EXPONENT_CLAMP = 20.0
K3_RESULT_CLAMP = 10.0


def k1(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """k1 = s - t: unbiased estimate of KL(S || T); can be negative. Policy-gradient use only."""
    return s - t


def abs_estimator(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """abs = |s - t|."""
    return (s - t).abs()


def k2(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (s - t)^2."""
    return 0.5 * (s - t).square()


def k3(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """k3 = exp(d) - d - 1 with d = clamp(t - s, -20, 20), result clamped to [-10, 10] (verl low_var_kl)."""
    d = (t - s).clamp(-K3_EXPONENT_CLAMP, K3_EXPONENT_CLAMP)
    return (d.exp() - d - 1.0).clamp(-K3_RESULT_CLAMP, K3_RESULT_CLAMP)


def clamp_token_loss(loss: torch.Tensor, loss_max_clamp: float | None) -> torch.Tensor:
    """Per-token clamp to [-loss_max_clamp, loss_max_clamp] (verl; the lower bound is for k1)."""
    return loss if loss_max_clamp is None else loss.clamp(-loss_max_clamp, loss_max_clamp)
