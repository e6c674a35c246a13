"""An author's labels reach the pods, the reserved ones (`distillery.api.labels`) never do: a job or a
DistillationTeacher labelled `distillery.io/uses-teacher-<victim>`, `ray.io/*` or
`app.kubernetes.io/created-by` in its metadata (which the spec models cannot refuse) gets no pod of it
into another's NetworkPolicy or RayCluster, and only the head carries the shared teacher's access label
the operator gives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distillery_operator import naming
from distillery_operator.render import (
    ClusterSettings,
    RenderContext,
    pod_templates,
    render_job,
    render_shared_teacher,
    render_shared_teacher_policy,
)

from distillery.api import DistillationJob, DistillationTeacher
from distillery.plan.access.network import DEFAULT_NETWORK_POLICY
from distillery.validation import load_jobs, load_manifests

ROOT = Path(__file__).resolve().parents[2]
ON = RenderContext(namespace="ns", cluster=ClusterSettings(network_policy=DEFAULT_NETWORK_POLICY))
VICTIM = "victim"
SPOOFED = {
    naming.teacher_client_label(VICTIM): "true",
    naming.RAY_NODE_LABEL: "head",
    "ray.io/cluster": "someone-elses",
    "ray.io/node-type": "head",
    "app.kubernetes.io/created-by": "kuberay-operator",
    "app.kubernetes.io/managed-by": "spoofed",
}
AUTHORS = {"team": "ml", "example.com/cost-center": "c42"}


def _labelled(job: DistillationJob, labels: dict[str, str]) -> DistillationJob:
    """The job with these metadata.labels (no part of the spec: the models do not judge them)."""
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"labels": labels})})


def _roles(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for where, template in pod_templates(objects):
        part = where.rsplit(":", 1)[1]
        role = "worker" if part.startswith("worker") else "teacher" if part == "pod" else part
        out.setdefault(role, []).append(template["metadata"]["labels"])
    return out


def _shared_job() -> DistillationJob:
    (job,) = load_jobs(ROOT / "examples" / "shared-teacher.yaml")
    return job


def test_reserved_labels_of_the_author_reach_no_pod_and_the_authors_others_reach_every_pod() -> None:
    job = _labelled(_shared_job(), {**SPOOFED, **AUTHORS})
    roles = _roles(render_job(job, ON))
    assert set(roles) >= {"head", "worker", "submitter"}
    for role, pods in roles.items():
        for pod in pods:
            assert AUTHORS.items() <= pod.items(), role
            for key, value in SPOOFED.items():
                # The operator's own may be there (the head's ray-node label): never the author's value.
                assert pod.get(key) != value or (key == naming.RAY_NODE_LABEL and role == "head"), (role, key)
            assert naming.teacher_client_label(VICTIM) not in pod, role
    for obj in render_job(job, ON):
        assert not any(obj["metadata"]["labels"].get(k) == v for k, v in SPOOFED.items()), obj["kind"]


def test_only_the_head_carries_the_shared_teachers_access_label_even_when_the_author_sets_it() -> None:
    job = _shared_job()
    refs = {t.teacher_ref.name for t in job.spec.teachers if t.teacher_ref is not None}
    assert refs
    spoofing = _labelled(job, {naming.teacher_client_label(r): "true" for r in refs})
    _, (teacher,) = load_manifests(ROOT / "examples" / "teachers" / "qwen-7b.yaml")
    assert isinstance(teacher, DistillationTeacher)
    policy = render_shared_teacher_policy(teacher, namespace="ns", cluster=ON.cluster)
    assert policy is not None
    selector = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    for current in (job, spoofing):
        roles = _roles(render_job(current, ON))
        (head,) = roles["head"]
        assert selector.items() <= head.items()
        for role in ("worker", "submitter", "teacher"):
            for pod in roles.get(role, []):
                assert not any(k.startswith(naming.TEACHER_CLIENT_PREFIX) for k in pod), (role, pod)
                assert not selector.items() <= pod.items(), role


def test_a_distillation_teachers_reserved_metadata_labels_reach_no_replica() -> None:
    _, (teacher,) = load_manifests(ROOT / "examples" / "teachers" / "qwen-7b.yaml")
    assert isinstance(teacher, DistillationTeacher)
    labelled = teacher.model_copy(
        update={"metadata": teacher.metadata.model_copy(update={"labels": {**SPOOFED, **AUTHORS}})}
    )
    deployment, service = render_shared_teacher(labelled, namespace="ns", replicas=1)
    for labels in (deployment["metadata"]["labels"], deployment["spec"]["template"]["metadata"]["labels"]):
        assert AUTHORS.items() <= labels.items()
        assert not any(labels.get(key) == value for key, value in SPOOFED.items()), labels
    assert not any(service["metadata"]["labels"].get(key) == value for key, value in SPOOFED.items())
