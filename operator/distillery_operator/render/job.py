"""Every child of a job in creation order, and `distillery render`'s YAML stream of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from distillery.api import DistillationJob, Placement, Teacher
from distillery.validation import load_manifests
from distillery_operator.render.claim import render_checkpoint_claim
from distillery_operator.render.common import RenderContext
from distillery_operator.render.config_map import render_config_map
from distillery_operator.render.disruption_budget import render_teacher_disruption_budget
from distillery_operator.render.identity import render_trainer_identity
from distillery_operator.render.network_policy import render_network_policies
from distillery_operator.render.rayjob import render_rayjob
from distillery_operator.render.shared_teacher import (
    render_shared_teacher,
    render_shared_teacher_clients,
    render_shared_teacher_policy,
)
from distillery_operator.render.teacher import render_teacher_deployment, render_teacher_service
from distillery_operator.render.teacher_key import render_teacher_key_secret


def standalone_teachers(job: DistillationJob) -> list[Teacher]:
    return [t for t in job.spec.teachers if t.placement == Placement.STANDALONE]


def render_job(job: DistillationJob, ctx: RenderContext) -> list[dict[str, Any]]:
    """Every child of a job, in creation order (config first: the trainer and teachers read it; the network
    policies before any pod they select exists; the checkpoint claim before the trainer, whose pods mount it)."""
    objects = [render_config_map(job, ctx)]
    objects.extend(render_network_policies(job, ctx))
    key = render_teacher_key_secret(job, ctx)
    if key is not None:
        # Before the teachers and the trainer, whose pods take it by secretKeyRef.
        objects.append(key)
    for teacher in standalone_teachers(job):
        objects.append(render_teacher_service(job, teacher, ctx))
        objects.append(render_teacher_deployment(job, teacher, ctx))
        objects.append(render_teacher_disruption_budget(job, teacher, ctx))
    claim = render_checkpoint_claim(job, ctx)
    if claim is not None:
        objects.append(claim)
    objects.append(render_rayjob(job, ctx))
    return objects


def render_manifest_stream(path: str | Path, namespace: str = "default") -> str:
    """`distillery render`: the objects of every DistillationTeacher (at minReplicas) and job in a file as one
    YAML stream (InvalidManifest if bad)."""
    chunks: list[str] = []
    jobs, teachers = load_manifests(path)
    sources: list[tuple[str, list[dict[str, Any]]]] = []
    for teacher in teachers:
        # At its floor: what the operator makes before any job uses it.
        replicas = teacher.spec.scaling.min_replicas
        objects = render_shared_teacher(teacher, namespace=namespace, replicas=replicas)
        policy = render_shared_teacher_policy(teacher, namespace=namespace)
        # Its clients Secret as it is before any job uses it (no job's key digest yet).
        clients = render_shared_teacher_clients(teacher, namespace=namespace, clients={})
        # The policy and the Secret first, as the operator makes them: before any replica they concern.
        sources.append((teacher.metadata.name, [*([policy] if policy else []), clients, *objects]))
    for job in jobs:
        ctx = RenderContext(namespace=namespace)
        sources.append((job.metadata.name, [*render_trainer_identity(job, ctx), *render_job(job, ctx)]))
    for name, objects in sources:
        for obj in objects:
            header = f"# Source: {name} -> {obj['kind']}/{obj['metadata']['name']}\n"
            chunks.append("---\n" + header + yaml.safe_dump(obj, sort_keys=False, width=120))
    return "".join(chunks)


def pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Every pod template among rendered objects, named `Kind/name:part` (a teacher Deployment's template;
    a RayJob's head, each worker group and the submitter): what a cluster will make pods of."""
    out: list[tuple[str, dict[str, Any]]] = []
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "Deployment":
            out.append((f"{where}:pod", obj["spec"]["template"]))
        elif obj["kind"] == "RayJob":
            cluster = obj["spec"]["rayClusterSpec"]
            out.append((f"{where}:head", cluster["headGroupSpec"]["template"]))
            for group in cluster["workerGroupSpecs"]:
                out.append((f"{where}:worker-{group['groupName']}", group["template"]))
            out.append((f"{where}:submitter", obj["spec"]["submitterPodTemplate"]))
    return out
