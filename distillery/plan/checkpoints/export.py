"""The model a job keeps, resolved: what each checkpoint's `model/` folder (and `final/`) is made of.

That folder is what a user serves (`vllm serve`) or loads (`from_pretrained`) as is, so it carries what the
job actually used: the weights in `checkpoint.modelDtype` (not the trainer's float32 master copy, twice
the size), the tokenizer the job tokenized with (`student.tokenizer` when set, with its chat template) and
a generation config that stops where that tokenizer ends a response.
"""

from __future__ import annotations

from dataclasses import dataclass

from distillery.api.spec import DistillationJobSpec, ModelDtype


@dataclass(frozen=True)
class ExportSettings:
    """What the trainer's rank 0 writes as a checkpoint's `model/` folder."""

    dtype: ModelDtype
    tokenizer: str
    """Location (as the spec gives it: a path, hub id or pvc://) of the tokenizer the job used."""
    base_model: str = ""
    """The student model as the spec names it: what a LoRA student's adapter/ names as its base
    (adapter_config.json's base_model_name_or_path); '': the folder the trainer loaded."""


def resolve_export(spec: DistillationJobSpec) -> ExportSettings:
    """The kept model's settings of a spec."""
    return ExportSettings(
        dtype=spec.checkpoint.model_dtype,
        tokenizer=spec.student.tokenizer or spec.student.model,
        base_model=spec.student.model,
    )
