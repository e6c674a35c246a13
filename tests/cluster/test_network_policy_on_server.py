"""The NetworkPolicies (on by default, `distillery.plan.access.network` -> `render/network_policy.py`) on a real
API server: for every example and variant, each job's policies and every DistillationTeacher's are created
(a server-side dry run: validation and admission, nothing stored), and every pod the job renders is selected
by one of them (the pod templates carry the labels they select by). A policy the server must refuse (a port
out of range) is refused, so that the test can fail.

What cannot run here: enforcement; `tests/workloads/test_network_policy_on_node.py` has the node's enforcer
(kube-network-policies) drop what a policy denies.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from distillery_operator import naming
from distillery_operator.render import (
    ClusterSettings,
    RenderContext,
    pod_templates,
    render_job,
    render_shared_teacher_policy,
)
from harness import Installation, temporary_namespace, yaml_stream
from test_pod_admission_on_server import JOBS

from distillery.api import DistillationJob, DistillationTeacher
from distillery.plan.access.network import NetworkPolicySettings, Peer
from distillery.validation import load_manifests

pytestmark = pytest.mark.timeout(120)

SETTINGS = NetworkPolicySettings(
    kuberay=Peer("kuberay-system"),
    operator=Peer("distillery-system", {"app.kubernetes.io/name": "distillery"}),
    monitoring=Peer("monitoring", {"app.kubernetes.io/name": "prometheus"}),
)
ROOT = Path(__file__).resolve().parents[2]
TEACHERS = [
    t
    for source in sorted((ROOT / "examples" / "teachers").glob("*.yaml"))
    for t in load_manifests(source)[1]
    if isinstance(t, DistillationTeacher)
]


def rendered(job: DistillationJob, namespace: str) -> list[dict[str, Any]]:
    return render_job(
        job, RenderContext(namespace=namespace, cluster=ClusterSettings(network_policy=SETTINGS))
    )


def dry_run(installation: Installation, objects: list[dict[str, Any]]) -> tuple[int, str]:
    result = installation.admin(
        "create", "--dry-run=server", "-o", "name", "-f", "-", input=yaml_stream(objects), check=False
    )
    return result.returncode, result.stdout + result.stderr


def test_every_policy_is_accepted_and_every_pod_is_selected(installation: Installation) -> None:
    assert TEACHERS
    with temporary_namespace(installation, "netpol") as namespace:
        policies = []
        for job in JOBS:
            objects = rendered(job, namespace)
            mine = [o for o in objects if o["kind"] == "NetworkPolicy"]
            assert naming.network_policy_name(job.metadata.name) in {p["metadata"]["name"] for p in mine}
            selectors = [p["spec"]["podSelector"]["matchLabels"] for p in mine]
            for where, template in pod_templates(objects):
                labels = template["metadata"]["labels"]
                assert any(s.items() <= labels.items() for s in selectors), (job.metadata.name, where, labels)
            policies.extend(mine)
        cluster = ClusterSettings(network_policy=SETTINGS)
        for teacher in TEACHERS:
            policy = render_shared_teacher_policy(teacher, namespace=namespace, cluster=cluster)
            assert policy is not None
            policies.append(policy)
        code, out = dry_run(installation, policies)
        assert code == 0, out
        assert len(out.split()) == len(policies), out


def test_a_policy_the_server_must_refuse_is_refused(installation: Installation) -> None:
    with temporary_namespace(installation, "netpol-bad") as namespace:
        policy = next(o for o in rendered(JOBS[0], namespace) if o["kind"] == "NetworkPolicy")
        bad = copy.deepcopy(policy)
        bad["spec"]["ingress"][1]["ports"][0]["port"] = 70000
        code, out = dry_run(installation, [bad])
        assert code != 0 and "must be between 1 and 65535" in out, out
