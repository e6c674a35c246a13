"""The job's loss, resolved: a typed, immutable LossConfig keyed by the API's own enums.

`resolve_loss` is the one place where the spec's `loss` block becomes the values the loss library reads: the
per-token clamp when the spec sets none (by mode), and the API's "0 = none" for both clamps. The teachers'
top-k (how many log-probs each position gets) is a teacher engine setting, not the loss's: the loss takes K
from the targets it is given. A LossConfig refuses invalid combinations when it is built (tests and
benchmarks build one directly), once, rather than deep inside a training step.
"""

from __future__ import annotations

from dataclasses import dataclass

from distillery.api.spec import TOPK_MODES, DistillationJobSpec, Loss, LossMode, Objective, Reduction


def default_loss_max_clamp(mode: LossMode) -> float | None:
    """The per-token clamp when the spec sets none: verl's 10, except for k2, which gets none.

    k2 = (s - t)^2 / 2 passes 10 once |s - t| > sqrt(20) = 4.5, and the clamp then zeroes its gradient: the
    tokens the student likes and a near-certain teacher rejects get no push at all. On the bundled task
    k2 with the clamp collapsed to 0% accuracy; without it, it did not (bench/README.md).
    """
    return None if mode == LossMode.K2 else 10.0


@dataclass(frozen=True)
class LossConfig:
    """Loss settings; defaults as in the API (and verl for the clamps)."""

    mode: LossMode = LossMode.K3
    objective: Objective = Objective.DIRECT
    reduction: Reduction = Reduction.TOKEN_MEAN
    """token_mean (default): sum of token losses / number of valid tokens in the batch, as verl
    and TRL; sequence_mean: mean over sequences of each sequence's token mean; sum: plain sum."""
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
        if not isinstance(self.mode, LossMode):
            raise ValueError(f"unknown loss mode {self.mode!r}; known: {sorted(m.value for m in LossMode)}")
        if not isinstance(self.objective, Objective):
            raise ValueError(
                f"unknown objective {self.objective!r}; known: {sorted(o.value for o in Objective)}"
            )
        if not isinstance(self.reduction, Reduction):
            raise ValueError(
                f"unknown reduction {self.reduction!r}; known: {sorted(r.value for r in Reduction)}"
            )
        if self.mode == LossMode.K1 and self.objective == Objective.DIRECT:
            # As verl: d(s - t)/dθ = grad log pi_S(y), whose expectation is 0, not a KL gradient.
            raise ValueError("k1 needs objective policy_gradient (its direct gradient is not a KL gradient)")
        if self.mode == LossMode.FORWARD_KL_TOPK and self.renormalize and self.add_tail:
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
        """The loss reads the teacher's top-k log-probs (else only the sampled token's)."""
        return self.mode in TOPK_MODES


def _zero_is_none(clamp: float | None) -> float | None:
    # The API documents 0 as "no clamp"; the loss library spells that None.
    return None if clamp == 0 else clamp


def resolve_loss(loss: Loss) -> LossConfig:
    """The loss settings of a spec's `loss` block."""
    max_clamp = default_loss_max_clamp(loss.mode) if loss.loss_max_clamp is None else loss.loss_max_clamp
    return LossConfig(
        mode=loss.mode,
        objective=loss.objective,
        reduction=loss.reduction,
        beta=loss.beta,
        temperature=loss.temperature,
        loss_max_clamp=_zero_is_none(max_clamp),
        log_prob_min_clamp=_zero_is_none(loss.log_prob_min_clamp),
        clip_ratio_low=loss.clip_ratio_low,
        clip_ratio_high=loss.clip_ratio_high,
        renormalize=loss.renormalize,
        add_tail=loss.add_tail,
        task_reward_coef=loss.task_reward_coef,
    )


def max_logprobs(spec: DistillationJobSpec) -> int:
    """The teachers' max log-probs: the loss's topK, at least 1 (the sampled token's log-prob)."""
    return max(spec.loss.top_k, 1)
