"""A job's NetworkPolicy as rendered, without an API server: none unless the chart turns them on; one
that selects every pod the job renders (head, workers, KubeRay's submitter, teachers) and lets in the
job's own pods, KubeRay's namespace on the dashboard and the monitoring namespace on the metrics ports.
(`tests/cluster/test_network_policy_on_server.py` has a real API server accept it.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from distillery_operator import naming
from distillery_operator.render import (
    ClusterSettings,
    NetworkPolicySettings,
    RenderContext,
    pod_templates,
    render_job,
)

from distillery.api import DistillationJob
from distillery.runtime_config import RUNTIME_METRICS_PORT, TEACHER_PORT
from distillery.validation import load_jobs

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "tests" / "golden" / "variants.yaml"]
JOBS = [job for source in SOURCES for job in load_jobs(source)]
SETTINGS = NetworkPolicySettings(kuberay_namespace="ray-operators", monitoring_namespace="prom")


def policies(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize("job", JOBS, ids=lambda job: job.metadata.name)
def test_off_by_default_and_on_it_selects_every_pod_of_the_job(job: DistillationJob) -> None:
    assert policies(render_job(job, RenderContext(namespace="ns"))) == []
    objects = render_job(job, RenderContext(namespace="ns", cluster=ClusterSettings(network_policy=SETTINGS)))
    (policy,) = policies(objects)
    assert policy["metadata"]["name"] == naming.network_policy_name(job.metadata.name)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector == {naming.JOB_LABEL: naming.label_value(job.metadata.name)}
    templates = pod_templates(objects)
    roles = {where.rsplit(":", 1)[1] for where, _ in templates}
    assert {"head", "submitter"} <= roles, roles  # KubeRay's submitter too: it calls the dashboard
    for where, template in templates:
        labels = template["metadata"]["labels"]
        assert selector.items() <= labels.items(), (where, labels)
    # Made before any pod it selects exists.
    kinds = [o["kind"] for o in objects]
    assert kinds.index("NetworkPolicy") < min(
        kinds.index(kind) for kind in ("RayJob", "Deployment") if kind in kinds
    )


def test_the_three_rules() -> None:
    job = JOBS[0]
    (policy,) = policies(
        render_job(job, RenderContext(namespace="ns", cluster=ClusterSettings(network_policy=SETTINGS)))
    )
    spec = policy["spec"]
    pods = spec["podSelector"]
    assert spec["policyTypes"] == ["Ingress"]  # egress open: models and external teachers
    own, kuberay, monitoring = spec["ingress"]
    assert own == {"from": [{"podSelector": pods}]}  # any port: GCS, the client port 10001, teachers
    namespace = "kubernetes.io/metadata.name"
    assert kuberay["from"] == [{"namespaceSelector": {"matchLabels": {namespace: "ray-operators"}}}]
    assert [p["port"] for p in kuberay["ports"]] == [8265]
    assert monitoring["from"] == [{"namespaceSelector": {"matchLabels": {namespace: "prom"}}}]
    assert sorted(p["port"] for p in monitoring["ports"]) == sorted(
        {RUNTIME_METRICS_PORT, 8080, TEACHER_PORT}
    )
    assert 10001 not in [p["port"] for rule in (kuberay, monitoring) for p in rule["ports"]]


def test_settings_parse_and_refuse() -> None:
    assert NetworkPolicySettings.parse(" ") is None  # off
    parsed = NetworkPolicySettings.parse("kuberay=a,monitoring=b")
    assert parsed is not None
    assert (parsed.kuberay_namespace, parsed.monitoring_namespace) == ("a", "b")
    with pytest.raises(ValueError, match="no namespace for monitoring"):
        NetworkPolicySettings.parse("kuberay=a")
