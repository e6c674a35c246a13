"""distillation_loss against the straightforward reference: every mode and option, values and gradients."""

from __future__ import annotations

import dataclasses
import math
import zlib

import pytest
import torch
from distillery_runtime.losses import TeacherTargets, distillation_loss
from losses import reference as ref

from distillery.api.spec import LossMode, Objective, Reduction
from distillery.plan.loss import LossConfig

CONFIGS = [
    LossConfig(mode=LossMode.K2),
    LossConfig(mode=LossMode.K3),
    LossConfig(mode=LossMode.ABS),
    LossConfig(mode=LossMode.K3, temperature=0.7),
    LossConfig(mode=LossMode.K1, objective=Objective.POLICY_GRADIENT),
    LossConfig(
        mode=LossMode.K3, objective=Objective.POLICY_GRADIENT, clip_ratio_low=0.1, clip_ratio_high=0.3
    ),
    LossConfig(mode=LossMode.FORWARD_KL_TOPK),
    LossConfig(mode=LossMode.FORWARD_KL_TOPK, add_tail=True),
    LossConfig(mode=LossMode.FORWARD_KL_TOPK, renormalize=True),
    LossConfig(mode=LossMode.FORWARD_KL_TOPK, renormalize=True, temperature=0.8),
    LossConfig(mode=LossMode.FORWARD_KL_TOPK, log_prob_min_clamp=None, loss_max_clamp=None),
    LossConfig(mode=LossMode.FORWARD_KL_TOPK, objective=Objective.POLICY_GRADIENT),
    LossConfig(mode=LossMode.REVERSE_KL_TOPK),
    LossConfig(mode=LossMode.REVERSE_KL_TOPK, add_tail=True),
    LossConfig(mode=LossMode.REVERSE_KL_TOPK, temperature=0.9),
    LossConfig(mode=LossMode.JSD, beta=0.5),
    LossConfig(mode=LossMode.JSD, beta=0.1, temperature=0.9),
    LossConfig(mode=LossMode.JSD, beta=0.0),
    LossConfig(mode=LossMode.JSD, beta=1.0),
    LossConfig(mode=LossMode.JSD, beta=0.5, add_tail=True),
    LossConfig(mode=LossMode.JSD, beta=0.5, objective=Objective.POLICY_GRADIENT),
]


def _ids(cfg: LossConfig) -> str:
    changed = [
        f"{f.name}={getattr(cfg, f.name)}"
        for f in dataclasses.fields(cfg)
        if f.name != "mode" and getattr(cfg, f.name) != f.default
    ]
    return ",".join([cfg.mode, *changed])


def _both(cfg, batch, old=None, task=None, chunk=3):
    logits, resp, mask, tids, tlp, ttok = batch
    cfg = dataclasses.replace(cfg, chunk_tokens=chunk)
    ours_in = logits.clone().requires_grad_(True)
    out = distillation_loss(ours_in, resp, mask, TeacherTargets(tids, tlp, ttok), cfg, old, task)
    out.loss.backward()
    ref_in = logits.clone().requires_grad_(True)
    task_d = (
        None
        if task is None
        else {(i, j): task[i, j] for i in range(task.shape[0]) for j in range(task.shape[1])}
    )
    old_d = (
        None if old is None else {(i, j): old[i, j] for i in range(old.shape[0]) for j in range(old.shape[1])}
    )
    expected = ref.distillation_loss(cfg, ref_in, resp, mask, tids, tlp, ttok, old_d, task_d)
    expected.backward()
    return out, ours_in.grad, expected, ref_in.grad


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
@pytest.mark.parametrize("reduction", list(Reduction))
def test_matches_reference(cfg: LossConfig, reduction: Reduction) -> None:
    batch = ref.make_batch(
        pad_rows=[(1, 2)], pad_entries=2, seed=zlib.crc32(f"{_ids(cfg)}/{reduction}".encode()) % 1000
    )
    out, grad, expected, ref_grad = _both(dataclasses.replace(cfg, reduction=reduction), batch)
    torch.testing.assert_close(out.loss, expected, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-8, atol=1e-10)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("mode", [LossMode.K3, LossMode.FORWARD_KL_TOPK, LossMode.JSD])
