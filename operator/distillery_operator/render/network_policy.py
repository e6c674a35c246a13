"""A job's NetworkPolicy (where the chart turns them on): its pods accept traffic only from each other,
from KubeRay's operator, and from the monitoring namespace's scrapers.

The Ray head's dashboard and Jobs API (8265) run code on the student's GPUs for whoever reaches them, and
the GCS (6379) and a teacher's vLLM server (8000) have no authentication either. KubeRay's own submitter
and operator must reach the dashboard, so binding it to localhost is not an option; a policy can say who
may. One policy selects every pod of the job (`distillery.io/job`, which user podLabels cannot set) and
allows:

- any port from the job's own pods: Ray's head and workers talk on ports Ray picks (GCS, object manager,
  workers), the driver calls the teachers, KubeRay's submitter calls the dashboard;
- the dashboard port from KubeRay's operator namespace (it follows the RayJob through the dashboard);
- the metrics ports (the runtime's exporter, Ray's, the teachers' vLLM /metrics, which shares the
  teacher's serving port) from the monitoring namespace.

Egress is left open: pods download models and call external teachers. The policy needs a CNI that
enforces NetworkPolicy (Calico, Cilium ...); without one it is accepted and does nothing. The namespace
stays the trust boundary: a pod someone else makes there with the job's label is let in like the job's.
The operator makes the policy with the job's other children (before its pods) and never deletes one:
turned off in the chart, a job's policy goes with the job.
"""

from __future__ import annotations

from typing import Any

from distillery.api import DistillationJob
from distillery.runtime_config import RUNTIME_METRICS_PORT, TEACHER_PORT
from distillery_operator import naming
from distillery_operator.render.common import RenderContext, metadata, stamp, user_labels
from distillery_operator.render.rayjob import DASHBOARD_PORT, RAY_METRICS_PORT

NETWORK_POLICY_API_VERSION = "networking.k8s.io/v1"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace: selects one namespace by its name."""


def _namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def render_network_policy(job: DistillationJob, ctx: RenderContext) -> dict[str, Any] | None:
    """The job's policy, or None where the chart leaves them off."""
    settings = ctx.cluster.network_policy
    if settings is None:
        return None
    pods = {naming.JOB_LABEL: naming.label_value(job.metadata.name)}
    name = naming.network_policy_name(job.metadata.name)
    labels = naming.child_labels(job.metadata.name, "network", user_labels(job))
    return stamp(
        {
            "apiVersion": NETWORK_POLICY_API_VERSION,
            "kind": "NetworkPolicy",
            "metadata": metadata(job, ctx, name, labels),
            "spec": {
                "podSelector": {"matchLabels": pods},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"from": [{"podSelector": {"matchLabels": pods}}]},
                    {"from": [_namespace(settings.kuberay_namespace)], "ports": _tcp(DASHBOARD_PORT)},
                    {
                        "from": [_namespace(settings.monitoring_namespace)],
                        "ports": _tcp(RUNTIME_METRICS_PORT, RAY_METRICS_PORT, TEACHER_PORT),
                    },
                ],
            },
        }
    )
