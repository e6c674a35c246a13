"""Every loss on the trainer's devices and dtypes agrees with the same loss in float64 on the CPU.

test_losses_entry.py proves the float64 CPU result right against the reference; this proves the float32
(and bf16-logit) results on each device close to it, with the production chunking and with small chunks.
On a machine without a CUDA GPU (CI) the cuda cases are reported as skipped with the reason; they run on
a GPU with `pytest --noconftest tests/losses/test_losses_device.py` (no other fixture is needed).
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch
from distillery_runtime.losses import TeacherTargets, distillation_loss
from losses import reference as ref
from losses.test_losses_entry import CONFIGS, _ids

from distillery.plan.loss import LossConfig

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
    ),
]


def _loss_and_grad(cfg: LossConfig, batch, device: str, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    logits, resp, mask, tids, tlp, ttok = (t.to(device) for t in batch)
    x = logits.detach().to(dtype).clone().requires_grad_(True)
    teacher = TeacherTargets(tids, tlp.float() if dtype != torch.float64 else tlp, ttok.to(tlp.dtype))
    out = distillation_loss(x, resp, mask, teacher, cfg)
    out.loss.backward()
    return out.loss.detach().double().cpu(), x.grad.double().cpu()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [None, 7])
@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_float32_on_device_matches_float64(cfg: LossConfig, chunk: int | None, device: str) -> None:
    cfg = dataclasses.replace(cfg, chunk_tokens=chunk)
    batch = ref.make_batch(
        b=3, t=40, v=3000, k=16, pad_rows=[(1, 2)], pad_entries=3, seed=zlib.crc32(_ids(cfg).encode()) % 1000
    )
    want_loss, want_grad = _loss_and_grad(cfg, batch, "cpu", torch.float64)
    loss, grad = _loss_and_grad(cfg, batch, device, torch.float32)
    assert want_grad.abs().sum() > 0
    assert abs(float(loss - want_loss)) <= 1e-5 * max(abs(float(want_loss)), 1.0)
    assert _rel(grad, want_grad) < 1e-4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_bfloat16_logits_on_device_match_float64(cfg: LossConfig, device: str) -> None:
    # The reference sees the same bf16-rounded logits: what is measured is the loss's arithmetic, not the
    # input's rounding. The gradient is returned in bf16 (8 bits of mantissa), hence the tolerance.
    batch = list(ref.make_batch(b=2, t=24, v=2000, k=16, seed=zlib.crc32(_ids(cfg).encode()) % 1000))
    batch[0] = batch[0].to(torch.bfloat16).double()
    want_loss, want_grad = _loss_and_grad(cfg, batch, "cpu", torch.float64)
    loss, grad = _loss_and_grad(cfg, batch, device, torch.bfloat16)
    assert abs(float(loss - want_loss)) <= 1e-3 * max(abs(float(want_loss)), 1.0)
    assert _rel(grad, want_grad) < 1e-2
