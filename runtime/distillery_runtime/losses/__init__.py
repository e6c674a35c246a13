"""Distillation losses: sampled-token estimators, top-k divergences, one entry point.

The trainer calls `distillation_loss(student_logits, response_ids, mask, teacher, config)`;
`LOSS_REGISTRY` maps each `loss.mode` to its per-token function; formulas are in the
docstrings of estimators.py, topk.py and divergence.py (a full-vocabulary reference is in
`distillery_runtime.testing.full_vocab`).
"""

from .chunked import ChunkedGatherLogSoftmax, gather_log_softmax
from .config import ESTIMATOR_MODES, TOPK_MODES, LossConfig, LossOutput, TeacherTargets
from .divergence import add_tail_bucket, generalized_jsd, kl, renormalize
from .entry import distillation_loss
from .estimators import abs_estimator, clamp_token_loss, k1, k2, k3
from .policy_gradient import ppo_clipped_token_loss
from .reduction import reduce_tokens
from .registry import LOSS_REGISTRY, TokenInputs, get_token_loss_fn
from .topk import forward_kl_topk, forward_kl_topk_renormalized, jsd_topk, reverse_kl_topk

__all__ = [
    "ESTIMATOR_MODES",
    "LOSS_REGISTRY",
    "TOPK_MODES",
    "ChunkedGatherLogSoftmax",
    "LossConfig",
    "LossOutput",
    "TeacherTargets",
    "TokenInputs",
    "abs_estimator",
    "add_tail_bucket",
    "clamp_token_loss",
    "distillation_loss",
    "forward_kl_topk",
    "forward_kl_topk_renormalized",
    "gather_log_softmax",
    "generalized_jsd",
    "get_token_loss_fn",
    "jsd_topk",
    "k1",
    "k2",
    "k3",
    "kl",
    "ppo_clipped_token_loss",
    "reduce_tokens",
    "renormalize",
    "reverse_kl_topk",
]
