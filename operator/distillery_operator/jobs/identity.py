"""The trainer's identity: the writes that keep a job's ServiceAccount, Role and RoleBinding as rendered.

Pure, like `decide` (which plans the other children); the controller runs these writes first, so the
ServiceAccount exists before KubeRay makes the pods that run as it. The objects depend on the job's
applied spec (the ConfigMap's record) where there is one: `serviceAccountName` is not a live field, so
the RayJob keeps the account it was made with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from distillery.api import DistillationJob
from distillery_operator import naming
from distillery_operator.jobs.decide import Action, job_metadata, parse_applied, parse_current
from distillery_operator.observe.summaries import IDENTITY_KINDS, Child
from distillery_operator.render import RenderContext, render_trainer_identity

PATCHED_FIELDS = {"ServiceAccount": (), "Role": ("rules",), "RoleBinding": ("subjects",)}
"""What a drift patch puts back besides labels and annotations (a RoleBinding's roleRef is immutable and
always the job's own Role)."""


def identity_actions(body: Mapping[str, Any], children: Iterable[Child], *, terminal: bool) -> list[Action]:
    """Creates what is missing (not for a finished job) and patches what someone edited; children of
    another job with the same name (waiting for the garbage collector) are left alone."""
    meta = job_metadata(body)
    children = list(children)
    seen = {(c.kind, c.name): c for c in children if c.kind in IDENTITY_KINDS}
    config = next((c for c in children if c.kind == "ConfigMap" and c.owner_uid == meta.uid), None)
    spec = parse_applied(config) or parse_current(body)[0]
    if spec is None:
        return []
    job = DistillationJob(metadata=meta, spec=spec)
    ctx = RenderContext(namespace=meta.namespace or "", owner_uid=meta.uid)
    actions: list[Action] = []
    for obj in render_trainer_identity(job, ctx):
        kind, name = obj["kind"], obj["metadata"]["name"]
        child = seen.get((kind, name))
        if child is None:
            if not terminal:
                actions.append(Action("create", kind, name, obj, "missing"))
        elif child.owner_uid == meta.uid and (
            child.spec_hash != obj["metadata"]["annotations"][naming.SPEC_HASH_ANNOTATION]
            or any(child.state.get(k) != obj[k] for k in PATCHED_FIELDS[kind])
        ):
            patch = {k: obj[k] for k in PATCHED_FIELDS[kind]}
            patch["metadata"] = {k: obj["metadata"][k] for k in ("labels", "annotations")}
            actions.append(Action("patch", kind, name, patch, "drift"))
    return actions
