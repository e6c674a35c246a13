"""Pod shape: every pod the operator renders (teachers, Ray head, workers, KubeRay's submitter) has CPU and
memory requests and limits, a Pod Security `restricted` security context and its pool's placement, and
the defaults follow `distillery.plan.pods.resources`. (That a real API server admits them under
`restricted` and a quota: tests/cluster/test_pod_admission_on_server.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from distillery_operator.observe.drift import differences
from distillery_operator.render import (
    HEAD_START_PARAMS,
    RUNTIME_UID,
    RenderContext,
    pod_templates,
    render_job,
    shape_pod,
)

from distillery.api import DistillationJob
from distillery.plan.pods.quantity import canonical_memory, memory_bytes
from distillery.plan.pods.resources import ContainerResources, pod_resources
from distillery.plan.pods.scheduling import PodScheduling
from distillery.validation import load_jobs, parse_job

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "tests" / "golden" / "variants.yaml"]
JOBS = [job for source in SOURCES for job in load_jobs(source)]
CTX = RenderContext(namespace="team-a")


def templates(job: DistillationJob) -> list[tuple[str, dict[str, Any]]]:
    return pod_templates(render_job(job, CTX))


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.metadata.name)
def test_every_pod_has_resources_and_a_restricted_security_context(job: DistillationJob) -> None:
    found = templates(job)
    kinds = {where.rsplit(":", 1)[1] for where, _ in found}
    assert {"head", "worker-student", "submitter"} <= kinds
    for where, template in found:
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == RUNTIME_UID
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"] == {"drop": ["ALL"]}, where
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][part]), (where, part)
            # Never a limit below its request (the API server refuses that pod).
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            assert memory_bytes(limits["memory"]) >= memory_bytes(requests["memory"]), where
        for volume in pod.get("volumes", []):
            if volume.get("emptyDir", {}).get("medium") == "Memory":
                limit = memory_bytes(pod["containers"][0]["resources"]["limits"]["memory"])
                assert 0 < memory_bytes(volume["emptyDir"]["sizeLimit"]) <= limit, where


def test_the_head_advertises_no_cpus_or_gpus() -> None:
    (rayjob,) = [o for o in render_job(JOBS[0], CTX) if o["kind"] == "RayJob"]
    params = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]
    assert params == HEAD_START_PARAMS
    assert params["num-cpus"] == params["num-gpus"] == "0"


def test_head_and_submitter_follow_the_student_pools_placement() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    doc["spec"]["student"]["pool"].update(nodeSelector={"gpu": "h100"}, tolerations=[toleration])
    job = DistillationJob.model_validate(doc)
    shaped = dict(templates(job))
    trainer = [where for where in shaped if where.startswith("RayJob/")]
    assert len(trainer) == 3
    for where in trainer:
        assert shaped[where]["spec"]["nodeSelector"] == {"gpu": "h100"}, where
        assert shaped[where]["spec"]["tolerations"] == [toleration], where
    teacher = [where for where in shaped if where.startswith("Deployment/")]
    assert teacher and all("tolerations" not in shaped[w]["spec"] for w in teacher)


def test_the_users_resources_win_key_by_key() -> None:
    # standalone-teacher.yaml: workers request cpu 32 and memory 256Gi and set no limits.
    (job,) = load_jobs(ROOT / "examples" / "standalone-teacher.yaml")
    worker = pod_resources(job.spec).worker
    assert worker.requests == {
        "cpu": "32",
        "memory": "256Gi",
        "nvidia.com/gpu": "8",
        "ephemeral-storage": "5Gi",
    }
    # A request without a limit: the limit is the request (the model cache's disk is requested only).
    assert worker.limits == {k: v for k, v in worker.requests.items() if k != "ephemeral-storage"}
    doc = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())
    doc["spec"]["student"]["pool"]["resources"] = {"limits": {"memory": "300Gi"}}
    worker = pod_resources(DistillationJob.model_validate(doc).spec).worker
    assert worker.requests["memory"] == worker.limits["memory"] == "300Gi"  # a limit alone: the request too
    assert worker.requests["cpu"] == worker.limits["cpu"] == "32"  # 4 a GPU, the default
    assert worker.shm_size == "150Gi"  # as the API server writes it back


def test_teacher_memory_grows_with_the_model_and_an_unknown_model_gets_the_fallback() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())
    teacher = doc["spec"]["teachers"][0]
    sizes = {}
    for model in ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "someone/unknown-model"):
        teacher["model"] = model
        spec = DistillationJob.model_validate(doc).spec
        sizes[model] = memory_bytes(pod_resources(spec).teachers[teacher["name"]].limits["memory"])
    assert sizes["Qwen/Qwen2.5-7B-Instruct"] < sizes["Qwen/Qwen2.5-32B-Instruct"]
    # 32B in bfloat16 is ~61 GiB of weights: the replica must hold them in page cache while loading.
    assert sizes["Qwen/Qwen2.5-32B-Instruct"] > 61 * 2**30
    gpus = teacher["pool"]["gpusPerReplica"]
    assert sizes["someone/unknown-model"] == (16 + 32) * gpus * 2**30


def test_cpu_only_pools_request_little_so_a_small_node_schedules_the_job() -> None:
    (job,) = load_jobs(ROOT / "examples" / "local-addition.yaml")
    plan = pod_resources(job.spec)
    assert job.spec.student.pool.gpus_per_worker == 0
    for resources in (plan.head, plan.worker, plan.submitter):
        assert memory_bytes(resources.requests["memory"]) <= 2**30
        assert resources.requests["cpu"] in ("100m",)


def test_the_builder_refuses_a_pod_it_cannot_size() -> None:
    resources = ContainerResources({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}, "512Mi", "")
    pod = {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]}
    with pytest.raises(ValueError, match="one container"):
        shape_pod(pod, resources, PodScheduling())


def test_memory_quantities_parse() -> None:
    assert memory_bytes("8Gi") == 8 * 2**30
    assert memory_bytes("500M") == 500 * 10**6
    assert memory_bytes(1024) == 1024
    with pytest.raises(ValueError):
        memory_bytes("lots")


def test_shm_sizes_are_written_as_the_api_server_writes_them_back() -> None:
    # A Deployment's `sizeLimit: 25600Mi` reads back as `25Gi`: rendered in that form, and compared by value.
    assert canonical_memory(25600 * 2**20) == "25Gi"
    assert canonical_memory(1536 * 2**20) == "1536Mi"
    for job in JOBS:
        for where, template in templates(job):
            for volume in template["spec"].get("volumes", []):
                size = volume.get("emptyDir", {}).get("sizeLimit")
                if size is not None:
                    assert size == canonical_memory(memory_bytes(size)), where
    want = {"spec": {"volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1024Mi"}}]}}
    live = {"spec": {"volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]}}
    assert differences(want, live) == []
    live["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = "2Gi"
    assert differences(want, live) == ["spec.volumes[0]"]


def test_distillery_plan_prints_each_pods_resources_and_why() -> None:
    (job,) = load_jobs(ROOT / "examples" / "standalone-teacher.yaml")
    lines = pod_resources(job.spec).lines()
    kinds = [line.split(":")[1].strip() for line in lines]
    assert kinds == ["ray head", "ray worker", "submitter", "teacher qwen-7b"]
    assert "requests cpu=32 memory=256Gi nvidia.com/gpu=8" in lines[1]
    assert "the pool's resources override it" in lines[1]
    assert "17.7 GiB of weights" in lines[3] and "/dev/shm 25Gi" in lines[3]
    assert "/dev/shm" not in lines[2]  # the submitter has none


def test_a_pools_shared_memory_sizes_its_pods_dev_shm() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())
    assert pod_resources(parse_job(doc).spec).worker.shm_size == "128Gi"  # half the 256Gi limit
    doc["spec"]["student"]["pool"]["sharedMemory"] = "32Gi"
    doc["spec"]["teachers"][0]["pool"]["sharedMemory"] = "8Gi"
    resources = pod_resources(parse_job(doc).spec)
    assert resources.worker.shm_size == "32Gi" and resources.teachers["qwen-7b"].shm_size == "8Gi"
    assert resources.head.shm_size == "4Gi"  # the head's own: half its 8Gi
