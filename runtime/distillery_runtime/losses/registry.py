"""The loss registry: each `LossMode` maps to exactly one per-token function.

Every registered function takes the per-token inputs (TokenInputs) and the LossConfig and
returns the per-token distillation loss [B, T] before the shared loss_max_clamp and masking.
The formulas live in estimators.py and topk.py; this module only picks arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from distillery.api.spec import LossMode
from distillery.plan.loss import LossConfig

from .terms import estimators, topk


@dataclass(frozen=True)
class TokenInputs:
    """Per-token inputs. student_token s [B, T]: student log-prob of the sampled token (full
    softmax, temperature applied); teacher_token t [B, T] (may be -inf at pad rows);
    student_topk / teacher_topk [B, T, K]: log-probs at the teacher's top-k ids; topk_valid [B, T, K]."""

    student_token: torch.Tensor
    teacher_token: torch.Tensor | None = None
    student_topk: torch.Tensor | None = None
    teacher_topk: torch.Tensor | None = None
    topk_valid: torch.Tensor | None = None


TokenLossFn = Callable[[TokenInputs, LossConfig], torch.Tensor]
LOSS_REGISTRY: dict[LossMode, TokenLossFn] = {}


def register(mode: LossMode) -> Callable[[TokenLossFn], TokenLossFn]:
    def decorator(fn: TokenLossFn) -> TokenLossFn:
        if mode in LOSS_REGISTRY:
            raise ValueError(f"loss mode {mode!r} registered twice")
        LOSS_REGISTRY[mode] = fn
        return fn

    return decorator


def get_token_loss_fn(mode: LossMode) -> TokenLossFn:
    """The one function registered for this loss mode."""
    try:
        return LOSS_REGISTRY[mode]
    except KeyError:
        raise ValueError(
            f"unknown loss mode {mode!r}; known: {sorted(m.value for m in LOSS_REGISTRY)}"
        ) from None


def _sampled(inputs: TokenInputs, config: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    if inputs.teacher_token is None:
        raise ValueError(f"loss mode {config.mode.value!r} needs the teacher's token_logprobs")
    t = inputs.teacher_token
    # Pad rows hold -inf; they are masked out later, but must not reach arithmetic as -inf.
    t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    if config.log_prob_min_clamp is not None:
        # Floor the teacher side only: it bounds k1/k2 when the teacher finds the token
        # implausible, while the student's own sample keeps its gradient.
        t = t.clamp_min(config.log_prob_min_clamp)
    return inputs.student_token, t.to(inputs.student_token.dtype)


def _topk(inputs: TokenInputs, config: LossConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if inputs.student_topk is None or inputs.teacher_topk is None or inputs.topk_valid is None:
        raise ValueError(f"loss mode {config.mode.value!r} needs the teacher's topk_ids and topk_logprobs")
    return inputs.student_topk, inputs.teacher_topk.to(inputs.student_topk.dtype), inputs.topk_valid


@register(LossMode.K1)
def _k1(inputs: TokenInputs, config: LossConfig) -> torch.Tensor:
    return estimators.k1(*_sampled(inputs, config))


@register(LossMode.ABS)
def _abs(inputs: TokenInputs, config: LossConfig) -> torch.Tensor:
    return estimators.abs_estimator(*_sampled(inputs, config))


@register(LossMode.K2)
def _k2(inputs: TokenInputs, config: LossConfig) -> torch.Tensor:
    return estimators.k2(*_sampled(inputs, config))


@register(LossMode.K3)
def _k3(inputs: TokenInputs, config: LossConfig) -> torch.Tensor:
    return estimators.k3(*_sampled(inputs, config))


@register(LossMode.FORWARD_KL_TOPK)
def _forward_kl_topk(inputs: TokenInputs, config: LossConfig) -> torch.Tensor:
    student, teacher, valid = _topk(inputs, config)
    if config.renormalize:
        return topk.forward_kl_topk_renormalized(student, teacher, valid, config.temperature)
    return topk.forward_kl_topk(student, teacher, valid, config.log_prob_min_clamp, config.add_tail)


@register(LossMode.REVERSE_KL_TOPK)
def _reverse_kl_topk(inputs: TokenInputs, config: LossConfig) -> torch.Tensor:
    student, teacher, valid = _topk(inputs, config)
    return topk.reverse_kl_topk(student, teacher, valid, config.temperature, config.add_tail)


@register(LossMode.JSD)
def _jsd(inputs: TokenInputs, config: LossConfig) -> torch.Tensor:
    student, teacher, valid = _topk(inputs, config)
    return topk.jsd_topk(student, teacher, valid, config.beta, config.temperature, config.add_tail)


assert set(LOSS_REGISTRY) == set(LossMode), "every API loss mode needs exactly one function"
