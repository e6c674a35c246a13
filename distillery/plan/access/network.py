"""Who may open a connection to a job's pods and to a shared teacher's (pure): the flows table.

A job's pods serve things that must not be open to every pod of the cluster: the Ray head's dashboard and
Jobs API (8265) run code on the student's GPUs, the GCS (6379) and the client port (10001) drive the Ray
cluster, and a teacher's server scores and generates for whoever asks. Each of them is needed by a few
known callers only. This module names those callers, one `Flow` each (from, to, ports, why); the operator's
renderer (`render/network_policy.py`) turns the flows into NetworkPolicies, one per `Pods` group, and
docs/security.md shows the same table (a test checks it against `job_flows` and `shared_teacher_flows`).

What it decides, and why:
- Ingress only. Every pod group of a job (and of a shared teacher) is isolated for ingress, even one that
  nothing may call (KubeRay's submitter). Egress stays open: pods download models and data (the Hub, S3,
  a proxy), call external teachers, resolve names; those are hostnames behind changing addresses, which a
  NetworkPolicy (IP blocks only) cannot name, and what must be closed is the way in.
- Among the job's own Ray pods (head and workers), every TCP port. Ray's GCS, raylets, object managers,
  dashboard agents and each worker process listen on ports Ray picks at start (only the head's are fixed
  by the RayJob); listing them would be a guess that breaks with the next Ray.
- Everything else on named ports only, from named callers: KubeRay's submitter and operator to the
  dashboard, the driver (on the head) to its teachers, Distillery's operator to a shared teacher's
  /metrics, Prometheus to the metrics ports.
- A shared teacher serves the jobs that reference it: the operator labels their head pods as its clients
  (`render/network_policy.py` names the label), and the teacher's policy lets in pods with that label.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from distillery.api.spec import DistillationJobSpec, Placement
from distillery.runtime_config import RUNTIME_METRICS_PORT, TEACHER_PORT

DASHBOARD_PORT = 8265
"""Ray's dashboard and Jobs API on the head: KubeRay's operator follows the RayJob there, its submitter
submits the driver there."""
RAY_METRICS_PORT = 8080
"""Ray's own Prometheus exporter (`--metrics-export-port`), on the head and the workers."""


class Pods(StrEnum):
    """A group of pods that one NetworkPolicy selects."""

    RAY = "ray"
    """The job's Ray head and workers."""
    RAY_HEAD = "ray-head"
    """The job's Ray head (it runs the driver, `distillery run`)."""
    SUBMITTER = "submitter"
    """KubeRay's submitter pod of the job (`ray job submit`)."""
    TEACHERS = "teachers"
    """The job's standalone teachers' replicas."""
    SHARED_TEACHER = "shared-teacher"
    """The replicas of a DistillationTeacher."""
    TEACHER_CLIENTS = "teacher-clients"
    """The pods of the namespace labelled as clients of a DistillationTeacher: the heads of the jobs that
    reference it."""


class Outside(StrEnum):
    """The callers from outside the job, each found in the settings."""

    KUBERAY = "kuberay"
    OPERATOR = "operator"
    MONITORING = "monitoring"


@dataclass(frozen=True)
class Peer:
    """Pods outside the job: those of `namespace` with `pod_labels` (none: every pod of it)."""

    namespace: str
    pod_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NetworkPolicySettings:
    """Where the callers from outside a job run (the chart's `networkPolicy` values)."""

    kuberay: Peer
    """KubeRay's operator: it reads the job's state from the head's dashboard."""
    operator: Peer
    """Distillery's operator: it reads each shared teacher replica's /metrics to scale it."""
    monitoring: Peer
    """Prometheus: it scrapes the metrics ports."""

    def peer(self, who: Outside) -> Peer:
        return {
            Outside.KUBERAY: self.kuberay,
            Outside.OPERATOR: self.operator,
            Outside.MONITORING: self.monitoring,
        }[who]


