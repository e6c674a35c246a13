"""What one more padded forward costs, in padded tokens: how the trainer's micro-batches and a transformers
teacher's forwards group their samples by length (`distillery_runtime.data.packing.length_groups`).

A padded forward computes every row as wide as its longest: a step of the e2e bench's small job (32 samples,
prompts of 6-14 tokens, responses of 128 or, where the student sampled its end of text early, fewer) is ~8%
padding in one forward. Sorted by length and cut where a cut saves more padded tokens than a forward costs,
the same samples take less arithmetic. Each forward costs a fixed amount besides its tokens: its kernels'
dispatch, and smaller matrix products. The gradient and the log-probs are the same either way: the trainer
adds the micro-batches' losses over the step's one normaliser, and a causal model's row never sees another.

On CPU a forward costs `CPU_FORWARD_COST_TOKENS`. Measured on the 2-core AVX-512 host (2026-12-04): the
fixed cost of a forward over the cost of a token (the e2e bench's students and teachers, 32 rows of 134 tokens
in one forward against eight of four rows) is 12-55 tokens in float32, 60-128 in bfloat16, 158 for the 0.6M
student on rows of 40 tokens. `bench/length_groups.py` (ten steps' samples like the small job's, the fewest
forwards against the cut, alternating; `bench/README.md`), the cut at 32 / 64 / 128 tokens, step time over
the fewest forwards' (8.0% padding in those): the student's training step 0.95 / 0.90 / 0.94 in float32 and
0.95 / 0.93 / 0.93 in bfloat16, the teacher's forward 0.96 / 0.89 / 0.95 and 0.96 / 0.94 / 0.97.

On GPUs it is not measured: there a forward's fixed cost is its kernel launches, and small matrix products
leave the device idle. They take the fewest forwards (the user's micro-batches, a teacher's memory bounds),
sorted by length for the least padding among them, as do FSDP trainers over several ranks on any device,
whose every micro-batch gathers the sharded weights again.
"""

from __future__ import annotations

from distillery.api.spec import DistillationJobSpec, Sharding
from distillery.plan.memory.features import resolve_memory_features
from distillery.plan.rollout.settings import trainer_world_size

CPU_FORWARD_COST_TOKENS = 64
"""What one more forward costs on CPU, in padded tokens (the module docstring's measurements)."""


def forward_cost_tokens(*, on_gpu: bool) -> int | None:
    """One more forward's cost in padded tokens on the device; None: the fewest forwards."""
    return None if on_gpu else CPU_FORWARD_COST_TOKENS


def trainer_forward_cost(spec: DistillationJobSpec, sharding: Sharding) -> int | None:
    """The trainer's, in the plan's `sharding`: its device's, or None for FSDP over several ranks (each
    micro-batch gathers the weights: one more is a collective, not a kernel launch)."""
    if sharding == Sharding.FSDP and trainer_world_size(spec) > 1:
        return None
    return forward_cost_tokens(on_gpu=spec.student.pool.gpus_per_worker > 0)


def padding_line(spec: DistillationJobSpec) -> str:
    """`distillery plan`'s line: how the trainer's micro-batches are grouped by length, and why."""
    cost = trainer_forward_cost(spec, resolve_memory_features(spec).sharding)
    if cost is not None:
        return (
            f"micro-batches: sorted by length, cut where a cut saves over {cost} padded tokens "
            "(on CPU: a forward's fixed cost is small)"
        )
    on_gpu = spec.student.pool.gpus_per_worker > 0
    why = "on GPUs" if on_gpu else "FSDP over several ranks: each gathers the weights"
    return f"micro-batches: the fewest of microBatchSize samples, sorted by length ({why})"
