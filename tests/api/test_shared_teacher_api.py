"""The DistillationTeacher API and a job's `placement: shared` teacher, without an API server: the
scaling bounds and their rule, the job's teacherRef rule, and what the plan makes of a shared teacher
(its Service URL, Distillery's compact protocol, nothing loaded or run by the job)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from distillery.api import DistillationTeacher, Placement, Scaling
from distillery.plan import resolve
from distillery.runtime_config import (
    TeacherProtocol,
    resolve_runtime_config,
    shared_teacher_service_name,
    shared_teacher_url,
)
from distillery.validation import InvalidManifest, parse_job

ROOT = Path(__file__).resolve().parents[2]
TEACHER: dict[str, Any] = {
    "apiVersion": "distillery.io/v1alpha1",
    "kind": "DistillationTeacher",
    "metadata": {"name": "qwen-7b", "namespace": "team-a"},
    "spec": {"model": "Qwen/Qwen2.5-7B-Instruct", "scaling": {"minReplicas": 0, "maxReplicas": 4}},
}


def teacher(**scaling: Any) -> DistillationTeacher:
    doc = copy.deepcopy(TEACHER)
    doc["spec"]["scaling"].update(scaling)
    return DistillationTeacher.model_validate(doc)


def shared_job(base: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    doc["metadata"]["namespace"] = "team-a"
    doc["spec"]["teachers"] = [
        {
            "name": "math",
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "placement": "shared",
            "teacherRef": {"name": "qwen-7b"},
        }
    ]
    return doc


def test_a_teacher_defaults_to_scale_to_zero_with_one_replica_at_most() -> None:
    scaling = Scaling()
    assert (scaling.min_replicas, scaling.max_replicas) == (0, 1)
    spec = teacher().spec
    assert spec.pool.gpus_per_replica == 1 and spec.inference.dtype == "auto"
    assert spec.scaling.target_waiting_per_replica == 8 and spec.scaling.idle_seconds == 600


def test_min_replicas_may_equal_max_but_not_exceed_it() -> None:
    assert teacher(minReplicas=4).spec.scaling.min_replicas == 4
    with pytest.raises(ValidationError, match="must not exceed maxReplicas"):
        teacher(minReplicas=5)


@pytest.mark.parametrize(
    ("field", "value"),
    [("minReplicas", -1), ("maxReplicas", 0), ("maxReplicas", 257), ("targetWaitingPerReplica", -1)],
)
def test_scaling_bounds(field: str, value: int) -> None:
    with pytest.raises(ValidationError):
        teacher(**{field: value})


def test_the_pool_is_the_job_teachers_pool_with_its_rules() -> None:
    doc = copy.deepcopy(TEACHER)
    doc["spec"]["pool"] = {"gpusPerReplica": 3, "tensorParallel": 2}
    with pytest.raises(ValidationError, match="multiple of tensorParallel"):
        DistillationTeacher.model_validate(doc)


def test_a_teacher_of_another_kind_is_refused() -> None:
    with pytest.raises(ValidationError):
        DistillationTeacher.model_validate({**TEACHER, "kind": "DistillationJob"})


def test_a_shared_teacher_needs_a_teacher_ref_and_only_a_shared_one_may_have_one(
    base_manifest: dict[str, Any],
) -> None:
    doc = shared_job(base_manifest)
    del doc["spec"]["teachers"][0]["teacherRef"]
    with pytest.raises(InvalidManifest, match="teacherRef"):
        parse_job(doc)
    doc = shared_job(base_manifest)
    doc["spec"]["teachers"][0]["placement"] = "standalone"
    with pytest.raises(InvalidManifest, match="teacherRef"):
        parse_job(doc)


def test_the_plan_reaches_a_shared_teacher_at_its_service_in_the_jobs_namespace(
    base_manifest: dict[str, Any],
) -> None:
    job = parse_job(shared_job(base_manifest))
    config = resolve_runtime_config(job, "team-a", in_cluster=True)
    (math,) = config.teachers
    assert math.placement == Placement.SHARED
    assert math.endpoints == ["http://qwen-7b.team-a.svc:8000"] == [shared_teacher_url("qwen-7b", "team-a")]
    assert math.protocol == TeacherProtocol.COMPACT  # Distillery's own teacher server serves it
    # The server answers to the DistillationTeacher's name, whatever the job calls the teacher.
    assert math.served_model_name == "qwen-7b" == resolve(job.spec).engines["math"].served_model_name
    # The job loads nothing of a teacher served elsewhere.
    assert "Qwen/Qwen2.5-7B-Instruct" not in job.spec.loaded_models()


def test_a_shared_teachers_service_is_its_name_when_that_is_a_dns_1035_label() -> None:
    assert shared_teacher_service_name("qwen-7b") == "qwen-7b"
    assert shared_teacher_url("qwen-7b", None) == "http://qwen-7b:8000"
    # A leading digit, a dot or a long name is made a label; two names never share a Service.
    assert shared_teacher_service_name("7b").startswith("d")
    dotted = shared_teacher_service_name("qwen.7b")
    assert dotted != shared_teacher_service_name("qwen-7b") and "." not in dotted
    long = shared_teacher_service_name("t" * 100)
    assert len(long) <= 63 and long != shared_teacher_service_name("t" * 101)


def test_the_example_teachers_are_valid() -> None:
    paths = sorted((ROOT / "examples" / "teachers").glob("*.yaml"))
    assert paths
    for path in paths:
        teacher = DistillationTeacher.model_validate(yaml.safe_load(path.read_text()))
        assert teacher.spec.scaling.min_replicas <= teacher.spec.scaling.max_replicas


def test_the_shared_example_references_an_example_teacher() -> None:
    job = parse_job(yaml.safe_load((ROOT / "examples" / "shared-teacher.yaml").read_text()))
    names = {
        yaml.safe_load(p.read_text())["metadata"]["name"]
        for p in (ROOT / "examples" / "teachers").glob("*.yaml")
    }
    refs = {t.teacher_ref.name for t in job.spec.teachers if t.teacher_ref is not None}
    assert refs and refs <= names
