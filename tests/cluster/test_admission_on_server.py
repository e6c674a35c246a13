"""Bounded authors on a real kube-apiserver (README "Admission policy", "Least-privilege install").

- The chart's ValidatingAdmissionPolicies, rendered from its values and installed as Helm would, refuse a
  job with a disallowed image, ServiceAccount or Secret volume (and a DistillationTeacher with a disallowed
  image) with exactly the line `distillery validate --admission` prints, and admit an allowed job. A value
  an object already had passes an update (Kueue's suspend); a changed one is judged again.
- The namespaced install (`watch.clusterWide: false`): the operator, with only the Role the chart makes in
  its watched namespace, reconciles a job there without one refused request, and may create nothing in
  another namespace.

The policies are bound by a namespace label of this module's own (`admission.namespaceSelector`), so the
other tests of the session's installation never meet them.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from distillery_operator import naming
from harness import (
    RELEASE_NAMESPACE,
    REPO,
    Installation,
    running_operator,
    temporary_namespace,
    wait_until,
    yaml_stream,
)
from helm_chart import render_objects
from test_rbac_on_server import audit_offset, audit_requests

from distillery.admission import AdmissionSettings, violations
from distillery.validation import parse_job, parse_teacher

pytestmark = pytest.mark.timeout(150)

LABEL = "distillery.io/admission-test"
SETTINGS = {
    "enabled": True,
    "allowedImagePrefixes": ["ghcr.io/distillery-ai/", "registry.example.com/ml/"],
    "allowedServiceAccounts": ["distillery-runtime"],
    "allowSecretVolumes": False,
    "allowSecretEnv": False,
}
SECRET_VOLUME = {"name": "creds", "secret": {"secretName": "creds"}}
SECRET_VARIABLE = {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}
PROBE_IMAGE = "docker.io/someone/probe:1"


def job(name: str, **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "standalone-teacher.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"].update(spec)
    return doc


def teacher(name: str, **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "teachers" / "qwen-7b.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"].update(spec)
    return doc


def create(
    installation: Installation, namespace: str, doc: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return installation.admin("create", "-n", namespace, "-f", "-", input=yaml_stream([doc]), check=False)


def expected(doc: dict[str, Any]) -> list[str]:
    """What `distillery validate --admission` says of `doc` with SETTINGS (one line per refusal)."""
    parsed = parse_teacher(doc) if doc["kind"] == "DistillationTeacher" else parse_job(doc)
    return [v.message for v in violations(parsed.spec, AdmissionSettings.model_validate(SETTINGS))]


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The policy's message from kubectl's error line."""
    assert result.returncode != 0, f"admitted: {result.stdout}"
    assert "ValidatingAdmissionPolicy" in result.stderr, result.stderr
    return result.stderr.strip().split("denied request: ", 1)[1]


@pytest.fixture(scope="module")
def bounded(installation: Installation) -> Iterator[str]:
    """A namespace that the chart's policies, installed with SETTINGS, apply to."""
    with temporary_namespace(installation, "bounded") as namespace:
        values = {
            "fullnameOverride": namespace,
            "admission": {**SETTINGS, "namespaceSelector": {"matchLabels": {LABEL: namespace}}},
        }
        objects = [o for o in render_objects(values) if o["kind"].startswith("ValidatingAdmissionPolicy")]
        assert len(objects) == 4
        installation.admin("apply", "--server-side", "-f", "-", input=yaml_stream(objects))
        installation.admin("label", "namespace", namespace, f"{LABEL}={namespace}")
        # The server's policy informer picks the policies up a moment later (until then the probe is
        # admitted, and then refused as AlreadyExists: only the policy's refusal ends the wait).
        probe = job("probe", image=PROBE_IMAGE)
        wait_until(
            lambda: "ValidatingAdmissionPolicy" in create(installation, namespace, probe).stderr,
            what="the policy to refuse a job",
        )
        try:
            yield namespace
        finally:
            for o in objects:
                installation.admin("delete", o["kind"], o["metadata"]["name"], "--wait=false", check=False)


def test_a_disallowed_image_is_refused_with_the_validate_message(
    installation: Installation, bounded: str
) -> None:
    doc = job("evil", image="docker.io/someone/miner:latest")
    (line,) = expected(doc)
    assert refusal(create(installation, bounded, doc)) == line
    assert line.startswith("spec.image: docker.io/someone/miner:latest is not under an image prefix")
    # ... a DistillationTeacher's too.
    shared = teacher("evil-teacher", image="registry.example.com/mlx/vllm:1")  # not under .../ml/
    (line,) = expected(shared)
    assert refusal(create(installation, bounded, shared)) == line


