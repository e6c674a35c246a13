"""The loss library's inputs and outputs: LossConfig (one source of defaults), TeacherTargets, LossOutput.

LossConfig mirrors the DistillationJob API's `loss` block (distillery.api.spec.Loss) field by
field in snake_case; `LossConfig.from_api` copies it over. Invalid combinations are refused
here, once, rather than deep inside a training step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

ESTIMATOR_MODES = frozenset({"k1", "k2", "k3", "abs"})
TOPK_MODES = frozenset({"forward_kl_topk", "reverse_kl_topk", "jsd"})
OBJECTIVES = frozenset({"policy_gradient", "direct"})
REDUCTIONS = frozenset({"token_mean", "sequence_mean", "sum"})


def default_loss_max_clamp(mode: str) -> float | None:
    """The per-token clamp when the spec sets none: verl's 10, except for k2, which gets none.

    k2 = (s - t)^2 / 2 passes 10 once |s - t| > sqrt(20) = 4.5, and the clamp then zeroes its gradient: the
    tokens the student likes and a near-certain teacher rejects get no push at all. On the bundled task
    k2 with the clamp collapsed to 0% accuracy; without it, it did not (bench/README.md).
    """
    return None if mode == "k2" else 10.0


@dataclass(frozen=True)
class LossConfig:
    """Loss settings; defaults as in the API (and verl for the clamps)."""

    mode: str = "k3"
    objective: str = "direct"
    reduction: str = "token_mean"
    """token_mean (default): sum of token losses / number of valid tokens in the batch, as verl
    and TRL; sequence_mean: mean over sequences of each sequence's token mean; sum: plain sum."""
    top_k: int = 0
    beta: float = 0.5
    temperature: float = 1.0
    loss_max_clamp: float | None = 10.0
    log_prob_min_clamp: float | None = -10.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    renormalize: bool = False
    add_tail: bool = False
    task_reward_coef: float = 0.0
    chunk_tokens: int | None = None
    """Tokens per chunk of the vocabulary pass (None: sized to ~128 MiB of float32)."""

    def __post_init__(self) -> None:
        if self.mode not in ESTIMATOR_MODES | TOPK_MODES:
            raise ValueError(
                f"unknown loss mode {self.mode!r}; known: {sorted(ESTIMATOR_MODES | TOPK_MODES)}"
            )
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; known: {sorted(OBJECTIVES)}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {self.reduction!r}; known: {sorted(REDUCTIONS)}")
        if self.mode == "k1" and self.objective == "direct":
            # As verl: d(s - t)/dθ = grad log pi_S(y), whose expectation is 0, not a KL gradient.
            raise ValueError("k1 needs objective policy_gradient (its direct gradient is not a KL gradient)")
        if self.mode == "forward_kl_topk" and self.renormalize and self.add_tail:
            raise ValueError("renormalize and add_tail exclude each other: a renormalised top-k has no tail")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {self.beta}")
        if self.temperature <= 0.0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.loss_max_clamp is not None and self.loss_max_clamp <= 0.0:
            raise ValueError("loss_max_clamp must be > 0 or None")
        if self.log_prob_min_clamp is not None and self.log_prob_min_clamp >= 0.0:
            raise ValueError("log_prob_min_clamp must be < 0 or None")
        if self.clip_ratio_low < 0.0 or self.clip_ratio_high < 0.0:
            raise ValueError("clip ratios must be >= 0")
        if self.task_reward_coef < 0.0:
            raise ValueError("task_reward_coef must be >= 0")
        if self.chunk_tokens is not None and self.chunk_tokens < 1:
            raise ValueError("chunk_tokens must be >= 1 or None")

    @property
    def uses_topk(self) -> bool:
        return self.mode in TOPK_MODES

    @classmethod
    def from_api(cls, loss: Any, **overrides: Any) -> LossConfig:
        """Build from the API's `loss` model (or anything with the same snake_case attributes)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if hasattr(loss, f.name):
                value = getattr(loss, f.name)
                values[f.name] = value.value if hasattr(value, "value") else value
        if "loss_max_clamp" in values and values["loss_max_clamp"] is None:  # unset in the API
            values["loss_max_clamp"] = default_loss_max_clamp(values.get("mode", cls.mode))
        for clamp in ("loss_max_clamp", "log_prob_min_clamp"):
            if values.get(clamp) == 0:
                values[clamp] = None  # the API's "0 = none"
        values.update(overrides)
        return cls(**values)


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
    """loss: the scalar to back-propagate; metrics: diagnostics for logging; token_loss [B, T]:
    the detached per-token distillation loss (0 where masked); mask [B, T]: the tokens that counted."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    token_loss: torch.Tensor | None = None
    mask: torch.Tensor | None = None
