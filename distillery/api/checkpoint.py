"""The DistillationJob's checkpoints (`spec.checkpoint`): where they go, how many are kept, the resume policy
and the kept model's dtype."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import (
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_RE,
    MAX_NAME,
    MAX_QUANTITY,
    POSITIVE_QUANTITY_RE,
    Location,
)


class ResumePolicy(StrEnum):
    AUTO = "auto"
    NEVER = "never"
    REQUIRED = "required"


_NO_OPERATOR_CLAIM = "not with pvc (an existing claim is yours) or ephemeral (no claim)"


def _operator_claim_rule(field: str, attr: str) -> Rule:
    """`field` shapes the claim the operator makes: neither a claim of the user's nor no claim at all."""
    return Rule(
        check=lambda c: getattr(c, attr) is None or (c.pvc is None and not c.ephemeral),
        cel=f"!has(self.{field}) || (!has(self.pvc) && !self.ephemeral)",
        message=f"applies to the claim the operator makes: {_NO_OPERATOR_CLAIM}",
        field=field,
    )


class ModelDtype(StrEnum):
    """The dtype of the kept model's weights (a checkpoint's `model/`, `final/`)."""

    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class Checkpoint(ApiModel):
    """Where checkpoints, the run's metrics and the final model go, and how a restarted job picks them up.

    In a cluster they go to a PersistentVolumeClaim mounted at `path` in the trainer pods: the one `pvc`
    names, else one the operator makes for the job (`<job>-checkpoints`, kept after the job is deleted
    unless `deleteWithJob`), else, with `ephemeral`, the pods' own emptyDir. A local run (`distillery run`)
    writes to its output folder and ignores all four."""

    path: Location = "/checkpoints"
    """Absolute directory inside the trainer pods, where the checkpoint claim is mounted; one sub-directory
    per step, `final/` (the model you keep) and `runs/<job>/` (metrics, report). Object-store URIs are not
    supported."""
    pvc: str | None = Field(default=None, pattern=DNS_LABEL_RE, max_length=MAX_NAME)
    """Your own PersistentVolumeClaim, mounted at `path` in the Ray head and every worker pod (the driver on
    the head finds the checkpoint to resume, rank 0 writes them, every rank loads them): ReadWriteMany,
    unless all the pods share one node. The operator never changes or deletes it. Unset: the operator makes
    a claim for the job (`size`, `storageClassName`, `deleteWithJob`), unless `ephemeral`."""
    size: str | None = Field(default=None, pattern=POSITIVE_QUANTITY_RE, max_length=MAX_QUANTITY)
    """Storage the operator's claim asks for, a Kubernetes quantity (`200Gi`). Unset: estimated from the
    student's parameters, (keep + 1) checkpoints and a copy of the model with 10% headroom (`distillery
    plan` prints it), or 100Gi when the student's shape is unknown."""
    storage_class_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN_RE, max_length=MAX_NAME)
    """StorageClass of the operator's claim; unset: the cluster's default class. It must provide
    ReadWriteMany (NFS, CephFS, EFS, Filestore ...): the Ray head and the workers are pods that may run on
    different nodes."""
    delete_with_job: bool = False
    """The operator's claim is owned by the job, so `kubectl delete dj` deletes it with the model on it.
    Default: kept (no owner), for you to read back and delete (`kubectl delete pvc <job>-checkpoints`); a
    job made again with the same name uses it again."""
    ephemeral: bool = False
    """No claim: checkpoints, metrics and the final model go to the trainer pods' emptyDir and are lost with
    the pods, which KubeRay deletes when the run ends. For tests and throwaway runs."""
    keep: int = Field(default=3, ge=1, le=1000)
    """Complete checkpoints kept; older ones are deleted after a new one is written."""
    resume: ResumePolicy = ResumePolicy.AUTO
    """auto: continue from this job's newest complete checkpoint if any; never: start fresh; required: fail if
    none. A job deleted and made again finds the old one's checkpoints at the same path: auto and never stop
    before the first step, naming them (never deleted); required continues from them."""
    model_dtype: ModelDtype = ModelDtype.BFLOAT16
    """dtype of the weights in each checkpoint's `model/` folder and in `final/`, the model `vllm serve` and
    `from_pretrained` load as is (with the tokenizer the job used and its generation_config.json). Resuming
    reads the exact float32 weights the checkpoint keeps beside it, whatever this is."""

    rules = (
        Rule(
            # It was documented as "(or URI)" and an s3:// path became a local folder named "s3:".
            check=lambda c: c.path.startswith("/"),
            cel="self.path.startsWith('/')",
            message="must be an absolute directory in the trainer pods (a claim is mounted there); "
            "object-store URIs are not supported",
            field="path",
        ),
        # An existing claim is the user's (its size, class and life are theirs); ephemeral has no claim.
        _operator_claim_rule("size", "size"),
        _operator_claim_rule("storageClassName", "storage_class_name"),
        Rule(
            check=lambda c: not c.delete_with_job or (c.pvc is None and not c.ephemeral),
            cel="!self.deleteWithJob || (!has(self.pvc) && !self.ephemeral)",
            message=f"applies to the claim the operator makes: {_NO_OPERATOR_CLAIM}",
            field="deleteWithJob",
        ),
        Rule(
            check=lambda c: not c.ephemeral or c.pvc is None,
            cel="!self.ephemeral || !has(self.pvc)",
            message="ephemeral means no claim at all: not with pvc",
            field="ephemeral",
        ),
    )
