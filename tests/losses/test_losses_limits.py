"""Limits and edge cases: K = V equals full vocabulary, JSD endpoints, identical distributions,
clamps, masks, teacher pad rows, reductions, diagnostics, the registry."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from distillery_runtime.losses import (
    LOSS_REGISTRY,
    TeacherTargets,
    distillation_loss,
    generalized_jsd,
    get_token_loss_fn,
    k1,
    k2,
    k3,
    kl,
    reduce_tokens,
)
from distillery_runtime.losses.terms.estimators import clamp_token_loss
from distillery_runtime.testing.full_vocab import forward_kl_full, jsd_full, reverse_kl_full
from losses import reference as ref

from distillery.api.spec import Loss, LossMode, Objective, Reduction
from distillery.plan.loss import LossConfig, resolve_loss

TOPK_CONFIGS = [
    LossConfig(mode=LossMode.FORWARD_KL_TOPK),
    LossConfig(mode=LossMode.FORWARD_KL_TOPK, add_tail=True),
    LossConfig(mode=LossMode.FORWARD_KL_TOPK, renormalize=True),
    LossConfig(mode=LossMode.REVERSE_KL_TOPK),
    LossConfig(mode=LossMode.REVERSE_KL_TOPK, add_tail=True),
    LossConfig(mode=LossMode.JSD),
    LossConfig(mode=LossMode.JSD, add_tail=True),
]
ALL_CONFIGS = [
    LossConfig(mode=LossMode.K2),
    LossConfig(mode=LossMode.K3),
    LossConfig(mode=LossMode.ABS),
    *TOPK_CONFIGS,
]


def _pair(b=2, t=5, v=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(b, t, v, generator=g, dtype=torch.float64) * 2
    te = s + torch.randn(b, t, v, generator=g, dtype=torch.float64)
    return s, te


def _full_targets(student, teacher_logits, k, resp=None):
    t_lp = F.log_softmax(teacher_logits, -1)
    top = t_lp.topk(k, dim=-1)
    resp = torch.zeros(student.shape[:2], dtype=torch.long) if resp is None else resp
    return resp, TeacherTargets(top.indices, top.values, t_lp.gather(-1, resp[..., None])[..., 0])


@pytest.mark.parametrize(
    ("cfg", "full"),
    [
        (
            LossConfig(mode=LossMode.FORWARD_KL_TOPK, log_prob_min_clamp=None),
            lambda s, t, c: forward_kl_full(s, t),
        ),
        (
            LossConfig(mode=LossMode.FORWARD_KL_TOPK, add_tail=True, log_prob_min_clamp=None),
            lambda s, t, c: forward_kl_full(s, t),
        ),
        (
            LossConfig(mode=LossMode.FORWARD_KL_TOPK, renormalize=True, temperature=0.8),
            lambda s, t, c: forward_kl_full(s, t, 0.8),
        ),
        (
            LossConfig(mode=LossMode.REVERSE_KL_TOPK, temperature=0.7),
            lambda s, t, c: reverse_kl_full(s, t, 0.7),
        ),
        (LossConfig(mode=LossMode.REVERSE_KL_TOPK, add_tail=True), lambda s, t, c: reverse_kl_full(s, t)),
        (LossConfig(mode=LossMode.JSD, beta=0.0), lambda s, t, c: jsd_full(s, t, 0.0)),
        (
            LossConfig(mode=LossMode.JSD, beta=0.3, temperature=0.9),
            lambda s, t, c: jsd_full(s, t, 0.3, 0.9, chunk_tokens=c),
        ),
        (LossConfig(mode=LossMode.JSD, beta=1.0), lambda s, t, c: jsd_full(s, t, 1.0)),
        (
            LossConfig(mode=LossMode.JSD, beta=0.5, add_tail=True),
            lambda s, t, c: jsd_full(s, t, 0.5, chunk_tokens=c),
        ),
    ],
)
def test_topk_with_k_equal_v_is_the_full_vocabulary_loss(cfg, full) -> None:
    s, te = _pair(v=30)
    resp, teacher = _full_targets(s, te, k=30)
    cfg = dataclasses.replace(cfg, loss_max_clamp=None, chunk_tokens=3)
    mask = torch.ones(s.shape[:2], dtype=torch.bool)
    a = s.clone().requires_grad_(True)
    out = distillation_loss(a, resp, mask, teacher, dataclasses.replace(cfg, reduction=Reduction.SUM))
    out.loss.backward()
    b = s.clone().requires_grad_(True)
    expected = full(b, te, 3)
    expected.sum().backward()
    torch.testing.assert_close(out.token_loss, expected.detach(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize(
    ("lib", "reference"),
    [
        (lambda x, te: forward_kl_full(x, te, 0.9, chunk_tokens=2), lambda ls, lt: ref._kl(lt, ls)),
        (lambda x, te: reverse_kl_full(x, te, 0.9, chunk_tokens=2), lambda ls, lt: ref._kl(ls, lt)),
        (lambda x, te: jsd_full(x, te, 0.25, 0.9, chunk_tokens=2), lambda ls, lt: ref._jsd(lt, ls, 0.25)),
    ],
    ids=["forward", "reverse", "jsd"],
)
def test_full_vocabulary_losses_match_reference(lib, reference) -> None:
    """Chunked and checkpointed (chunk 2 of 10 tokens) against a per-token loop."""
    s, te = _pair(seed=4)
    a = s.clone().requires_grad_(True)
    got = lib(a, te)
    got.sum().backward()
    b = s.clone().requires_grad_(True)
    ls, lt = F.log_softmax(b / 0.9, -1), F.log_softmax(te / 0.9, -1)
    expected = torch.stack([reference(ls[i, j], lt[i, j]) for i in range(2) for j in range(5)]).reshape(2, 5)
    expected.sum().backward()
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-8, atol=1e-12)


def test_jsd_endpoints_and_the_mixture_definition() -> None:
    s, te = _pair(seed=2)
    ls, lt = F.log_softmax(s, -1), F.log_softmax(te, -1)
    torch.testing.assert_close(generalized_jsd(lt, ls, 0.0), kl(lt, ls))  # forward KL(T || S)
    torch.testing.assert_close(generalized_jsd(lt, ls, 1.0), kl(ls, lt))  # reverse KL(S || T)
    torch.testing.assert_close(jsd_full(s, te, 0.0), forward_kl_full(s, te))
    torch.testing.assert_close(jsd_full(s, te, 1.0), reverse_kl_full(s, te))
    # The mixture formula itself vanishes at both ends (M -> S or M -> T), hence the special cases.
    fwd = kl(lt, ls)
    assert (generalized_jsd(lt, ls, 1e-6) < 1e-4 * fwd).all()
    assert (generalized_jsd(lt, ls, 1 - 1e-6) < 1e-4 * kl(ls, lt)).all()
    # JSD(0.5) is symmetric, bounded by log 2 and positive for different distributions.
    torch.testing.assert_close(generalized_jsd(lt, ls, 0.5), generalized_jsd(ls, lt, 0.5))
    j = generalized_jsd(lt, ls, 0.5)
    assert (j > 0).all() and (j <= math.log(2)).all()


@pytest.mark.parametrize(
    "cfg",
    ALL_CONFIGS,
    ids=lambda c: f"{c.mode}{'+tail' if c.add_tail else ''}{'+renorm' if c.renormalize else ''}",
)
def test_identical_distributions_give_zero(cfg: LossConfig) -> None:
    s, _ = _pair(seed=3)
    resp = torch.randint(0, s.shape[-1], s.shape[:2], generator=torch.Generator().manual_seed(0))
    resp, teacher = _full_targets(s, s, k=6, resp=resp)
    mask = torch.ones(s.shape[:2], dtype=torch.bool)
    # No floor: a uniformly drawn token can be below the -10 floor, which would change one side.
    out = distillation_loss(s, resp, mask, teacher, dataclasses.replace(cfg, log_prob_min_clamp=None))
    torch.testing.assert_close(out.token_loss, torch.zeros_like(out.token_loss), rtol=0, atol=1e-12)
    assert out.metrics["distill/kl_k1"] == pytest.approx(0.0, abs=1e-12)
    for full in (forward_kl_full(s, s), reverse_kl_full(s, s), jsd_full(s, s, 0.5)):
        torch.testing.assert_close(full, torch.zeros_like(full), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "cfg",
    ALL_CONFIGS,
    ids=lambda c: f"{c.mode}{'+tail' if c.add_tail else ''}{'+renorm' if c.renormalize else ''}",
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_teacher_pad_rows_contribute_nothing_and_stay_finite(cfg: LossConfig, dtype: torch.dtype) -> None:
    pads = [(0, 2), (1, 4), (1, 1)]
    logits, resp, mask, tids, tlp, ttok = ref.make_batch(pad_rows=pads, pad_entries=3, seed=9, dtype=dtype)
    a = logits.clone().requires_grad_(True)
    out = distillation_loss(a, resp, mask, TeacherTargets(tids, tlp, ttok), cfg)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(a.grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values())
    for i, j in pads:
        assert not out.mask[i, j] and out.token_loss[i, j] == 0
        assert torch.count_nonzero(a.grad[i, j]) == 0
    assert out.metrics["distill/teacher_pad_tokens"] == 3
    # Same loss as when those positions are masked out by the caller.
    unmasked = mask.clone()
    for i, j in pads:
        unmasked[i, j] = False
    again = distillation_loss(logits, resp, unmasked, TeacherTargets(tids, tlp, ttok), cfg)
    torch.testing.assert_close(out.loss, again.loss, rtol=0, atol=0)


def test_all_pad_batch_gives_zero_loss_and_zero_gradient() -> None:
    b, t = 2, 3
    logits, resp, mask, tids, tlp, ttok = ref.make_batch(
        b=b, t=t, pad_rows=[(i, j) for i in range(b) for j in range(t)]
    )
    for cfg in ALL_CONFIGS:
        a = logits.clone().requires_grad_(True)
        out = distillation_loss(a, resp, mask, TeacherTargets(tids, tlp, ttok), cfg)
        out.loss.backward()
        assert out.loss.item() == 0.0 and torch.count_nonzero(a.grad) == 0
        assert out.metrics["distill/tokens"] == 0


def test_masked_positions_do_not_matter() -> None:
    logits, resp, mask, tids, tlp, ttok = ref.make_batch(seed=12)
    for cfg in ALL_CONFIGS:
        a = logits.clone().requires_grad_(True)
        out = distillation_loss(a, resp, mask, TeacherTargets(tids, tlp, ttok), cfg)
        out.loss.backward()
        assert torch.count_nonzero(a.grad[~mask]) == 0 and torch.count_nonzero(a.grad[mask]) > 0
        changed = logits.clone()
        changed[~mask] = 100.0 * torch.randn_like(changed[~mask])
        again = distillation_loss(changed, resp, mask, TeacherTargets(tids, tlp, ttok), cfg)
        torch.testing.assert_close(out.loss, again.loss, rtol=0, atol=0)


def test_k3_clamps_match_verl() -> None:
    s = torch.zeros(5, dtype=torch.float64)
    t = torch.tensor([30.0, 5.0, 0.5, -3.0, -30.0], dtype=torch.float64)
    d = torch.tensor([20.0, 5.0, 0.5, -3.0, -20.0], dtype=torch.float64)  # exponent clamped to [-20, 20]
    expected = (d.exp() - d - 1).clamp(-10, 10)
    torch.testing.assert_close(k3(s, t), expected)
    assert k3(s, t)[0] == 10.0 and k3(s, t)[-1] == 10.0 and k3(s, t)[1] == 10.0
    assert 0 < k3(s, t)[2] < 10.0
    # Gradient: zero where clamped, d/ds (exp(t - s) - (t - s) - 1) = 1 - exp(t - s) elsewhere.
    x = s.clone().requires_grad_(True)
    k3(x, t).sum().backward()
    torch.testing.assert_close(
        x.grad, torch.tensor([0.0, 0.0, 1 - math.exp(0.5), 1 - math.exp(-3.0), 0.0], dtype=torch.float64)
    )


def test_loss_max_clamp_bounds_every_estimator_both_ways() -> None:
    s = torch.tensor([0.0, -1.0, -8.0], dtype=torch.float64)
    t = torch.tensor([-9.0, -1.5, 0.0], dtype=torch.float64)
    assert clamp_token_loss(k1(s, t), 3.0).tolist() == [3.0, 0.5, -3.0]
    assert clamp_token_loss(k2(s, t), 3.0).tolist() == [3.0, 0.125, 3.0]
    assert clamp_token_loss(k1(s, t), None).tolist() == [9.0, 0.5, -8.0]


def test_log_prob_min_clamp_floors_teacher_token_and_topk_logprobs() -> None:
    logits, resp, mask, tids, tlp, ttok = ref.make_batch(seed=13)
    far = ttok.clone().fill_(-50.0)
    s = F.log_softmax(logits, -1).gather(-1, resp[..., None])[..., 0]
    out = distillation_loss(
        logits,
        resp,
        mask,
        TeacherTargets(None, None, far),
        LossConfig(
            mode=LossMode.K1,
            objective=Objective.POLICY_GRADIENT,
            loss_max_clamp=None,
            log_prob_min_clamp=-10.0,
        ),
    )
    torch.testing.assert_close(out.token_loss[mask], (s + 10.0)[mask])
    # Top-k: a student log-prob below the floor gets no gradient (verl clamps both sides).
    very_low = logits.clone()
    very_low[..., :] = 0.0
    very_low.scatter_(-1, tids[..., :1], -40.0)  # the teacher's top-1 is almost impossible for the student
    a = very_low.clone().requires_grad_(True)
    cfg = LossConfig(mode=LossMode.FORWARD_KL_TOPK, loss_max_clamp=None)
    distillation_loss(a, resp, mask, TeacherTargets(tids, tlp, ttok), cfg).loss.backward()
    floored = a.grad.gather(-1, tids[..., :1])[mask]
    b = very_low.clone().requires_grad_(True)
    distillation_loss(
        b, resp, mask, TeacherTargets(tids, tlp, ttok), dataclasses.replace(cfg, log_prob_min_clamp=None)
    ).loss.backward()
    unfloored = b.grad.gather(-1, tids[..., :1])[mask]
    assert (unfloored.abs() > 1e-3).all() and (floored.abs() < unfloored.abs() * 1e-3).all()


def test_reductions() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    assert reduce_tokens(values, mask, Reduction.TOKEN_MEAN).item() == pytest.approx(7 / 3)
    assert reduce_tokens(values, mask, Reduction.SEQUENCE_MEAN).item() == pytest.approx((1.5 + 4.0) / 2)
    assert reduce_tokens(values, mask, Reduction.SUM).item() == pytest.approx(7.0)
    nothing = torch.zeros_like(mask)
    for r in Reduction:
        assert reduce_tokens(values, nothing, r).item() == 0.0
    with pytest.raises(ValueError):
        reduce_tokens(values, mask, "mean")


def test_diagnostics_match_a_direct_computation() -> None:
    logits, resp, mask, tids, tlp, ttok = ref.make_batch(seed=21, pad_entries=2, pad_rows=[(1, 3)])
    out = distillation_loss(
        logits, resp, mask, TeacherTargets(tids, tlp, ttok), LossConfig(mode=LossMode.JSD)
    )
    ls = F.log_softmax(logits, -1)
    t_mass, s_mass, overlap, k1s = [], [], [], []
    for i in range(logits.shape[0]):
        for j in range(logits.shape[1]):
            keep = torch.isfinite(tlp[i, j])
            if not mask[i, j] or not keep.any():
                continue
            ids = tids[i, j][keep]
            t_mass.append(tlp[i, j][keep].exp().sum().item())
            s_mass.append(ls[i, j][ids].exp().sum().item())
            student_top = set(logits[i, j].topk(tids.shape[-1]).indices.tolist())
            overlap.append(len(set(ids.tolist()) & student_top) / len(ids))
            k1s.append((ls[i, j, resp[i, j]] - ttok[i, j]).item())
    m = out.metrics
    assert m["distill/tokens"] == len(t_mass)
    assert m["distill/teacher_topk_mass"] == pytest.approx(sum(t_mass) / len(t_mass), rel=1e-9)
    assert m["distill/student_topk_mass"] == pytest.approx(sum(s_mass) / len(s_mass), rel=1e-9)
    assert m["distill/topk_overlap"] == pytest.approx(sum(overlap) / len(overlap), rel=1e-9)
    assert m["distill/kl_k1"] == pytest.approx(sum(k1s) / len(k1s), rel=1e-9)
    assert m["distill/token_loss_mean"] == pytest.approx(out.loss.item(), rel=1e-9)
    assert 0 < m["distill/topk_overlap"] <= 1 and 0 < m["distill/student_topk_mass"] < 1


def test_registry_maps_each_api_mode_to_one_function() -> None:
    api_modes = {m.value for m in LossMode}
    assert set(LOSS_REGISTRY) == api_modes
    assert len({id(fn) for fn in LOSS_REGISTRY.values()}) == len(api_modes)
    for mode in api_modes:
        assert get_token_loss_fn(mode) is LOSS_REGISTRY[mode]
    with pytest.raises(ValueError, match="unknown loss mode"):
        get_token_loss_fn("kl")


def test_config_from_api_model_keeps_the_api_defaults() -> None:
    assert resolve_loss(Loss()) == LossConfig()
    api = Loss.model_validate({"mode": "jsd", "topK": 16, "beta": 0.3, "addTail": True, "temperature": 0.9})
    cfg = resolve_loss(api)
    assert (cfg.mode, cfg.beta, cfg.add_tail, cfg.temperature) == (LossMode.JSD, 0.3, True, 0.9)
    assert cfg.loss_max_clamp == 10.0 and cfg.log_prob_min_clamp == -10.0
    assert cfg.reduction == Reduction.TOKEN_MEAN and cfg.objective == Objective.DIRECT


def test_config_from_api_k2_has_no_loss_clamp_unless_asked() -> None:
    # A clamp zeroes k2's gradient past |s - t| > sqrt(2 * clamp): unset means none for k2 only.
    assert resolve_loss(Loss.model_validate({"mode": "k2"})).loss_max_clamp is None
    assert resolve_loss(Loss.model_validate({"mode": "k3"})).loss_max_clamp == 10.0
    assert resolve_loss(Loss.model_validate({"mode": "k2", "lossMaxClamp": 5})).loss_max_clamp == 5.0


def test_config_from_api_zero_clamps_mean_none() -> None:
    # The API documents 0 as "no clamp"; the runtime must not refuse a valid spec at start-up.
    cfg = resolve_loss(Loss.model_validate({"mode": "k2", "lossMaxClamp": 0, "logProbMinClamp": 0}))
    assert cfg.loss_max_clamp is None and cfg.log_prob_min_clamp is None


def test_overlap_is_measured_on_an_even_sample_of_counted_tokens() -> None:
    from distillery_runtime.losses.diagnostics import overlap_sample

    counted = torch.zeros(3, 40, dtype=torch.bool)
    counted[:, 5:35] = True
    counted[1, 20:] = False
    picked = overlap_sample(counted, limit=10)
    assert picked.sum() == 10 and not (picked & ~counted).any()
    assert picked[0].any() and picked[2].any()  # spread over the batch, not the first 10
    assert torch.equal(overlap_sample(counted, limit=1000), counted)
