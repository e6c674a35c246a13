"""Distillation losses: sampled-token estimators, top-k divergences, one entry point.

The trainer calls `distillation_loss(student_logits, response_ids, mask, teacher, config)`, config the
resolved `distillery.plan.loss.LossConfig`; `LOSS_REGISTRY` maps each `LossMode` to its per-token function;
`reduction` owns which tokens count and the token-mean / sequence-mean / sum reduction; formulas are in the
docstrings of estimators.py, topk.py and divergence.py (a full-vocabulary reference is in
`distillery_runtime.testing.full_vocab`).
"""

from .entry import distillation_loss
from .reduction import counted_tokens, reduce_tokens, reduction_units
from .registry import LOSS_REGISTRY, TokenInputs, get_token_loss_fn
from .targets import LossOutput, TeacherTargets
from .terms.chunked import ChunkedGatherLogSoftmax, gather_log_softmax
from .terms.divergence import add_tail_bucket, generalized_jsd, kl, renormalize
from .terms.estimators import abs_estimator, clamp_token_loss, k1, k2, k3
from .terms.policy_gradient import ppo_clipped_token_loss
from .terms.topk import forward_kl_topk, forward_kl_topk_renormalized, jsd_topk, reverse_kl_topk

__all__ = [
    "LOSS_REGISTRY",
    "ChunkedGatherLogSoftmax",
    "LossOutput",
    "TeacherTargets",
    "TokenInputs",
    "abs_estimator",
    "add_tail_bucket",
    "clamp_token_loss",
    "counted_tokens",
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
    "reduction_units",
    "renormalize",
    "reverse_kl_topk",
]
