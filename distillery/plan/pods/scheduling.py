"""Where each pod of a job runs and what it carries besides the runtime's own (pure): placement, priority,
pod metadata, the user's env and volumes, and image pull secrets.

One function decides it for every pod kind, so the renderers only translate (`render.pod_shape`):

- **workers**: the student pool's settings.
- **Ray head**: each field of `student.head` that is set (not None) wins; an unset one is the student
  pool's, which is what keeps the head on the workers' tainted GPU nodes unless told otherwise. Volumes
  and mounts go together: a mount names a volume of its own section, so the head takes both from
  `student.head` when it sets either.
- **KubeRay's submitter**: the head's placement, priority, metadata and pull secrets (it must be
  schedulable where the head is), but not the user's env, volumes or mounts: it runs only the Ray CLI,
  which submits the driver to the head, and a claim mounted read-write by the head could not be mounted
  by a second pod on another node.
- **standalone teachers**: their own pool's settings.
- **image pull secrets**: the cluster's (the chart's `imagePullSecrets`, which the operator is given)
  first, then the job's `spec.imagePullSecrets`, each once; every pod kind gets them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from distillery.api.pod import Affinity, EnvVar, PodSettings, TopologySpreadConstraint, Volume, VolumeMount
from distillery.api.spec import (
    DistillationJobSpec,
    Placement,
    StudentHead,
    StudentPool,
    TeacherPool,
    Toleration,
)

T = TypeVar("T")


@dataclass(frozen=True)
class PodScheduling:
    """The settings of one pod kind, resolved: what `render.pod_shape` writes into its template."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Toleration] = ()
    priority_class_name: str | None = None
    affinity: Affinity | None = None
    topology_spread_constraints: Sequence[TopologySpreadConstraint] = ()
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    env: Sequence[EnvVar] = ()
    volumes: Sequence[Volume] = ()
    volume_mounts: Sequence[VolumeMount] = ()
    image_pull_secrets: Sequence[str] = ()


@dataclass(frozen=True)
class JobScheduling:
    """The resolved settings of every pod kind of a job."""

    head: PodScheduling
    worker: PodScheduling
    submitter: PodScheduling
    teachers: dict[str, PodScheduling] = field(default_factory=dict)
    """By teacher name, standalone teachers only."""


def _either(own: T | None, default: T) -> T:
    """The head's own value where it sets one (an empty one included), else the pool's."""
    return default if own is None else own


def _of(
    settings: PodSettings,
    node_selector: Mapping[str, str],
    tolerations: Sequence[Toleration],
    pull_secrets: Sequence[str],
) -> PodScheduling:
    return PodScheduling(
        node_selector=node_selector,
        tolerations=tuple(tolerations),
        priority_class_name=settings.priority_class_name,
        affinity=settings.affinity,
        topology_spread_constraints=tuple(settings.topology_spread_constraints or ()),
        pod_labels=settings.pod_labels or {},
        pod_annotations=settings.pod_annotations or {},
        env=tuple(settings.env or ()),
        volumes=tuple(settings.volumes or ()),
        volume_mounts=tuple(settings.volume_mounts or ()),
        image_pull_secrets=tuple(pull_secrets),
    )


def _head_settings(head: StudentHead, pool: StudentPool) -> PodSettings:
    """The head's pod settings: the pool's, with each field the head sets in its place (volumes and mounts
    as a pair: a mount names a volume of its own section). Every PodSettings field, a new one included."""
    own = {name: value for name in PodSettings.model_fields if (value := getattr(head, name)) is not None}
    if "volumes" in own or "volume_mounts" in own:
        own = {"volumes": [], "volume_mounts": [], **own}
    return pool.model_copy(update=own)


def teacher_scheduling(pool: TeacherPool, pull_secrets: Sequence[str]) -> PodScheduling:
    """A teacher replica's settings: its own pool's (a job's standalone teacher or a DistillationTeacher)."""
    return _of(pool, pool.node_selector, pool.tolerations, pull_secrets)


def image_pull_secrets(cluster: Sequence[str], spec: DistillationJobSpec) -> tuple[str, ...]:
    """The cluster's pull secrets, then the job's, each once (the order they are tried in)."""
    return tuple(dict.fromkeys([*cluster, *spec.image_pull_secrets]))


def pod_scheduling(spec: DistillationJobSpec, cluster_pull_secrets: Sequence[str] = ()) -> JobScheduling:
    """The settings of every pod kind of a job (the module's rules)."""
    secrets = image_pull_secrets(cluster_pull_secrets, spec)
    pool, head = spec.student.pool, spec.student.head
    worker = _of(pool, pool.node_selector, pool.tolerations, secrets)
    head_scheduling = _of(
        _head_settings(head, pool),
        _either(head.node_selector, pool.node_selector),
        _either(head.tolerations, pool.tolerations),
        secrets,
    )
    submitter = replace(head_scheduling, env=(), volumes=(), volume_mounts=())
    teachers = {
        t.name: teacher_scheduling(t.pool, secrets)
        for t in spec.teachers
        if t.placement == Placement.STANDALONE
    }
    return JobScheduling(head=head_scheduling, worker=worker, submitter=submitter, teachers=teachers)
