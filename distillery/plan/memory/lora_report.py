"""`distillery plan`'s lines on a LoRA student: the adapter, the weight sync per step, and the trainer's
peak memory with the adapter against full fine-tuning of the same job (pure)."""

from __future__ import annotations

import dataclasses

from distillery.api.spec import DistillationJobSpec
from distillery.model_shapes import resolve_shape
from distillery.plan.lora import describe, resolve_lora
from distillery.plan.memory.features import job_memory_plan
from distillery.plan.memory.gpu import GIB, plan_memory


def lora_lines(spec: DistillationJobSpec) -> list[str]:
    """Nothing for full fine-tuning; for a LoRA student its settings and costs."""
    lora = resolve_lora(spec)
    if lora is None:
        return []
    compute_bytes = 4 if spec.student.precision == "float32" else 2
    lines = describe(lora, resolve_shape(spec.student.model), compute_bytes)
    plan = job_memory_plan(spec)
    if plan is not None:
        # Full fine-tuning's plan of the same layout (its own features may differ: this is the same layout).
        full = plan_memory(dataclasses.replace(plan.layout, adapter_params=0))
        lines.append(
            f"  trainer peak per GPU: {plan.trainer_peak_bytes / GIB:.2f} GiB with the adapter, "
            f"{full.trainer_peak_bytes / GIB:.2f} GiB for full fine-tuning in the same layout "
            f"({plan.trainer_peak_bytes / full.trainer_peak_bytes:.2f}x)"
        )
    return lines