def test_an_allowed_job_is_admitted(installation: Installation, bounded: str) -> None:
    doc = job("good", image="registry.example.com/ml/runtime:0.1.0", serviceAccountName="distillery-runtime")
    doc["spec"]["student"]["pool"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    assert expected(doc) == []
    result = create(installation, bounded, doc)
    assert result.returncode == 0, result.stderr
    assert create(installation, bounded, job("default-image")).returncode == 0  # the CRD's default image
    assert create(installation, bounded, teacher("good-teacher")).returncode == 0


def test_a_disallowed_service_account_is_refused(installation: Installation, bounded: str) -> None:
    doc = job("borrowed", serviceAccountName="default")
    (line,) = expected(doc)
    assert refusal(create(installation, bounded, doc)) == line
    assert line.startswith("spec.serviceAccountName: default is not a ServiceAccount this cluster allows")


def test_secret_volumes_are_refused_when_not_allowed(installation: Installation, bounded: str) -> None:
    doc = job("mounts")
    doc["spec"]["student"]["head"] = {"volumes": [SECRET_VOLUME]}
    doc["spec"]["teachers"][0]["pool"] = {
        **doc["spec"]["teachers"][0].get("pool", {}),
        "volumes": [{"name": "tmp", "emptyDir": {}}, SECRET_VOLUME],
    }
    (line,) = expected(doc)
    assert refusal(create(installation, bounded, doc)) == line
    assert line.startswith(
        "spec.student.head.volumes[name=creds], spec.teachers[name=qwen-7b].pool.volumes[name=creds]: "
    )
    shared = teacher("mounting-teacher", pool={"volumes": [SECRET_VOLUME]})
    (line,) = expected(shared)
    assert refusal(create(installation, bounded, shared)) == line


def test_variables_from_secrets_are_refused_when_not_allowed(
    installation: Installation, bounded: str
) -> None:
    doc = job("reads")
    doc["spec"]["student"]["pool"]["env"] = [{"name": "PLAIN", "value": "1"}, SECRET_VARIABLE]
    (line,) = expected(doc)
    assert refusal(create(installation, bounded, doc)) == line
    assert line.startswith("spec.student.pool.env[name=TOKEN]: this cluster allows no variables from Secrets")
    shared = teacher("reading-teacher", pool={"env": [SECRET_VARIABLE]})
    (line,) = expected(shared)
    assert refusal(create(installation, bounded, shared)) == line


def test_what_an_object_already_had_passes_an_update(installation: Installation, bounded: str) -> None:
    """A job made before the policy covered its namespace keeps working; a new choice is judged."""
    with temporary_namespace(installation, "before") as namespace:
        old = job("old", image="docker.io/someone/old:1", serviceAccountName="default")
        old["spec"]["student"]["pool"]["volumes"] = [SECRET_VOLUME]
        assert create(installation, namespace, old).returncode == 0
        installation.admin("label", "namespace", namespace, f"{LABEL}={bounded}")
        probe = job("probe", image=PROBE_IMAGE)
        wait_until(
            lambda: "ValidatingAdmissionPolicy" in create(installation, namespace, probe).stderr,
            what="the policy to cover the namespace",
        )

        def patch(spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
            patch_doc = json.dumps({"spec": spec})
            return installation.admin(
                "patch", "dj", "old", "-n", namespace, "--type=merge", "-p", patch_doc, check=False
            )

        assert patch({"suspend": True}).returncode == 0  # Kueue's write
        changed = copy.deepcopy(old)
        changed["spec"]["image"] = "docker.io/someone/new:2"
        # validate has no old object: it judges all three; the server only the image, the one change.
        (line,) = [m for m in expected(changed) if m.startswith("spec.image: ")]
        assert refusal(patch({"image": "docker.io/someone/new:2"})) == line


# ---------------------------------------------------------------------------------------------- namespaced


def test_the_namespaced_install_reconciles_with_its_roles_only(
    installation: Installation, namespace: str, tmp_path: Path
) -> None:
    release = f"ns-{uuid.uuid4().hex[:6]}"
    values = {"fullnameOverride": release, "watch": {"clusterWide": False, "namespaces": [namespace]}}
    objects = render_objects(values)
    account = f"{release}-operator"
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    rbac = [
        o
        for o in objects
        if o["kind"] in ("Role", "RoleBinding") and o["metadata"]["name"].startswith(account)
    ]
    service_account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": account, "namespace": RELEASE_NAMESPACE},
    }
    installation.admin("apply", "-f", "-", input=yaml_stream([service_account, *rbac]))
    user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}"
    try:
        since = audit_offset(installation)
        kubeconfig = installation.token_kubeconfig(account, RELEASE_NAMESPACE)
        with running_operator(
            installation, namespace, tmp_path / "operator.log", kubeconfig=kubeconfig
        ) as operator:
            assert create(installation, namespace, job("nsjob")).returncode == 0
            wait_until(
                lambda: installation.get("rayjob", naming.rayjob_name("nsjob"), namespace),
                what=f"the RayJob ({operator.output()[-3000:]})",
            )
            wait_until(
                lambda: ((installation.get("dj", "nsjob", namespace) or {}).get("status") or {}).get("phase"),
                what="the job's status",
            )
        refused = [str(r) for r in audit_requests(installation, since, {user}) if r.code == 403]
        assert not refused, "the server refused the namespaced operator:\n" + "\n".join(refused)

        def can(verb: str, resource: str, where: str) -> bool:
            result = installation.admin(
                "auth", "can-i", verb, resource, "-n", where, f"--as={user}", check=False
            )
            return result.stdout.strip() == "yes"

        assert can("create", "rayjobs.ray.io", namespace) and can("create", "deployments.apps", namespace)
        for resource in (
            "rayjobs.ray.io",
            "deployments.apps",
            "serviceaccounts",
            "roles.rbac.authorization.k8s.io",
        ):
            assert not can("create", resource, "default"), resource
    finally:
        installation.admin(
            "delete", "-f", "-", "--wait=false", input=yaml_stream([service_account, *rbac]), check=False
        )
