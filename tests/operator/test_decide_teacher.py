"""A DistillationTeacher's decision (`distillery_operator.teachers.decide`), pure: its objects at the replicas
the scaling rules choose, the Event of each change, the finalizer while active jobs use it, its status."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml
from distillery_operator.observe.summaries import SUMMARIZERS, Child
from distillery_operator.render import ClusterSettings
from distillery_operator.teachers.decide import FINALIZER, TeacherDecision, TeacherUse, decide_teacher

from distillery.plan.access.auth import key_digest
from distillery.plan.teachers.scaling import ReplicaLoad

REPO = Path(__file__).resolve().parents[2]
NOW = "2026-11-28T12:00:00Z"


WITHOUT_POLICIES = ClusterSettings(network_policy=None)


def decide(body: dict[str, Any], **kwargs: Any) -> TeacherDecision:
    """The decision with the chart's NetworkPolicies off: the tests of scaling see only its Deployment and
    Service (`test_its_network_policy_is_made_first_and_repaired` has the policy)."""
    return decide_teacher(body, **{"cluster": WITHOUT_POLICIES, **kwargs})


def teacher_body(**scaling: Any) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((REPO / "examples" / "teachers" / "qwen-7b.yaml").read_text())
    body["metadata"].update({"namespace": "ns", "uid": "uid-1", "generation": 1})
    body["spec"]["scaling"].update(scaling)
    return body


def made(decision: Any) -> dict[str, Child]:
    """The objects the decision creates, as their watch would summarise them."""
    return {
        a.kind: SUMMARIZERS[a.kind](copy.deepcopy(a.body)) for a in decision.actions if a.verb == "create"
    }


def test_an_unused_teacher_at_min_zero_is_made_at_zero_replicas_with_its_endpoint() -> None:
    decision = decide(
        teacher_body(), deployment=None, service=None, uses=[], loads=[], idle_for_seconds=0, now=NOW
    )
    assert [(a.verb, a.kind, a.name) for a in decision.actions] == [
        ("create", "Service", "qwen-7b"),
        ("create", "Deployment", "qwen-7b"),
    ]
    deployment = decision.actions[1].body
    assert deployment["spec"]["replicas"] == 0
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert decision.status.endpoint == "http://qwen-7b.ns.svc:8000" and decision.status.jobs == []
    assert decision.finalizers is None and decision.events == []
    ready = next(c for c in decision.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "ScaledToZero")


def test_the_first_active_job_scales_it_from_zero_and_puts_the_finalizer_on() -> None:
    body = teacher_body()
    children = made(
        decide(body, deployment=None, service=None, uses=[], loads=[], idle_for_seconds=0, now=NOW)
    )
    uses = [TeacherUse("a", active=True), TeacherUse("old", active=False)]
    decision = decide(
        body,
        deployment=children["Deployment"],
        service=children["Service"],
        uses=uses,
        loads=[],
        idle_for_seconds=0,
        now=NOW,
    )
    assert [(a.verb, a.body) for a in decision.actions] == [("patch", {"spec": {"replicas": 1}})]
    assert [(e.reason, e.message) for e in decision.events] == [
        ("ScaledFromZero", "replicas 0 -> 1: 1 active job referencing the teacher")
    ]
    assert decision.finalizers == [FINALIZER]
    assert decision.status.jobs == ["a"] and decision.status.replicas == 1


def test_when_its_last_job_ends_the_finalizer_goes_and_after_the_idle_time_its_replicas() -> None:
    body = teacher_body(idleSeconds=60)
    body["metadata"]["finalizers"] = ["other", FINALIZER]
    children = made(
        decide(body, deployment=None, service=None, uses=[], loads=[], idle_for_seconds=0, now=NOW)
    )
    deployment = Child(
        "Deployment",
        "qwen-7b",
        "uid-1",
        children["Deployment"].spec_hash,
        {"replicas": 2, "readyReplicas": 2},
        children["Deployment"].owned,
    )
    idle = [ReplicaLoad(), ReplicaLoad()]
    kept = decide(
        body,
        deployment=deployment,
        service=children["Service"],
        uses=[TeacherUse("a", False)],
        loads=idle,
        idle_for_seconds=30,
        now=NOW,
    )
    assert kept.finalizers == ["other"] and kept.status.replicas == 2 and kept.actions == []
    down = decide(
        body,
        deployment=deployment,
        service=children["Service"],
        uses=[],
        loads=idle,
        idle_for_seconds=61,
        now=NOW,
    )
    assert [a.body for a in down.actions] == [{"spec": {"replicas": 0}}]
    assert [e.reason for e in down.events] == ["Idle"]


def test_a_teacher_being_deleted_makes_nothing_again_but_keeps_serving_its_jobs() -> None:
    body = teacher_body()
    body["metadata"]["deletionTimestamp"] = NOW
    body["metadata"]["finalizers"] = [FINALIZER]
    decision = decide(
        body,
        deployment=None,
        service=None,
        uses=[TeacherUse("a", True)],
        loads=[],
        idle_for_seconds=0,
        now=NOW,
    )
    assert decision.actions == [] and decision.finalizers is None
    in_use = next(c for c in decision.status.conditions if c.type == "InUse")
    assert in_use.status == "True" and in_use.message == "used by a; deleting it waits until they end"


def test_an_edited_deployment_is_put_back() -> None:
    body = teacher_body()
    children = made(
        decide(body, deployment=None, service=None, uses=[], loads=[], idle_for_seconds=0, now=NOW)
    )
    edited = SUMMARIZERS["Deployment"](
        {
            **copy.deepcopy(
                decide(body, deployment=None, service=None, uses=[], loads=[], idle_for_seconds=0, now=NOW)
                .actions[1]
                .body
            ),
            "metadata": {"name": "qwen-7b", "annotations": {"distillery.io/spec-hash": "x"}},
        }
    )
    decision = decide(
        body, deployment=edited, service=children["Service"], uses=[], loads=[], idle_for_seconds=0, now=NOW
    )
    assert [(a.verb, a.kind, a.why) for a in decision.actions] == [
        ("patch", "Deployment", "drift: spec-hash")
    ]


def test_an_invalid_teacher_makes_nothing_and_says_why() -> None:
    body = teacher_body()
    body["spec"]["scaling"] = {"minReplicas": 3, "maxReplicas": 1}
    decision = decide(body, deployment=None, service=None, uses=[], loads=[], idle_for_seconds=0, now=NOW)
    assert decision.actions == []
    valid = next(c for c in decision.status.conditions if c.type == "Valid")
    assert valid.status == "False" and "spec.scaling.minReplicas" in valid.message


def test_with_an_hpa_the_deployment_is_made_at_min_replicas_and_its_count_left_alone() -> None:
    body = teacher_body(minReplicas=1)
    first = decide(
        body,
        deployment=None,
        service=None,
        uses=[],
        loads=[],
        idle_for_seconds=0,
        now=NOW,
        replicas_by_hpa=True,
    )
    children = made(first)
    assert first.actions[1].body["spec"]["replicas"] == 1
    scaled = Child(
        "Deployment",
        "qwen-7b",
        "uid-1",
        children["Deployment"].spec_hash,
        {"replicas": 4, "readyReplicas": 4},
        children["Deployment"].owned,
    )
    later = decide(
        body,
        deployment=scaled,
        service=children["Service"],
        uses=[TeacherUse("a", True)],
        loads=[],
        idle_for_seconds=10_000,
        now=NOW,
        replicas_by_hpa=True,
    )
    assert later.actions == [] and later.events == [] and later.status.replicas == 4


def test_its_network_policy_is_made_first_and_repaired() -> None:
    """On by default: the policy before the replicas it selects, left alone once made, put back when edited."""
    body = teacher_body()
    first = decide_teacher(
        body, deployment=None, service=None, uses=[], loads=[], idle_for_seconds=0, now=NOW
    )
    assert [(a.verb, a.kind) for a in first.actions] == [
        ("create", "NetworkPolicy"),
        ("create", "Service"),
        ("create", "Deployment"),
    ]
    children = made(first)
    seen = {"deployment": children["Deployment"], "service": children["Service"], "uses": [], "loads": []}
    steady = decide_teacher(
        body, **seen, network_policy=children["NetworkPolicy"], idle_for_seconds=0, now=NOW
    )
    assert steady.actions == []
    policy = first.actions[0].body
    opened = copy.deepcopy(policy)
    # Someone lets every pod in where only the jobs' heads were. (A rule added beside ours is not drift,
    # as for any list the operator renders: whoever may edit a policy may as well add one of their own.)
    opened["spec"]["ingress"][0]["from"] = [{"podSelector": {}}]
    edited = SUMMARIZERS["NetworkPolicy"](opened)
    repaired = decide_teacher(body, **seen, network_policy=edited, idle_for_seconds=0, now=NOW)
    assert [(a.verb, a.kind) for a in repaired.actions] == [("patch", "NetworkPolicy")]
    assert repaired.actions[0].body["spec"] == policy["spec"]


def test_its_clients_secret_holds_the_digests_of_its_active_jobs_keys_and_its_replicas_mount_it() -> None:
    uses = [TeacherUse("a", active=True, uid="u-a"), TeacherUse("b", active=False, uid="u-b")]
    clients = {"ns/a": key_digest("key-of-a")}
    decision = decide(
        teacher_body(),
        deployment=None,
        service=None,
        uses=uses,
        clients=clients,
        loads=[],
        idle_for_seconds=0,
        now=NOW,
    )
    secret = decision.clients
    assert secret is not None and secret["metadata"]["name"] == "qwen-7b-clients"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # deleted with the teacher
    document = yaml.safe_load(base64.b64decode(secret["data"]["clients.json"]))
    assert document == {"jobs": {"ns/a": key_digest("key-of-a")}}
    assert "key-of-a" not in str(secret)  # digests only
    deployment = next(a.body for a in decision.actions if a.kind == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    # The server reads its clients from the file; it has no key of its own to take instead.
    assert env["DISTILLERY_TEACHER_CLIENTS"]["value"] == "/etc/distillery/clients/clients.json"
    assert "VLLM_API_KEY" not in env
    volume = next(v for v in pod["volumes"] if v["name"] == "teacher-clients")
    assert volume["secret"] == {"secretName": "qwen-7b-clients"}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "teacher-clients")
    assert mount == {"name": "teacher-clients", "mountPath": "/etc/distillery/clients", "readOnly": True}


def test_the_same_clients_give_the_same_secret_whatever_their_order() -> None:
    def secret(clients: dict[str, str]) -> Any:
        return decide(
            teacher_body(),
            deployment=None,
            service=None,
            uses=[],
            clients=clients,
            loads=[],
            idle_for_seconds=0,
            now=NOW,
        ).clients

    a, b = {"ns/a": "00" * 32}, {"ns/b": "11" * 32}
    assert secret({**a, **b}) == secret({**b, **a}) != secret(a)
