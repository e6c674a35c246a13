"""Divergences between two distributions given as log-probabilities over the last dimension.

Pure tensor formulas shared by the top-k losses (over the teacher's K ids, with a validity
mask for padded entries) and the full-vocabulary losses (mask None). Padded entries never
enter arithmetic as -inf: they are replaced by 0 before use and weighted by 0, so a padded
row yields 0 with a finite gradient instead of NaN.
"""

from __future__ import annotations

import math

import torch

# Floor for a tail bucket's probability inside its logarithm (bounds loss and gradient when
# the top-k already holds all the mass); same role as verl's tail_mass_eps.
TAIL_MASS_EPS = 1e-6


def _safe(log_p: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    return log_p if valid is None else torch.where(valid, log_p, torch.zeros_like(log_p))


def kl(log_p: torch.Tensor, log_q: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """KL(P || Q) = sum_v p_v (log p_v - log q_v) over the last dim, entries with valid False skipped."""
    lp, lq = _safe(log_p, valid), _safe(log_q, valid)
    terms = lp.exp() * (lp - lq)
    if valid is not None:
        terms = torch.where(valid, terms, torch.zeros_like(terms))
    return terms.sum(dim=-1)


def renormalize(log_p: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """log p_v - log sum_{u valid} p_u: the distribution restricted to the valid entries.

    A row with no valid entry comes back as zeros (to be masked by the caller), not NaN.
    """
    if valid is None:
        return log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
    row_ok = valid.any(dim=-1, keepdim=True)
    x = torch.where(valid, log_p, torch.full_like(log_p, -math.inf))
    x = torch.where(row_ok, x, torch.zeros_like(x))
    return _safe(log_p, valid) - torch.logsumexp(x, dim=-1, keepdim=True)


def add_tail_bucket(
    log_p: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the bucket log(1 - sum_k exp(log p_k)) holding the mass outside the K entries (TRL).

    The tail probability is floored at TAIL_MASS_EPS. Returns ([..., K+1] log-probs, [..., K+1] mask);
    the tail entry is valid wherever the row has at least one valid entry.
    """
    if valid is None:
        valid = torch.ones_like(log_p, dtype=torch.bool)
    row_ok = valid.any(dim=-1, keepdim=True)
    x = torch.where(valid, log_p, torch.full_like(log_p, -math.inf))
    x = torch.where(row_ok, x, torch.zeros_like(x))
    log_mass = torch.logsumexp(x, dim=-1, keepdim=True).clamp(max=math.log1p(-TAIL_MASS_EPS))
    # log(1 - exp(a)) via expm1 keeps precision when the mass is small.
    tail = torch.log(-torch.expm1(log_mass))
    return torch.cat([_safe(log_p, valid), tail], dim=-1), torch.cat([valid, row_ok], dim=-1)


def generalized_jsd(
    log_p_teacher: torch.Tensor,
    log_p_student: torch.Tensor,
    beta: float,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """JSD_beta(T, S) = beta KL(T || M) + (1 - beta) KL(S || M), M = beta T + (1 - beta) S.

    The mixture formula is 0 at both ends, so (as TRL and ms-swift) the endpoints are special
    cases: beta = 0 is the forward KL(T || S), beta = 1 the reverse KL(S || T).
    """
    if beta == 0.0:
        return kl(log_p_teacher, log_p_student, valid)
    if beta == 1.0:
        return kl(log_p_student, log_p_teacher, valid)
    lt, ls = _safe(log_p_teacher, valid), _safe(log_p_student, valid)
    log_m = torch.logaddexp(lt + math.log(beta), ls + math.log1p(-beta))
    return beta * kl(lt, log_m, valid) + (1.0 - beta) * kl(ls, log_m, valid)
