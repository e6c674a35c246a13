"""Where a job's checkpoints, metrics and final model live in a cluster (pure).

The trainer pods write everything they keep under `checkpoint.path`: the step folders, `final/` (the model
you keep) and `runs/<job>/` (metrics, samples, report). What is mounted there, in this order:

- `checkpoint.pvc`: the user's claim, as it is; the operator never makes, changes or deletes it;
- `checkpoint.ephemeral`: nothing but each pod's emptyDir, lost with the pods;
- otherwise the operator's claim `<job>-checkpoints` (`checkpoint_claim_name`), which it makes before the
  trainer and keeps after the job is deleted (no owner reference), unless `deleteWithJob` (then the job
  owns it and the garbage collector deletes it with the job). A job made again with the same name finds
  it again, and the runtime's `checkpoint.resume` decides what happens to the old run's checkpoints.

The operator's claim's size, when `checkpoint.size` is unset, comes from the student's parameter count P
(its shape, as the memory plan knows it: `model_shapes.resolve_shape`):

    bytes = 1.1 x ((keep + 1) x checkpoint_bytes + final_bytes) + 1 GiB, rounded up to whole GiB
    checkpoint_bytes = P x d + T x STATE_BYTES_PER_PARAMETER        final_bytes = P x d (+ T x 4 for LoRA)

where T is the parameters trained: every one (T = P) in full fine-tuning, the adapter's in a LoRA student
(`lora.adapter_params`). A checkpoint holds the kept model in checkpoint.modelDtype (d: 2 for bfloat16 and
float16, 4 for float32) and, of what trains, its float32 weights (4 bytes a parameter: master/, or a LoRA
student's adapter/) and AdamW's two float32 moments (8). A LoRA checkpoint has no float32 copy of the frozen
base (the job's own student model is it), so its size is the merged model's and megabytes more, not 14 bytes
a parameter. keep + 1 of them exist at once, because a save writes the new one before it prunes the oldest.
`final/` is the kept model (and a LoRA student's adapter): hard links into the last checkpoint where the
filesystem has them (no space), a copy where it has not. 10% is headroom for the filesystem, configs and
tokenizer files; 1 GiB is for the run's metrics, samples and report. A student whose shape is unknown gets
FALLBACK_SIZE. The runtime's preflight checks a folder's free space with the same `checkpoint_bytes`
(distillery_runtime.checkpoints.checkpoint).

Access mode: ReadWriteMany when more than one pod mounts the claim, as those may run on different nodes:
the Ray head (its driver finds the checkpoint to resume) and every worker (rank 0 writes, every rank loads
a resumed one), so every job the operator renders today; ReadWriteOnce only where one pod mounts it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distillery.api.spec import DistillationJobSpec, ModelDtype
from distillery.model_shapes import ModelShape, resolve_shape
from distillery.names import child_name
from distillery.plan.lora import adapter_params, resolve_lora

GIB = 1024**3
STATE_BYTES_PER_PARAMETER = 12
"""What a checkpoint holds a trained parameter besides the kept model: its float32 weight (4: master/, or a
LoRA student's adapter/) and AdamW's two float32 moments (8)."""
ADAPTER_BYTES_PER_PARAMETER = 4
"""A LoRA student's adapter, float32, as `final/` keeps it beside the model."""
MODEL_DTYPE_BYTES = {ModelDtype.BFLOAT16: 2, ModelDtype.FLOAT16: 2, ModelDtype.FLOAT32: 4}
"""Bytes a parameter of the kept model (`model/`, `final/`) in each checkpoint.modelDtype."""
HEADROOM = 1.1
RUN_FILES_BYTES = 1 * GIB
"""metrics.jsonl, eval.jsonl, samples.jsonl and the report of one run."""
FALLBACK_SIZE = "100Gi"
"""The operator's claim's size when neither checkpoint.size nor the student's shape says."""
READ_WRITE_MANY = "ReadWriteMany"
READ_WRITE_ONCE = "ReadWriteOnce"
DEFAULT_CLASS = "the cluster's default"


def checkpoint_claim_name(job_name: str) -> str:
    """The operator's checkpoint claim of a job: `<job>-checkpoints`, the same for every job of that name,
    so that a job made again finds it (a DNS label of at most 63 characters)."""
    return child_name(job_name, "checkpoints")


@dataclass(frozen=True)
class OperatorClaim:
    """The PersistentVolumeClaim the operator makes for a job's checkpoints."""

    name: str
    size: str
    """The storage it asks for, a Kubernetes quantity."""
    size_reason: str
    access_mode: str
    access_reason: str
    storage_class_name: str | None
    """None: the cluster's default StorageClass (the field is left out of the claim)."""
    delete_with_job: bool
    """Owned by the job (deleted with it); else no owner, so it is kept."""


@dataclass(frozen=True)
class CheckpointStorage:
    """What the trainer pods mount at checkpoint.path, and why."""

    path: str
    claim: str | None
    """The claim mounted there (the user's or the operator's); None: an emptyDir (ephemeral)."""
    operator_claim: OperatorClaim | None = None
    """Set when the operator makes the claim."""

    @property
    def ephemeral(self) -> bool:
        return self.claim is None

    @property
    def kept(self) -> bool:
        """The output outlives the job: on a claim the job does not own."""
        return self.claim is not None and not (self.operator_claim and self.operator_claim.delete_with_job)

    def lines(self) -> list[str]:
        """The decision and why, one line each, for `distillery plan`."""
        if self.claim is None:
            return [
                f"checkpoint storage: emptyDir at {self.path} (checkpoint.ephemeral): lost with the trainer's "
                "pods, which KubeRay deletes when the run ends"
            ]
        claim = self.operator_claim
        if claim is None:
            return [
                f"checkpoint storage: claim {self.claim} at {self.path} (checkpoint.pvc: yours; the operator "
                "never changes or deletes it)"
            ]
        life = (
            "deleted with the job (checkpoint.deleteWithJob)"
            if claim.delete_with_job
            else "kept after the job is deleted"
        )
        return [
            f"checkpoint storage: claim {claim.name} at {self.path}, made by the operator, {life}",
            f"  size: {claim.size} ({claim.size_reason})",
            f"  accessModes: {claim.access_mode} ({claim.access_reason})",
            f"  storageClassName: {claim.storage_class_name or DEFAULT_CLASS}",
        ]


def checkpoint_storage(job_name: str, spec: DistillationJobSpec) -> CheckpointStorage:
    """The checkpoint storage of a validated spec of the job named `job_name`, in a cluster."""
    checkpoint = spec.checkpoint
    if checkpoint.pvc is not None:
        return CheckpointStorage(path=checkpoint.path, claim=checkpoint.pvc)
    if checkpoint.ephemeral:
        return CheckpointStorage(path=checkpoint.path, claim=None)
    name = checkpoint_claim_name(job_name)
    size, size_reason = claim_size(spec)
    access_mode, access_reason = access_mode_of(spec)
    claim = OperatorClaim(
        name=name,
        size=size,
        size_reason=size_reason,
        access_mode=access_mode,
        access_reason=access_reason,
        storage_class_name=checkpoint.storage_class_name,
        delete_with_job=checkpoint.delete_with_job,
    )
    return CheckpointStorage(path=checkpoint.path, claim=name, operator_claim=claim)


def claim_size(spec: DistillationJobSpec) -> tuple[str, str]:
    """The operator's claim's size and why (the module docstring has the formula)."""
    checkpoint = spec.checkpoint
    if checkpoint.size is not None:
        return checkpoint.size, "set in the spec"
    shape = resolve_shape(spec.student.model)
    if shape is None:
        return FALLBACK_SIZE, (
            "auto: the student's shape is unknown (not a local folder with config.json, nor a well-known "
            "model), so is its size: the fallback"
        )
    model = MODEL_DTYPE_BYTES[checkpoint.model_dtype]
    copies = checkpoint.keep + 1
    adapter = trained_adapter(spec, shape)
    one = checkpoint_bytes(shape.params, model, adapter)
    needed = HEADROOM * (copies * one + final_bytes(shape.params, model, adapter)) + RUN_FILES_BYTES
    gib = max(1, math.ceil(needed / GIB))
    if adapter is None:
        reason = (
            f"auto: {shape.params / 1e9:.2f}B parameters x ({copies} checkpoints x "
            f"{STATE_BYTES_PER_PARAMETER + model} + final/ {model}) bytes, + 10% and 1 GiB for the run's files"
        )
    else:
        reason = (
            f"auto: LoRA, {copies} checkpoints and final/ of the merged model ({shape.params / 1e9:.2f}B "
            f"parameters x {model} bytes) and the adapter ({adapter / 1e6:.2f}M parameters x "
            f"{STATE_BYTES_PER_PARAMETER} bytes with its AdamW state), + 10% and 1 GiB for the run's files"
        )
    return f"{gib}Gi", reason


def checkpoint_bytes(parameters: int, model_bytes: int, adapter: int | None = None) -> int:
    """Bytes of one checkpoint of a student of `parameters` parameters kept in `model_bytes` a parameter:
    the kept model, and STATE_BYTES_PER_PARAMETER for each trained parameter (every one; or, for a LoRA
    student, the `adapter`'s: float32 weights and AdamW moments, no float32 copy of the frozen base). What
    the claim is sized by and the runtime's preflight checks."""
    trained = parameters if adapter is None else adapter
    return parameters * model_bytes + trained * STATE_BYTES_PER_PARAMETER


def final_bytes(parameters: int, model_bytes: int, adapter: int | None = None) -> int:
    """Bytes of `final/` where it is a copy (no hard links): the kept model, and a LoRA student's adapter."""
    return parameters * model_bytes + (adapter or 0) * ADAPTER_BYTES_PER_PARAMETER


def trained_adapter(spec: DistillationJobSpec, shape: ModelShape) -> int | None:
    """Parameters of a LoRA student's adapter on a student of `shape`; None: full fine-tuning."""
    lora = resolve_lora(spec)
    return None if lora is None else adapter_params(shape, lora)


def mounting_pods(spec: DistillationJobSpec) -> int:
    """The pods that mount the checkpoint claim: the Ray head and each worker."""
    return 1 + spec.student.pool.workers


def access_mode_of(spec: DistillationJobSpec) -> tuple[str, str]:
    """ReadWriteMany where pods that may run on different nodes share the claim; ReadWriteOnce for one."""
    pods = mounting_pods(spec)
    if pods == 1:
        return READ_WRITE_ONCE, "one pod mounts it"
    workers = spec.student.pool.workers
    return READ_WRITE_MANY, (
        f"{pods} pods mount it, the Ray head and {workers} worker{'s' if workers > 1 else ''}, "
        "on whichever nodes they are scheduled"
    )
