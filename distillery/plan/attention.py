"""The trainer's attention kernel, per micro-batch: the model's own (sdpa), or eager where that is faster.

Eager attention (a matmul, a softmax, a matmul) keeps a [rows, heads, width, width] block per layer for the
backward, so it costs time and memory with the square of the width. torch's CPU flash-attention kernel,
which sdpa takes on CPU, needs none of that, but its backward in bfloat16 is slow on short rows: in a
training step of the e2e bench's small student (11.5M parameters, 32 rows of ~157 tokens, bfloat16
autocast, 2-core AVX-512/AMX host) the sdpa backward took 211 ms of a 0.71 s step. `bench/trainer_attention.py`
times the trainer's step both ways over widths (`bench/README.md`): in bfloat16 eager is faster up to ~200
tokens a row and slower past ~250 (2.85x slower at 1,024); in float32 neither wins at short widths (0.94-1.10x,
the host's noise) and sdpa wins past them. On a GPU sdpa runs fused kernels and stays.

So a bfloat16 student on CPU trains its micro-batches of up to `CPU_BF16_EAGER_MAX_WIDTH` tokens a row with
eager attention and the wider ones with the model's own; every other job uses the model's own kernel. The
two compute the same attention (the same mask, the same softmax), so the choice changes no result beyond
floating-point rounding, and a run is as deterministic as before: the width decides, not timing.
"""

from __future__ import annotations

from distillery.api.spec import DistillationJobSpec, Precision, RolloutEngine

CPU_BF16_EAGER_MAX_WIDTH = 192
"""Widest micro-batch (tokens a row: padded width, or a packed row's length) that a bfloat16 CPU trainer
runs with eager attention. Measured (`bench/trainer_attention.py`, 2026-12-01, bfloat16): eager 0.77-0.82x
the sdpa step at 64-160 tokens a row, 0.96-0.98x at 192-224, 1.05x at 256, 1.65x at 512."""

EAGER = "eager"


def eager_attention_width(spec: DistillationJobSpec) -> int:
    """The widest micro-batch the trainer runs with eager attention; 0: none (the model's own kernel)."""
    on_cpu = spec.student.pool.gpus_per_worker == 0
    # auto resolves to float32 on CPU (trainer.resolve_precision): only an explicit bfloat16 computes in it.
    if on_cpu and spec.student.precision == Precision.BFLOAT16:
        return CPU_BF16_EAGER_MAX_WIDTH
    return 0


def attention_kernel(width: int, eager_width: int, own: str) -> str:
    """The attention implementation of a micro-batch `width` tokens a row wide: eager up to `eager_width`,
    the model's own (`own`, what it was loaded with) past it."""
    return EAGER if 0 < width <= eager_width else own


def decode_attention(spec: DistillationJobSpec, engine: RolloutEngine) -> str | None:
    """The attention implementation of the transformers rollout engine's decode steps: eager on CPU, where
    torch's flash-attention kernel, which sdpa takes there, costs more to set up for the step's one query row
    than the attention itself (a matmul and a softmax over the cache); None (the model's own) on GPUs and for
    vLLM. The prompts' forward keeps the model's own kernel. Measured (`bench/README.md`, the e2e bench's
    rollout of 32 x 128 tokens, the two alternating in one process): the 0.4M student 0.424 -> 0.390 s, the
    11.5M one level in float32 (2.97 / 2.94 s)."""
    on_cpu = spec.student.pool.gpus_per_worker == 0
    return EAGER if on_cpu and engine == RolloutEngine.TRANSFORMERS else None


def attention_line(spec: DistillationJobSpec) -> str:
    """`distillery plan`'s line: the trainer's attention kernel and why."""
    width = eager_attention_width(spec)
    if width:
        return (
            f"attention: eager for micro-batches up to {width} tokens a row, the model's own (sdpa) past them "
            "(a bfloat16 student on CPU: torch's CPU flash-attention backward is slower on short rows)"
        )
    on_cpu = spec.student.pool.gpus_per_worker == 0
    why = "float32 on CPU: eager is no faster at any width" if on_cpu else "fused kernels on GPUs"
    return f"attention: the model's own (sdpa) ({why})"
