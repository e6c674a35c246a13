"""The CPU, memory and `/dev/shm` of every pod a job runs (pure): teachers, the Ray head, Ray workers and
KubeRay's submitter.

Every container gets CPU and memory requests and limits. A GPU request does not count toward a pod's QoS
class, so a GPU pod without them is BestEffort (evicted first under node pressure), and a namespace
ResourceQuota on `requests.cpu`/`requests.memory`/`limits.*` refuses it outright. The user's
`pool.resources` wins key by key; what it leaves unset comes from the defaults below:

- **request**: the user's request, else the user's limit (Kubernetes' own rule for a limit without a
  request), else the default;
- **limit**: the user's limit, else the user's request (never a limit below a request), else the default.

Defaults, by pod:

- **GPU teacher replica** (vLLM): CPU_PER_GPU cores a GPU (tokenisation, the API server, NCCL's proxy
  threads), and memory `MEMORY_PER_GPU_GIB x gpus + 1.25 x the bfloat16 weights`: vLLM reads the
  safetensors through the page cache, which the container's memory cgroup counts, and the rest is
  CUDA/NCCL host buffers. The parameter count comes from the model's shape (`model_shapes.resolve_shape`,
  as the memory plan knows it); an unknown model gets UNKNOWN_MODEL_GIB a GPU instead of the weights term.
  Requests equal limits: a replica holds whole GPUs, and the Guaranteed QoS class keeps it from being the
  first evicted.
- **GPU student worker**: the same CPU, and memory from the host-memory plan (`pods/host_memory.py`: the
  runtime, the load, the offloaded state, the engines asleep at sleep level 1 and a checkpoint's gathers,
  by phase) with its headroom; for a student of unknown shape, as a teacher of unknown size.
- **CPU-only pools** (`gpus... = 0`: tests and tiny jobs): small requests (CPU_ONLY_CPU_REQUEST, memory
  CPU_ONLY_MEMORY_REQUEST) so that a small node schedules the whole job, and limits that let the process
  use what it needs (CPU_ONLY_CPU_LIMIT; memory CPU_ONLY_MEMORY_GIB plus the same weights term). Burstable.
- **Ray head** (`student.head.resources` wins key by key, as a pool's does): it runs the driver (`distillery run`: data, grading, teacher requests), GCS and the
  dashboard, no GPU work: HEAD_CPU and HEAD_MEMORY_GIB, requests equal to limits. In a CPU-only job the
  runtime's actors reserve no Ray CPUs (`distillery_runtime.run.placement`), so Ray may place them
  on the head: its memory is then the CPU-only worker's.
- **Submitter** (KubeRay's `ray job submit` + `ray job logs --follow`): KubeRay's own default limits
  (1 CPU, 1Gi) and a smaller request, since it only waits.

Where a pod's model cache is an emptyDir (`pods/model_cache.py`), its size is also an `ephemeral-storage`
request (unless the pool's resources set one).

`/dev/shm` of the teachers and Ray pods (a memory-backed emptyDir, whose use counts toward the memory limit) gets a
`sizeLimit` of the pool's `sharedMemory`, else SHM_FRACTION of the memory limit: Ray's object store takes 30% of memory by default and
vLLM/NCCL keep their buffers there; a larger one could let shared memory alone reach the limit and get
the pod OOM-killed, with no sign of why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from distillery.api.spec import DistillationJobSpec, Placement, Resources, TeacherPool
from distillery.model_shapes import resolve_shape
from distillery.plan.pods.host_memory import HEADROOM, plan_host_memory
from distillery.plan.pods.model_cache import TRAINER, CacheVolume, model_cache
from distillery.plan.pods.quantity import canonical_memory, memory_bytes

GIB = 1024**3
CPU_PER_GPU = 4
MEMORY_PER_GPU_GIB = 16
UNKNOWN_MODEL_GIB = 32
"""Memory a GPU when the model's size is unknown (in place of the weights term)."""
WEIGHTS_HEADROOM = 1.25
CPU_ONLY_CPU_REQUEST = "100m"
CPU_ONLY_CPU_LIMIT = "4"
CPU_ONLY_MEMORY_REQUEST = "1Gi"
CPU_ONLY_MEMORY_GIB = 6
HEAD_CPU = "2"
HEAD_MEMORY_GIB = 8
SUBMITTER_REQUESTS = {"cpu": "100m", "memory": "200Mi"}
SUBMITTER_LIMITS = {"cpu": "1", "memory": "1Gi"}
SHM_FRACTION = 0.5
HEAD_OWNER = "student.head.resources"


