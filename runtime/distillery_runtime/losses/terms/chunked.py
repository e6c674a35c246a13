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


def _block_shape(batch: int, tokens: int, chunk: int) -> tuple[int, int]:
    """(rows, tokens) of a block of at most `chunk` tokens, the shape of the reused buffers: whole rows
    grouped when a row fits (a short response's step is then one or a few blocks, not one per row: each
    block is a dozen kernel launches, and at a small vocabulary those launches were a quarter of a
    trainer step on CPU), else one row cut along its tokens."""
    if tokens <= chunk:
        return max(1, min(batch, chunk // max(1, tokens))), max(1, tokens)
    return 1, chunk


def _chunks(batch: int, tokens: int, chunk: int) -> list[tuple[slice, slice]]:
    """The (rows, tokens) blocks that cover a [batch, tokens] grid, each at most `_block_shape`."""
    rows, width = _block_shape(batch, tokens, chunk)
    return [
        (slice(i, min(i + rows, batch)), slice(s, min(s + width, tokens)))
        for i in range(0, batch, rows)
        for s in range(0, tokens, width)
    ]


class ChunkedGatherLogSoftmax(torch.autograd.Function):
    """out[b, t, j] = log_softmax(logits[b, t] / T)[ids[b, t, j]], computed in chunks of tokens.

    logits [B, T, V] may be a non-contiguous view (e.g. the shifted slice of the model's output):
    it is read chunk by chunk, never copied whole. Forward saves logits (by reference), ids and
    the per-token log-normaliser lse = logsumexp(logits / T). Backward, with g = grad of out:
        d logits[b, t, v] = (sum_j g[b, t, j] [ids[b, t, j] = v] - softmax(logits[b, t] / T)[v] sum_j g[b, t, j]) / T
    recomputed one chunk at a time. Second output: each token's top-`student_topk` ids (no
    gradient), found in the same pass for the overlap diagnostic, on the rows topk_rows selects.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: torch.Tensor,
        ids: torch.Tensor,
        temperature: float,
        chunk_tokens: int,
        student_topk: int,
        topk_rows: torch.Tensor | None,
        entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, v = logits.shape
        dtype = _compute_dtype(logits.dtype)
        out = torch.empty(ids.shape, dtype=dtype, device=logits.device)
        lse = torch.empty((b, t), dtype=dtype, device=logits.device)
        top = torch.full((b, t, student_topk), -1, dtype=torch.long, device=logits.device)
        ent = torch.zeros((b, t if entropy else 0), dtype=dtype, device=logits.device)
        # Chunk buffers reused across chunks: a fresh [chunk, V] allocation per chunk is a
        # fresh mmap on CPU, and its page faults cost as much as the log-softmax itself.
        shape = (*_block_shape(b, t, chunk_tokens), v)
        logp_buf = torch.empty(shape, dtype=dtype, device=logits.device)
        convert = logits.dtype != dtype or temperature != 1.0
        x_buf = torch.empty(shape, dtype=dtype, device=logits.device) if convert else None
        sel_buf: torch.Tensor | None = None
        p_buf = torch.empty(shape, dtype=dtype, device=logits.device) if entropy else None
        for r, c in _chunks(b, t, chunk_tokens):
            x = logits[r, c]
            block = x.shape[:2]
            if x_buf is not None:
                xb = x_buf[: block[0], : block[1]]
                _scaled(x, temperature, out=xb)
                x = xb
            logp = logp_buf[: block[0], : block[1]]
            # The fused log-softmax kernel (one pass, faster than torch.logsumexp, which
            # materialises x - max), written into the reused buffer; the normaliser is then
            # recovered from the gathered columns.
            torch.ops.aten._log_softmax.out(x, -1, False, out=logp)
            torch.gather(logp, -1, ids[r, c], out=out[r, c])
            lse[r, c] = _normaliser(x, ids[r, c], out[r, c])
            if student_topk:
                kk = min(student_topk, v)
                if topk_rows is None:
                    top[r, c] = x.topk(kk, dim=-1, sorted=False).indices
                else:
                    picked = topk_rows[r, c].nonzero()  # [n, 2]: (row, token) within the block
                    if picked.numel():
                        # Copy the picked rows into a reused buffer (batched top-k, no fresh mmap).
                        if sel_buf is None:
                            sel_buf = torch.empty((shape[0] * shape[1], v), dtype=dtype, device=logits.device)
                        sel = sel_buf[: picked.shape[0]]
                        for j, (pr, pt) in enumerate(picked.tolist()):  # at most a few dozen rows
                            sel[j].copy_(x[pr, pt])
                        top[r.start + picked[:, 0], c.start + picked[:, 1]] = sel.topk(
                            kk, dim=-1, sorted=False
                        ).indices
            if p_buf is not None:
                ent[r, c] = _entropy(logp, p_buf[: block[0], : block[1]])
        ctx.save_for_backward(logits, ids, lse)
        ctx.temperature = temperature  # type: ignore[attr-defined]
        ctx.chunk_tokens = chunk_tokens  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(top, ent)
        return out, top, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        grad_out: torch.Tensor,
        _grad_top: torch.Tensor | None,
        _grad_entropy: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, ...]:
        logits, ids, lse = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature: float = ctx.temperature  # type: ignore[attr-defined]
        chunk: int = ctx.chunk_tokens  # type: ignore[attr-defined]
        grad_out = grad_out.to(lse.dtype)
        neg_gsum = -grad_out.sum(dim=-1, keepdim=True)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        # Same dtype: build each chunk's gradient in place inside `grad` (no temporary at all).
        in_place = logits.dtype == lse.dtype
        tmp = (
            None
            if in_place
            else torch.empty(
                (*_block_shape(logits.shape[0], logits.shape[1], chunk), logits.shape[2]),
                dtype=lse.dtype,
                device=grad.device,
            )
        )
        for r, c in _chunks(logits.shape[0], logits.shape[1], chunk):
            buf = grad[r, c] if tmp is None else tmp[: r.stop - r.start, : c.stop - c.start]
            if temperature != 1.0:
                _scaled(logits[r, c], temperature, out=buf)
                buf.sub_(lse[r, c, None])
            else:
                torch.sub(logits[r, c], lse[r, c, None], out=buf)
            buf.exp_().mul_(neg_gsum[r, c])
            buf.scatter_add_(-1, ids[r, c], grad_out[r, c])
            if temperature != 1.0:
                buf.div_(temperature)
            if not in_place:
                grad[r, c].copy_(buf)
        return grad, None, None, None, None, None, None


def _entropy(logp: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """-sum p log p of each row of a chunk's log-softmax, written through the reused buffer `p` (no
    [chunk, V] allocation). A row holding a -inf log-prob (a masked logit: 0 x -inf) is redone by xlogy."""
    torch.exp(logp, out=p)
    out = -p.mul_(logp).sum(-1)
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        q = logp[bad].exp()
        out[bad] = -torch.special.xlogy(q, q).sum(-1)
    return out


def _scaled(x: torch.Tensor, temperature: float, *, out: torch.Tensor) -> None:
    """out = x / temperature, computed in out's dtype. torch.div(bf16, t, out=float32) divides in bf16
    and only then widens: 8 bits of mantissa on every scaled logit (a 1% gradient error was measured)."""
    if x.dtype != out.dtype:
        out.copy_(x)
        if temperature != 1.0:
            out.div_(temperature)
    elif temperature != 1.0:
        torch.div(x, temperature, out=out)
    else:
        out.copy_(x)


def gather_log_softmax(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
    student_topk: int = 0,
    topk_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log_softmax(logits / temperature) gathered at ids, without a full log-softmax over V.

    logits [N, V] or [B, T, V] (any float dtype, views welcome), ids [N, J] or [B, T, J]. Returns
    (log-probs [.., J] in float32, or float64 for float64 logits; the student's top-`student_topk`
    ids [.., student_topk], empty when 0; with topk_rows (bool [..]) only those rows get them,
    the others hold -1: a top-k over V costs about as much as the log-softmax itself).
    """
    out, top, _ = gather_log_softmax_and_entropy(
        logits, ids, temperature, chunk_tokens, student_topk, topk_rows, entropy=False
    )
    return out, top


def gather_log_softmax_and_entropy(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
    student_topk: int = 0,
    topk_rows: torch.Tensor | None = None,
    *,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`gather_log_softmax`, plus each token's entropy -sum_v p log p of log_softmax(logits / temperature)
    [..] (no gradient), computed in the same pass from the chunk's log-softmax: one exp and one product
    over the chunk, no second forward. With entropy False the third output is empty."""
    if logits.dim() not in (2, 3) or ids.dim() != logits.dim() or ids.shape[:-1] != logits.shape[:-1]:
        raise ValueError(
            f"expected logits [.., V] and ids [.., J] (2 or 3 dims), got {tuple(logits.shape)}, {tuple(ids.shape)}"
        )
    chunk = chunk_tokens or chunk_tokens_for(logits.shape[-1])
    flat = logits.dim() == 2
    out, top, ent = ChunkedGatherLogSoftmax.apply(
        logits.unsqueeze(0) if flat else logits,
        (ids.unsqueeze(0) if flat else ids).long(),
        float(temperature),
        int(chunk),
        int(student_topk),
        None if topk_rows is None else (topk_rows.unsqueeze(0) if flat else topk_rows),
        entropy,
    )
    return (out.squeeze(0), top.squeeze(0), ent.squeeze(0)) if flat else (out, top, ent)
