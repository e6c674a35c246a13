"""The chunked log-softmax gather (custom autograd): values, gradients, gradcheck, top-k ids."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from distillery_runtime.losses import ChunkedGatherLogSoftmax, gather_log_softmax
from distillery_runtime.losses.terms.chunked import gather_log_softmax_and_entropy


def _inputs(n=7, v=23, j=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, v, generator=g, dtype=dtype) * 3
    ids = torch.randint(0, v, (n, j), generator=g)
    ids[0, 1] = ids[0, 0]  # duplicate ids (pad id 0 repeated in practice) must accumulate
    return logits, ids


@pytest.mark.parametrize("temperature", [1.0, 0.8])
@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_gradcheck_float64(temperature: float, chunk: int) -> None:
    logits, ids = _inputs()
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: ChunkedGatherLogSoftmax.apply(x[None], ids[None], temperature, chunk, 0, None)[0],
        (logits,),
        eps=1e-6,
        atol=1e-8,
    )


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_log_softmax_gather(temperature: float) -> None:
    logits, ids = _inputs(dtype=torch.float32, n=9, v=300, j=6, seed=1)
    weights = torch.randn(ids.shape)
    a = logits.clone().requires_grad_(True)
    out, _ = gather_log_softmax(a, ids, temperature, chunk_tokens=4)
    (out * weights).sum().backward()
    b = logits.clone().requires_grad_(True)
    expected = F.log_softmax(b / temperature, -1).gather(-1, ids)
    (expected * weights).sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(a.grad, b.grad)


def test_bfloat16_logits_are_computed_in_float32() -> None:
    logits, ids = _inputs(dtype=torch.float32, n=6, v=200, seed=2)
    low = logits.bfloat16().requires_grad_(True)
    out, _ = gather_log_softmax(low, ids, chunk_tokens=4)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert low.grad is not None and low.grad.dtype == torch.bfloat16
    ref = logits.bfloat16().float().requires_grad_(True)
    expected = F.log_softmax(ref, -1).gather(-1, ids)
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(low.grad.float(), ref.grad, rtol=1e-2, atol=1e-2)


def test_student_topk_ids_are_the_largest_logits() -> None:
    logits, ids = _inputs(dtype=torch.float32, n=5, v=50, seed=3)
    _, top = gather_log_softmax(logits, ids, temperature=0.5, chunk_tokens=2, student_topk=7)
    expected = logits.topk(7, dim=-1).indices
    assert top.shape == (5, 7)
    assert torch.equal(top.sort(-1).values, expected.sort(-1).values)


def test_bad_shapes_are_refused() -> None:
    logits, ids = _inputs()
    with pytest.raises(ValueError):
        gather_log_softmax(logits[None], ids)


@pytest.mark.parametrize("chunk", [2, 3, 100])
def test_gradcheck_float64_on_a_shifted_batch_view(chunk: int) -> None:
    """[B, T, V] input that is a non-contiguous slice (the trainer's shifted logits), chunks
    crossing sequence boundaries, bf16-free float64 gradcheck."""
    g = torch.Generator().manual_seed(4)
    full = torch.randn(2, 6, 11, generator=g, dtype=torch.float64).requires_grad_(True)
    ids = torch.randint(0, 11, (2, 4, 3), generator=g)

    def fn(x: torch.Tensor) -> torch.Tensor:
        view = x[:, 1:5]
        assert not view.is_contiguous()
        return gather_log_softmax(view, ids, 0.9, chunk_tokens=chunk)[0]

    assert torch.autograd.gradcheck(fn, (full,), eps=1e-6, atol=1e-8)
    torch.testing.assert_close(fn(full), F.log_softmax(full[:, 1:5] / 0.9, -1).gather(-1, ids))


def test_student_topk_only_on_selected_rows() -> None:
    logits, ids = _inputs(dtype=torch.float32, n=6, v=40, seed=5)
    rows = torch.tensor([True, False, False, True, False, True])
    _, top = gather_log_softmax(logits, ids, chunk_tokens=4, student_topk=3, topk_rows=rows)
    assert (top[~rows] == -1).all()
    expected = logits[rows].topk(3, dim=-1).indices
    assert torch.equal(top[rows].sort(-1).values, expected.sort(-1).values)


@pytest.mark.parametrize("chunk", [6, 7, 15, 4, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_grouped_in_blocks_match_the_full_log_softmax(chunk: int, dtype: torch.dtype) -> None:
    """Whole rows share a block when a row fits (5 rows of 3 tokens: blocks of 2, 2 and 1 rows at 6 and
    7 tokens, one block at 15), or each row is cut (4, 2): values, gradient, entropy and the student's
    top-k on selected (row, token) positions match the plain computation."""
    g = torch.Generator().manual_seed(6)
    full = torch.randn(5, 4, 30, generator=g).to(dtype)
    ids = torch.randint(0, 30, (5, 3, 4), generator=g)
    rows = torch.rand(5, 3, generator=g) < 0.5
    weights = torch.randn(ids.shape, generator=g)
    a = full.clone().requires_grad_(True)
    out, top, ent = gather_log_softmax_and_entropy(a[:, 1:], ids, 0.7, chunk, student_topk=3, topk_rows=rows)
    (out * weights).sum().backward()
    b = full.float().requires_grad_(True)
    logp = F.log_softmax(b[:, 1:] / 0.7, -1)
    (logp.gather(-1, ids) * weights).sum().backward()
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(out, logp.gather(-1, ids), **tol)
    torch.testing.assert_close(a.grad.float(), b.grad, **tol)
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1).detach(), **tol)
    assert (top[~rows] == -1).all()
    expected = (full[:, 1:].float() / 0.7).topk(3, dim=-1).indices[rows]
    assert torch.equal(top[rows].sort(-1).values, expected.sort(-1).values)
