"""The loss library's tensors in and out: TeacherTargets and LossOutput.

The settings are `distillery.plan.loss.LossConfig`, keyed by the API's enums and resolved from the spec once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TeacherTargets:
    """What the teacher returned for each response position t (already aligned with the student's).

    topk_ids int [B, T, K] and topk_logprobs float [B, T, K] (raw teacher log-probs, temperature 1);
    token_logprobs float [B, T]: teacher log-prob of the sampled token. Padding: log-prob -inf
    (ids 0) where the teacher has nothing; such entries and rows contribute nothing.
    """

    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None
    token_logprobs: torch.Tensor | None = None


@dataclass
class LossOutput:
    """loss: the scalar to back-propagate; token_loss [B, T]: the detached per-token distillation loss (0
    where masked); mask [B, T]: the tokens that counted (`reduction.counted_tokens`); metrics: diagnostics
    for logging."""

    loss: torch.Tensor
    token_loss: torch.Tensor
    mask: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
