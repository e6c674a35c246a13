"""Every pod the operator renders is admitted by a production-like namespace (issue 26, must show).

For every example and every job of tests/golden/variants.yaml, each pod template the operator renders (a
teacher Deployment's, the Ray head's, each worker group's and KubeRay's submitter's: `pod_templates`) is
created as a Pod with a server-side dry run in a namespace that
- enforces Pod Security `restricted` (the `pod-security.kubernetes.io/enforce` label; the PodSecurity
  admission plugin is on by default in kube-apiserver, and the refused pods below show it is on here), and
- has a ResourceQuota on requests.cpu, requests.memory, limits.cpu, limits.memory and
  requests.nvidia.com/gpu (the quota admission plugin refuses a pod that leaves any of them unset).

A dry run runs every admission plugin without storing or scheduling the pod. Two deliberately
non-compliant pods are refused, so that the test can fail: one without a security context (Pod Security)
and one without CPU and memory (the quota).

What the dry run leaves out: what KubeRay adds to the head and worker pods when it makes them (its `ray
start` command, an init container that copies the worker container's security context); the node
scenarios (tests/workloads) run those.
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from distillery_operator.render import ClusterSettings, RenderContext, pod_templates, render_job
from harness import Installation, temporary_namespace, wait_until, yaml_stream
from support.pod_settings import job_with_settings

from distillery.api import DistillationJob
from distillery.validation import load_jobs

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "tests" / "golden" / "variants.yaml"]
JOBS = [job for source in SOURCES for job in load_jobs(source)]
QUOTA = {
    "requests.cpu": "10k",
    "requests.memory": "100Ti",
    "limits.cpu": "10k",
    "limits.memory": "100Ti",
    "requests.nvidia.com/gpu": "1k",
}


@pytest.fixture(scope="module")
def restricted(installation: Installation) -> Iterator[str]:
    """A namespace that enforces Pod Security `restricted` and a quota on CPU, memory and GPUs."""
    with temporary_namespace(installation, "restricted") as name:
        installation.admin(
            "label",
            "namespace",
            name,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        )
        quota = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "compute", "namespace": name},
            "spec": {"hard": QUOTA},
        }
        installation.admin("apply", "-f", "-", input=yaml_stream([quota]))

        # Quota admission refuses every pod until the controller has counted the namespace's usage.
        def counted() -> bool:
            live = installation.get("resourcequota", "compute", name)
            return bool(live and set(live.get("status", {}).get("hard", {})) == set(QUOTA))

        wait_until(counted, timeout=60, what="the ResourceQuota's status")
        yield name


def as_pods(job: DistillationJob, namespace: str, ctx: RenderContext | None = None) -> list[dict[str, Any]]:
    """Each pod template of the job's rendered objects as a Pod of its own name."""
    pods = []
    for where, template in pod_templates(render_job(job, ctx or RenderContext(namespace=namespace))):
        name = re.sub(r"[^a-z0-9-]+", "-", where.lower()).strip("-")[:63].rstrip("-")
        metadata = {"name": name, "namespace": namespace, **template["metadata"]}
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
    return pods


def dry_run(installation: Installation, pods: list[dict[str, Any]]) -> tuple[int, str, str]:
    result = installation.admin(
        "create", "--dry-run=server", "-o", "name", "-f", "-", input=yaml_stream(pods), check=False
    )
    return result.returncode, result.stdout, result.stderr


def ensure_service_accounts(installation: Installation, namespace: str, pods: list[dict[str, Any]]) -> None:
    # The ServiceAccount admission plugin refuses a pod whose account does not exist (the operator makes
    # it, or the user names theirs).
    for account in sorted(
        {p["spec"]["serviceAccountName"] for p in pods if "serviceAccountName" in p["spec"]}
    ):
        if installation.get("serviceaccount", account, namespace) is None:
            installation.admin("create", "serviceaccount", account, "-n", namespace)


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.metadata.name)
def test_every_rendered_pod_is_admitted_under_restricted_and_a_quota(
    installation: Installation, restricted: str, job: DistillationJob
) -> None:
    pods = as_pods(job, restricted)
    kinds = {p["metadata"]["name"].rsplit("-", 1)[-1] for p in pods}
    assert {"head", "student", "submitter"} <= kinds, kinds
    ensure_service_accounts(installation, restricted, pods)
    code, out, err = dry_run(installation, pods)
    assert code == 0, err
    admitted = {line.removeprefix("pod/") for line in out.split()}
    assert admitted == {p["metadata"]["name"] for p in pods}, (out, err)