@dataclass(frozen=True)
class ContainerResources:
    """One container's `resources` and its pod's `/dev/shm` size."""

    requests: dict[str, str]
    limits: dict[str, str]
    shm_size: str | None
    """The `sizeLimit` of the pod's memory-backed `/dev/shm`; None: the pod has none (the submitter)."""
    reason: str
    """Where the CPU and memory came from (`distillery plan` prints it)."""

    def to_yaml_dict(self) -> dict[str, dict[str, str]]:
        return {"requests": dict(self.requests), "limits": dict(self.limits)}


@dataclass(frozen=True)
class PodResources:
    """The resources of each pod kind of a job."""

    head: ContainerResources
    worker: ContainerResources
    submitter: ContainerResources
    teachers: dict[str, ContainerResources] = field(default_factory=dict)
    """By teacher name, standalone teachers only (the others run no pods of their own)."""

    def lines(self) -> list[str]:
        """Each pod kind's requests and limits and why, one line each, for `distillery plan`."""
        pods = {"ray head": self.head, "ray worker": self.worker, "submitter": self.submitter}
        pods.update({f"teacher {name}": resources for name, resources in self.teachers.items()})
        return [
            f"pod resources: {kind}: requests {_listed(r.requests)}, limits {_listed(r.limits)}"
            + (f", /dev/shm {r.shm_size}" if r.shm_size else "")
            + f" ({r.reason})"
            for kind, r in pods.items()
        ]


def _listed(values: Mapping[str, str]) -> str:
    return " ".join(f"{key}={value}" for key, value in values.items())


def _gib(n: float) -> str:
    return f"{math.ceil(n)}Gi"


def _weights_gib(model: str, bytes_per_parameter: int) -> float | None:
    shape = resolve_shape(model)
    return None if shape is None else WEIGHTS_HEADROOM * shape.params * bytes_per_parameter / GIB


def _shm(limits: Mapping[str, str]) -> str:
    mib = max(1, math.floor(memory_bytes(limits["memory"]) * SHM_FRACTION / 2**20))
    return canonical_memory(mib * 2**20)


def _container(
    defaults_requests: Mapping[str, str],
    defaults_limits: Mapping[str, str],
    user: Resources | None,
    gpus: int,
    gpu_resource: str,
    reason: str,
    *,
    shared_memory: bool = True,
    owner: str = "the pool's resources",
) -> ContainerResources:
    """The user's resources over the defaults (the module's rules), plus the GPUs, which only the pool's
    GPU count sets."""
    user_requests = {k: str(v) for k, v in (user.requests if user else {}).items()}
    user_limits = {k: str(v) for k, v in (user.limits if user else {}).items()}
    requests = dict(user_requests)
    limits = dict(user_limits)
    for key in ("cpu", "memory"):
        requests.setdefault(key, user_limits.get(key, defaults_requests[key]))
        limits.setdefault(key, user_requests.get(key, defaults_limits[key]))
    if gpus > 0:
        requests[gpu_resource] = limits[gpu_resource] = str(gpus)
    if user_requests or user_limits:
        reason = f"{reason}; {owner} override it key by key"
    return ContainerResources(requests, limits, _shm(limits) if shared_memory else None, reason)


def _gpu_pod(gpus: int, weights_gib: float | None) -> tuple[dict[str, str], str]:
    extra = UNKNOWN_MODEL_GIB * gpus if weights_gib is None else weights_gib
    values = {"cpu": str(CPU_PER_GPU * gpus), "memory": _gib(MEMORY_PER_GPU_GIB * gpus + extra)}
    why = "unknown model size" if weights_gib is None else f"{weights_gib:.1f} GiB of weights"
    return values, f"{CPU_PER_GPU} CPUs and {MEMORY_PER_GPU_GIB} GiB a GPU, {why}"


