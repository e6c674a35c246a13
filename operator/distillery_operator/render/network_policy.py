"""NetworkPolicies from the flows table (`distillery.plan.access.network`): one per pod group of a job, one for a
DistillationTeacher's replicas.

Each policy selects one `Pods` group by labels the operator sets and a job's podLabels cannot (everything
under distillery.io/ and app.kubernetes.io/), isolates it for ingress, and lets in exactly the flows whose
target it is: a job's own pods by their labels in the job's namespace, KubeRay's operator, Distillery's and
Prometheus by namespace (and pod labels where the chart gives them). A group no flow reaches (KubeRay's
submitter) gets a policy with no rule: nothing may connect to it. Egress is left open (the plan says why).

The policies need a CNI that enforces NetworkPolicy; without one they are stored and do nothing
(docs/security.md "Network"). They are made before any pod they select, and never deleted by the
operator: a job's go with the job (owner references), a teacher's with the teacher.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from distillery.api import DistillationJob
from distillery.plan.access.network import (
    Flow,
    NetworkPolicySettings,
    Outside,
    Peer,
    Pods,
    job_flows,
    job_pods,
    shared_teacher_flows,
    shared_teachers_used,
)
from distillery_operator import naming
from distillery_operator.render.common import RenderContext, metadata, stamp, user_labels

NETWORK_POLICY_API_VERSION = "networking.k8s.io/v1"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace: selects one namespace by its name."""
COMPONENTS = {
    Pods.RAY: "trainer",
    Pods.RAY_HEAD: "trainer",
    Pods.SUBMITTER: "submitter",
    Pods.TEACHERS: "teacher",
}
"""The `app.kubernetes.io/component` of each group of a job's pods (as the pod renderers set it)."""


def job_pod_selector(job_name: str, pods: Pods) -> dict[str, str]:
    """The labels that select one group of the job's pods."""
    labels = {naming.JOB_LABEL: naming.label_value(job_name), naming.COMPONENT_LABEL: COMPONENTS[pods]}
    if pods == Pods.RAY_HEAD:
        labels[naming.RAY_NODE_LABEL] = "head"
    return labels


def ray_pod_labels(job: DistillationJob, *, head: bool) -> dict[str, str]:
    """The labels a Ray pod of the job carries for the policies: head or worker, and on the head (the
    driver: the one caller of teachers) the client label of each DistillationTeacher the job references."""
    labels = {naming.RAY_NODE_LABEL: "head" if head else "worker"}
    if head:
        labels.update({naming.teacher_client_label(name): "true" for name in shared_teachers_used(job.spec)})
    return labels


def _outside(peer: Peer) -> dict[str, Any]:
    selector: dict[str, Any] = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: peer.namespace}}}
    if peer.pod_labels:
        selector["podSelector"] = {"matchLabels": dict(peer.pod_labels)}
    return selector


def _peer(
    source: Pods | Outside, settings: NetworkPolicySettings, *, job: str = "", teacher: str = ""
) -> dict[str, Any]:
    """The NetworkPolicyPeer of a flow's source: a job's pods (or a shared teacher's clients) in the policy's
    own namespace, or the callers from outside at their namespace."""
    if isinstance(source, Outside):
        return _outside(settings.peer(source))
    if source == Pods.TEACHER_CLIENTS:
        return {"podSelector": {"matchLabels": {naming.teacher_client_label(teacher): "true"}}}
    return {"podSelector": {"matchLabels": job_pod_selector(job, source)}}


def _spec(
    selector: Mapping[str, str],
    flows: Iterable[Flow],
    settings: NetworkPolicySettings,
    *,
    job: str = "",
    teacher: str = "",
) -> dict[str, Any]:
    ingress = []
    for flow in flows:
        rule: dict[str, Any] = {"from": [_peer(flow.source, settings, job=job, teacher=teacher)]}
        if flow.ports:  # none: every port (the Ray pods among themselves)
            rule["ports"] = [{"protocol": "TCP", "port": port.number} for port in flow.ports]
        ingress.append(rule)
    return {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Ingress"], "ingress": ingress}


def render_network_policies(job: DistillationJob, ctx: RenderContext) -> list[dict[str, Any]]:
    """The job's policies, one per group of its pods; none where the chart turns them off."""
    settings = ctx.cluster.network_policy
    if settings is None:
        return []
    name = job.metadata.name
    flows = job_flows(job.spec)
    policies = []
    for pods in job_pods(job.spec):
        labels = naming.child_labels(name, "network", user_labels(job))
        policy_name = naming.network_policy_name(name, "" if pods == Pods.RAY else pods.value)
        spec = _spec(job_pod_selector(name, pods), (f for f in flows if f.target == pods), settings, job=name)
        policies.append(
            stamp(
                {
                    "apiVersion": NETWORK_POLICY_API_VERSION,
                    "kind": "NetworkPolicy",
                    "metadata": metadata(job, ctx, policy_name, labels),
                    "spec": spec,
                }
            )
        )
    return policies


def shared_teacher_policy_spec(
    teacher: str, selector: Mapping[str, str], settings: NetworkPolicySettings
) -> dict[str, Any]:
    """The spec of the policy of the DistillationTeacher `teacher`, whose replicas `selector` selects."""
    return _spec(selector, shared_teacher_flows(), settings, teacher=teacher)
