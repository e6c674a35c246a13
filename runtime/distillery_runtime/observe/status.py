"""Progress into the DistillationJob's status, from the trainer, in a cluster.

The runtime owns `status.progress`, `status.lastCheckpoint`, `status.model` and `status.teacherOutages` (the operator
never writes them; it shows an outage as TeachersReady False, reason TeacherUnavailable) and
patches them through the `status` subresource with a JSON merge patch, using the namespaced Role
`distillery-runtime` (get/patch on distillationjobs/status). Patches are rate-limited (at most one per
`min_interval` seconds; checkpoints and the final step always go through) and a failed patch is logged,
never fatal: training must not stop because the API server is briefly unreachable.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from distillery.api.spec import GROUP, PLURAL, VERSION
from distillery.api.status import (
    CheckpointStatus,
    DistillationJobStatus,
    ModelStatus,
    Progress,
    TeacherOutage,
)

log = logging.getLogger("distillery.runtime.status")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status_patch(status: DistillationJobStatus, field: str) -> dict[str, Any]:
    """The merge patch writing one of the runtime's fields of `status` (by its Python name), and no other."""
    return {"status": status.model_dump(by_alias=True, exclude_none=True, include={field})}


def progress_patch(record: dict[str, Any], total: int, eval_accuracy: float | None) -> dict[str, Any]:
    """The merge patch for one step's record (pure)."""
    progress = Progress(
        step=int(record["step"]),
        total_steps=total,
        loss=record.get("loss"),
        kl=record.get("kl"),
        tokens_per_second=round(float(record.get("tokens_per_s", 0.0)), 2),
        eval_accuracy=eval_accuracy,
        updated_at=now_iso(),
    )
    return _status_patch(DistillationJobStatus(progress=progress), "progress")


def checkpoint_patch(step: int, path: str) -> dict[str, Any]:
    ckpt = CheckpointStatus(step=step, path=path, time=now_iso())
    return _status_patch(DistillationJobStatus(last_checkpoint=ckpt), "last_checkpoint")


def model_patch(step: int, path: str, dtype: str, claim: str | None = None) -> dict[str, Any]:
    """The merge patch naming the final model (`final/`, published after the last step) and the claim it
    is on."""
    model = ModelStatus(path=path, claim=claim, step=step, dtype=dtype, time=now_iso())
    return _status_patch(DistillationJobStatus(model=model), "model")


def outages_patch(outages: dict[str, TeacherOutage]) -> dict[str, Any]:
    """The merge patch for the teachers the trainer waits for now (a list: a merge patch replaces it)."""
    status = DistillationJobStatus(teacher_outages=[o for _, o in sorted(outages.items())])
    return _status_patch(status, "teacher_outages")


class StatusReporter:
    """Patches the job's status subresource with the official kubernetes client."""

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        claim: str | None = None,
        api: Any = None,
        min_interval: float = 10.0,
    ) -> None:
        """`claim`: the PersistentVolumeClaim mounted at spec.checkpoint.path, named with the final model."""
        self.namespace, self.name, self.claim = namespace, name, claim
        self.min_interval = min_interval
        self._last = float("-inf")
        self._eval: float | None = None
        self._outages: dict[str, TeacherOutage] = {}
        if api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.CustomObjectsApi()
        self.api = api

    def _patch(self, body: dict[str, Any]) -> bool:
        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, self.name, body
            )
            return True
        except Exception as error:
            log.warning("status patch of %s/%s failed: %s", self.namespace, self.name, error)
            return False

    def progress(self, record: dict[str, Any], total: int) -> None:
        now = time.monotonic()
        if record["step"] < total and now - self._last < self.min_interval:
            return
        self._last = now
        self._patch(progress_patch(record, total, self._eval))

    def eval_accuracy(self, accuracy: float) -> None:
        self._eval = accuracy

    def checkpoint(self, step: int, path: str) -> None:
        self._patch(checkpoint_patch(step, path))

    def model(self, step: int, path: str, dtype: str) -> None:
        self._patch(model_patch(step, path, dtype, self.claim))

    def teacher_outage(self, teacher: str, down: bool, message: str = "") -> None:
        """A teacher stopped answering, or came back: patched at once (never rate-limited)."""
        if down:
            self._outages[teacher] = TeacherOutage(name=teacher, since=now_iso(), message=message[:1024])
        elif self._outages.pop(teacher, None) is None:
            return
        self._patch(outages_patch(self._outages))
