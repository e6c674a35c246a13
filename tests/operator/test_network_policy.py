"""NetworkPolicies as rendered, without an API server (`distillery.plan.access.network` decides the flows,
`render/network_policy.py` translates them): on by default, one per pod group of every example and variant,
every pod the job renders isolated, each rule the translation of one flow; the flows of a colocated,
standalone, external and shared-teacher job; a DistillationTeacher's policy lets in the heads of the jobs
that reference it and no other pod of theirs; docs/security.md shows the same table.
(`tests/cluster/test_network_policy_on_server.py` has a real API server accept them;
`tests/workloads/test_network_policy_on_node.py` has a real enforcer drop what they deny.)"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from pathlib import Path
from typing import Any

import pytest
from distillery_operator import naming
from distillery_operator.reconcile.controller import cluster_network_policy
from distillery_operator.render import (
    ClusterSettings,
    RenderContext,
    job_pod_selector,
    pod_templates,
    render_job,
    render_shared_teacher,
    render_shared_teacher_policy,
)

from distillery.api import DistillationJob, DistillationTeacher
from distillery.plan.access.network import (
    DASHBOARD,
    DEFAULT_NETWORK_POLICY,
    RAY_METRICS,
    RUNTIME_METRICS,
    TEACHER,
    Flow,
    NetworkPolicySettings,
    Outside,
    Peer,
    Pods,
    job_flows,
    job_pods,
    shared_teacher_flows,
)
from distillery.validation import load_jobs, load_manifests

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "tests" / "golden" / "variants.yaml"]
JOBS = [job for source in SOURCES for job in load_jobs(source)]
BY_NAME = {job.metadata.name: job for job in JOBS}
SETTINGS = NetworkPolicySettings(
    kuberay=Peer("ray-operators"),
    operator=Peer("platform", {"app": "distillery-operator"}),
    monitoring=Peer("prom", {"app": "prometheus"}),
)
ON = RenderContext(namespace="ns", cluster=ClusterSettings(network_policy=SETTINGS))


def policies(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "NetworkPolicy"]


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return selector.items() <= labels.items()


def templates_by_role(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """Pod labels by role: head, worker, submitter, teacher."""
    out: dict[str, list[dict[str, str]]] = {}
    for where, template in pod_templates(objects):
        part = where.rsplit(":", 1)[1]
        role = "worker" if part.startswith("worker") else "teacher" if part == "pod" else part
        out.setdefault(role, []).append(template["metadata"]["labels"])
    return out


@pytest.mark.parametrize("job", JOBS, ids=lambda job: job.metadata.name)
def test_on_by_default_every_pod_isolated_and_made_first(job: DistillationJob) -> None:
    default = policies(render_job(job, RenderContext(namespace="ns")))
    assert len(default) == len(job_pods(job.spec))
    off = RenderContext(namespace="ns", cluster=ClusterSettings(network_policy=None))
    assert policies(render_job(job, off)) == []
    objects = render_job(job, ON)
    rendered = policies(objects)
    names = {p["metadata"]["name"] for p in rendered}
    assert naming.network_policy_name(job.metadata.name) in names  # the Ray pods': the name of old
    selectors = [p["spec"]["podSelector"]["matchLabels"] for p in rendered]
    for where, template in pod_templates(objects):
        labels = template["metadata"]["labels"]
        assert any(selects(s, labels) for s in selectors), (where, labels)  # nothing left open
    for policy in rendered:
        assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress open: models, data, external teachers
    # Every selector selects some pod of the job (none is a typo that isolates nothing).
    pods = [t["metadata"]["labels"] for _, t in pod_templates(objects)]
    assert all(any(selects(s, labels) for labels in pods) for s in selectors)
    kinds = [o["kind"] for o in objects]
    last_policy = max(i for i, kind in enumerate(kinds) if kind == "NetworkPolicy")
    assert last_policy < min(kinds.index(kind) for kind in ("RayJob", "Deployment") if kind in kinds)


@pytest.mark.parametrize("job", JOBS, ids=lambda job: job.metadata.name)
def test_each_rule_is_one_flow_translated(job: DistillationJob) -> None:
    name = job.metadata.name
    rendered = {p["metadata"]["name"]: p["spec"] for p in policies(render_job(job, ON))}
    flows = job_flows(job.spec)
    for pods in job_pods(job.spec):
        spec = rendered[naming.network_policy_name(name, "" if pods == Pods.RAY else pods.value)]
        assert spec["podSelector"] == {"matchLabels": job_pod_selector(name, pods)}
        into = [f for f in flows if f.target == pods]
        assert len(spec["ingress"]) == len(into)
        for rule, flow in zip(spec["ingress"], into, strict=True):
            (peer,) = rule["from"]
            if isinstance(flow.source, Outside):
                outside = SETTINGS.peer(flow.source)
                namespace = {"kubernetes.io/metadata.name": outside.namespace}
                assert peer["namespaceSelector"] == {"matchLabels": namespace}
                assert peer.get("podSelector", {}).get("matchLabels", {}) == outside.pod_labels
            else:
                assert peer == {"podSelector": {"matchLabels": job_pod_selector(name, flow.source)}}
            ports = [p["port"] for p in rule.get("ports", [])]
            assert ports == [p.number for p in flow.ports]
            assert all(p["protocol"] == "TCP" for p in rule.get("ports", []))


def _table(flows: tuple[Flow, ...]) -> set[tuple[str, str, tuple[int, ...]]]:
    return {(str(f.source), str(f.target), tuple(p.number for p in f.ports)) for f in flows}


RAY_BASE = {
    ("ray", "ray", ()),  # Ray among itself: every port (GCS 6379, client 10001, ports Ray picks)
    ("submitter", "ray-head", (8265,)),
    ("kuberay", "ray-head", (8265,)),
    ("monitoring", "ray-head", (9100,)),
    ("monitoring", "ray", (8080,)),
}
WITH_TEACHERS = {("ray-head", "teachers", (8000,)), ("monitoring", "teachers", (8000,))}


@pytest.mark.parametrize(
    ("example", "expected"),
    [
        ("colocated-teacher", RAY_BASE),  # the teacher runs inside the Ray pods: nothing more
        ("external-teacher", RAY_BASE),  # egress only, which stays open
        ("shared-teacher", RAY_BASE),  # the teacher's own policy lets the head in
        ("standalone-teacher", RAY_BASE | WITH_TEACHERS),
    ],
)
def test_the_flows_of_each_placement(example: str, expected: set[Any]) -> None:
    (job,) = load_jobs(ROOT / "examples" / f"{example}.yaml")
    assert _table(job_flows(job.spec)) == expected
    assert (Pods.TEACHERS in job_pods(job.spec)) == (expected == RAY_BASE | WITH_TEACHERS)
    # The ports the policies name are the ones the pods serve.
    assert {DASHBOARD.number, RAY_METRICS.number, RUNTIME_METRICS.number, TEACHER.number} == {
        8265,
        8080,
        9100,
        8000,
    }


def test_the_head_alone_carries_the_shared_teachers_client_labels() -> None:
    (job,) = load_jobs(ROOT / "examples" / "shared-teacher.yaml")
    refs = {t.teacher_ref.name for t in job.spec.teachers if t.teacher_ref is not None}
    assert refs
    roles = templates_by_role(render_job(job, ON))
    (head,) = roles["head"]
    for ref in refs:
        assert head[naming.teacher_client_label(ref)] == "true"
    for role in ("worker", "submitter"):
        for labels in roles[role]:
            assert not any(k.startswith(naming.TEACHER_CLIENT_PREFIX) for k in labels), (role, labels)
    assert head[naming.RAY_NODE_LABEL] == "head"
    assert all(labels[naming.RAY_NODE_LABEL] == "worker" for labels in roles["worker"])


def test_a_shared_teachers_policy_lets_in_its_jobs_heads_only() -> None:
    (job,) = load_jobs(ROOT / "examples" / "shared-teacher.yaml")
    _, (teacher,) = load_manifests(ROOT / "examples" / "teachers" / "qwen-7b.yaml")
    assert isinstance(teacher, DistillationTeacher)
    policy = render_shared_teacher_policy(teacher, namespace="ns", owner_uid="u", cluster=ON.cluster)
    assert policy is not None
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "DistillationTeacher"
    assert policy["metadata"]["name"] == naming.shared_teacher_policy_name(teacher.metadata.name)
    deployment, _ = render_shared_teacher(teacher, namespace="ns", replicas=1)
    replica = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"]["matchLabels"], replica)
    clients, operator, monitoring = policy["spec"]["ingress"]
    assert _table(shared_teacher_flows()) == {
        ("teacher-clients", "shared-teacher", (8000,)),
        ("operator", "shared-teacher", (8000,)),
        ("monitoring", "shared-teacher", (8000,)),
    }
    client_selector = clients["from"][0]["podSelector"]["matchLabels"]
    referencing = templates_by_role(render_job(job, ON))
    assert selects(client_selector, referencing["head"][0])
    assert not any(
        selects(client_selector, labels) for labels in referencing["worker"] + referencing["submitter"]
    )
    other = BY_NAME["standalone-teacher"] if "standalone-teacher" in BY_NAME else JOBS[0]
    assert not any(
        selects(client_selector, labels)
        for labels in chain.from_iterable(templates_by_role(render_job(other, ON)).values())
    )
    assert operator["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "platform"}},
            "podSelector": {"matchLabels": {"app": "distillery-operator"}},
        }
    ]
    assert monitoring["from"][0]["podSelector"] == {"matchLabels": {"app": "prometheus"}}
    off = ClusterSettings(network_policy=None)
    assert render_shared_teacher_policy(teacher, namespace="ns", cluster=off) is None
    # A DistillationTeacher's policy never selects a job's pods, nor a job's its replicas.
    for labels in chain.from_iterable(referencing.values()):
        assert not selects(policy["spec"]["podSelector"]["matchLabels"], labels)
    for job_policy in policies(render_job(job, ON)):
        assert not selects(job_policy["spec"]["podSelector"]["matchLabels"], replica)


def test_a_long_teacher_name_gives_a_valid_label() -> None:
    label = naming.teacher_client_label("t" * 60 + ".x" * 30)
    prefix, name = label.split("/")
    assert prefix == "distillery.io" and len(name) <= 63 and name[-1].isalnum()


def test_the_settings_from_the_charts_variable() -> None:
    assert cluster_network_policy({}) == DEFAULT_NETWORK_POLICY  # on, where nothing says otherwise
    assert cluster_network_policy({"DISTILLERY_NETWORK_POLICY": "off"}) is None
    parsed = cluster_network_policy(
        {
            "DISTILLERY_NETWORK_POLICY": '{"kuberay": {"namespace": "a"}, "monitoring": {"podLabels": {"x": "y"}}}'
        }
    )
    assert parsed == NetworkPolicySettings(
        kuberay=Peer("a"), operator=DEFAULT_NETWORK_POLICY.operator, monitoring=Peer("monitoring", {"x": "y"})
    )
    for bad, message in (
        ("kuberay=a,monitoring=b", "neither `off` nor a JSON object"),
        ('{"prometheus": {}}', "a JSON object of kuberay, operator, monitoring only"),
        ('{"operator": {"podLabels": {"a": 1}}}', "operator: namespace must be a string"),
    ):
        with pytest.raises(ValueError, match="DISTILLERY_NETWORK_POLICY=.*" + message.replace("`", ".")):
            cluster_network_policy({"DISTILLERY_NETWORK_POLICY": bad})


WHO = {
    Pods.RAY: "the job's Ray pods (head and workers)",
    Pods.RAY_HEAD: "the job's Ray head (the driver)",
    Pods.SUBMITTER: "KubeRay's submitter pod",
    Pods.TEACHERS: "the job's standalone teachers",
    Pods.SHARED_TEACHER: "a DistillationTeacher's replicas",
    Pods.TEACHER_CLIENTS: "the heads of the jobs that reference it",
    Outside.KUBERAY: "KubeRay's operator (`networkPolicy.kuberayNamespace`)",
    Outside.OPERATOR: "Distillery's operator (its release namespace and pod labels)",
    Outside.MONITORING: "Prometheus (`networkPolicy.monitoringNamespace`, `.monitoringPodLabels`)",
}


def flows_table() -> str:
    """docs/security.md's table of flows, from the plan: every flow of a job with standalone teachers, then
    a shared teacher's."""
    (job,) = load_jobs(ROOT / "examples" / "standalone-teacher.yaml")
    rows = ["| from | to | TCP ports | why |", "| --- | --- | --- | --- |"]
    for flow in (*job_flows(job.spec), *shared_teacher_flows()):
        ports = ", ".join(f"{p.number} ({p.name})" for p in flow.ports) or "all"
        rows.append(f"| {WHO[flow.source]} | {WHO[flow.target]} | {ports} | {flow.why} |")
    return "\n".join(rows)


def test_docs_show_the_plans_table() -> None:
    docs = (ROOT / "docs" / "security.md").read_text()
    assert flows_table() in docs, "docs/security.md 'Network' must hold this table:\n" + flows_table()
