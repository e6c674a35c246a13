"""Which spec changes a running job accepts: the live fields are applied, every other change is refused.

The applied spec is the one in the job's ConfigMap (the record of what the children were made from). A
live field (suspend, a teacher's replicas) comes from the current spec; any other difference is listed by
field path and refused, so a job is never half-updated: its children keep the applied spec.
"""

from __future__ import annotations

from typing import Any

from distillery.api import DistillationJobSpec

LIVE_FIELDS_DOC = "suspend and teachers[].replicas"


def _frozen_view(spec: DistillationJobSpec) -> dict[str, Any]:
    data = spec.to_yaml_dict()
    data.pop("suspend", None)
    for teacher in data.get("teachers", []):
        teacher.pop("replicas", None)
    return data


def changed_paths(old: Any, new: Any, path: str = "spec") -> list[str]:
    """Field paths (`spec.loss.topK`, `spec.teachers[1].model`) where two YAML values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out.extend(changed_paths(old.get(key), new.get(key), f"{path}.{key}"))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            out.extend(changed_paths(a, b, f"{path}[{index}]"))
        return out
    return [] if old == new else [path]


def refused_changes(applied: DistillationJobSpec, current: DistillationJobSpec) -> list[str]:
    """The non-live fields that differ between the applied and the current spec."""
    return changed_paths(_frozen_view(applied), _frozen_view(current))


def effective_spec(applied: DistillationJobSpec, current: DistillationJobSpec) -> DistillationJobSpec:
    """The applied spec with the live fields of the current one."""
    replicas = {t.name: t.replicas for t in current.teachers}
    teachers = [t.model_copy(update={"replicas": replicas.get(t.name, t.replicas)}) for t in applied.teachers]
    return applied.model_copy(update={"suspend": current.suspend, "teachers": teachers})