DEFAULT_NETWORK_POLICY = NetworkPolicySettings(
    kuberay=Peer("kuberay-system"),
    operator=Peer(
        "distillery-system",
        {"app.kubernetes.io/name": "distillery", "app.kubernetes.io/component": "operator"},
    ),
    monitoring=Peer("monitoring"),
)
"""The chart's defaults (the operator installed as the README says, `-n distillery-system`): what the
operator uses where the chart has not said (`distillery render`, tests)."""


@dataclass(frozen=True)
class Port:
    """A TCP port and what listens there."""

    number: int
    name: str


DASHBOARD = Port(DASHBOARD_PORT, "Ray dashboard and Jobs API")
RAY_METRICS = Port(RAY_METRICS_PORT, "Ray metrics")
RUNTIME_METRICS = Port(RUNTIME_METRICS_PORT, "runtime metrics")
TEACHER = Port(TEACHER_PORT, "teacher server: scoring, generation, /metrics")


@dataclass(frozen=True)
class Flow:
    """A connection the policies allow: `source` may open one to `target` on `ports` (empty: any TCP port)."""

    source: Pods | Outside
    target: Pods
    ports: tuple[Port, ...]
    why: str


def job_pods(spec: DistillationJobSpec) -> tuple[Pods, ...]:
    """The pod groups of a job, each isolated by a policy of its own (even where no flow reaches it)."""
    standalone = any(t.placement == Placement.STANDALONE for t in spec.teachers)
    return (Pods.RAY, Pods.RAY_HEAD, Pods.SUBMITTER, *((Pods.TEACHERS,) if standalone else ()))


def shared_teachers_used(spec: DistillationJobSpec) -> tuple[str, ...]:
    """The DistillationTeachers whose client the job's head is (sorted, each once)."""
    return tuple(sorted({t.teacher_ref.name for t in spec.teachers if t.teacher_ref is not None}))


def job_flows(spec: DistillationJobSpec) -> tuple[Flow, ...]:
    """Every connection into a job's pods that its policies allow."""
    flows = [
        Flow(
            Pods.RAY,
            Pods.RAY,
            (),
            "Ray's own traffic: GCS (6379), client (10001), raylets, object managers, dashboard agents and "
            "worker processes, on ports Ray picks at start; the trainer's weight sync to its rollout engines",
        ),
        Flow(
            Pods.SUBMITTER,
            Pods.RAY_HEAD,
            (DASHBOARD,),
            "KubeRay's submitter submits the driver and follows it",
        ),
        Flow(Outside.KUBERAY, Pods.RAY_HEAD, (DASHBOARD,), "KubeRay's operator reads the Ray job's state"),
        Flow(
            Outside.MONITORING, Pods.RAY_HEAD, (RUNTIME_METRICS,), "Prometheus scrapes the trainer's metrics"
        ),
        Flow(Outside.MONITORING, Pods.RAY, (RAY_METRICS,), "Prometheus scrapes Ray's metrics"),
    ]
    if Pods.TEACHERS in job_pods(spec):
        flows += [
            Flow(Pods.RAY_HEAD, Pods.TEACHERS, (TEACHER,), "the driver scores and generates on its teachers"),
            Flow(Outside.MONITORING, Pods.TEACHERS, (TEACHER,), "Prometheus scrapes the teachers' /metrics"),
        ]
    return tuple(flows)


def shared_teacher_flows() -> tuple[Flow, ...]:
    """Every connection into a DistillationTeacher's replicas that its policy allows."""
    return (
        Flow(
            Pods.TEACHER_CLIENTS,
            Pods.SHARED_TEACHER,
            (TEACHER,),
            "the drivers of the jobs that reference it score and generate on it",
        ),
        Flow(
            Outside.OPERATOR,
            Pods.SHARED_TEACHER,
            (TEACHER,),
            "Distillery's operator reads each replica's /metrics (its queue) to scale it",
        ),
        Flow(
            Outside.MONITORING, Pods.SHARED_TEACHER, (TEACHER,), "Prometheus scrapes the replicas' /metrics"
        ),
    )