def test_a_pod_without_a_security_context_or_resources_is_refused(
    installation: Installation, restricted: str
) -> None:
    (pod,) = [p for p in as_pods(JOBS[0], restricted) if p["metadata"]["name"].endswith("submitter")]
    insecure = json.loads(json.dumps(pod))
    insecure["metadata"]["name"] = "insecure"
    del insecure["spec"]["securityContext"]
    del insecure["spec"]["containers"][0]["securityContext"]
    code, _, err = dry_run(installation, [insecure])
    assert code != 0 and "violates PodSecurity" in err, err

    unsized = json.loads(json.dumps(pod))
    unsized["metadata"]["name"] = "unsized"
    del unsized["spec"]["containers"][0]["resources"]
    code, _, err = dry_run(installation, [unsized])
    assert code != 0 and "must specify" in err, err

    # The same pod as rendered is admitted: the refusals above are the removed fields' doing.
    code, out, err = dry_run(installation, [pod])
    assert code == 0 and out.strip() == f"pod/{pod['metadata']['name']}", err


@pytest.fixture
def priority_class(installation: Installation) -> Iterator[str]:
    """A PriorityClass (cluster-scoped) of the test's own: the Priority admission plugin refuses a pod that
    names one that does not exist."""
    name = f"distillery-test-{uuid.uuid4().hex[:8]}"
    installation.admin("create", "priorityclass", name, "--value=1000")
    try:
        yield name
    finally:
        installation.admin("delete", "priorityclass", name, "--wait=false", check=False)


def test_pods_with_every_pod_setting_are_admitted(
    installation: Installation, restricted: str, priority_class: str
) -> None:
    """Issue 26: affinity, spread constraints, a priority class, pod labels and annotations, env from a
    Secret, a ConfigMap and a field, the user's volumes and mounts, and image pull secrets (the cluster's
    and the job's) on every pod kind, still admitted under `restricted` and the quota; the priority the
    server resolved from the class shows that the field reached it."""
    job = DistillationJob.model_validate(job_with_settings(priority_class))
    ctx = RenderContext(
        namespace=restricted, cluster=ClusterSettings(image_pull_secrets=("cluster-registry",))
    )
    pods = as_pods(job, restricted, ctx)
    assert {p["metadata"]["name"].rsplit("-", 1)[-1] for p in pods} >= {"head", "student", "submitter", "pod"}
    ensure_service_accounts(installation, restricted, pods)
    items = []
    for pod in pods:  # one at a time: kubectl writes several objects as concatenated JSON documents
        result = installation.admin(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=yaml_stream([pod]), check=False
        )
        assert result.returncode == 0, result.stderr
        items.append(json.loads(result.stdout))
    for pod in items:
        spec = pod["spec"]
        assert spec["priorityClassName"] == priority_class and spec["priority"] == 1000, pod["metadata"][
            "name"
        ]
        assert spec["imagePullSecrets"][0] == {"name": "cluster-registry"}
        assert spec["affinity"]["nodeAffinity"] and spec["topologySpreadConstraints"]
        assert pod["metadata"]["labels"]["team"] == "ml"
        assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"

    # The same pods naming a priority class that does not exist are refused: the field is checked.
    missing = json.loads(json.dumps(pods[:1]))
    missing[0]["spec"]["priorityClassName"] = "no-such-class"
    code, _, err = dry_run(installation, missing)
    assert code != 0 and "no-such-class" in err, err
