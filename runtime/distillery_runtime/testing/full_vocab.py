"""Reference full-vocabulary losses, for tests and benchmarks: both logit sets at hand, a divergence over V.

Per token: log-softmax both [N, V] logit sets after dividing by the temperature, then a
divergence over V. To keep memory flat at large V the tokens are processed in chunks under
activation checkpointing (torch.utils.checkpoint): only a chunk's softmax is alive at a time
and backward recomputes it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from distillery_runtime.losses.terms.chunked import chunk_tokens_for
from distillery_runtime.losses.terms.divergence import generalized_jsd, kl

_PerRow = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _chunked(
    fn: _PerRow,
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float,
    chunk_tokens: int | None,
) -> torch.Tensor:
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"logit shapes differ: {tuple(student_logits.shape)} vs {tuple(teacher_logits.shape)}"
        )
    lead, v = student_logits.shape[:-1], student_logits.shape[-1]
    s, t = student_logits.reshape(-1, v), teacher_logits.reshape(-1, v)
    chunk = chunk_tokens or chunk_tokens_for(v)

    def per_chunk(sc: torch.Tensor, tc: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(sc.dtype, torch.float32)
        ls = F.log_softmax(sc.to(dtype) / temperature, dim=-1)
        lt = F.log_softmax(tc.to(dtype) / temperature, dim=-1)
        return fn(ls, lt)

    if s.shape[0] <= chunk:
        return per_chunk(s, t).reshape(lead)
    parts = [
        checkpoint(per_chunk, s[i : i + chunk], t[i : i + chunk], use_reentrant=False)
        for i in range(0, s.shape[0], chunk)
    ]
    return torch.cat(parts).reshape(lead)


def forward_kl_full(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """KL(P_T || P_S) = sum_v p_T(v) (log p_T(v) - log p_S(v)), P = softmax(logits / temperature)."""
    return _chunked(lambda ls, lt: kl(lt, ls), student_logits, teacher_logits, temperature, chunk_tokens)


def reverse_kl_full(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """KL(P_S || P_T) = sum_v p_S(v) (log p_S(v) - log p_T(v)), P = softmax(logits / temperature)."""
    return _chunked(lambda ls, lt: kl(ls, lt), student_logits, teacher_logits, temperature, chunk_tokens)


def jsd_full(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """Generalized JSD(beta) over the full vocabulary (TRL generalized_jsd_loss, per token):
    beta KL(P_T || M) + (1 - beta) KL(P_S || M), M = beta P_T + (1 - beta) P_S;
    beta = 0 is KL(P_T || P_S), beta = 1 is KL(P_S || P_T)."""
    return _chunked(
        lambda ls, lt: generalized_jsd(lt, ls, beta),
        student_logits,
        teacher_logits,
        temperature,
        chunk_tokens,
    )
