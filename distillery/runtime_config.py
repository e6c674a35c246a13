"""The resolved runtime config: the spec plus everything the operator decided (teacher endpoints, names).

The operator writes it into the job's ConfigMap; the runtime reads it (`distillery run CONFIG.json` in the
RayJob entrypoint). Locally, `distillery run job.yaml` resolves it itself. One pure function builds it, so
the cluster and the laptop agree on what a spec means.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import Field

from distillery.api import ApiModel, DistillationJob, DistillationJobSpec, Placement, Teacher, TeacherEngine
from distillery.plan import resolve
from distillery.plan.checkpoints.storage import checkpoint_storage
from distillery.plan.teachers.client import LocalAccess, TeacherClient, check_local_access, teacher_client

CONFIG_KEY = "runtime-config.json"
"""The ConfigMap key (and file name in the trainer pods) of the resolved config."""
CONFIG_MOUNT_DIR = "/etc/distillery"
TEACHER_PORT = 8000
"""The port of a standalone teacher's server (OpenAI API and the compact scoring endpoint)."""
RUNTIME_METRICS_PORT = 9100
"""The port of the trainer's Prometheus metrics (the head pod's `runtime-metrics` port)."""


class TeacherProtocol(StrEnum):
    COMPACT = "compact"
    """Distillery's packed-binary scoring endpoint (standalone and shared teachers run our server)."""
    OPENAI = "openai"
    """The OpenAI-compatible /v1/completions path with prompt_logprobs (external teachers)."""
    IN_PROCESS = "in_process"
    """An engine in a Ray actor of the run (colocated teachers, and the standalone teachers a CPU
    `distillery run` scores with the transformers forward: `plan.scoring_engine`)."""


class ResolvedTeacher(ApiModel):
    """How the runtime reaches one teacher."""

    name: str
    placement: Placement
    protocol: TeacherProtocol
    endpoints: list[str] = Field(default_factory=list)
    """Base URLs; a Service's DNS name resolves to all its ready replicas."""
    served_model_name: str
    max_logprobs: int
    max_model_len: int
    client: TeacherClient | None = None
    """How to talk to `endpoints` (TLS, CA bundle, API key's variable); None for a teacher in the run."""


class StatusTarget(ApiModel):
    """The DistillationJob whose status the runtime patches with its progress (none when local)."""

    namespace: str
    name: str


class RuntimeConfig(ApiModel):
    """Everything the runtime needs, in one JSON document."""

    job_name: str
    namespace: str | None = None
    spec: DistillationJobSpec
    teachers: list[ResolvedTeacher]
    status_target: StatusTarget | None = None
    metrics_port: int = RUNTIME_METRICS_PORT
    run_id: str | None = None
    """In a cluster, the job's uid: every checkpoint records it, so a run never deletes, overwrites or
    silently resumes the checkpoints of another run of the same job (one deleted and made again)."""
    checkpoint_claim: str | None = None
    """In a cluster, the PersistentVolumeClaim mounted at spec.checkpoint.path (the user's or the
    operator's; none when ephemeral), named with the final model in status.model."""


def teacher_service_name(job_name: str, teacher_name: str) -> str:
    """Deterministic name (<= 63 chars) of a standalone teacher's Deployment and Service.

    A DNS-1035 label, as Services need: a job name that starts with a digit gets a `d` in front.
    """
    from distillery.names import child_name, dns1035

    return dns1035(child_name(job_name, "teacher", teacher_name))


def teacher_url(job_name: str, teacher_name: str, namespace: str | None) -> str:
    """The base URL of a standalone teacher: its Service's DNS name in `namespace` (the bare Service name
    without one). The runtime config and the operator's status both read it."""
    host = teacher_service_name(job_name, teacher_name)
    if namespace:
        host = f"{host}.{namespace}.svc"
    return f"http://{host}:{TEACHER_PORT}"


def shared_teacher_service_name(teacher_name: str) -> str:
    """The Service (and Deployment) of a DistillationTeacher: its own name where that is a DNS-1035 label,
    so `kubectl get svc` shows the teacher's name; else a cut of it with a hash of the whole (two teachers
    never share one)."""
    from distillery.names import child_name, dns1035

    return dns1035(child_name(teacher_name))


def shared_teacher_url(teacher_name: str, namespace: str | None) -> str:
    """The base URL of a DistillationTeacher for the jobs that reference it (`placement: shared`): its
    Service in `namespace`, the jobs' own (a job references teachers of its namespace only)."""
    host = shared_teacher_service_name(teacher_name)
    if namespace:
        host = f"{host}.{namespace}.svc"
    return f"http://{host}:{TEACHER_PORT}"


