"""The pure core: from a job and its observed children to the writes, the status and the events.

No API server here: children are the rendered objects run through the same summarizers the kopf indexes
use, with a status patched in where a test plays KubeRay or the Deployment controller.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from distillery_operator.jobs.decide import Decision, decide
from distillery_operator.k8s.scheduling import unscheduled_pods
from distillery_operator.k8s.workqueue import Backoff, WorkQueue
from distillery_operator.observe.summaries import (
    SUMMARIZERS,
    Child,
    ClaimFacts,
    Health,
    Observed,
    SharedTeacherFacts,
    assemble,
)
from distillery_operator.reconcile.controller import status_body
from distillery_operator.render import NO_CLUSTER_SETTINGS, ClusterSettings

from distillery.api import DistillationJobStatus, DistillationTeacherSpec, Phase
from distillery.plan.teachers.client import TeacherClient

ROOT = Path(__file__).resolve().parents[2]
T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"


POLICIES = ["NetworkPolicy"] * 3
"""A job without standalone teachers: the policies of its Ray pods, its head and its submitter."""


def job_body(example: str, **spec: Any) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples" / example).read_text())
    body["metadata"].update(namespace="ns", uid="uid-1", generation=1, resourceVersion="1")
    body["spec"].update(spec)
    return body


EXAMPLE_CLAIMS = {name: ClaimFacts(name, ("ReadWriteMany",)) for name in ("datasets", "distill-checkpoints")}
"""The users' claims the examples name (pvc://datasets, checkpoint.pvc), as a cluster would have them."""


class World:
    """A job and its children, advanced by applying the decision's writes (as the API server would)."""

    def __init__(self, body: dict[str, Any], cluster: ClusterSettings = NO_CLUSTER_SETTINGS):
        self.body = body
        self.cluster = cluster
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.health: dict[str, Health] = {}
        self.shared: dict[str, SharedTeacherFacts] = {}
        self.events: list[Any] = []
        self.claims: dict[str, ClaimFacts] = dict(EXAMPLE_CLAIMS)

    def observed(self) -> Observed:
        # The teacher key Secret is made, never watched (the operator may not list or watch Secrets).
        children = [SUMMARIZERS[kind](obj) for (kind, _), obj in self.objects.items() if kind in SUMMARIZERS]
        observed = assemble(children, self.health)
        observed.shared = dict(self.shared)
        return observed

    def decide(self, now: str) -> Decision:
        """As the controller decides: again with the claims read, when the decision asks for them."""
        observed = self.observed()
        decision = decide(self.body, observed, now, cluster=self.cluster)
        if decision.read_claims:
            observed.claims = {name: self.claims.get(name) for name in decision.read_claims}
            decision = decide(self.body, observed, now, cluster=self.cluster)
        return decision

    def step(self, now: str = T1) -> Decision:
        decision = self.decide(now)
        for action in decision.actions:
            key = (action.kind, action.name)
            if action.verb == "create":
                self.objects[key] = copy.deepcopy(action.body)
            else:
                merge(self.objects[key], action.body)
        self.body["status"] = status_body(decision.status)
        self.events.extend(decision.events)
        return decision

    def settle(self, now: str = T1) -> Decision:
        """Steps until a step asks for nothing (fails if that takes more than a few steps)."""
        for _ in range(4):
            decision = self.step(now)
            again = self.decide(now)
            if not again.actions and not again.events and status_body(again.status) == self.body["status"]:
                return decision
        raise AssertionError("did not converge")

    def play(self, kind: str, name: str, status: dict[str, Any]) -> None:
        self.objects[(kind, name)].setdefault("status", {}).update(status)

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.body["status"]["conditions"] if c["type"] == kind)


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        elif value is None:
            target.pop(key, None)
        else:
            target[key] = value