def _cpu_only_pod(weights_gib: float | None) -> tuple[dict[str, str], dict[str, str], str]:
    memory = _gib(CPU_ONLY_MEMORY_GIB + (weights_gib or 0.0))
    requests = {"cpu": CPU_ONLY_CPU_REQUEST, "memory": CPU_ONLY_MEMORY_REQUEST}
    return requests, {"cpu": CPU_ONLY_CPU_LIMIT, "memory": memory}, "CPU-only pool: small requests"


def pod_resources(spec: DistillationJobSpec) -> PodResources:
    """The resources of every pod kind of a job (the module's rules)."""
    pool = spec.student.pool
    head_resources = spec.student.head.resources
    student_weights = _weights_gib(spec.student.model, 4)
    if pool.gpus_per_worker > 0:
        values, why = _gpu_pod(pool.gpus_per_worker, student_weights)
        host = plan_host_memory(spec)
        if host is not None:
            values["memory"] = f"{host.default_memory_gib}Gi"
            why = (
                f"{CPU_PER_GPU} CPUs a GPU; memory: the host-memory plan's {host.peak_phase} peak "
                f"{host.peak_bytes / GIB:.1f} GiB x {HEADROOM}"
            )
        worker = _container(values, values, pool.resources, pool.gpus_per_worker, pool.gpu_resource, why)
        head_values = {"cpu": HEAD_CPU, "memory": _gib(HEAD_MEMORY_GIB)}
        head = _container(
            head_values,
            head_values,
            head_resources,
            0,
            pool.gpu_resource,
            "the head's fixed default",
            owner=HEAD_OWNER,
        )
    else:
        requests, limits, why = _cpu_only_pod(student_weights)
        worker = _container(requests, limits, pool.resources, 0, pool.gpu_resource, why)
        # Ray may place the zero-CPU actors of a CPU-only job on the head: it gets the workers' memory.
        head = _container(
            requests,
            limits,
            head_resources,
            0,
            pool.gpu_resource,
            f"{why}; the head may host the actors",
            owner=HEAD_OWNER,
        )
    submitter = _container(
        SUBMITTER_REQUESTS,
        SUBMITTER_LIMITS,
        None,
        0,
        pool.gpu_resource,
        "KubeRay's submitter limits",
        shared_memory=False,
    )
    if pool.shared_memory is not None:
        worker = replace(worker, shm_size=pool.shared_memory)
    caches = model_cache(spec)
    head, worker = _with_cache(head, caches.get(TRAINER)), _with_cache(worker, caches.get(TRAINER))
    teachers = {
        t.name: teacher_resources(t.pool, t.model, caches.get(t.name))
        for t in spec.teachers
        if t.placement == Placement.STANDALONE
    }
    return PodResources(head=head, worker=worker, submitter=submitter, teachers=teachers)


def teacher_resources(pool: TeacherPool, model: str, cache: CacheVolume | None) -> ContainerResources:
    """One vLLM replica of a teacher's pool: a job's standalone teacher's or a DistillationTeacher's."""
    weights = _weights_gib(model, 2)
    if pool.gpus_per_replica > 0:
        values, why = _gpu_pod(pool.gpus_per_replica, weights)
        resources = _container(values, values, pool.resources, pool.gpus_per_replica, pool.gpu_resource, why)
    else:
        requests, limits, why = _cpu_only_pod(weights)
        resources = _container(requests, limits, pool.resources, 0, pool.gpu_resource, why)
    if pool.shared_memory is not None:
        resources = replace(resources, shm_size=pool.shared_memory)
    return _with_cache(resources, cache)


def _with_cache(resources: ContainerResources, cache: CacheVolume | None) -> ContainerResources:
    """An `ephemeral-storage` request of the cache's size where the pod's cache is an emptyDir: the
    scheduler places it where the disk is, and the kubelet does not evict it for using it."""
    if cache is None or cache.size_limit is None or "ephemeral-storage" in resources.requests:
        return resources
    requests = {**resources.requests, "ephemeral-storage": cache.size_limit}
    return replace(resources, requests=requests)