def teacher_endpoints(job: DistillationJob, teacher: Teacher, namespace: str | None) -> list[str]:
    """Where a job reaches one of its teachers: a standalone teacher at its Service, a shared one at its
    DistillationTeacher's, an external one at its URL; a colocated one runs in the trainer (none)."""
    if teacher.placement == Placement.STANDALONE:
        return [teacher_url(job.metadata.name, teacher.name, namespace)]
    if teacher.placement == Placement.SHARED and teacher.teacher_ref is not None:
        return [shared_teacher_url(teacher.teacher_ref.name, namespace)]
    if teacher.placement == Placement.EXTERNAL:
        return [teacher.endpoint or ""]
    return []


class UnservedSharedTeacher(ValueError):
    """A local run of a job whose shared teacher has no local server: one line per such teacher, naming its
    field."""


def local_shared_endpoints(job: DistillationJob, served: Mapping[str, str]) -> dict[str, list[str]]:
    """Where a local run reaches its shared teachers (keyed by the job's teacher name): at the URL that
    `served` (`--shared-teacher NAME=URL`) gives for its DistillationTeacher. Raises UnservedSharedTeacher
    naming every shared teacher that has none: with no cluster there is no Service to fall back on."""
    endpoints: dict[str, list[str]] = {}
    missing: list[str] = []
    for index, teacher in enumerate(job.spec.teachers):
        if teacher.placement != Placement.SHARED or teacher.teacher_ref is None:
            continue
        ref = teacher.teacher_ref.name
        if ref in served:
            endpoints[teacher.name] = [served[ref].rstrip("/")]
        else:
            missing.append(
                f"spec.teachers[{index}].teacherRef: DistillationTeacher {ref} has no local server; start one "
                f"with distillery serve-teacher and pass --shared-teacher {ref}=URL"
            )
    if missing:
        raise UnservedSharedTeacher("\n".join(missing))
    return endpoints


def resolve_runtime_config(
    job: DistillationJob,
    namespace: str | None,
    *,
    in_cluster: bool,
    shared_teachers: Mapping[str, str] | None = None,
    local_gpus: int = 0,
    teacher_access: Mapping[str, LocalAccess] | None = None,
) -> RuntimeConfig:
    """The runtime config of a job: standalone and shared teachers at their Service (Distillery's teacher
    server, its compact protocol), external at their URL. Out of a cluster a shared teacher is at the URL
    that `shared_teachers` (DistillationTeacher name -> URL) gives; UnservedSharedTeacher if none. A teacher
    computed in the run's processes (`plan.scoring_engine`; out of a cluster it depends on `local_gpus`, the
    CUDA GPUs the machine shows) is reached in process. Out of a cluster an external teacher's API key and CA
    bundle are where `teacher_access` (teacher name -> LocalAccess) says; LocalAccessError if the spec
    asks for one that it does not give (`plan.teacher_client`)."""
    spec = job.spec
    if not in_cluster:
        check_local_access(spec.teachers, teacher_access or {})
    engines = resolve(spec, local_gpus=None if in_cluster else local_gpus).engines
    local_shared = {} if in_cluster else local_shared_endpoints(job, shared_teachers or {})
    teachers: list[ResolvedTeacher] = []
    for index, teacher in enumerate(spec.teachers):
        endpoints = local_shared.get(teacher.name) or teacher_endpoints(job, teacher, namespace)
        if (
            teacher.placement in (Placement.COLOCATED, Placement.STUDENT)
            or engines[teacher.name].engine == TeacherEngine.TRANSFORMERS
        ):
            protocol, endpoints = TeacherProtocol.IN_PROCESS, []
        elif teacher.placement in (Placement.STANDALONE, Placement.SHARED):
            protocol = TeacherProtocol.COMPACT
        else:
            protocol = TeacherProtocol.OPENAI
        teachers.append(
            ResolvedTeacher(
                name=teacher.name,
                placement=teacher.placement,
                protocol=protocol,
                endpoints=endpoints,
                served_model_name=engines[teacher.name].served_model_name,
                max_logprobs=engines[teacher.name].max_logprobs,
                max_model_len=engines[teacher.name].max_model_len,
                client=teacher_client(
                    teacher,
                    index,
                    endpoints,
                    in_cluster=in_cluster,
                    local=(teacher_access or {}).get(teacher.name),
                    job_name=job.metadata.name,
                ),
            )
        )
    status_target = (
        StatusTarget(namespace=namespace, name=job.metadata.name) if in_cluster and namespace else None
    )
    return RuntimeConfig(
        job_name=job.metadata.name,
        namespace=namespace,
        spec=spec,
        teachers=teachers,
        status_target=status_target,
        run_id=job.metadata.uid if in_cluster else None,
        checkpoint_claim=checkpoint_storage(job.metadata.name, spec).claim if in_cluster else None,
    )
