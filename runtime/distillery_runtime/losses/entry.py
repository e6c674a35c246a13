"""distillation_loss: the one entry point the trainer calls.

Reads top to bottom: one chunked pass over the vocabulary for the student log-probs that
the loss needs (sampled token + teacher top-k ids), per-token loss from the registry, the
per-token clamp, the mask, then either the direct reduction or the PPO-clipped objective
with advantage = -loss, and the diagnostics.
"""

from __future__ import annotations

import torch

from distillery.api.spec import LossMode, Objective
from distillery.plan.loss import LossConfig

from .diagnostics import (
    logprob_gap_metrics,
    overlap_sample,
    sampled_kl_metrics,
    token_loss_metrics,
    topk_metrics,
)
from .reduction import counted_tokens, masked, masked_mean, reduce_tokens
from .registry import TokenInputs, get_token_loss_fn
from .targets import LossOutput, TeacherTargets
from .terms.chunked import gather_log_softmax_and_entropy
from .terms.estimators import clamp_token_loss
from .terms.policy_gradient import ppo_clipped_token_loss
from .terms.topk import fold_out_of_vocab


def distillation_loss(
    student_logits: torch.Tensor,
    response_ids: torch.Tensor,
    mask: torch.Tensor,
    teacher: TeacherTargets,
    config: LossConfig,
    old_logprobs: torch.Tensor | None = None,
    task_advantages: torch.Tensor | None = None,
) -> LossOutput:
    """Distillation loss for one micro-batch.

    student_logits [B, T, V]: raw logits at the positions predicting response token t (shifted);
    response_ids [B, T]: the sampled tokens; mask [B, T]: True for response tokens (prompt and
    padding False); teacher: the teacher's targets; old_logprobs [B, T]: the rollout policy's
    log-probs (policy_gradient; None = on-policy); task_advantages [B, T]: task-reward advantages,
    weighted by config.task_reward_coef (> 0 to use them).

    Tokens where the teacher has nothing (token log-prob not finite for the sampled-token modes,
    all top-k entries -inf for the top-k modes) are dropped from the mask: they add nothing. Top-k ids
    beyond the student's V are folded into the tail (`fold_out_of_vocab`) and counted in
    `distill/teacher_topk_out_of_vocab`.

    Besides the loss's own diagnostics: `distill/entropy`, the student's mean per-token entropy (at the
    loss temperature) over the response tokens, and with old_logprobs at temperature 1,
    `distill/logprob_gap_mean` / `_max`, how far the rollout engine's log-probs of the sampled tokens are
    from the trainer's (~0 when the weight sync, the template and the precision agree).
    """
    _check_shapes(student_logits, response_ids, mask)
    mask = mask.bool()
    use_task = config.task_reward_coef > 0.0
    if use_task and task_advantages is None:
        raise ValueError("task_reward_coef > 0 needs task_advantages")

    # Which tokens count: the caller's mask, less the positions the teacher has nothing for. Counted before
    # the fold below, as the trainer counts the step's normaliser (it does not know V).
    counted = counted_tokens(mask, teacher, config)
    out_of_vocab = None
    if config.uses_topk:
        assert teacher.topk_ids is not None and teacher.topk_logprobs is not None  # counted_tokens checked
        folded_ids, folded_logprobs, out_of_vocab = fold_out_of_vocab(
            teacher.topk_ids, teacher.topk_logprobs, student_logits.shape[-1]
        )
        teacher = TeacherTargets(folded_ids, folded_logprobs, teacher.token_logprobs)

    inputs, student_top_ids, entropy, overlap_rows = _student_inputs(
        student_logits, response_ids, teacher, counted, config, use_task
    )
    student_token = inputs.student_token
    token_loss = clamp_token_loss(get_token_loss_fn(config.mode)(inputs, config), config.loss_max_clamp)
    token_loss = masked(token_loss, counted)
    loss, metrics = _objective(
        token_loss, student_token, counted, mask, config, old_logprobs, task_advantages
    )

    metrics["distill/loss"] = float(loss.detach())
    metrics["distill/entropy"] = masked_mean(entropy, mask)
    if old_logprobs is not None and config.temperature == 1.0:
        # The rollout engine's log-probs are of the raw distribution: comparable at temperature 1 only.
        metrics.update(logprob_gap_metrics(student_token, old_logprobs, mask))
    metrics.update(token_loss_metrics(token_loss, counted, mask & ~counted))
    if config.uses_topk:
        assert (
            inputs.student_topk is not None
            and inputs.teacher_topk is not None
            and inputs.topk_valid is not None
        )
        assert teacher.topk_ids is not None and out_of_vocab is not None
        metrics["distill/teacher_topk_out_of_vocab"] = float((out_of_vocab & counted.unsqueeze(-1)).sum())
        metrics.update(
            topk_metrics(
                inputs.student_topk,
                inputs.teacher_topk,
                inputs.topk_valid,
                teacher.topk_ids,
                student_top_ids,
                counted,
                overlap_rows,
            )
        )
    if teacher.token_logprobs is not None:
        metrics.update(sampled_kl_metrics(student_token, teacher.token_logprobs, counted))
    return LossOutput(loss=loss, token_loss=token_loss.detach(), mask=counted, metrics=metrics)


