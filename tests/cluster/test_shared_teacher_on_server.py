"""Shared teachers on a real control plane (issue 28): the operator process, with the chart's RBAC, serves a
DistillationTeacher and the jobs that reference it.

- a teacher at minReplicas 0 gets its Deployment at zero replicas and its Service; its status names its
  endpoint;
- the first job that references it scales it 0 -> 1 (an Event with the reason ScaledFromZero) and puts the
  finalizer on it; the teacher's status lists the job;
- a job referencing a teacher that does not exist makes nothing and waits (phase Pending, the field named),
  and is made once the teacher appears;
- a job deleted mid-run leaves the other job and the teachers as they were;
- deleting the teacher while a job uses it is held by the finalizer, and the job says so; once the job is
  deleted the finalizer goes and the teacher with its objects is collected.

No node here: the replicas never become ready and no /metrics answers, so scaling by queue length is
covered by the unit tests (`tests/api/test_teacher_scaling.py`) and the node scenario.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from distillery_operator import naming
from distillery_operator.teachers.loop import INTERVAL_ENV
from harness import REPO, Installation, kubectl, running_operator, wait_until

pytestmark = pytest.mark.timeout(150)


def teacher_manifest(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "teachers" / "qwen-7b.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["scaling"] = {"minReplicas": 0, "maxReplicas": 2, "idleSeconds": 1}
    return doc


def job_manifest(name: str, teacher: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "shared-teacher.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["teachers"][0]["teacherRef"] = {"name": teacher}
    doc["spec"]["checkpoint"] = {"deleteWithJob": True}
    return doc


class View:
    def __init__(self, installation: Installation, namespace: str) -> None:
        self.installation, self.namespace = installation, namespace

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        config = self.installation.plane.admin_kubeconfig
        return kubectl(config, "-n", self.namespace, *args, input=input, check=check).stdout

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def get(self, resource: str, name: str) -> dict[str, Any] | None:
        out = self.kubectl("get", resource, name, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def events(self, name: str) -> list[dict[str, Any]]:
        out = self.kubectl("get", "events", "-o", "json", f"--field-selector=involvedObject.name={name}")
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items


@pytest.fixture
def view(installation: Installation, namespace: str, tmp_path: Path) -> Iterator[View]:
    # Decisions every second (the chart's default is 15 s), so that the test does not wait on them.
    with running_operator(installation, namespace, tmp_path / "operator.log", env={INTERVAL_ENV: "1"}):
        yield View(installation, namespace)


def test_a_shared_teacher_scales_from_zero_for_its_first_job_and_is_held_while_jobs_use_it(
    view: View,
) -> None:
    v = view
    v.apply(teacher_manifest("shared"))
    deployment = wait_until(lambda: v.get("deployment", "shared"), what="the teacher's Deployment")
    assert deployment["spec"]["replicas"] == 0
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "DistillationTeacher"
    assert "distillery.io/job" not in deployment["spec"]["template"]["metadata"]["labels"]
    assert v.get("service", "shared")["spec"]["clusterIP"] == "None"
    status = wait_until(
        lambda: (
            (v.get("dt", "shared") or {}).get("status", {}).get("endpoint")
            and v.get("dt", "shared")["status"]
        ),
        what="the teacher's status",
    )
    assert status["endpoint"] == f"http://shared.{v.namespace}.svc:8000"
    assert not v.get("dt", "shared")["metadata"].get("finalizers")

    v.apply(job_manifest("first", "shared"))
    wait_until(lambda: v.get("deployment", "shared")["spec"]["replicas"] == 1, what="0 -> 1 replicas")
    wait_until(
        lambda: any(e["reason"] == "ScaledFromZero" for e in v.events("shared")),
        what="the ScaledFromZero Event",
    )
    teacher = wait_until(
        lambda: (t := v.get("dt", "shared")) and t["status"].get("jobs") == ["first"] and t,
        what="the jobs listed",
    )
    assert teacher["metadata"]["finalizers"] == ["distillery.io/in-use"]
    wait_until(lambda: v.get("rayjob", naming.rayjob_name("first")), what="the first job's RayJob")

    # A job whose teacher does not exist yet: nothing made, it waits, naming the field.
    v.apply(job_manifest("second", "later"))
    status = wait_until(
        lambda: (
            (v.get("dj", "second") or {}).get("status", {}).get("phase") and v.get("dj", "second")["status"]
        ),
        what="the second job's status",
    )
    assert status["phase"] == "Pending"
    assert (
        status["message"]
        == "spec.teachers[0].teacherRef: DistillationTeacher later does not exist; the job waits for it"
    )
    assert (
        v.get("rayjob", naming.rayjob_name("second")) is None
        and v.get("configmap", naming.config_map_name("second")) is None
    )
    v.apply(teacher_manifest("later"))
    wait_until(
        lambda: v.get("rayjob", naming.rayjob_name("second")),
        what="the second job made once its teacher exists",
    )

    # A job deleted mid-run takes nothing of the teacher's or the other job's with it.
    v.kubectl("delete", "dj", "second")
    wait_until(
        lambda: v.get("rayjob", naming.rayjob_name("second")) is None, what="the second job's RayJob gone"
    )
    assert v.get("rayjob", naming.rayjob_name("first")) is not None
    assert v.get("deployment", "shared")["spec"]["replicas"] == 1 and v.get("dt", "later") is not None
    wait_until(lambda: v.get("dt", "later")["status"].get("jobs") == [], what="the later teacher unused")

    # Deleting a teacher in use: held by its finalizer; the job says so.
    v.kubectl("delete", "dt", "shared", "--wait=false")
    wait_until(
        lambda: "is being deleted" in v.get("dj", "first")["status"]["teachers"][0]["message"],
        what="the job saying its teacher is being deleted",
    )
    assert v.get("dt", "shared") is not None and v.get("deployment", "shared") is not None
    v.kubectl("delete", "dj", "first", "--wait=false")
    wait_until(lambda: v.get("dt", "shared") is None, timeout=60, what="the teacher collected once unused")
    wait_until(lambda: v.get("deployment", "shared") is None, timeout=60, what="its Deployment collected")
