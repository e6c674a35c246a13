"""PPO-clipped policy-gradient objective, used when the distillation loss acts as a reward.

advantage A_t (detached) and log-ratio r_t = log pi(y_t) - log pi_old(y_t):
    loss_t = max(-A_t exp(r_t), -A_t clip(exp(r_t), 1 - clip_low, 1 + clip_high))
with r_t clamped to [-20, 20] before exp (verl). Without old log-probs the step is on-policy
(pi_old = the current policy, detached), which leaves ratio 1 and gradient -A_t grad log pi.
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0


def ppo_clipped_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO-clipped loss. Returns (loss [..], clipped [..] bool, log_ratio [..] detached)."""
    old = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    log_ratio = (logprobs - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    adv = advantages.detach()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped, log_ratio.detach()
