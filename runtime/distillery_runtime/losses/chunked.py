"""Memory-lean log-softmax gather over a large vocabulary: a chunked custom autograd function.

The top-k losses need the student's log-probabilities at a few ids per token (the teacher's
top-k and the sampled token), not the whole [N, V] log-softmax. The naive way materialises a
float32 [N, V] log-softmax and autograd keeps it for backward; at V = 151,936 that is as large
as the logits themselves, and the backward adds more of the same size. Here the forward walks
over chunks of tokens and keeps only the log-normaliser (one float per token); the backward
recomputes the softmax chunk by chunk and writes it straight into the gradient, so the peak
beyond the logits and their gradient is one chunk.
"""

from __future__ import annotations

import torch

# One chunk's float32 working set; bounds the extra memory independent of N and V.
DEFAULT_CHUNK_BYTES = 128 * 1024 * 1024


def chunk_tokens_for(vocab_size: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Tokens per chunk so that one float32 [chunk, V] block stays within chunk_bytes."""
    return max(1, chunk_bytes // (4 * max(1, vocab_size)))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # bf16/fp16 logits are upcast per chunk; float64 stays float64 (gradcheck).
    return torch.promote_types(dtype, torch.float32)


def _normaliser(x: torch.Tensor, ids: torch.Tensor, logp_at_ids: torch.Tensor) -> torch.Tensor:
    """logsumexp(x) per row as x[id] - log_softmax(x)[id] at the row's most probable gathered id
    (finite, and the smallest rounding error); rows where that is not finite fall back to logsumexp."""
    best = logp_at_ids.argmax(dim=-1, keepdim=True)
    lse = (x.gather(-1, ids).gather(-1, best) - logp_at_ids.gather(-1, best)).squeeze(-1)
    bad = ~torch.isfinite(lse)
    if bool(bad.any()):
        lse[bad] = torch.logsumexp(x[bad], dim=-1)
    return lse


class ChunkedGatherLogSoftmax(torch.autograd.Function):
    """out[n, j] = log_softmax(logits[n] / temperature)[ids[n, j]], computed in chunks of tokens.

    Forward saves logits (by reference), ids and the per-token log-normaliser
    lse[n] = logsumexp(logits[n] / temperature). Backward, with g = grad of out:
        d logits[n, v] = (sum_j g[n, j] [ids[n, j] = v] - softmax(logits[n] / T)[v] sum_j g[n, j]) / T
    recomputed one chunk at a time. Optional second output: each token's top-`student_topk`
    ids (no gradient), found in the same pass for the overlap diagnostic.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: torch.Tensor,
        ids: torch.Tensor,
        temperature: float,
        chunk_tokens: int,
        student_topk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, v = logits.shape
        dtype = _compute_dtype(logits.dtype)
        out = torch.empty(ids.shape, dtype=dtype, device=logits.device)
        lse = torch.empty(n, dtype=dtype, device=logits.device)
        top = torch.empty((n, student_topk), dtype=torch.long, device=logits.device)
        for s in range(0, n, chunk_tokens):
            e = min(s + chunk_tokens, n)
            x = logits[s:e].to(dtype)
            if temperature != 1.0:
                x = x / temperature
            # log_softmax is one fused pass, faster than torch.logsumexp (which materialises
            # x - max); the normaliser is then recovered from the gathered columns.
            logp = torch.log_softmax(x, dim=-1)
            torch.gather(logp, -1, ids[s:e], out=out[s:e])
            del logp
            lse[s:e] = _normaliser(x, ids[s:e], out[s:e])
            if student_topk:
                top[s:e] = x.topk(min(student_topk, v), dim=-1, sorted=False).indices
        ctx.save_for_backward(logits, ids, lse)
        ctx.temperature = temperature
        ctx.chunk_tokens = chunk_tokens
        ctx.mark_non_differentiable(top)
        return out, top

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor, _grad_top: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        logits, ids, lse = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature: float = ctx.temperature  # type: ignore[attr-defined]
        chunk: int = ctx.chunk_tokens  # type: ignore[attr-defined]
        grad_out = grad_out.to(lse.dtype)
        neg_gsum = -grad_out.sum(dim=-1, keepdim=True)
        grad = torch.empty_like(logits)
        # Same dtype: build the chunk's gradient in place inside `grad` (no temporary at all).
        in_place = logits.dtype == lse.dtype
        for s in range(0, logits.shape[0], chunk):
            e = min(s + chunk, logits.shape[0])
            buf = (
                grad[s:e]
                if in_place
                else torch.empty((e - s, logits.shape[1]), dtype=lse.dtype, device=logits.device)
            )
            if temperature != 1.0:
                torch.div(logits[s:e], temperature, out=buf)
                buf.sub_(lse[s:e, None])
            else:
                torch.sub(logits[s:e], lse[s:e, None], out=buf)
            buf.exp_().mul_(neg_gsum[s:e])
            buf.scatter_add_(-1, ids[s:e], grad_out[s:e])
            if temperature != 1.0:
                buf.div_(temperature)
            if not in_place:
                grad[s:e].copy_(buf)
        return grad, None, None, None, None


def gather_log_softmax(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
    student_topk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log_softmax(logits / temperature) gathered at ids, without a full [N, V] log-softmax.

    logits [N, V] (any float dtype), ids [N, J] int64. Returns (log-probs [N, J] in float32 or
    float64, student top-`student_topk` ids [N, student_topk] or an empty [N, 0] tensor).
    """
    if logits.dim() != 2 or ids.dim() != 2 or ids.shape[0] != logits.shape[0]:
        raise ValueError(
            f"expected logits [N, V] and ids [N, J], got {tuple(logits.shape)}, {tuple(ids.shape)}"
        )
    chunk = chunk_tokens or chunk_tokens_for(logits.shape[-1])
    return ChunkedGatherLogSoftmax.apply(
        logits, ids.long(), float(temperature), int(chunk), int(student_topk)
    )
