"""The operator's lifecycle on a real control plane, driven as a user drives a cluster (the project's kubectl).

The operator runs as a process with the chart's ServiceAccount token, so the chart's RBAC is enforced; the
API server validates, defaults and admits what it writes (OwnerReferencesPermissionEnforcement included);
the real garbage collector, scheduler and Deployment/ReplicaSet controllers run. KubeRay and the kubelet
cannot run here and are played (`played.py`, each faithfully to what the real one writes); Kueue cannot
run either, and the Kueue test admits its job as Kueue would.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from harness import (
    OPERATOR_SA,
    RELEASE_NAMESPACE,
    REPO,
    Installation,
    OperatorProcess,
    running_operator,
    wait_until,
    yaml_stream,
)
from played import PlayedKubelet, PlayedKubeRay, api_client, played_kubelet

from distillery.api import API_VERSION, GROUP, PLURAL, VERSION

pytestmark = pytest.mark.timeout(180)

OPERATOR_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{OPERATOR_SA}"
MOPD = "mopd-math-code"
MOPD_TEACHERS = [f"{MOPD}-teacher-{t}" for t in ("math", "code", "general")]
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def example(file: str, **metadata: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / file).read_text())
    doc["metadata"].update(metadata)
    return doc


@dataclass
class Cluster:
    """One test's view: the user's kubectl in its namespace, the played controllers, the operator."""

    installation: Installation
    namespace: str
    client: kubernetes.client.ApiClient
    kuberay: PlayedKubeRay
    kubelet: PlayedKubelet
    operator: OperatorProcess

    # -------------------------------------------------------------------------------- the user (kubectl)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = self.installation.admin(*args, "-n", self.namespace, input=input, check=check)
        return result.stdout if result.returncode == 0 else result.stderr

    def apply(self, manifest: dict[str, Any]) -> str:
        return self.kubectl("apply", "-f", "-", input=yaml_stream([manifest]))

    def patch_job(self, name: str, spec: dict[str, Any]) -> None:
        self.kubectl("patch", "dj", name, "--type=merge", "-p", json.dumps({"spec": spec}))

    # -------------------------------------------------------------------------------- reading (as admin)

    def get(self, resource: str, name: str) -> dict[str, Any] | None:
        return self.installation.get(resource, name, self.namespace)

    def names(self, resource: str) -> list[str]:
        return self.installation.names(resource, self.namespace)

    def job(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = kubernetes.client.CustomObjectsApi(
                self.client
            ).get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        except kubernetes.client.exceptions.ApiException as error:
            if error.status == 404:
                return None
            raise
        return obj

    def status(self, name: str) -> dict[str, Any]:
        return (self.job(name) or {}).get("status") or {}

    def phase(self, name: str) -> str | None:
        return self.status(name).get("phase")

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == kind), {})

    def deployment(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.client.sanitize_for_serialization(
            kubernetes.client.AppsV1Api(self.client).read_namespaced_deployment(name, self.namespace)
        )
        return obj

    def rayjob(self, name: str) -> dict[str, Any]:
        return self.kuberay.rayjob(name)

    def pods(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        items: list[dict[str, Any]] = json.loads(self.kubectl("get", "pods", "-l", selector, "-o", "json"))[
            "items"
        ]
        return items

    def evict(self, pod: str) -> int:
        """The Eviction API's answer for `pod` (kubectl drain's request): 201 evicted, 429 a budget refused."""
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": self.namespace},
        }
        try:
            kubernetes.client.CoreV1Api(self.client).create_namespaced_pod_eviction(
                pod, self.namespace, eviction
            )
        except kubernetes.client.exceptions.ApiException as error:
            return int(error.status)
        return 201

    def events(self, name: str) -> list[dict[str, Any]]:
        out = self.kubectl("get", "events", "-o", "json", f"--field-selector=involvedObject.name={name}")
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def operator_writes(self) -> list[dict[str, Any]]:
        """The operator's writes in this namespace, from the API server's audit log (Events left out)."""
        return [
            e
            for e in self.installation.plane.audit_events()
            if e.get("stage") == "ResponseComplete"
            and e["user"]["username"] == OPERATOR_USER
            and e["verb"] in WRITE_VERBS
            and (e.get("objectRef") or {}).get("namespace") == self.namespace
            and (e.get("objectRef") or {}).get("resource") != "events"
        ]

    def writes_quiet(self, seconds: float) -> Callable[[], bool]:
        """A predicate for wait_until: true once the operator has written nothing for `seconds`."""
        seen = {"count": len(self.operator_writes()), "since": time.monotonic()}

        def quiet() -> bool:
            count = len(self.operator_writes())
            if count != seen["count"]:
                seen.update(count=count, since=time.monotonic())
            return time.monotonic() - seen["since"] >= seconds

        return quiet

    def reconciles(self, kind: str, result: str = "") -> float:
        """distillery_operator_reconciles_total{kind=KIND[, result=RESULT]} (summed), from /metrics."""
        url = f"http://127.0.0.1:{self.operator.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        prefix = f'distillery_operator_reconciles_total{{kind="{kind}"'
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        if result:
            lines = [line for line in lines if f'result="{result}"' in line]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


@pytest.fixture
def cluster(installation: Installation, namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    client = api_client(installation.plane.admin_kubeconfig)
    log = tmp_path / "operator.log"
    try:
        with (
            played_kubelet(client, f"node-{namespace}") as kubelet,
            running_operator(installation, namespace, log) as operator,
        ):
            yield Cluster(
                installation, namespace, client, PlayedKubeRay(client, namespace), kubelet, operator
            )
    finally:
        if log.exists():
            print("---- operator log (tail) ----\n" + log.read_text(errors="replace")[-6000:])
        client.close()


def teacher_labels(job: str, teacher: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": job, "distillery.io/teacher": teacher}


def ready_replicas(c: Cluster, name: str) -> int:
    return int(c.deployment(name).get("status", {}).get("readyReplicas") or 0)


# ------------------------------------------------------------------------------------------------ lifecycle


def test_lifecycle_with_kubectl(cluster: Cluster) -> None:
    c = cluster
    c.kubectl("apply", "-f", str(REPO / "examples" / "multi-teacher.yaml"))

    # Children appear, each owned by the job (controller, blockOwnerDeletion: the GC waits for them).
    wait_until(lambda: f"{MOPD}-trainer" in c.names("rayjobs"), what="the RayJob")
    wait_until(lambda: c.names("deployments") == sorted(MOPD_TEACHERS), what="the teacher Deployments")
    assert c.names("services") == sorted(MOPD_TEACHERS)
    assert f"{MOPD}-config" in c.names("configmaps")
    uid = c.job(MOPD)["metadata"]["uid"]
    owner = {"apiVersion": API_VERSION, "kind": "DistillationJob", "name": MOPD, "uid": uid,
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    children = [("rayjob", f"{MOPD}-trainer"), ("configmap", f"{MOPD}-config")]
    children += [
        (kind, n) for kind in ("deployment", "service", "poddisruptionbudget") for n in MOPD_TEACHERS
    ]
    for kind, name in children:
        assert c.get(kind, name)["metadata"]["ownerReferences"] == [owner], (kind, name)
    # Each teacher's PodDisruptionBudget selects its Deployment's pods, one of them evictable at a time.
    for name in MOPD_TEACHERS:
        budget = c.get("poddisruptionbudget", name)
        assert budget["spec"]["selector"] == c.deployment(name)["spec"]["selector"]
        assert budget["spec"]["maxUnavailable"] == 1
    wait_until(lambda: c.phase(MOPD) == "StartingTeachers", what="StartingTeachers")
    assert c.status(MOPD)["teachersReady"] == "0/3"
    assert c.status(MOPD)["observedGeneration"] == 1

    # The scheduler binds the teacher pods to the node; each becomes ready when its vLLM server answers
    # /health; the Deployment controller counts it; one by one the teachers are ready.
    for index, teacher in enumerate(("math", "code", "general")):
        c.kubelet.pass_readiness(teacher_labels(MOPD, teacher))
        wait_until(
            lambda i=index: c.status(MOPD).get("teachersReady") == f"{i + 1}/3", what=f"{index + 1}/3 ready"
        )
    wait_until(lambda: c.condition(MOPD, "TeachersReady").get("status") == "True", what="TeachersReady")
    wait_until(lambda: c.phase(MOPD) == "Pending", what="Pending while the trainer starts")

    # KubeRay starts the trainer.
    c.kuberay.initializing(f"{MOPD}-trainer")
    wait_until(lambda: c.condition(MOPD, "TrainerReady").get("reason") == "TrainerStarting", what="starting")
    c.kuberay.running(f"{MOPD}-trainer")
    wait_until(lambda: c.phase(MOPD) == "Running", what="Running")
    assert c.condition(MOPD, "TrainerReady")["status"] == "True"
    assert c.status(MOPD)["startTime"]

    # The runtime reports progress through the status subresource; the operator keeps it.
    progress = {"step": 7, "totalSteps": 500, "loss": 0.25}
    c.kubectl("patch", "dj", MOPD, "--subresource=status", "--type=merge", "-p",
              json.dumps({"status": {"progress": progress}}))  # fmt: skip
    columns = c.kubectl("get", "dj", MOPD)
    header, row = columns.splitlines()
    assert header.split() == ["NAME", "PHASE", "STEP", "STEPS", "TEACHERS", "AGE"]
    assert row.split()[:5] == [MOPD, "Running", "7", "500", "3/3"]

    # KubeRay finishes it: Succeeded, Complete, teachers scaled to zero (their pods go, their GPUs back).
    c.kuberay.finished(f"{MOPD}-trainer", "SUCCEEDED")
    wait_until(lambda: c.phase(MOPD) == "Succeeded", what="Succeeded")
    assert c.condition(MOPD, "Complete")["status"] == "True"
    wait_until(
        lambda: all(c.deployment(n)["spec"]["replicas"] == 0 for n in MOPD_TEACHERS), what="replicas 0"
    )
    wait_until(lambda: c.names("pods") == [], what="the teacher pods gone")
    wait_until(lambda: all(ready_replicas(c, n) == 0 for n in MOPD_TEACHERS), what="no ready replicas")
    status = c.status(MOPD)
    assert status["completionTime"] and status["progress"]["step"] == 7
    assert status["teachersReady"] == "0/3"

    # Events tell the story (kubectl get events, kubectl describe); kubectl sees the phase.
    expected = {"StartingTeachers", "Pending", "Running", "Succeeded", "AllTeachersReady", "RayJobRunning"}
    wait_until(lambda: expected <= {e["reason"] for e in c.events(MOPD)}, what=f"events {expected}")
    described = c.kubectl("describe", "dj", MOPD)
    for text in ("Phase:", "Succeeded", "Conditions:", "Complete", "Events:", "RayJobRunning"):
        assert text in described, text
    assert c.kubectl("get", "dj", MOPD, "-o", "jsonpath={.status.phase}") == "Succeeded"
    # Every write the operator made was accepted the first time (nothing in the log, no ApiError Event).
    assert [e["message"] for e in c.events(MOPD) if e["type"] == "Warning"] == []
    assert "failed" not in c.operator.output()

    # Level-triggered and idempotent: more events change nothing once converged.
    before = len(c.operator_writes())
    seen = c.reconciles("DistillationJob")
    c.kuberay.finished(f"{MOPD}-trainer", "SUCCEEDED")  # KubeRay repeats itself
    c.kubectl("annotate", "dj", MOPD, "touched=yes")
    wait_until(lambda: c.reconciles("DistillationJob") > seen, what="the operator to see the annotation")
    assert c.operator_writes()[before:] == []
    assert c.phase(MOPD) == "Succeeded"


def test_an_idle_job_costs_no_writes(cluster: Cluster) -> None:
    """A colocated and an external teacher's status (no replicas) as the server stores it, with the CRD's
    defaults filled in, is the status the operator decides: once settled, a reconcile writes nothing."""
    c = cluster
    c.kubectl("apply", "-f", str(REPO / "examples" / "colocated-teacher.yaml"))
    c.kubectl("apply", "-f", str(REPO / "examples" / "external-teacher.yaml"))
    for name in ("colocated-teacher", "external-teacher"):
        wait_until(lambda n=name: c.status(n).get("children"), what=f"{name} reconciled")
    wait_until(lambda: c.phase("colocated-teacher") == "Pending", what="Pending")
    wait_until(lambda: c.phase("external-teacher") == "StartingTeachers", what="StartingTeachers")
    # The external teacher's first health check has answered (its status then changes from "not checked
    # yet"): on a loaded machine it came after the writes were counted, and its status write was taken for
    # one of an idle reconcile.
    wait_until(
        lambda: "not checked yet" not in c.status("external-teacher")["teachers"][0].get("message", ""),
        what="the external teacher's first health check",
    )
    assert c.status("colocated-teacher")["teachers"][0]["replicas"] == 0  # the CRD's default, filled in
    before = len(c.operator_writes())
    for name in ("colocated-teacher", "external-teacher"):
        seen = c.reconciles("DistillationJob")
        c.kubectl("annotate", "dj", name, "touched=yes")
        wait_until(lambda s=seen: c.reconciles("DistillationJob") > s, what=f"a reconcile of {name}")
    assert [(w["verb"], w["objectRef"]["name"]) for w in c.operator_writes()[before:]] == []


# ------------------------------------------------------------------------------------------------ suspend


def test_suspend_and_resume(cluster: Cluster) -> None:
    c = cluster
    name, deployment, rayjob = "gkd-jsd", "gkd-jsd-teacher-teacher", "gkd-jsd-trainer"
    c.kubelet.pass_readiness(teacher_labels(name, "teacher"))
    c.kubectl("apply", "-f", str(REPO / "examples" / "gkd.yaml"))
    wait_until(lambda: rayjob in c.names("rayjobs"), what="the RayJob")
    assert c.rayjob(rayjob)["spec"]["suspend"] is False
    wait_until(lambda: ready_replicas(c, deployment) == 1, what="the teacher ready")
    c.kuberay.running(rayjob)
    wait_until(lambda: c.phase(name) == "Running", what="Running")

    c.patch_job(name, {"suspend": True})
    wait_until(lambda: c.rayjob(rayjob)["spec"]["suspend"] is True, what="the RayJob suspended")
    c.kuberay.suspend(rayjob)
    wait_until(lambda: c.phase(name) == "Suspended", what="Suspended")
    wait_until(lambda: c.deployment(deployment)["spec"]["replicas"] == 0, what="the teacher at 0 replicas")
    wait_until(lambda: c.names("pods") == [], what="the teacher's pod gone (its GPUs free)")
    assert c.condition(name, "Suspended")["status"] == "True"
    assert c.condition(name, "SpecApplied")["status"] == "True"  # suspend is a live field
    assert c.status(name)["observedGeneration"] == 2

    c.patch_job(name, {"suspend": False})
    wait_until(lambda: c.rayjob(rayjob)["spec"]["suspend"] is False, what="the RayJob resumed")
    wait_until(lambda: ready_replicas(c, deployment) == 1, what="the teacher ready again")
    wait_until(lambda: c.condition(name, "Suspended").get("status") == "False", what="not suspended")
    wait_until(lambda: c.phase(name) == "Pending", what="Pending until KubeRay runs it again")
    c.kuberay.running(rayjob)
    wait_until(lambda: c.phase(name) == "Running", what="Running again")


# ------------------------------------------------------------------------------------------------ Kueue


def kueue_job(queue: str = "gpu-queue") -> dict[str, Any]:
    """The README's cluster example with the Kueue label its comment shows."""
    doc = example("standalone-teacher.yaml")
    doc["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = queue
    return doc


def test_kueue_admits_the_job_and_the_teachers_wait_for_it(cluster: Cluster) -> None:
    """Kueue cannot run here: the test admits the job as Kueue does, by unsuspending its RayJob.

    Until then the job is Pending, says what it waits for, and its teachers hold no GPUs (0 replicas).
    """
    c = cluster
    name, rayjob, deployment = "qwen-7b-to-1p5b", "qwen-7b-to-1p5b-trainer", "qwen-7b-to-1p5b-teacher-qwen-7b"
    c.kubelet.pass_readiness(teacher_labels(name, "qwen-7b"))
    c.apply(kueue_job())
    wait_until(lambda: rayjob in c.names("rayjobs"), what="the RayJob")
    created = c.rayjob(rayjob)
    assert created["spec"]["suspend"] is True
    assert created["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    teacher = c.deployment(deployment)
    assert "kueue.x-k8s.io/queue-name" not in teacher["metadata"]["labels"]  # Kueue must not queue it
    assert teacher["spec"]["replicas"] == 0  # no GPUs held while the trainer waits
    wait_until(lambda: c.condition(name, "TrainerReady").get("reason") == "Queued", what="Queued")
    message = c.condition(name, "TrainerReady")["message"]
    assert "waiting for Kueue to admit it (queue gpu-queue)" in message
    assert "without Kueue, remove the kueue.x-k8s.io/queue-name label" in message
    assert c.phase(name) == "Pending"
    assert c.condition(name, "TeachersReady")["reason"] == "Queued"
    assert c.names("pods") == []

    # Kueue admits the workload: it unsuspends the RayJob. The teachers start; the operator must not
    # suspend the RayJob again.
    c.kubectl("patch", "rayjob", rayjob, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_until(lambda: c.deployment(deployment)["spec"]["replicas"] == 2, what="the teachers scaled up")
    wait_until(lambda: ready_replicas(c, deployment) == 2, what="both teacher replicas ready")
    c.kuberay.running(rayjob)
    wait_until(lambda: c.phase(name) == "Running", what="Running")
    assert c.rayjob(rayjob)["spec"]["suspend"] is False

    # A node drain evicts through the Eviction API, which honours the teacher's PodDisruptionBudget (the
    # real disruption controller counts its healthy pods): one replica may go, the second may not until
    # the first is back, so a drain never takes both of a teacher's replicas at once.
    wait_until(
        lambda: c.get("poddisruptionbudget", deployment).get("status", {}).get("disruptionsAllowed") == 1,
        what="the budget to allow one disruption",
    )
    first, second = sorted(p["metadata"]["name"] for p in c.pods(teacher_labels(name, "qwen-7b")))
    assert c.evict(first) == 201
    assert c.evict(second) == 429  # TooManyRequests: the budget is spent
    wait_until(lambda: ready_replicas(c, deployment) == 2, what="the evicted replica replaced and ready")

    # Suspending the DistillationJob does force the RayJob's suspend.
    c.patch_job(name, {"suspend": True})
    wait_until(lambda: c.rayjob(rayjob)["spec"]["suspend"] is True, what="the RayJob suspended")


def test_without_kueue_removing_the_label_starts_the_job(cluster: Cluster) -> None:
    """What the Queued message advises on a cluster without Kueue (nothing admits the job): remove the label."""
    c = cluster
    name, rayjob, deployment = "qwen-7b-to-1p5b", "qwen-7b-to-1p5b-trainer", "qwen-7b-to-1p5b-teacher-qwen-7b"
    c.apply(kueue_job())
    wait_until(lambda: c.condition(name, "TrainerReady").get("reason") == "Queued", what="Queued")
    c.kubectl("label", "dj", name, "kueue.x-k8s.io/queue-name-")
    wait_until(lambda: c.rayjob(rayjob)["spec"]["suspend"] is False, what="the RayJob unsuspended")
    wait_until(lambda: c.deployment(deployment)["spec"]["replicas"] == 2, what="the teachers scaled up")
    wait_until(lambda: c.phase(name) == "StartingTeachers", what="StartingTeachers")


# ------------------------------------------------------------------------------------------------ spec changes


def test_spec_changes_live_and_refused(cluster: Cluster) -> None:
    c = cluster
    c.kubectl("apply", "-f", str(REPO / "examples" / "multi-teacher.yaml"))
    wait_until(lambda: f"{MOPD}-trainer" in c.names("rayjobs"), what="the RayJob")
    config = f"{MOPD}-config"
    config_before = c.get("configmap", config)["data"]

    # Replicas are live: the Deployment follows.
    teachers = c.job(MOPD)["spec"]["teachers"]
    teachers[0]["replicas"] = 3
    c.patch_job(MOPD, {"teachers": teachers})
    wait_until(lambda: c.deployment(MOPD_TEACHERS[0])["spec"]["replicas"] == 3, what="3 replicas")
    wait_until(lambda: c.status(MOPD).get("observedGeneration") == 2, what="generation 2")
    assert c.condition(MOPD, "SpecApplied")["status"] == "True"

    # The loss is not: refused with the field paths, nothing half-applied.
    c.patch_job(MOPD, {"loss": {"mode": "forward_kl_topk", "topK": 16}})
    wait_until(lambda: c.condition(MOPD, "SpecApplied").get("status") == "False", what="SpecApplied False")
    cond = c.condition(MOPD, "SpecApplied")
    assert cond["reason"] == "SpecChangeRefused"
    assert "spec.loss.mode" in cond["message"] and "spec.loss.topK" in cond["message"]
    assert c.status(MOPD)["observedGeneration"] == 3
    config_after = c.get("configmap", config)["data"]
    assert '"mode":"k3"' in config_after["runtime-config.json"]
    assert config_before != config_after  # the live replicas change was recorded
    warnings = wait_until(
        lambda: [e for e in c.events(MOPD) if e["reason"] == "SpecChangeRefused"], what="a Warning Event"
    )
    assert warnings[0]["type"] == "Warning" and "spec.loss.topK" in warnings[0]["message"]
    assert "SpecChangeRefused" in c.kubectl("describe", "dj", MOPD)

    # A change the CRD refuses never reaches the operator: the server names the field.
    refused = c.installation.admin(
        "patch", "dj", MOPD, "-n", c.namespace, "--type=merge", "-p", '{"spec":{"loss":{"topK":0}}}',
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "spec.loss.topK" in refused.stderr

    # Reverting the refused change clears the condition.
    c.patch_job(MOPD, {"loss": {"mode": "k3", "topK": None}})
    wait_until(lambda: c.condition(MOPD, "SpecApplied").get("status") == "True", what="SpecApplied True")


def test_a_label_key_the_children_would_refuse_is_refused_at_apply(cluster: Cluster) -> None:
    """`spec.labels` go onto every child: a key the API server would refuse there is refused with the job,
    naming the field, so nothing is half-created. (It used to pass the CRD and leave the job with a 422 on
    its first child; the operator's handling of API errors is tested with injected faults in
    tests/operator/test_operator_e2e.py.)"""
    c = cluster
    job = example("gkd.yaml")
    job["spec"]["labels"] = {"team name": "ml"}
    refused = c.kubectl("apply", "-f", "-", input=yaml_stream([job]), check=False)
    assert "spec.labels" in refused and "keys must be label keys" in refused, refused
    assert c.job("gkd-jsd") is None and c.names("rayjobs") == [] and c.names("deployments") == []

    job["spec"]["labels"] = {"example.com/team": "ml"}
    c.apply(job)
    wait_until(lambda: "gkd-jsd-trainer" in c.names("rayjobs"), what="the RayJob")
    assert c.deployment("gkd-jsd-teacher-teacher")["metadata"]["labels"]["example.com/team"] == "ml"


# ------------------------------------------------------------------------------------------------ drift


def test_edited_or_deleted_children_are_put_back(cluster: Cluster) -> None:
    c = cluster
    name, deployment, rayjob = "gkd-jsd", "gkd-jsd-teacher-teacher", "gkd-jsd-trainer"
    c.kubectl("apply", "-f", str(REPO / "examples" / "gkd.yaml"))
    wait_until(lambda: rayjob in c.names("rayjobs"), what="the RayJob")
    wait_until(lambda: c.phase(name) == "StartingTeachers", what="StartingTeachers")
    original = c.deployment(deployment)["spec"]["template"]["spec"]["containers"][0]
    service_ports = c.get("service", deployment)["spec"]["ports"]
    config = c.get("configmap", f"{name}-config")["data"]
    entrypoint = c.rayjob(rayjob)["spec"]["entrypoint"]

    # Someone sets another image on the teacher (kubectl set image; the spec-hash annotation stays).
    c.kubectl("set", "image", f"deployment/{deployment}", "teacher=someone/else:latest")
    wait_until(
        lambda: (
            c.deployment(deployment)["spec"]["template"]["spec"]["containers"][0]["image"]
            == original["image"]
        ),
        what="the image put back",
    )
    # ... edits its command, the Service's port, the runtime config and the trainer's entrypoint.
    command = '[{"op":"replace","path":"/spec/template/spec/containers/0/command/1","value":"-c"}]'
    c.kubectl("patch", "deployment", deployment, "--type=json", "-p", command)
    c.kubectl("patch", "service", deployment, "--type=json", "-p",
              '[{"op":"replace","path":"/spec/ports/0/port","value":9000}]')  # fmt: skip
    c.kubectl("patch", "configmap", f"{name}-config", "--type=merge", "-p",
              '{"data":{"runtime-config.json":"{}"}}')  # fmt: skip
    c.kubectl("patch", "rayjob", rayjob, "--type=merge", "-p", '{"spec":{"entrypoint":"sleep infinity"}}')
    wait_until(
        lambda: (
            c.deployment(deployment)["spec"]["template"]["spec"]["containers"][0]["command"]
            == original["command"]
        ),
        what="the command put back",
    )
    wait_until(lambda: c.get("service", deployment)["spec"]["ports"] == service_ports, what="the port back")
    wait_until(lambda: c.get("configmap", f"{name}-config")["data"] == config, what="the config back")
    wait_until(lambda: c.rayjob(rayjob)["spec"]["entrypoint"] == entrypoint, what="the entrypoint back")

    # Someone deletes the teacher's Deployment: it is made again.
    first_uid = c.deployment(deployment)["metadata"]["uid"]
    c.kubectl("delete", "deployment", deployment)
    wait_until(
        lambda: (
            (c.get("deployment", deployment) or {}).get("metadata", {}).get("uid") not in (None, first_uid)
        ),
        what="the Deployment made again",
    )

    # What others may change is not fought over: a label added, a pod-template annotation (kubectl rollout
    # restart), the fields the API server fills in. The operator sees those edits and writes nothing.
    wait_until(
        lambda: c.status(name)["teachers"][0]["message"] == "0/1 replicas ready", what="the status settled"
    )
    # ... and the operator's writes for the Deployment made again, which the status settling does not bound
    # (CI on 2026-12-01 counted one more status patch of the job after it): none for 3 s before the edits.
    wait_until(c.writes_quiet(3.0), what="the operator's writes to stop")
    before = len(c.operator_writes())
    seen = c.reconciles("Deployment")
    c.kubectl("label", "deployment", deployment, "owner=platform-team")
    c.kubectl("rollout", "restart", f"deployment/{deployment}")
    wait_until(lambda: c.reconciles("Deployment") >= seen + 2, what="the operator to see both edits")
    seen = c.reconciles("DistillationJob")
    c.kubectl("annotate", "dj", name, "touched=yes")
    wait_until(lambda: c.reconciles("DistillationJob") > seen, what="a reconcile of the job")
    assert [(w["verb"], w["objectRef"]["resource"]) for w in c.operator_writes()[before:]] == []
    assert c.deployment(deployment)["metadata"]["labels"]["owner"] == "platform-team"


# ------------------------------------------------------------------------------------------------ deletion


def test_delete_cascades_through_the_garbage_collector_and_nothing_is_recreated(cluster: Cluster) -> None:
    c = cluster
    c.kubelet.pass_readiness({"app.kubernetes.io/instance": MOPD})
    path = str(REPO / "examples" / "multi-teacher.yaml")
    c.kubectl("apply", "-f", path)
    wait_until(lambda: f"{MOPD}-trainer" in c.names("rayjobs"), what="the RayJob")
    wait_until(lambda: c.status(MOPD).get("teachersReady") == "3/3", what="the teachers ready")
    assert len(c.names("pods")) == 3
    assert c.names("poddisruptionbudgets") == sorted(MOPD_TEACHERS)

    created = len(c.operator_writes())
    c.kubectl("delete", "-f", path, "--wait=true")
    assert c.job(MOPD) is None
    for resource in ("deployments", "replicasets", "pods", "services", "poddisruptionbudgets", "rayjobs"):
        wait_until(lambda r=resource: c.names(r) == [], what=f"the GC to delete the {resource}")
    wait_until(lambda: f"{MOPD}-config" not in c.names("configmaps"), what="the GC to delete the ConfigMap")
    # The operator saw the job and its children go and made none again. (Which event a deletion's
    # reconcile is counted under depends on the order the watches deliver them: either is a deletion.)
    wait_until(
        lambda: (
            c.reconciles("Deployment", result="deleted") + c.reconciles("DistillationJob", result="deleted")
            > 0
        ),
        what="the deletions seen",
    )
    assert [w for w in c.operator_writes() if w["verb"] == "create"] == [
        w for w in c.operator_writes()[:created] if w["verb"] == "create"
    ]
    assert c.names("deployments") == [] and c.names("rayjobs") == []


def test_a_pod_no_node_admits_is_named_until_a_node_does(cluster: Cluster) -> None:
    """The real scheduler finds no node for the teacher's pod (its pool selects a label no node has): the
    job says which pod waits and the scheduler's reason (PodsScheduled, the phase's message, a Warning
    Event) instead of waiting in silence; once the node gets the label, the pod is placed and it clears."""
    c = cluster
    name, selector = "gkd-jsd", {"distillery.io/test-pool": "a100"}
    job = example("gkd.yaml")
    job["spec"]["teachers"][0].setdefault("pool", {})["nodeSelector"] = selector
    c.apply(job)
    wait_until(
        lambda: c.condition(name, "PodsScheduled").get("status") == "False", timeout=60,
        what="PodsScheduled False",
    )  # fmt: skip
    cond = c.condition(name, "PodsScheduled")
    assert cond["reason"] == "Unschedulable"
    assert f"pod {name}-teacher-teacher-" in cond["message"] and "(teacher)" in cond["message"]
    assert "node affinity/selector" in cond["message"], cond["message"]
    assert c.status(name)["message"].startswith("waiting for a node: pod "), c.status(name)["message"]
    wait_until(
        lambda: any(e["reason"] == "Unschedulable" and e["type"] == "Warning" for e in c.events(name)),
        what="a Warning Event",
    )

    body = {"metadata": {"labels": selector}}
    kubernetes.client.CoreV1Api(c.client).patch_node(c.kubelet.node, body)
    wait_until(
        lambda: c.condition(name, "PodsScheduled").get("status") == "True", timeout=60,
        what="PodsScheduled True once a node has the label",
    )  # fmt: skip
    assert not c.status(name)["message"].startswith("waiting for a node")
