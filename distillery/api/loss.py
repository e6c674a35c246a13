"""The DistillationJob's loss (`spec.loss`): the divergence or estimator, the objective and the reduction."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from distillery.api.base import ApiModel, Rule


class LossMode(StrEnum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"
    ABS = "abs"
    FORWARD_KL_TOPK = "forward_kl_topk"
    REVERSE_KL_TOPK = "reverse_kl_topk"
    JSD = "jsd"


TOPK_MODES = frozenset({LossMode.FORWARD_KL_TOPK, LossMode.REVERSE_KL_TOPK, LossMode.JSD})


class Objective(StrEnum):
    POLICY_GRADIENT = "policy_gradient"
    DIRECT = "direct"


class Reduction(StrEnum):
    TOKEN_MEAN = "token_mean"
    SEQUENCE_MEAN = "sequence_mean"
    SUM = "sum"


class Loss(ApiModel):
    """What the student minimises: a per-token divergence between the student's and the teacher's log-probs
    of the sampled tokens (or of the teacher's top-k), reduced over the batch."""

    mode: LossMode = LossMode.K3
    """k1, k2, k3, abs: sampled-token estimators; forward_kl_topk, reverse_kl_topk, jsd: over teacher top-k."""
    top_k: int = Field(default=0, ge=0, le=1024)
    """Teacher log-probs per position; >= 1 for the top-k modes, 0 = sampled token only."""
    beta: float = Field(default=0.5, ge=0.0, le=1.0)
    """JSD interpolation: 0 = forward KL(teacher||student), 1 = reverse KL(student||teacher)."""
    temperature: float = Field(default=1.0, gt=0.0, le=10.0)
    """Student logits are divided by it before the loss."""
    objective: Objective = Objective.DIRECT
    """direct: back-propagate the loss; policy_gradient: advantage = -loss in a PPO-clipped objective."""
    renormalize: bool = False
    """forward_kl_topk: renormalise the student over the teacher's top-k (ms-swift) instead of full softmax."""
    add_tail: bool = False
    """Top-k modes: add the bucket log(1 - sum exp(top-k)) for the mass outside the top-k (TRL)."""
    loss_max_clamp: float | None = Field(default=None, ge=0.0)
    """Per-token loss clamp; 0 = none. Unset: 10 (verl's), but none for k2: a clamp at c zeroes k2's gradient
    where |s - t| > sqrt(2c), the tokens the teacher rejects (k2 with 10 collapsed on the bundled task)."""
    log_prob_min_clamp: float = Field(default=-10.0, le=0.0)
    """Floor for log-probs entering a loss (0 = none)."""
    clip_ratio_low: float = Field(default=0.2, ge=0.0, le=1.0)
    """PPO clip: the ratio is kept above 1 - clipRatioLow (policy_gradient)."""
    clip_ratio_high: float = Field(default=0.2, ge=0.0, le=10.0)
    """PPO clip: the ratio is kept below 1 + clipRatioHigh (policy_gradient)."""
    reduction: Reduction = Reduction.TOKEN_MEAN
    """token_mean: mean over all response tokens of the batch; sequence_mean: mean of per-sequence means; sum."""
    on_policy_fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    """lambda: probability that a batch is sampled by the student; else dataset responses are used."""
    task_reward_coef: float = Field(default=0.0, ge=0.0)
    """> 0 adds task-reward advantages (data.grader's score on answerField) to the distillation advantages."""

    rules = (
        Rule(
            check=lambda loss: loss.mode not in TOPK_MODES or loss.top_k >= 1,
            cel="!(self.mode in ['forward_kl_topk', 'reverse_kl_topk', 'jsd']) || self.topK >= 1",
            message="must be >= 1 for the top-k modes (forward_kl_topk, reverse_kl_topk, jsd)",
            field="topK",
        ),
        Rule(
            check=lambda loss: not (loss.mode == LossMode.K1 and loss.objective == Objective.DIRECT),
            cel="!(self.mode == 'k1' && self.objective == 'direct')",
            message="k1 needs objective policy_gradient (its direct gradient is not a KL gradient)",
            field="objective",
        ),
        Rule(
            check=lambda loss: loss.objective == Objective.DIRECT or loss.mode not in TOPK_MODES,
            cel="self.objective == 'direct' || !(self.mode in ['forward_kl_topk', 'reverse_kl_topk', 'jsd'])",
            message="policy_gradient applies to the sampled-token modes (k1, k2, k3, abs) only",
            field="objective",
        ),
        Rule(
            check=lambda loss: not loss.add_tail or loss.mode in TOPK_MODES,
            cel="!self.addTail || self.mode in ['forward_kl_topk', 'reverse_kl_topk', 'jsd']",
            message="applies to the top-k modes only",
            field="addTail",
        ),
    )