def _check_shapes(student_logits: torch.Tensor, response_ids: torch.Tensor, mask: torch.Tensor) -> None:
    if (
        student_logits.dim() != 3
        or response_ids.shape != student_logits.shape[:2]
        or mask.shape != response_ids.shape
    ):
        raise ValueError(
            f"expected student_logits [B, T, V], response_ids and mask [B, T]; got {tuple(student_logits.shape)}, "
            f"{tuple(response_ids.shape)}, {tuple(mask.shape)}"
        )


def _student_inputs(
    student_logits: torch.Tensor,
    response_ids: torch.Tensor,
    teacher: TeacherTargets,
    counted: torch.Tensor,
    config: LossConfig,
    use_task: bool,
) -> tuple[TokenInputs, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The per-token inputs of the loss from one pass over the student's vocabulary, with what the
    diagnostics read from the same pass: (inputs, the student's own top ids, its entropy, the rows sampled
    for the top-k overlap)."""
    # One pass over the vocabulary: column 0 is the sampled token, then the teacher's top-k.
    ids = response_ids.long().unsqueeze(-1)
    k, overlap_rows = 0, None
    if config.uses_topk:
        assert teacher.topk_ids is not None and teacher.topk_logprobs is not None
        k = teacher.topk_ids.shape[-1]
        valid = torch.isfinite(teacher.topk_logprobs)
        ids = torch.cat([ids, teacher.topk_ids.long()], dim=-1)
        overlap_rows = overlap_sample(counted)
    if _shift_invariant(config, use_task):
        # The loss renormalises over the top-k, so it does not depend on the log-normaliser and
        # neither does its gradient: take the exact log-probs without autograd (for the values and
        # the metrics) and route the gradient through a plain gather of the logits, whose backward
        # is the gradient tensor itself - no softmax over V in backward.
        with torch.no_grad():
            logp, student_top_ids, entropy = gather_log_softmax_and_entropy(
                student_logits, ids, config.temperature, config.chunk_tokens, k, overlap_rows
            )
        raw = student_logits.gather(-1, ids).to(logp.dtype) / config.temperature
        logp = logp + (raw - raw.detach())
    else:
        # The student's entropy comes from the same pass over the vocabulary (no second forward).
        logp, student_top_ids, entropy = gather_log_softmax_and_entropy(
            student_logits, ids, config.temperature, config.chunk_tokens, k, overlap_rows
        )
    student_token = logp[..., 0]
    if config.uses_topk:
        inputs = TokenInputs(
            student_token, teacher.token_logprobs, logp[..., 1:], teacher.topk_logprobs, valid
        )
    else:
        inputs = TokenInputs(student_token, teacher.token_logprobs)
    return inputs, student_top_ids, entropy, overlap_rows


def _objective(
    token_loss: torch.Tensor,
    student_token: torch.Tensor,
    counted: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    old_logprobs: torch.Tensor | None,
    task_advantages: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The back-propagated loss from the per-token loss: the direct reduction (plus the task's PPO term),
    or the PPO-clipped objective with the loss as a per-token reward; and the objective's metrics."""
    use_task = config.task_reward_coef > 0.0
    metrics: dict[str, float] = {}
    if config.objective == Objective.DIRECT:
        loss = reduce_tokens(token_loss, counted, config.reduction)
        if use_task:
            assert task_advantages is not None
            task_loss, clipped, log_ratio = ppo_clipped_token_loss(
                student_token, old_logprobs, task_advantages, config.clip_ratio_low, config.clip_ratio_high
            )
            task = reduce_tokens(task_loss, mask, config.reduction)
            loss = loss + config.task_reward_coef * task
            metrics["distill/task_loss"] = float(task.detach())
            metrics["distill/pg_clipfrac"] = masked_mean(clipped.to(token_loss.dtype), mask)
    else:
        # verl use_policy_gradient: the loss is a per-token reward; task advantages (if any) add to it.
        advantages = -token_loss.detach()
        pg_mask = counted
        if use_task:
            assert task_advantages is not None
            advantages = advantages + config.task_reward_coef * task_advantages.to(advantages.dtype)
            pg_mask = mask
        pg_loss, clipped, log_ratio = ppo_clipped_token_loss(
            student_token, old_logprobs, advantages, config.clip_ratio_low, config.clip_ratio_high
        )
        loss = reduce_tokens(pg_loss, pg_mask, config.reduction)
        metrics["distill/pg_clipfrac"] = masked_mean(clipped.to(token_loss.dtype), pg_mask)
        metrics["distill/ppo_kl"] = masked_mean(-log_ratio, pg_mask)
        metrics["distill/advantage_mean"] = masked_mean(advantages, pg_mask)
    return loss, metrics


def _shift_invariant(config: LossConfig, use_task: bool) -> bool:
    """True when the back-propagated loss is unchanged by adding a constant to every student
    log-prob of a token: renormalised top-k losses in direct mode (the sampled token's log-prob,
    needed with a full-softmax gradient by the policy-gradient objectives, is then only a metric)."""
    renormalised = (config.mode in {LossMode.REVERSE_KL_TOPK, LossMode.JSD} and not config.add_tail) or (
        config.mode == LossMode.FORWARD_KL_TOPK and config.renormalize
    )
    return renormalised and config.objective == Objective.DIRECT and not use_task
