"""The student's memory features, decided by the memory plan: sharding, activation checkpointing, CPU offload.

Each feature trades time for memory: activation checkpointing recomputes every decoder layer in the
backward, FSDP2 over a world of one gathers and casts every layer on every pass, CPU offload runs the
optimizer step on the host. `bench/e2e_vs_trl.py` measured the first two at ~40% of a step of a job that
fits without them. So a feature the spec leaves unset (`auto`) is on only where the job needs it: the
cheapest layout that fits the student's GPUs (`plan.memory.plan_memory`) wins, tried in this order
(sharding, checkpointing, offload):

  1. replicated, nothing else (on one rank; over several ranks auto always shards: FSDP2 divides the
     state, which is what lets large jobs scale);
  2. FSDP2 (on one rank its bf16 working copy is a layer, not autocast's copy of every weight);
  3. checkpointing, replicated then FSDP2 (each layer recomputed: ~30% more compute);
  4. CPU offload, without then with checkpointing (the optimizer step on the host: the dearest).

A value set in the spec is kept as is, and the search runs over the others. Where nothing fits, the most
frugal layout is the answer and `distillery validate` refuses the job with the plan's numbers. Without a
memory plan (a CPU job, or a student whose shape is unknown) the features follow the ranks: FSDP2 over
several ranks, and on a GPU of unknown need checkpointing too, the safe side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from distillery.api.spec import DistillationJobSpec, Sharding
from distillery.plan.memory.gpu import GIB, MemoryPlan, TrainingLayout, base_layout, plan_memory
from distillery.plan.rollout.settings import trainer_world_size


@dataclass(frozen=True)
class MemoryFeatures:
    """What the trainer ranks run with, and why (one line per feature, for `distillery plan`)."""

    sharding: Sharding
    """fsdp or replicate, never auto."""
    activation_checkpointing: bool
    cpu_offload: bool
    reasons: tuple[str, str, str] = ("", "", "")
    """Why each of sharding, activationCheckpointing and cpuOffload is what it is."""

    def lines(self) -> list[str]:
        """`field: value (why)` for each feature."""
        values = (
            str(self.sharding),
            "on" if self.activation_checkpointing else "off",
            "on" if self.cpu_offload else "off",
        )
        names = ("sharding", "activationCheckpointing", "cpuOffload")
        return [f"{n}: {v} ({why})" for n, v, why in zip(names, values, self.reasons, strict=True)]


_Candidate = tuple[Sharding, bool, bool]


def _candidates(spec: DistillationJobSpec, ranks: int) -> list[_Candidate]:
    """(sharding, checkpointing, offload) that keep what the spec sets, cheapest first."""
    R, F = Sharding.REPLICATE, Sharding.FSDP
    order: list[_Candidate] = [
        (R, False, False),
        (F, False, False),
        (R, True, False),
        (F, True, False),
        (F, False, True),
        (F, True, True),
    ]
    training = spec.student.training
    # auto shards over several ranks whatever their memory: it divides the state, which is what scales. A
    # LoRA student's trainable state is a fraction of a percent: a replica of its frozen weights, where it
    # fits, saves every layer's all-gather in every forward and backward.
    several = (F,) if ranks > 1 and spec.student.lora is None else (R, F)
    shardings = {Sharding.AUTO: several}.get(training.sharding, (training.sharding,))
    return [
        c
        for c in order
        if c[0] in shardings
        and training.activation_checkpointing in (None, c[1])
        and training.cpu_offload in (None, c[2])
    ]


def _with(layout: TrainingLayout, candidate: _Candidate) -> TrainingLayout:
    sharding, checkpointing, offload = candidate
    return dataclasses.replace(
        layout, sharding=str(sharding), activation_checkpointing=checkpointing, cpu_offload=offload
    )


def resolve_memory_features(spec: DistillationJobSpec) -> MemoryFeatures:
    """The memory features of a validated spec (see the module docstring)."""
    training = spec.student.training
    layout = base_layout(spec)
    ranks = trainer_world_size(spec)
    candidates = _candidates(spec, ranks)
    if not candidates:  # only an explicit replicate with offload, which the API refuses
        candidates = [(Sharding.FSDP, bool(training.activation_checkpointing), True)]
    if layout is None:
        return _without_plan(spec, ranks, candidates)
    plans = {c: plan_memory(_with(layout, c)) for c in candidates}
    fitting = [c for c, p in plans.items() if p.fits]
    chosen = fitting[0] if fitting else candidates[-1]

    def without(index: int) -> MemoryPlan:
        """The plan of the chosen layout with one feature turned back off (replicated, for sharding)."""
        sharding, checkpointing, offload = chosen
        key: _Candidate = (
            Sharding.REPLICATE if index == 0 else sharding,
            checkpointing and index != 1,
            offload and index != 2,
        )
        return plans.get(key) or plan_memory(_with(layout, key))

    return MemoryFeatures(*chosen, reasons=_reasons(spec, chosen, plans[chosen], without, ranks))


def _without_plan(spec: DistillationJobSpec, ranks: int, candidates: list[_Candidate]) -> MemoryFeatures:
    on_cpu = spec.student.pool.gpus_per_worker == 0
    if on_cpu:
        # No GPU memory to save: the cheapest layout the spec allows.
        chosen, why = candidates[0], "a CPU job: no GPU memory to save"
    else:
        # A GPU job whose student's shape is unknown: the memory-safe side, FSDP2 and checkpointing.
        safe = [c for c in candidates if c[0] == Sharding.FSDP and (c[1] or c[2])]
        chosen = safe[0] if safe else candidates[-1]
        why = "the student's shape is unknown, so no memory plan: the memory-saving side"
    sharding_why = (
        f"auto: {ranks} trainer ranks" if ranks > 1 and chosen[0] == Sharding.FSDP else f"auto: {why}"
    )
    reasons = (
        _explicit(spec.student.training.sharding != Sharding.AUTO) or sharding_why,
        _explicit(spec.student.training.activation_checkpointing is not None) or f"auto: {why}",
        _explicit(spec.student.training.cpu_offload is not None) or f"auto: {why}",
    )
    return MemoryFeatures(*chosen, reasons=reasons)


def _explicit(is_set: bool) -> str:
    return "set in the spec" if is_set else ""


def _reasons(
    spec: DistillationJobSpec,
    chosen: _Candidate,
    plan: MemoryPlan,
    without: Callable[[int], MemoryPlan],
    ranks: int,
) -> tuple[str, str, str]:
    training = spec.student.training
    gpu = plan.layout.gpu_bytes / GIB
    fits = f"peak {plan.peak_bytes / GIB:.1f} of {gpu:g} GiB per GPU"
    explicit = (
        _explicit(training.sharding != Sharding.AUTO),
        _explicit(training.activation_checkpointing is not None),
        _explicit(training.cpu_offload is not None),
    )
    if not plan.fits:
        verdict = f"auto: nothing fits, {fits}; the most frugal layout"
        return (explicit[0] or verdict, explicit[1] or verdict, explicit[2] or verdict)

    def needed(index: int) -> str:
        other = without(index)
        return f"auto: without it the {other.peak_phase} phase would need {other.peak_bytes / GIB:.1f} of {gpu:g} GiB"

    sharding, checkpointing, offload = chosen
    if sharding == Sharding.FSDP and ranks > 1 and spec.student.lora is None:
        sharding_why = f"auto: {ranks} trainer ranks share the state"
    elif sharding == Sharding.REPLICATE and ranks > 1:
        sharding_why = f"auto: a LoRA student's replica (frozen weights in the compute dtype) fits, {fits}"
    elif sharding == Sharding.FSDP:
        sharding_why = needed(0).replace("without it", "replicated,")
    else:
        sharding_why = f"auto: one trainer rank and a replica fits, {fits}"
    return (
        explicit[0] or sharding_why,
        explicit[1] or (needed(1) if checkpointing else f"auto: fits without it, {fits}"),
        explicit[2] or (needed(2) if offload else "auto: not needed"),
    )


def job_memory_plan(spec: DistillationJobSpec) -> MemoryPlan | None:
    """The memory plan of the job as it will run (its resolved features); None without a plan."""
    layout = base_layout(spec)
    if layout is None:
        return None
    features = resolve_memory_features(spec)
    return plan_memory(
        _with(layout, (features.sharding, features.activation_checkpointing, features.cpu_offload))
    )
