"""Straightforward reference implementations of the distillation losses, for the tests.

Written the plain way on purpose: a full-vocabulary log_softmax per token, a Python loop over
tokens, padded teacher entries removed by boolean indexing, probabilities in probability
space. Independent of the library's masking, chunking and custom autograd.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

EPS = 1e-6  # tail floor, as the library's TAIL_MASS_EPS


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    return (p_log.exp() * (p_log - q_log)).sum()


def _jsd(t_log: torch.Tensor, s_log: torch.Tensor, beta: float) -> torch.Tensor:
    if beta == 0.0:
        return _kl(t_log, s_log)
    if beta == 1.0:
        return _kl(s_log, t_log)
    m = beta * t_log.exp() + (1 - beta) * s_log.exp()
    return (
        beta * (t_log.exp() * (t_log - m.log())).sum() + (1 - beta) * (s_log.exp() * (s_log - m.log())).sum()
    )


def _with_tail(log_p: torch.Tensor) -> torch.Tensor:
    tail = torch.clamp(1.0 - log_p.exp().sum(), min=EPS)
    return torch.cat([log_p, tail.log().reshape(1)])


def token_loss(cfg, logits_row, resp_id, tids, tlp, ttok):
    """Per-token loss for one position, or None when the teacher has nothing there."""
    ls_full = F.log_softmax(logits_row / cfg.temperature, dim=-1)
    c = cfg.log_prob_min_clamp
    if cfg.mode in {"k1", "k2", "k3", "abs"}:
        if not math.isfinite(float(ttok)):
            return None
        s = ls_full[resp_id]
        t = ttok if c is None else torch.clamp(ttok, min=c)
        d = s - t
        if cfg.mode == "k1":
            val = d
        elif cfg.mode == "abs":
            val = d.abs()
        elif cfg.mode == "k2":
            val = 0.5 * d * d
        else:
            e = torch.clamp(-d, -20.0, 20.0)
            val = torch.clamp(e.exp() - e - 1.0, -10.0, 10.0)
    else:
        keep = torch.isfinite(tlp)
        if not bool(keep.any()):
            return None
        s_k, t_k = ls_full[tids[keep]], tlp[keep]
        if cfg.mode == "forward_kl_topk" and cfg.renormalize:
            val = _kl(F.log_softmax(t_k / cfg.temperature, -1), F.log_softmax(s_k, -1))
        elif cfg.mode == "forward_kl_topk":
            tc = t_k if c is None else torch.clamp(t_k, min=c)
            sc = s_k if c is None else torch.clamp(s_k, min=c)
            val = _kl(tc, sc)
            if cfg.add_tail:
                pt = torch.clamp(1.0 - t_k.exp().sum(), min=EPS)
                ps = torch.clamp(1.0 - s_k.exp().sum(), min=EPS)
                val = val + pt * (pt.log() - ps.log())
            else:
                val = torch.clamp(val, min=0.0)
        else:
            if cfg.add_tail:
                s_b, t_b = _with_tail(s_k), _with_tail(t_k)
            else:
                s_b, t_b = F.log_softmax(s_k, -1), F.log_softmax(t_k / cfg.temperature, -1)
            val = _kl(s_b, t_b) if cfg.mode == "reverse_kl_topk" else _jsd(t_b, s_b, cfg.beta)
    if cfg.loss_max_clamp is not None:
        val = torch.clamp(val, -cfg.loss_max_clamp, cfg.loss_max_clamp)
    return val


def reduce(values: dict, b: int, t: int, reduction: str) -> torch.Tensor:
    """values: {(i, j): scalar} for the counted tokens."""
    if not values:
        return torch.zeros((), dtype=torch.float64)
    if reduction == "sum":
        return sum(values.values())
    if reduction == "token_mean":
        return sum(values.values()) / len(values)
    per_seq = []
    for i in range(b):
        row = [v for (bi, _), v in values.items() if bi == i]
        if row:
            per_seq.append(sum(row) / len(row))
    return sum(per_seq) / len(per_seq)


def distillation_loss(cfg, logits, resp, mask, tids, tlp, ttok, old=None, task=None):
    """Reference for the entry point: direct and policy-gradient objectives."""
    b, t, _ = logits.shape
    values, slogp = {}, {}
    for i in range(b):
        for j in range(t):
            if not mask[i, j]:
                continue
            tok_t = ttok[i, j] if ttok is not None else torch.tensor(float("nan"))
            v = token_loss(
                cfg,
                logits[i, j],
                resp[i, j],
                None if tids is None else tids[i, j],
                None if tlp is None else tlp[i, j],
                tok_t,
            )
            slogp[(i, j)] = F.log_softmax(logits[i, j] / cfg.temperature, -1)[resp[i, j]]
            if v is not None:
                values[(i, j)] = v
    use_task = cfg.task_reward_coef > 0
    if cfg.objective == "direct":
        loss = reduce(values, b, t, cfg.reduction)
        if use_task:
            pg = {key: _ppo(cfg, s, old, task[key], key) for key, s in slogp.items()}
            loss = loss + cfg.task_reward_coef * reduce(pg, b, t, cfg.reduction)
        return loss
    pg = {}
    for key, s in slogp.items():
        if key not in values and not use_task:
            continue
        adv = -values[key].detach() if key in values else torch.zeros((), dtype=s.dtype)
        if use_task:
            adv = adv + cfg.task_reward_coef * task[key]
        pg[key] = _ppo(cfg, s, old, adv, key)
    return reduce(pg, b, t, cfg.reduction)


def _ppo(cfg, s, old, adv, key):
    o = s.detach() if old is None else old[key]
    ratio = torch.exp(torch.clamp(s - o, -20.0, 20.0))
    return torch.maximum(
        -adv * ratio, -adv * torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    )


def make_batch(b=2, t=6, v=40, k=8, seed=0, dtype=torch.float64, pad_rows=(), pad_entries=0, noise=1.0):
    """Random student logits and a teacher close to them: (logits, resp, mask, tids, tlp, ttok).

    pad_rows: (i, j) positions where the teacher has nothing (ids 0, log-probs -inf);
    pad_entries: per other row, how many trailing top-k entries are padded.
    Mask: the first position of each sequence is prompt and the last of sequence 0 is padding.
    """
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g, dtype=dtype) * 2
    teacher_logp = F.log_softmax(logits + noise * torch.randn(b, t, v, generator=g, dtype=dtype), -1)
    top = teacher_logp.topk(k, dim=-1)
    tids, tlp = top.indices.clone(), top.values.clone()
    resp = torch.multinomial(logits.reshape(-1, v).softmax(-1).float(), 1, generator=g).reshape(b, t)
    ttok = teacher_logp.gather(-1, resp[..., None])[..., 0].clone()
    if pad_entries:
        tids[..., k - pad_entries :] = 0
        tlp[..., k - pad_entries :] = -math.inf
    for i, j in pad_rows:
        tids[i, j] = 0
        tlp[i, j] = -math.inf
        ttok[i, j] = -math.inf
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:, 0] = False
    mask[0, -1] = False
    return logits, resp, mask, tids, tlp, ttok