def test_policy_gradient_with_old_logprobs_and_task_advantages(mode: LossMode) -> None:
    batch = ref.make_batch(pad_rows=[(0, 3)], seed=7)
    logits, resp = batch[0], batch[1]
    g = torch.Generator().manual_seed(3)
    current = torch.log_softmax(logits, -1).gather(-1, resp[..., None])[..., 0]
    # Old log-probs off by up to ~0.5 in log space, so that some ratios fall outside [0.8, 1.2].
    old = current + 0.5 * torch.randn(current.shape, generator=g, dtype=current.dtype)
    task = torch.randn(current.shape, generator=g, dtype=current.dtype)
    for objective in [Objective.POLICY_GRADIENT, Objective.DIRECT]:
        cfg = LossConfig(mode=mode, objective=objective, task_reward_coef=0.5)
        out, grad, expected, ref_grad = _both(cfg, batch, old=old, task=task)
        torch.testing.assert_close(out.loss, expected, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-8, atol=1e-10)
        assert 0.0 < out.metrics["distill/pg_clipfrac"] < 1.0


def test_float32_and_bfloat16_logits_match_float64_reference() -> None:
    batch = ref.make_batch(seed=11, pad_entries=1)
    cfg = LossConfig(mode=LossMode.FORWARD_KL_TOPK, add_tail=True)
    _, _, expected, ref_grad = _both(cfg, batch)
    for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)]:
        low = (batch[0].to(dtype), *batch[1:4], batch[4].float(), batch[5].float())
        out, grad, _, _ = _both(cfg, low)
        assert grad.dtype == dtype
        torch.testing.assert_close(out.loss.double(), expected, rtol=tol, atol=tol)
        torch.testing.assert_close(grad.double(), ref_grad, rtol=tol, atol=tol * ref_grad.abs().max())


def test_chunk_size_does_not_change_results() -> None:
    batch = ref.make_batch(seed=5, pad_rows=[(1, 1)])
    results = [_both(LossConfig(mode=LossMode.FORWARD_KL_TOPK), batch, chunk=c)[:2] for c in (1, 4, 1000)]
    for out, grad in results[1:]:
        torch.testing.assert_close(out.loss, results[0][0].loss, rtol=1e-12, atol=0)
        torch.testing.assert_close(grad, results[0][1], rtol=1e-12, atol=1e-15)


def test_k1_direct_is_refused() -> None:
    with pytest.raises(ValueError, match="k1 needs objective policy_gradient"):
        LossConfig(mode=LossMode.K1, objective=Objective.DIRECT)
    assert LossConfig(mode=LossMode.K1, objective=Objective.POLICY_GRADIENT).mode == LossMode.K1


@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "kl"},
        {"mode": "k3"},  # the API's enum, not a string copy of it
        {"objective": "sft"},
        {"reduction": "mean"},
        {"mode": "forward_kl_topk", "renormalize": True, "add_tail": True},
        {"beta": 1.5},
        {"temperature": 0.0},
        {"log_prob_min_clamp": 1.0},
        {"task_reward_coef": -1.0},
    ],
)
def test_invalid_configs_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        LossConfig(**bad)


def test_missing_teacher_inputs_are_reported() -> None:
    logits, resp, mask, tids, tlp, _ = ref.make_batch()
    with pytest.raises(ValueError, match="token_logprobs"):
        distillation_loss(logits, resp, mask, TeacherTargets(tids, tlp, None), LossConfig(mode=LossMode.K3))
    with pytest.raises(ValueError, match="topk"):
        distillation_loss(
            logits, resp, mask, TeacherTargets(None, None, tlp[..., 0]), LossConfig(mode=LossMode.JSD)
        )
    with pytest.raises(ValueError, match="task_advantages"):
        distillation_loss(
            logits, resp, mask, TeacherTargets(tids, tlp, tlp[..., 0]), LossConfig(task_reward_coef=1.0)
        )


@pytest.mark.parametrize("cfg", CONFIGS[:1] + CONFIGS[6:], ids=_ids)
def test_masked_vocabulary_columns_stay_finite(cfg: LossConfig) -> None:
    """Padded vocabulary entries (logit -inf, as Qwen's 151,936 vs 152,064) including the teacher's
    pad id 0: values and gradients stay finite and match the reference."""
    logits, resp, mask, tids, tlp, ttok = ref.make_batch(pad_rows=[(1, 2)], pad_entries=2, seed=31)
    logits[..., 0] = -math.inf
    logits[..., -5:] = -math.inf
    resp = resp.clamp(1, logits.shape[-1] - 6)
    keep = (tids > 0) & (tids < logits.shape[-1] - 5)
    tlp = torch.where(keep, tlp, -math.inf)
    ttok = torch.where(
        torch.isfinite(ttok), torch.log_softmax(logits, -1).gather(-1, resp[..., None])[..., 0] - 0.3, ttok
    )
    out, grad, expected, ref_grad = _both(cfg, (logits, resp, mask, tids, tlp, ttok))
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(out.loss, expected, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-8, atol=1e-10)
