"""Each job's NetworkPolicy (chart value `networkPolicy.enabled`, `render/network_policy.py`) on a real API
server: for every example and variant it is created (a server-side dry run: validation and admission,
nothing stored), and it selects every pod the job renders (the pod templates carry the label it selects
by). A policy the server must refuse (a port out of range) is refused, so that the test can fail.

What cannot run here: enforcement. The test node's CNI (a bridge) does not drop traffic by policy; Calico
or Cilium would.
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
    NetworkPolicySettings,
    RenderContext,
    pod_templates,
    render_job,
)
from harness import Installation, temporary_namespace, yaml_stream
from test_pod_admission_on_server import JOBS

from distillery.api import DistillationJob

pytestmark = pytest.mark.timeout(120)

SETTINGS = NetworkPolicySettings(kuberay_namespace="kuberay-system", monitoring_namespace="monitoring")


def rendered(job: DistillationJob, namespace: str) -> list[dict[str, Any]]:
    return render_job(
        job, RenderContext(namespace=namespace, cluster=ClusterSettings(network_policy=SETTINGS))
    )


def dry_run(installation: Installation, objects: list[dict[str, Any]]) -> tuple[int, str]:
    result = installation.admin(
        "create", "--dry-run=server", "-o", "name", "-f", "-", input=yaml_stream(objects), check=False
    )
    return result.returncode, result.stdout + result.stderr


def test_every_jobs_policy_is_accepted_and_selects_all_its_pods(installation: Installation) -> None:
    with temporary_namespace(installation, "netpol") as namespace:
        policies = []
        for job in JOBS:
            objects = rendered(job, namespace)
            (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
            assert policy["metadata"]["name"] == naming.network_policy_name(job.metadata.name)
            selector = policy["spec"]["podSelector"]["matchLabels"]
            for where, template in pod_templates(objects):
                labels = template["metadata"]["labels"]
                assert selector.items() <= labels.items(), (job.metadata.name, where, labels)
            policies.append(policy)
        code, out = dry_run(installation, policies)
        assert code == 0, out
        assert len(out.split()) == len(policies), out


def test_a_policy_the_server_must_refuse_is_refused(installation: Installation) -> None:
    with temporary_namespace(installation, "netpol-bad") as namespace:
        (policy,) = [o for o in rendered(JOBS[0], namespace) if o["kind"] == "NetworkPolicy"]
        bad = copy.deepcopy(policy)
        bad["spec"]["ingress"][1]["ports"][0]["port"] = 70000
        code, out = dry_run(installation, [bad])
        assert code != 0 and "must be between 1 and 65535" in out, out