def test_standalone_job_from_creation_to_success() -> None:
    world = World(job_body("gkd.yaml"))
    first = world.step(T0)
    assert [(a.verb, a.kind) for a in first.actions] == [
        ("create", "ConfigMap"), *[("create", "NetworkPolicy")] * 4, ("create", "Secret"),
        ("create", "Service"), ("create", "Deployment"), ("create", "PodDisruptionBudget"),
        ("create", "PersistentVolumeClaim"), ("create", "RayJob"),
    ]  # fmt: skip
    world.settle()
    assert world.body["status"]["phase"] == "StartingTeachers"
    assert world.condition("TeachersReady")["status"] == "False"
    assert world.body["status"]["teachers"][0]["message"] == "0/1 replicas ready"

    world.play("Deployment", "gkd-jsd-teacher-teacher", {"readyReplicas": 1})
    world.settle(T1)
    assert world.body["status"]["phase"] == "Pending"  # teachers ready, trainer not yet running
    assert world.condition("TeachersReady")["lastTransitionTime"] == T1

    world.play("RayJob", "gkd-jsd-trainer", {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"})
    world.settle(T2)
    status = world.body["status"]
    assert status["phase"] == "Running" and status["startTime"] == T2
    assert world.condition("TeachersReady")["lastTransitionTime"] == T1  # unchanged status, same time

    world.play("RayJob", "gkd-jsd-trainer", {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"})
    done = world.settle(T2)
    assert world.body["status"]["phase"] == "Succeeded"
    assert world.condition("Complete")["status"] == "True"
    assert world.objects[("Deployment", "gkd-jsd-teacher-teacher")]["spec"]["replicas"] == 0
    assert done.external == {}
    reasons = [e.reason for e in world.events]
    assert reasons.count("Succeeded") == 1 and reasons.count("Running") == 1

    # Terminal is sticky: a deleted RayJob is not recreated and the phase stays.
    del world.objects[("RayJob", "gkd-jsd-trainer")]
    again = world.step(T2)
    assert again.actions == [] and world.body["status"]["phase"] == "Succeeded"


def test_a_teacher_the_trainer_cannot_reach_is_shown_until_it_answers_again() -> None:
    """The runtime reports the teachers it waits for in status.teacherOutages; the operator turns that into
    TeachersReady False (reason TeacherUnavailable) with the trainer's last error, and a Warning Event."""
    world = World(job_body("gkd.yaml"))
    world.settle(T0)
    world.play("Deployment", "gkd-jsd-teacher-teacher", {"readyReplicas": 1})
    world.play("RayJob", "gkd-jsd-trainer", {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"})
    world.settle(T1)
    assert world.condition("TeachersReady")["reason"] == "AllTeachersReady"

    outage = {"name": "teacher", "since": T1, "message": "connection refused"}
    world.body["status"]["teacherOutages"] = [outage]  # the runtime's field, patched by the trainer
    decision = decide(world.body, world.observed(), T2)
    ready = next(c for c in decision.status.conditions if c.type == "TeachersReady")
    assert ready.status == "False" and ready.reason == "TeacherUnavailable"
    assert (
        f"teacher: the trainer cannot reach it: not answering since {T1}: connection refused" in ready.message
    )
    assert decision.status.phase == "Running" and decision.status.teachers_ready == "0/1"
    waiting = next(c for c in decision.status.conditions if c.type == "TeacherUnavailable")
    assert waiting.status == "True" and waiting.reason == "TeacherNotAnswering"
    assert waiting.message.startswith("the trainer waits for teacher: not answering since")
    assert [e.type for e in decision.events if e.reason == "TeacherUnavailable"] == ["Warning"]
    assert "teacherOutages" not in status_body(decision.status)  # never written by the operator

    world.body["status"] = {**status_body(decision.status), "teacherOutages": []}
    back = decide(world.body, world.observed(), T2)
    ready = next(c for c in back.status.conditions if c.type == "TeachersReady")
    assert ready.reason == "AllTeachersReady" and back.status.teachers_ready == "1/1"
    waiting = next(c for c in back.status.conditions if c.type == "TeacherUnavailable")
    assert waiting.status == "False" and waiting.reason == "TeachersAnswering"


def test_failed_rayjob_fails_the_job_with_kuberays_reason_but_retrying_does_not() -> None:
    world = World(job_body("gkd.yaml", backoffLimit=1, checkpoint={"pvc": "ckpt"}))
    world.claims["ckpt"] = ClaimFacts("ckpt", ("ReadWriteMany",))
    world.settle()
    world.play("RayJob", "gkd-jsd-trainer", {"jobStatus": "FAILED", "jobDeploymentStatus": "Retrying"})
    world.settle()
    assert world.body["status"]["phase"] != "Failed"
    world.play(
        "RayJob", "gkd-jsd-trainer",
        {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded", "message": "too slow"},
    )  # fmt: skip
    world.settle()
    assert world.body["status"]["phase"] == "Failed"
    failed = world.condition("Failed")
    assert (failed["reason"], failed["message"]) == ("DeadlineExceeded", "too slow")
    assert [e.type for e in world.events if e.reason == "Failed"] == ["Warning"]


def test_multi_teacher_status_counts_each_teacher() -> None:
    world = World(job_body("multi-teacher.yaml"))
    world.settle()
    world.play("Deployment", "mopd-math-code-teacher-math", {"readyReplicas": 1})
    world.settle()
    status = world.body["status"]
    assert status["teachersReady"] == "1/3"
    assert [t["ready"] for t in status["teachers"]] == [True, False, False]
    assert (
        "code" in status["message"] and "general" in status["message"] and "math (" not in status["message"]
    )
    world.play("Deployment", "mopd-math-code-teacher-code", {"conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "deadline exceeded"}
    ]})  # fmt: skip
    world.settle()
    cond = world.condition("TeachersReady")
    assert cond["reason"] == "TeacherUnavailable" and "code: deadline exceeded" in cond["message"]


def test_external_teacher_readiness_follows_its_health() -> None:
    world = World(job_body("external-teacher.yaml"))
    decision = world.settle()
    (target,) = decision.external.values()
    assert decision.external.keys() == {"big"}
    assert target.endpoint == "http://vllm-72b.inference.svc.cluster.local:8000"
    # Checked as the trainer scores: plain http, spread over the Service's addresses, no key.
    assert target.client == TeacherClient(field="spec.teachers[0]", tls=False, resolve_dns=True)
    assert sorted(kind for kind, _ in world.objects) == [
        "ConfigMap",
        *POLICIES,
        "PersistentVolumeClaim",
        "RayJob",
    ]
    assert world.condition("TeachersReady")["reason"] == "TeachersStarting"  # not checked yet
    world.health["big"] = Health(True, "GET .../health: 200")
    world.settle()
    assert world.condition("TeachersReady")["status"] == "True"
    world.health["big"] = Health(False, "GET .../health: connection refused")
    world.settle()
    cond = world.condition("TeachersReady")
    assert cond["reason"] == "TeacherUnavailable" and "connection refused" in cond["message"]
    assert world.events[-1].type == "Warning"


@pytest.mark.parametrize(
    ("example", "trainer", "teacher", "message"),
    [
        ("colocated-teacher.yaml", "colocated-teacher-trainer", "teacher", "runs inside the trainer on the student's GPUs"),
        ("context-distillation.yaml", "qwen-7b-context-trainer", "self", "the student's base, scored by its rollout engine with the adapter off"),
    ],
)  # fmt: skip
def test_a_teacher_in_the_trainer_is_ready_when_the_trainer_runs(
    example: str, trainer: str, teacher: str, message: str
) -> None:
    """A colocated teacher and the student's own base (placement student) have nothing outside the trainer."""
    world = World(job_body(example))
    world.settle()
    assert world.body["status"]["phase"] == "Pending"  # nothing outside the trainer to wait for
    assert world.body["status"]["teachers"][0]["ready"] is False
    assert not [o for o in world.objects if o[0] == "Deployment"]
    world.play("RayJob", trainer, {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"})
    world.settle()
    assert world.body["status"]["phase"] == "Running"
    placement = world.body["status"]["teachers"][0].pop("placement")
    assert placement == job_body(example)["spec"]["teachers"][0]["placement"]
    assert world.body["status"]["teachers"][0] == {
        "name": teacher,
        "ready": True,
        "replicas": 0,
        "readyReplicas": 0,
        "message": message,
    }  # fmt: skip; replicas: the CRD's defaults, written as the server would fill them in


KUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def kueue_body() -> dict[str, Any]:
    """The README's example with the Kueue label its comment shows."""
    body = job_body("standalone-teacher.yaml")
    body["metadata"]["labels"] = {KUEUE_LABEL: "gpu-queue"}
    return body


def test_kueue_queued_job_is_pending_and_the_operator_never_unsuspends_it() -> None:
    world = World(kueue_body())
    world.settle()
    assert world.objects[("RayJob", "qwen-7b-to-1p5b-trainer")]["spec"]["suspend"] is True
    assert world.body["status"]["phase"] == "Pending"
    assert world.condition("TrainerReady")["reason"] == "Queued"
    # Kueue admits: it sets suspend false. The next reconciles leave it (and start the teachers).
    world.objects[("RayJob", "qwen-7b-to-1p5b-trainer")]["spec"]["suspend"] = False
    world.settle()
    assert world.settle().actions == []
    assert world.objects[("RayJob", "qwen-7b-to-1p5b-trainer")]["spec"]["suspend"] is False
    # Suspending the DistillationJob forces it.
    world.body["spec"]["suspend"] = True
    decision = world.step()
    assert [(a.kind, a.body) for a in decision.actions if a.kind == "RayJob"] == [
        ("RayJob", {"spec": {"suspend": True}})
    ]
    # Resuming a Kueue-managed job leaves suspend to Kueue.
    world.settle()
    world.body["spec"]["suspend"] = False
    decision = world.step()
    assert [a for a in decision.actions if a.kind == "RayJob"] == []


def test_kueue_held_teachers_hold_no_gpus_until_admission() -> None:
    world = World(kueue_body())
    deployment, rayjob = (
        ("Deployment", "qwen-7b-to-1p5b-teacher-qwen-7b"),
        ("RayJob", "qwen-7b-to-1p5b-trainer"),
    )
    first = world.step()
    created = {a.kind: a.body for a in first.actions}
    assert created["Deployment"]["spec"]["replicas"] == 0  # created at zero: no GPUs while queued
    world.settle()
    assert world.objects[deployment]["spec"]["replicas"] == 0
    teachers = world.condition("TeachersReady")
    assert (teachers["status"], teachers["reason"]) == ("False", "Queued")
    assert "until Kueue admits the trainer" in world.body["status"]["teachers"][0]["message"]
    trainer = world.condition("TrainerReady")["message"]
    assert "waiting for Kueue to admit it (queue gpu-queue)" in trainer
    assert f"without Kueue, remove the {KUEUE_LABEL} label" in trainer
    assert world.body["status"]["phase"] == "Pending"

    # Kueue admits the RayJob: the teachers go to their replicas (2).
    world.objects[rayjob]["spec"]["suspend"] = False
    decision = world.settle()
    assert world.objects[deployment]["spec"]["replicas"] == 2
    assert decision.actions == [] or all(a.kind == "Deployment" for a in decision.actions)
    assert world.condition("TeachersReady")["reason"] == "TeachersStarting"

    # Kueue preempts it (suspends the RayJob again): the teachers give their GPUs back.
    world.objects[rayjob]["spec"]["suspend"] = True
    world.settle()
    assert world.objects[deployment]["spec"]["replicas"] == 0


def test_a_job_without_kueue_starts_its_teachers_at_once() -> None:
    world = World(job_body("standalone-teacher.yaml"))
    world.settle()
    assert world.objects[("Deployment", "qwen-7b-to-1p5b-teacher-qwen-7b")]["spec"]["replicas"] == 2
    assert world.objects[("RayJob", "qwen-7b-to-1p5b-trainer")]["spec"]["suspend"] is False
    assert world.body["status"]["phase"] == "StartingTeachers"


def test_suspend_scales_teachers_to_zero_and_resume_restores_them() -> None:
    world = World(job_body("multi-teacher.yaml"))
    world.settle()
    world.body["spec"]["suspend"] = True
    world.settle()
    deployments = [o for (kind, _), o in world.objects.items() if kind == "Deployment"]
    assert [d["spec"]["replicas"] for d in deployments] == [0, 0, 0]
    assert world.objects[("RayJob", "mopd-math-code-trainer")]["spec"]["suspend"] is True
    assert world.body["status"]["phase"] == "Suspended"
    assert world.condition("Suspended")["status"] == "True"
    world.body["spec"]["suspend"] = False
    world.settle()
    assert [d["spec"]["replicas"] for d in deployments] == [1, 1, 1]
    assert world.objects[("RayJob", "mopd-math-code-trainer")]["spec"]["suspend"] is False


def test_live_changes_apply_and_other_changes_are_refused() -> None:
    world = World(job_body("multi-teacher.yaml"))
    world.settle()
    world.body["spec"]["teachers"][2]["replicas"] = 4
    world.body["spec"]["loss"] = {"mode": "k2"}
    world.body["spec"]["student"]["model"] = "other/model"
    world.body["metadata"]["generation"] = 2
    decision = world.settle()
    assert world.objects[("Deployment", "mopd-math-code-teacher-general")]["spec"]["replicas"] == 4
    cond = world.condition("SpecApplied")
    assert cond["status"] == "False" and cond["reason"] == "SpecChangeRefused"
    assert "spec.loss.mode" in cond["message"] and "spec.student.model" in cond["message"]
    assert "spec.teachers[2].replicas" not in cond["message"]
    config = world.objects[("ConfigMap", "mopd-math-code-config")]["data"]["runtime-config.json"]
    assert '"mode":"k3"' in config and '"other/model"' not in config
    assert world.body["status"]["observedGeneration"] == 2
    assert all(c["observedGeneration"] == 2 for c in world.body["status"]["conditions"])
    assert any(e.reason == "SpecChangeRefused" and e.type == "Warning" for e in world.events)
    assert decision is not None


def test_invalid_spec_creates_nothing_and_names_the_field() -> None:
    body = job_body("gkd.yaml")
    body["spec"]["loss"]["topK"] = 0
    world = World(body)
    decision = world.step()
    assert decision.actions == []
    assert world.body["status"]["phase"] == "Invalid"
    valid = world.condition("Valid")
    assert valid["status"] == "False" and valid["message"].startswith("spec.loss.topK:")
    assert [(e.type, e.reason) for e in world.events] == [("Warning", "Invalid"), ("Warning", "InvalidSpec")]


def test_children_of_another_job_with_the_same_name_are_left_alone() -> None:
    world = World(job_body("gkd.yaml"))
    world.settle()
    world.body["metadata"]["uid"] = "uid-2"  # the job was deleted and recreated; old children linger
    decision = world.step()
    assert decision.actions == []
    assert "of another job with this name" in world.body["status"]["message"]


def test_drift_is_repaired_and_nothing_else_is_touched() -> None:
    world = World(job_body("gkd.yaml"))
    world.settle()
    deployment = world.objects[("Deployment", "gkd-jsd-teacher-teacher")]
    deployment["metadata"]["annotations"]["distillery.io/spec-hash"] = "edited"
    decision = world.step()
    assert [(a.verb, a.kind, a.why) for a in decision.actions] == [
        ("patch", "Deployment", "drift: spec-hash")
    ]
    assert world.settle().actions == []


def test_the_job_gets_its_network_policies_first_and_they_are_repaired() -> None:
    world = World(job_body("gkd.yaml"))  # on by default
    first = world.step(T0)
    # Before any pod they select exists: right after the config.
    assert [(a.verb, a.kind) for a in first.actions][:4] == [
        ("create", "ConfigMap"),
        ("create", "NetworkPolicy"),
        ("create", "NetworkPolicy"),
        ("create", "NetworkPolicy"),
    ]
    world.settle()
    policy = world.objects[("NetworkPolicy", "gkd-jsd-network")]
    ray = {"distillery.io/job": "gkd-jsd", "app.kubernetes.io/component": "trainer"}
    assert policy["spec"]["podSelector"] == {"matchLabels": ray}
    rules = len(policy["spec"]["ingress"])
    policy["spec"]["ingress"] = [{}]  # opened to every pod of the cluster
    decision = world.step()
    assert [(a.verb, a.kind) for a in decision.actions] == [("patch", "NetworkPolicy")]
    assert len(world.objects[("NetworkPolicy", "gkd-jsd-network")]["spec"]["ingress"]) == rules
    # Off (the chart's networkPolicy.enabled: false): none made.
    plain = World(job_body("gkd.yaml"), ClusterSettings(network_policy=None))
    plain.settle()
    assert not [key for key in plain.objects if key[0] == "NetworkPolicy"]


def _defaulted(obj: dict[str, Any]) -> None:
    """What the API server and other controllers add to a child: defaults, labels, annotations, extras."""
    obj["metadata"]["labels"]["owner"] = "platform-team"
    spec = obj.get("spec") or {}
    if obj["kind"] == "Deployment":
        spec.update(revisionHistoryLimit=10)
        pod = spec["template"]["spec"]
        pod.update(restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
        spec["template"]["metadata"]["annotations"] = {"kubectl.kubernetes.io/restartedAt": T1}
        container = pod["containers"][0]
        container.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
        container["readinessProbe"].update(successThreshold=1)
        container["readinessProbe"]["httpGet"]["scheme"] = "HTTP"
        container.setdefault("env", []).append({"name": "INJECTED", "value": "by a webhook"})
        container["resources"]["requests"]["cpu"] = "500m"  # rendered "0.5": the same quantity
    if obj["kind"] == "Service":
        spec.update(clusterIPs=["None"], sessionAffinity="None", type="ClusterIP", ipFamilies=["IPv4"])
    if obj["kind"] == "RayJob":
        spec["rayClusterSpec"]["workerGroupSpecs"][0].update(numOfHosts=1)
        spec["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] = {"flavor": "a100"}
    obj["status"] = {"anything": "of another controller"}


@pytest.mark.parametrize(
    ("kind", "edit", "path"),
    [
        ("Deployment", lambda o: o["spec"]["template"]["spec"]["containers"][0].update(image="x:1"),
         "spec.template.spec.containers[0]"),
        ("Deployment", lambda o: o["spec"]["template"]["spec"]["containers"][0]["command"].append("--evil"),
         "spec.template.spec.containers[0]"),
        ("Deployment", lambda o: o["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].update(
            {"nvidia.com/gpu": "8"}), "spec.template.spec.containers[0]"),
        ("Deployment", lambda o: o["spec"]["template"]["spec"]["volumes"].pop(), "spec.template.spec.volumes[1]"),
        ("Service", lambda o: o["spec"]["ports"][0].update(port=9000), "spec.ports[0]"),
        ("Service", lambda o: o["spec"].update(selector={"app": "else"}), "spec.selector.app.kubernetes.io/instance"),
        ("ConfigMap", lambda o: o["data"].update({"runtime-config.json": "{}"}), "data.runtime-config.json"),
        ("RayJob", lambda o: o["spec"].update(entrypoint="sleep infinity"), "spec.entrypoint"),
        ("RayJob", lambda o: o["metadata"]["labels"].pop("distillery.io/job"), "labels.distillery.io/job"),
    ],
)  # fmt: skip
def test_an_edited_field_the_operator_renders_is_put_back(kind: str, edit: Any, path: str) -> None:
    """Drift is what the operator renders holding another value, whatever the spec-hash annotation says;
    what the server or others add (defaults, labels, a webhook's env var, Kueue's nodeSelector) is not."""
    body = job_body("gkd.yaml")
    body["spec"]["teachers"][0]["pool"]["resources"] = {"requests": {"cpu": "0.5"}}
    world = World(body)
    world.settle()
    for obj in world.objects.values():
        _defaulted(obj)
    assert world.step().actions == []  # defaults and others' additions are not drift

    name = next(n for (k, n) in world.objects if k == kind)
    edit(world.objects[(kind, name)])
    decision = world.step()
    assert [(a.verb, a.kind) for a in decision.actions] == [("patch", kind)]
    assert path in decision.actions[0].why
    assert world.step().actions == []  # put back: nothing more to do


def test_a_drifted_rayjob_keeps_the_suspend_kueue_gave_it() -> None:
    world = World(kueue_body())
    world.settle()
    rayjob = world.objects[("RayJob", "qwen-7b-to-1p5b-trainer")]
    rayjob["spec"]["suspend"] = False  # Kueue admitted it
    rayjob["spec"]["entrypoint"] = "sleep infinity"  # and someone edited it
    decision = world.step()
    (patch,) = [a for a in decision.actions if a.kind == "RayJob"]
    assert "suspend" not in patch.body["spec"] and patch.body["spec"]["entrypoint"].startswith(
        "distillery run"
    )
    assert rayjob["spec"]["suspend"] is False


def test_the_runtimes_fields_are_never_written() -> None:
    world = World(job_body("gkd.yaml"))
    world.body["status"] = {"progress": {"step": 3}, "lastCheckpoint": {"step": 2, "path": "/c/2"}}
    decision = world.step()
    assert decision.status.progress is None and decision.status.last_checkpoint is None
    written = status_body(decision.status)
    assert "progress" not in written and "lastCheckpoint" not in written


async def test_workqueue_deduplicates_and_never_runs_a_key_twice_at_once() -> None:
    queue = WorkQueue(Backoff(base=0.01, cap=0.04))
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    key = await queue.get()
    assert key == "a"
    queue.add("a")  # changed while processing: processed again, after done()
    assert await queue.get() == "b"
    queue.done("b")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), 0.05)
    queue.done("a")
    assert await asyncio.wait_for(queue.get(), 1) == "a"
    queue.done("a")
    delays = [queue.add_rate_limited("c") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    assert await asyncio.wait_for(queue.get(), 1) == "c"
    queue.forget("c")
    assert queue.backoff.next_delay("c") == 0.01
    queue.close()


def test_child_summaries_are_small() -> None:
    body = job_body("gkd.yaml")
    world = World(body)
    world.settle()
    for (kind, _), obj in world.objects.items():
        if kind not in SUMMARIZERS:
            continue  # the teacher key Secret: made, never watched
        child = SUMMARIZERS[kind](obj)
        # The checkpoint claim alone has no owner: it is kept after the job.
        owner = None if kind == "PersistentVolumeClaim" else "uid-1"
        assert isinstance(child, Child) and child.owner_uid == owner and child.spec_hash


def test_a_job_name_starting_with_a_digit_gets_services_named_with_a_letter() -> None:
    # Services must start with a letter (DNS-1035); the job's children are named after it.
    body = job_body("gkd.yaml")
    body["metadata"]["name"] = "7b-distill"
    world = World(body)
    world.settle()
    assert world.body["status"]["phase"] != "Invalid"
    services = [name for (kind, name) in world.objects if kind == "Service"]
    assert services == ["d7b-distill-teacher-teacher"]


def _cond(kind: str, status: str, reason: str, message: str, at: str = T0) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
        "observedGeneration": 1,
    }


def test_decide_returns_a_typed_status_serialised_as_the_api_expects() -> None:
    """decide's status is a DistillationJobStatus; `status_body` (what the controller patches) is the
    camelCase object the CRD describes, with unset fields left out, for a starting, a failed and an
    invalid job."""
    world = World(job_body("gkd.yaml"))
    decision = world.step(T0)
    assert isinstance(decision.status, DistillationJobStatus)
    children = {
        "rayJob": "gkd-jsd-trainer",
        "configMap": "gkd-jsd-config",
        "teacherDeployments": ["gkd-jsd-teacher-teacher"],
        "teacherServices": ["gkd-jsd-teacher-teacher"],
    }
    teacher = {
        "name": "teacher",
        "placement": "standalone",
        "ready": False,
        "replicas": 1,
        "readyReplicas": 0,
        "endpoint": "http://gkd-jsd-teacher-teacher.ns.svc:8000",
        "message": "Deployment not created yet",
    }
    valid = [
        _cond("Valid", "True", "SpecValid", "the spec is valid"),
        _cond("SpecApplied", "True", "SpecApplied", "the children match the spec"),
    ]
    kept = _cond(
        "OutputKept", "True", "ClaimKept",
        "checkpoints, metrics and the final model are on PersistentVolumeClaim gkd-jsd-checkpoints at "
        "/checkpoints in the trainer pods, kept after the job is deleted (kubectl delete pvc "
        "gkd-jsd-checkpoints frees it)",
    )  # fmt: skip
    mountable = _cond(
        "StorageReady", "True", "ClaimsMountable",
        "PersistentVolumeClaim datasets, gkd-jsd-checkpoints: found, with access modes that serve the pods",
    )  # fmt: skip
    storage = {"claim": "gkd-jsd-checkpoints", "kept": True, "ephemeral": False, "size": "31Gi"}
    assert status_body(decision.status) == {
        "phase": "StartingTeachers",
        "message": "waiting for teachers: teacher (Deployment not created yet)",
        "observedGeneration": 1,
        "conditions": [
            *valid,
            _cond("TeachersReady", "False", "TeachersStarting", "0/1 teachers ready; teacher: Deployment not created yet"),
            _cond("TrainerReady", "False", "TrainerNotCreated", "the RayJob does not exist yet"),
            _cond("PodsScheduled", "True", "NoPodWaiting", "no pod of the job waits for a node"),
            _cond("TeacherUnavailable", "False", "TeachersAnswering", "no teacher outage reported"),
            _cond("Suspended", "False", "NotSuspended", "not suspended"),
            kept,
            mountable,
        ],
        "teachers": [teacher],
        "teachersReady": "0/1",
        "children": children,
        "storage": {**storage, "message": "not made yet"},
    }  # fmt: skip

    world.play("Deployment", "gkd-jsd-teacher-teacher", {"readyReplicas": 1})
    world.play("RayJob", "gkd-jsd-trainer", {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"})
    world.settle(T1)
    world.play("RayJob", "gkd-jsd-trainer", {"jobStatus": "FAILED", "jobDeploymentStatus": "Complete"})
    failed = "RayJob gkd-jsd-trainer failed (jobStatus=FAILED, jobDeploymentStatus=Complete)"
    decision = world.step(T2)
    assert decision.finished and decision.status.phase == Phase.FAILED
    assert status_body(decision.status) == {
        "phase": "Failed",
        "message": failed,
        "observedGeneration": 1,
        "conditions": [
            *valid,
            _cond("TeachersReady", "False", "JobFinished", "teachers scaled to zero", T2),
            _cond("TrainerReady", "False", "RayJobFailed", failed, T2),
            _cond("Suspended", "False", "NotSuspended", "not suspended"),
            kept,
            mountable,
            _cond("Failed", "True", "RayJobFailed", failed, T2),
        ],
        "teachers": [{**teacher, "replicas": 0, "readyReplicas": 1, "message": "scaled to zero"}],
        "teachersReady": "0/1",
        "children": children,
        "storage": storage,
        "startTime": T1,
        "completionTime": T2,
    }  # fmt: skip

    invalid = World(job_body("gkd.yaml", teachers=[])).step(T0)
    problem = "spec.teachers: List should have at least 1 item after validation, not 0"
    assert not invalid.finished and invalid.status.phase == Phase.INVALID
    assert status_body(invalid.status) == {
        "phase": "Invalid",
        "message": f"the spec is invalid: {problem}",
        "observedGeneration": 1,
        "conditions": [_cond("Valid", "False", "InvalidSpec", problem)],
        "teachers": [],
    }


# ------------------------------------------------------------------------------------------------ checkpoint claim

CLAIM = ("PersistentVolumeClaim", "gkd-jsd-checkpoints")


def kept_claim(world: World, *, owner: str | None = None, storage: str = "31Gi", **status: Any) -> None:
    """The claim as an earlier job of this name left it: made by the operator, kept (no owner) unless
    `owner` is that job's uid."""
    made = World(job_body("gkd.yaml")).step(T0).actions
    claim = copy.deepcopy(next(a.body for a in made if a.kind == "PersistentVolumeClaim"))
    claim["metadata"].pop("ownerReferences", None)
    if owner is not None:
        ref = {"apiVersion": "distillery.io/v1alpha1", "kind": "DistillationJob", "name": "gkd-jsd"}
        claim["metadata"]["ownerReferences"] = [{**ref, "uid": owner, "controller": True}]
    claim["spec"]["resources"]["requests"]["storage"] = storage
    claim["status"] = status
    world.objects[CLAIM] = claim


def test_the_claim_is_made_once_and_never_patched() -> None:
    world = World(job_body("gkd.yaml"))
    world.settle(T0)
    claim = world.objects[CLAIM]
    assert "ownerReferences" not in claim["metadata"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "31Gi"
    # Someone grows it and edits its labels; the provisioner binds it: the operator writes nothing back.
    claim["spec"]["resources"]["requests"]["storage"] = "500Gi"
    claim["metadata"]["labels"]["owner"] = "me"
    claim["metadata"]["annotations"]["distillery.io/spec-hash"] = "edited"
    world.play(*CLAIM, {"phase": "Bound", "capacity": {"storage": "512Gi"}})
    decision = world.step(T1)
    assert [a for a in decision.actions if a.kind == "PersistentVolumeClaim"] == []
    storage = world.body["status"]["storage"]
    assert storage == {
        "claim": "gkd-jsd-checkpoints",
        "kept": True,
        "ephemeral": False,
        "size": "512Gi",
        "phase": "Bound",
    }
    assert world.condition("OutputKept")["reason"] == "ClaimKept"


def test_a_job_made_again_uses_the_claim_its_predecessor_kept() -> None:
    world = World(job_body("gkd.yaml", checkpoint={"deleteWithJob": True}))
    kept_claim(world, storage="20Gi", phase="Bound", capacity={"storage": "20Gi"})
    world.settle(T0)
    assert [k for k, _ in world.objects].count("PersistentVolumeClaim") == 1
    assert "ownerReferences" not in world.objects[CLAIM]["metadata"]  # never adopted: its data predates us
    storage = world.body["status"]["storage"]
    assert storage["kept"] is True and storage["size"] == "20Gi"
    # What differs from this job's plan is said, not fixed: a claim only grows, where its class allows.
    assert "asks for 20Gi, less than the 31Gi this job plans" in storage["message"]
    assert "made by an earlier job with this name and kept" in storage["message"]
    assert world.condition("OutputKept")["status"] == "True"


def test_a_claim_owned_by_a_deleted_job_of_the_same_name_is_waited_for() -> None:
    """With deleteWithJob the old job's claim goes with it, through the garbage collector: the new job makes
    its own once that one is gone, never mounting the old one's."""
    world = World(job_body("gkd.yaml"))
    kept_claim(world, owner="uid-0")
    decision = world.step(T0)
    assert [a for a in decision.actions if a.kind == "PersistentVolumeClaim"] == []
    assert "waiting for PersistentVolumeClaim/gkd-jsd-checkpoints" in (decision.status.message or "")
    del world.objects[CLAIM]
    decision = world.step(T1)
    assert [(a.verb, a.kind) for a in decision.actions] == [("create", "PersistentVolumeClaim")]


def test_a_claim_being_deleted_is_not_made_again_until_it_is_gone() -> None:
    world = World(job_body("gkd.yaml"))
    world.settle(T0)
    world.objects[CLAIM]["metadata"]["deletionTimestamp"] = T1
    world.play(*CLAIM, {"phase": "Bound"})
    decision = world.step(T1)
    assert decision.actions == []
    assert "being deleted" in world.body["status"]["storage"]["message"]
    del world.objects[CLAIM]
    assert [(a.verb, a.kind) for a in world.step(T2).actions] == [("create", "PersistentVolumeClaim")]


def test_a_claim_not_bound_says_what_it_needs() -> None:
    world = World(job_body("gkd.yaml", checkpoint={"storageClassName": "fast"}))
    world.settle(T0)
    world.play(*CLAIM, {"phase": "Pending"})
    world.settle(T1)
    storage = world.body["status"]["storage"]
    assert storage["phase"] == "Pending"
    assert "StorageClass fast may not provide ReadWriteMany, 31Gi" in storage["message"]
    world.play(*CLAIM, {"phase": "Bound"})
    world.settle(T2)
    assert "message" not in world.body["status"]["storage"]


def test_a_claim_deleted_after_the_job_finished_is_not_made_again() -> None:
    world = World(job_body("gkd.yaml"))
    world.settle(T0)
    world.play("RayJob", "gkd-jsd-trainer", {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"})
    world.settle(T1)
    del world.objects[CLAIM]  # the user took the model and deleted the claim
    decision = world.step(T2)
    assert not any(a.kind == "PersistentVolumeClaim" for a in decision.actions)
    assert world.body["status"]["storage"]["message"] == "deleted after the job finished"


def test_delete_with_job_makes_the_job_its_owner() -> None:
    world = World(job_body("gkd.yaml", checkpoint={"deleteWithJob": True}))
    world.settle(T0)
    (owner,) = world.objects[CLAIM]["metadata"]["ownerReferences"]
    assert owner["uid"] == "uid-1"
    assert world.body["status"]["storage"]["kept"] is False
    cond = world.condition("OutputKept")
    assert (cond["status"], cond["reason"]) == ("False", "DeletedWithJob")
    assert "copy out what you keep first" in cond["message"]


def test_an_ephemeral_job_makes_no_claim_and_warns_once() -> None:
    world = World(job_body("gkd.yaml", checkpoint={"ephemeral": True}))
    world.settle(T0)
    assert CLAIM not in world.objects
    assert world.body["status"]["storage"] == {"kept": False, "ephemeral": True}
    cond = world.condition("OutputKept")
    assert (cond["status"], cond["reason"]) == ("False", "Ephemeral")
    warnings = [e for e in world.events if e.reason == "Ephemeral"]
    assert (
        len(warnings) == 1
        and warnings[0].type == "Warning"
        and "lost when the pods go" in warnings[0].message
    )


def test_a_claim_the_job_names_is_the_users() -> None:
    world = World(job_body("standalone-teacher.yaml"))
    kept_claim(world, owner="uid-0")  # the operator's claim name, owned by another job: not in this one's way
    decision = world.settle(T0)
    assert not any(a.kind == "PersistentVolumeClaim" for a in decision.actions)
    assert "PersistentVolumeClaim" not in (world.body["status"].get("message") or "")
    assert world.body["status"]["storage"] == {
        "claim": "distill-checkpoints",
        "kept": True,
        "ephemeral": False,
    }
    assert world.condition("OutputKept")["reason"] == "UserClaim"


def test_pods_no_node_admits_are_named_while_the_job_starts() -> None:
    """The scheduler's reason for each unplaced pod reaches the PodsScheduled condition, the phase's message
    and a Warning Event; once the job runs, the operator stops listing its pods."""
    world = World(job_body("gkd.yaml"))
    world.settle(T0)
    assert world.condition("PodsScheduled")["status"] == "True"
    assert world.step(T0).starting  # teachers starting: the operator lists the job's pods
    taint = "0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}."
    unplaced = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": taint}
    pending = [
        {
            "metadata": {"name": name, "labels": {"app.kubernetes.io/component": component}},
            "spec": {},
            "status": {"phase": "Pending", "conditions": [unplaced]},
        }
        for name, component in (("gkd-jsd-teacher-teacher-abc", "teacher"), ("gkd-jsd-head-xyz", "trainer"))
    ]
    bound = {"metadata": {"name": "placed"}, "spec": {"nodeName": "n1"}, "status": pending[0]["status"]}
    waiting = unscheduled_pods([*pending, bound])
    assert [u.pod for u in waiting] == ["gkd-jsd-head-xyz", "gkd-jsd-teacher-teacher-abc"]

    children = [SUMMARIZERS[kind](obj) for (kind, _), obj in world.objects.items() if kind in SUMMARIZERS]
    decision = decide(world.body, assemble(children, world.health, waiting), T1)
    status = status_body(decision.status)
    cond = next(c for c in status["conditions"] if c["type"] == "PodsScheduled")
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"
    assert "pod gkd-jsd-head-xyz (trainer): 0/1 nodes are available" in cond["message"]
    assert "untolerated taint {nvidia.com/gpu: present}" in status["message"]
    assert any(e.type == "Warning" and e.reason == "Unschedulable" for e in decision.events)

    world.play("Deployment", "gkd-jsd-teacher-teacher", {"readyReplicas": 1})
    world.play("RayJob", "gkd-jsd-trainer", {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"})
    running = world.settle(T2)
    assert world.body["status"]["phase"] == "Running" and not running.starting


def test_shared_teacher_is_not_the_jobs_and_is_ready_when_its_service_answers() -> None:
    body = job_body("external-teacher.yaml")
    body["spec"]["teachers"] = [
        {"name": "big", "model": "qwen-72b", "placement": "shared", "teacherRef": {"name": "qwen-72b"}}
    ]
    world = World(body)
    world.shared["qwen-72b"] = SharedTeacherFacts(DistillationTeacherSpec(model="qwen-72b", max_logprobs=64))
    decision = world.settle()
    # Asked at its DistillationTeacher's Service; no Deployment, Service or PDB of the job's for it.
    assert {name: t.endpoint for name, t in decision.external.items()} == {
        "big": "http://qwen-72b.ns.svc:8000"
    }
    assert sorted(kind for kind, _ in world.objects) == [
        "ConfigMap",
        *POLICIES,
        "PersistentVolumeClaim",
        "RayJob",
        "Secret",  # the job's key, which the shared teacher wants
    ]
    teacher = world.body["status"]["teachers"][0]
    assert teacher["endpoint"] == "http://qwen-72b.ns.svc:8000" and not teacher["ready"]
    assert teacher["message"].startswith("DistillationTeacher qwen-72b: ")
    assert world.condition("TeachersReady")["reason"] == "TeachersStarting"
    world.health["big"] = Health(True, "GET .../health: 200")
    world.settle()
    assert world.condition("TeachersReady")["status"] == "True"


def _shared_job() -> dict[str, Any]:
    body = job_body("external-teacher.yaml")
    body["spec"]["teachers"] = [
        {"name": "big", "model": "qwen-72b", "placement": "shared", "teacherRef": {"name": "qwen-72b"}}
    ]
    return body


def test_a_job_whose_distillation_teacher_does_not_exist_makes_nothing_and_waits_for_it() -> None:
    world = World(_shared_job())
    world.settle()
    assert world.objects == {}
    status = world.body["status"]
    assert status["phase"] == "Pending"
    assert status["message"] == (
        "spec.teachers[0].teacherRef: DistillationTeacher qwen-72b does not exist; the job waits for it"
    )
    assert status["teachers"][0]["message"].startswith("DistillationTeacher qwen-72b does not exist")
    # It appears: the job is made whole.
    world.shared["qwen-72b"] = SharedTeacherFacts(DistillationTeacherSpec(model="qwen-72b", max_logprobs=64))
    world.settle(T2)
    assert sorted(kind for kind, _ in world.objects) == [
        "ConfigMap",
        *POLICIES,
        "PersistentVolumeClaim",
        "RayJob",
        "Secret",  # the job's key, which the shared teacher wants
    ]


def test_a_job_asking_more_top_k_than_its_distillation_teacher_serves_is_refused_alone() -> None:
    world = World(_shared_job())
    top_k = world.body["spec"]["loss"].get("topK", 20)
    world.shared["qwen-72b"] = SharedTeacherFacts(
        DistillationTeacherSpec(model="qwen-72b", max_logprobs=max(1, top_k - 1))
    )
    world.settle()
    assert world.objects == {}
    assert world.body["status"]["phase"] == "Invalid"
    assert world.body["status"]["message"].startswith(
        f"spec.loss.topK: {top_k} is more than DistillationTeacher"
    )


def test_a_job_longer_than_its_distillation_teachers_context_is_refused_naming_the_field() -> None:
    world = World(_shared_job())
    world.shared["qwen-72b"] = SharedTeacherFacts(
        DistillationTeacherSpec.model_validate(
            {"model": "qwen-72b", "maxLogprobs": 64, "inference": {"maxModelLen": 16}}
        )
    )
    world.settle()
    assert world.objects == {} and world.body["status"]["phase"] == "Invalid"
    assert "serves 16 (its inference.maxModelLen)" in world.body["status"]["message"]


def test_a_running_job_says_its_distillation_teacher_is_being_deleted() -> None:
    world = World(_shared_job())
    spec = DistillationTeacherSpec(model="qwen-72b", max_logprobs=64)
    world.shared["qwen-72b"] = SharedTeacherFacts(spec)
    world.settle()
    world.shared["qwen-72b"] = SharedTeacherFacts(spec, deleting=True)
    world.settle(T2)
    message = world.body["status"]["teachers"][0]["message"]
    assert message.startswith(
        "DistillationTeacher qwen-72b is being deleted; it serves this job until the job ends"
    )
    # Already made: nothing is taken away.
    assert sorted(kind for kind, _ in world.objects) == [
        "ConfigMap",
        *POLICIES,
        "PersistentVolumeClaim",
        "RayJob",
        "Secret",  # the job's key, which the shared teacher wants
    ]
