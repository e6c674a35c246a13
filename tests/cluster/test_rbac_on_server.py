"""The chart's RBAC judged by a real kube-apiserver (RBAC authorizer, OwnerReferencesPermissionEnforcement,
the garbage collector), from its audit log of every request.

- The operator, run with the chart's ServiceAccount token and the Deployment's own arguments, goes through a
  job's whole life (its claims read, children created, status written, Events posted, a live spec change, a
  refused one, children repaired, suspension, deletion): none of its requests is refused, and the (verb,
  resource) pairs it used are exactly what the chart grants it (an unused grant fails as a missing one does).
- The mechanism: the same operator with a copy of the ClusterRole lacking one grant is refused (403 in the
  audit log) and the user sees it (no children and the 403 in `status.message`, or no status at all).
- The trainer's identity: a job without `spec.serviceAccountName` runs its Ray pods as the ServiceAccount
  the operator made for it, whose Role lets the runtime's own status reporter write progress to that job
  (and to no other); a job naming the chart's `distillery-runtime` ServiceAccount works through the
  chart's Role.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from distillery_operator import naming
from distillery_operator.reconcile.controller import NETWORK_POLICY_ENV
from harness import (
    OPERATOR_SA,
    RELEASE_NAMESPACE,
    REPO,
    Installation,
    running_operator,
    wait_until,
    yaml_stream,
)
from helm_chart import render_objects

from distillery.plan.access.auth import CLIENTS_KEY, clients_secret_name, job_identity

pytestmark = pytest.mark.timeout(150)

OPERATOR_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{OPERATOR_SA}"
Grant = tuple[str, str]
"""(verb, "group:resource[/subresource]") with the core group spelt "core" (as tests/chart spells them)."""

BLOCK_OWNER_DELETION: Grant = ("update", "distillery.io:distillationjobs/finalizers")
"""Never requested: OwnerReferencesPermissionEnforcement checks it when a child names the job with
`blockOwnerDeletion: true`, so every create of a child uses it."""


# ---------------------------------------------------------------------------------------------- audit log


@dataclass(frozen=True)
class Request:
    user: str
    verb: str
    resource: str
    namespace: str
    name: str
    code: int

    @property
    def grant(self) -> Grant:
        return (self.verb, self.resource)

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.name else self.namespace or "(cluster)"
        return f"{self.verb} {self.resource} {where} -> {self.code} (as {self.user})"


def audit_offset(installation: Installation) -> int:
    """Where the audit log ends now: requests after this are the test's."""
    log = installation.plane.audit_log
    return log.stat().st_size if log.exists() else 0


def audit_requests(installation: Installation, since: int, users: set[str]) -> list[Request]:
    """The resource requests of `users` logged after `since`, one per request (the last stage seen)."""
    by_id: dict[str, dict[str, Any]] = {}
    with installation.plane.audit_log.open("rb") as f:
        f.seek(max(since - 1, 0))
        if since and f.read(1) != b"\n":
            f.readline()  # `since` fell inside a line the server was still writing: a request of before
        for line in f:
            if not line.endswith(b"\n"):
                break  # the server is still writing it
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("user", {}).get("username") in users and event.get("objectRef"):
                by_id[event["auditID"]] = {**by_id.get(event["auditID"], {}), **event}
    requests = []
    for event in by_id.values():
        ref = event["objectRef"]
        resource = f"{ref.get('apiGroup') or 'core'}:{ref['resource']}"
        if ref.get("subresource"):
            resource += f"/{ref['subresource']}"
        requests.append(
            Request(
                user=event["user"]["username"],
                verb=event["verb"],
                resource=resource,
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                code=int((event.get("responseStatus") or {}).get("code") or 0),
            )
        )
    return requests


# ---------------------------------------------------------------------------------------------- grants


def rules_grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        (verb, f"{group or 'core'}:{resource}")
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def chart_grants(installation: Installation, service_account: str) -> set[Grant]:
    """What the rendered chart grants `service_account` through any of its bindings."""
    roles = {
        (o["kind"], o["metadata"]["name"]): o
        for o in installation.objects
        if o["kind"] in ("ClusterRole", "Role")
    }
    grants: set[Grant] = set()
    for binding in installation.objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == service_account for s in binding["subjects"]
        ):
            continue
        ref = binding["roleRef"]
        grants |= rules_grants(roles[(ref["kind"], ref["name"])]["rules"])
    return grants


def operator_cluster_role(installation: Installation) -> dict[str, Any]:
    (role,) = [
        o for o in installation.objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == OPERATOR_SA
    ]
    return role


# ---------------------------------------------------------------------------------------------- the user


def example(name: str, file: str = "standalone-teacher.yaml", **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / file).read_text())
    doc["metadata"] = {"name": name}  # no Kueue label: the RayJob starts unsuspended
    doc["spec"].update(spec)
    return doc


def apply(installation: Installation, namespace: str, doc: dict[str, Any]) -> None:
    installation.admin("apply", "-n", namespace, "-f", "-", input=yaml_stream([doc]))


def merge_patch(
    installation: Installation,
    namespace: str,
    resource: str,
    name: str,
    patch: dict[str, Any],
    subresource: str = "",
) -> None:
    args = ["patch", resource, name, "-n", namespace, "--type=merge", "-p", json.dumps(patch)]
    if subresource:
        args.append(f"--subresource={subresource}")
    installation.admin(*args)


def status(installation: Installation, namespace: str, name: str) -> dict[str, Any]:
    return (installation.get("distillationjob", name, namespace) or {}).get("status") or {}


def events(installation: Installation, namespace: str, name: str) -> list[dict[str, Any]]:
    items = json.loads(
        installation.admin(
            "get", "events", "-n", namespace, "-o", "json", f"--field-selector=involvedObject.name={name}"
        ).stdout
    )["items"]
    return items


def children(installation: Installation, namespace: str, job: str) -> dict[str, list[str]]:
    selector = f"{naming.JOB_LABEL}={job}"
    kinds = ("configmaps", "services", "deployments.apps", "rayjobs.ray.io", "persistentvolumeclaims")
    kinds += ("poddisruptionbudgets.policy", "networkpolicies.networking.k8s.io")
    kinds += ("serviceaccounts", "roles.rbac.authorization.k8s.io", "rolebindings.rbac.authorization.k8s.io")
    return {kind: installation.names(kind, namespace, selector) for kind in kinds}


# ---------------------------------------------------------------------------------------------- operator


def clients(installation: Installation, namespace: str) -> dict[str, str]:
    """The job digests in the shared teacher qwen-7b's clients Secret (empty before it is made)."""
    secret = installation.get("secret", clients_secret_name("qwen-7b"), namespace) or {}
    raw = secret.get("data", {}).get(CLIENTS_KEY)
    return dict(json.loads(base64.b64decode(raw))["jobs"]) if raw else {}


def test_the_operator_uses_exactly_what_the_chart_grants(
    installation: Installation, namespace: str, tmp_path: Path
) -> None:
    since = audit_offset(installation)
    name = "std"
    teacher = naming.teacher_name(name, "qwen-7b")
    rayjob = naming.rayjob_name(name)
    # The chart's own setting of the NetworkPolicies (on, as by default): the operator makes each job's.
    env = {NETWORK_POLICY_ENV: json.dumps({"kuberay": {"namespace": "kuberay-system"}})}
    with running_operator(installation, namespace, tmp_path / "operator.log", env=env) as operator:
        # No claim named: the operator makes the checkpoint claim, owned by the job (the garbage collector
        # deletes it with the job below: the operator never deletes anything).
        apply(installation, namespace, example(name, checkpoint={"deleteWithJob": True}))
        wait_until(
            lambda: installation.get("rayjob", rayjob, namespace),
            what=f"the RayJob ({operator.output()[-3000:]})",
        )
        wait_until(
            lambda: status(installation, namespace, name).get("phase") == "StartingTeachers",
            what="the status",
        )
        # KubeRay's part (no KubeRay here): the trainer runs.
        merge_patch(
            installation,
            namespace,
            "rayjob",
            rayjob,
            {"status": {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}},
            "status",
        )
        # A live change (teacher replicas: the Deployment is scaled) and a refused one (a Warning Event).
        spec = example(name)["spec"]
        merge_patch(
            installation,
            namespace,
            "dj",
            name,
            {"spec": {"teachers": [{**spec["teachers"][0], "replicas": 3}]}},
        )
        wait_until(
            lambda: (installation.get("deployment", teacher, namespace) or {})["spec"]["replicas"] == 3,
            what="the teacher scaled to 3",
        )
        merge_patch(
            installation, namespace, "dj", name, {"spec": {"loss": {"mode": "forward_kl_topk", "topK": 32}}}
        )
        wait_until(
            lambda: any(e["reason"] == "SpecChangeRefused" for e in events(installation, namespace, name)),
            what="the SpecChangeRefused Event",
        )
        # Someone edits the teacher's Service: the operator puts its own back.
        ports = installation.get("service", teacher, namespace)["spec"]["ports"]
        merge_patch(
            installation,
            namespace,
            "service",
            teacher,
            {
                "metadata": {"annotations": {naming.SPEC_HASH_ANNOTATION: "x"}},
                "spec": {"ports": [{**ports[0], "port": 9999}]},
            },
        )
        wait_until(
            lambda: (
                installation.get("service", teacher, namespace)["spec"]["ports"][0]["port"]
                == ports[0]["port"]
            ),
            what="the Service repaired",
        )
        # ... and the teacher's PodDisruptionBudget: put back too.
        merge_patch(installation, namespace, "pdb", teacher, {"spec": {"maxUnavailable": 2}})
        wait_until(
            lambda: installation.get("pdb", teacher, namespace)["spec"]["maxUnavailable"] == 1,
            what="the PodDisruptionBudget repaired",
        )
        # ... and the job's NetworkPolicy, opened to every pod of the cluster: put back.
        policy = naming.network_policy_name(name)
        rules = installation.get("networkpolicy", policy, namespace)["spec"]["ingress"]
        merge_patch(installation, namespace, "networkpolicy", policy, {"spec": {"ingress": [{}]}})
        wait_until(
            lambda: installation.get("networkpolicy", policy, namespace)["spec"]["ingress"] == rules,
            what="the NetworkPolicy repaired",
        )
        # Someone widens the trainer's Role and edits its ServiceAccount and RoleBinding: all put back.
        identity = naming.trainer_identity_name(name)
        rules = installation.get("role", identity, namespace)["rules"]
        merge_patch(
            installation, namespace, "role", identity, {"rules": [{**rules[0], "verbs": ["patch", "update"]}]}
        )
        for kind in ("serviceaccount", "rolebinding"):
            merge_patch(
                installation,
                namespace,
                kind,
                identity,
                {"metadata": {"annotations": {naming.SPEC_HASH_ANNOTATION: "x"}}},
            )
        wait_until(
            lambda: installation.get("role", identity, namespace)["rules"] == rules, what="the Role repaired"
        )
        for kind in ("serviceaccount", "rolebinding"):
            wait_until(
                lambda kind=kind: (
                    installation.get(kind, identity, namespace)["metadata"]["annotations"][
                        naming.SPEC_HASH_ANNOTATION
                    ]
                    != "x"
                ),
                what=f"the {kind} repaired",
            )
        merge_patch(installation, namespace, "dj", name, {"spec": {"suspend": True}})
        wait_until(
            lambda: installation.get("rayjob", rayjob, namespace)["spec"].get("suspend") is True,
            what="the RayJob suspended",
        )
        # A DistillationTeacher and a job using it: its objects, its finalizer and its status are written,
        # then the finalizer taken off once the job is gone.
        shared = yaml.safe_load((REPO / "examples" / "teachers" / "qwen-7b.yaml").read_text())
        apply(installation, namespace, shared)
        apply(
            installation, namespace, example("sj", "shared-teacher.yaml", checkpoint={"deleteWithJob": True})
        )
        wait_until(
            lambda: (
                (installation.get("dt", "qwen-7b", namespace) or {}).get("status", {}).get("jobs") == ["sj"]
            ),
            what="the DistillationTeacher used by the job",
        )
        # The teacher's clients Secret takes the job's key digest and drops it once the job is gone: each a
        # write the test waits for (the Secret may be made with the digest already in it, so the drop is
        # the patch that is sure to come; without this wait it raced the finalizer's removal).
        member = job_identity("sj", namespace)
        wait_until(lambda: member in clients(installation, namespace), what="the job's digest in the clients")
        installation.admin("delete", "dj", "sj", "-n", namespace)
        wait_until(
            lambda: not installation.get("dt", "qwen-7b", namespace)["metadata"].get("finalizers"),
            what="the DistillationTeacher's finalizer taken off",
        )
        wait_until(
            lambda: member not in clients(installation, namespace), what="the job's digest out of the clients"
        )
        # An external teacher behind TLS with an API key: its health checks read the key's Secret and the CA
        # bundle's ConfigMap by name (`get`), then fail on the bundle, which holds no certificate.
        apply(
            installation,
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "ext-key"},
                "stringData": {"key": "k"},
            },
        )
        apply(
            installation,
            namespace,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "ext-ca"},
                "data": {"ca.crt": "none"},
            },
        )
        external = example("ext", "external-teacher.yaml", checkpoint={"deleteWithJob": True})
        external["spec"]["teachers"][0].update(
            endpoint="https://127.0.0.1:9",
            external={
                "apiKeySecret": {"name": "ext-key", "key": "key"},
                "caBundle": {"configMapName": "ext-ca"},
            },
        )
        apply(installation, namespace, external)
        wait_until(
            lambda: (
                "caBundle"
                in ((status(installation, namespace, "ext").get("teachers") or [{}])[0].get("message") or "")
            ),
            what="the external teacher's bundle read and refused",
        )
        installation.admin("delete", "dj", "ext", "-n", namespace)
        installation.admin("delete", "dj", name, "-n", namespace)
        wait_until(
            lambda: not any(children(installation, namespace, name).values()),
            timeout=60,
            what="the children collected",
        )
        log = operator.output()

    requests = audit_requests(installation, since, {OPERATOR_USER})
    requests = [r for r in requests if r.namespace in (namespace, RELEASE_NAMESPACE)]
    refused = [str(r) for r in requests if r.code == 403]
    assert not refused, "the server refused the operator:\n" + "\n".join(refused) + "\n" + log[-3000:]
    used = {r.grant for r in requests}
    if any(r.verb == "create" and r.code < 300 and r.resource != "core:events" for r in requests):
        used.add(BLOCK_OWNER_DELETION)
        # The DistillationTeacher's objects name it with blockOwnerDeletion too.
        used.add(("update", "distillery.io:distillationteachers/finalizers"))
    granted = chart_grants(installation, OPERATOR_SA)
    assert used == granted, (
        f"used but not granted: {sorted(used - granted)}; granted but unused: {sorted(granted - used)}"
    )


def without(rules: list[dict[str, Any]], grant: Grant) -> list[dict[str, Any]]:
    """`rules` less one (verb, resource) pair; the rest of each rule stays."""
    verb, resource = grant
    out: list[dict[str, Any]] = []
    for rule in rules:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                verbs = rule["verbs"]
                if f"{group or 'core'}:{res}" == resource:
                    verbs = [v for v in verbs if v != verb]
                if verbs:
                    out.append({"apiGroups": [group], "resources": [res], "verbs": verbs})
    return out


@dataclass
class Lacking:
    """A second operator identity: the chart's ClusterRole less one grant, bound in the test's namespace,
    plus the chart's leader-election Role (on a Lease of its own)."""

    kubeconfig: Path
    user: str
    lease: str


@contextlib.contextmanager
def lacking(installation: Installation, namespace: str, grant: Grant) -> Iterator[Lacking]:
    account = f"lacking-{uuid.uuid4().hex[:6]}"
    rules = without(operator_cluster_role(installation)["rules"], grant)
    assert rules_grants(rules) == rules_grants(operator_cluster_role(installation)["rules"]) - {grant}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": account},
        "rules": rules,
    }
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}

    def binding(ns: str, kind: str, role_name: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": account, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role_name},
            "subjects": [subject],
        }

    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        role,
        binding(namespace, "ClusterRole", account),
        binding(RELEASE_NAMESPACE, "Role", f"{OPERATOR_SA}-leader-election"),
    ]
    installation.admin("apply", "-f", "-", input=yaml_stream(objects))
    try:
        yield Lacking(
            installation.token_kubeconfig(account, namespace),
            f"system:serviceaccount:{namespace}:{account}",
            f"lease-{account}",
        )
    finally:
        installation.admin("delete", "clusterrole", account, "--wait=false", check=False)
        installation.admin(
            "delete", "rolebinding", account, "-n", RELEASE_NAMESPACE, "--wait=false", check=False
        )


def test_a_missing_finalizers_grant_refuses_every_child_and_the_user_sees_why(
    installation: Installation, namespace: str, tmp_path: Path
) -> None:
    """Today's defect, kept as the proof of the mechanism: without `update distillationjobs/finalizers`
    the server refuses children that block their owner's deletion."""
    since = audit_offset(installation)
    with (
        lacking(installation, namespace, BLOCK_OWNER_DELETION) as who,
        running_operator(
            installation,
            namespace,
            tmp_path / "operator.log",
            f"--leader-elect-lease={who.lease}",
            kubeconfig=who.kubeconfig,
        ),
    ):
        apply(installation, namespace, example("std"))
        message = wait_until(
            lambda: (
                "403" in (status(installation, namespace, "std").get("message") or "")
                and status(installation, namespace, "std")["message"]
            ),
            what="the 403 in status.message",
        )
        wait_until(
            lambda: any(e["reason"] == "ApiError" for e in events(installation, namespace, "std")),
            what="the ApiError Event",
        )
    assert "blockOwnerDeletion" in message
    assert not any(children(installation, namespace, "std").values())
    refused = {(r.verb, r.resource) for r in audit_requests(installation, since, {who.user}) if r.code == 403}
    # The RayJob is not even asked for: it comes after the children it reads (its ConfigMap, the teacher key
    # Secret, its NetworkPolicies), all refused.
    assert ("create", "core:configmaps") in refused and ("create", "core:secrets") in refused, refused


def test_a_missing_status_grant_is_refused_and_the_job_shows_no_status(
    installation: Installation, namespace: str, tmp_path: Path
) -> None:
    since = audit_offset(installation)
    grant = ("patch", "distillery.io:distillationjobs/status")
    with (
        lacking(installation, namespace, grant) as who,
        running_operator(
            installation,
            namespace,
            tmp_path / "operator.log",
            f"--leader-elect-lease={who.lease}",
            kubeconfig=who.kubeconfig,
        ),
    ):
        apply(installation, namespace, example("std"))
        wait_until(
            lambda: any(
                r.grant == grant and r.code == 403 for r in audit_requests(installation, since, {who.user})
            ),
            what="the refused status patch in the audit log",
        )
        wait_until(
            lambda: installation.get("rayjob", naming.rayjob_name("std"), namespace), what="the RayJob"
        )
    # What the user sees: children, but `kubectl get dj` has no phase.
    assert status(installation, namespace, "std") == {}
    assert get_dj_column(installation, namespace, "std", "PHASE") == ""


# ---------------------------------------------------------------------------------------------- runtime

REPORT = """
import sys
from distillery_runtime.observe.status import StatusReporter

reporter = StatusReporter(sys.argv[1], sys.argv[2], min_interval=0)
reporter.progress({"step": 7, "loss": 0.25, "kl": 0.125, "tokens_per_s": 321.5}, 200)
reporter.checkpoint(7, "/checkpoints/step-7")
"""
"""What the trainer does (distillery_runtime.run.cli): the real reporter, its own client and config loading."""


OUTAGE = """
import sys
from distillery_runtime.observe.status import StatusReporter

reporter = StatusReporter(sys.argv[1], sys.argv[2], min_interval=0)
reporter.teacher_outage("qwen-7b", True, "no answer from http://qwen-7b within 120.0 s")
if sys.argv[3] == "back":
    reporter.teacher_outage("qwen-7b", False)
"""
"""What the trainer's loop does when its OutageTracker says a teacher went down (and came back)."""


def report_progress(kubeconfig: Path, namespace: str, job: str, script: str = REPORT, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    result = subprocess.run(
        [sys.executable, "-c", script, namespace, job, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


def teachers_ready(installation: Installation, namespace: str, job: str) -> dict[str, Any]:
    conditions = status(installation, namespace, job).get("conditions") or []
    return next((c for c in conditions if c["type"] == "TeachersReady"), {})


def get_dj_column(installation: Installation, namespace: str, job: str, column: str) -> str:
    """One column of `kubectl get dj JOB` as the user reads it (an empty cell is "")."""
    header, row = installation.admin("get", "dj", job, "-n", namespace).stdout.splitlines()[:2]
    names = header.split()
    starts = [header.index(f" {n}") + 1 if i else 0 for i, n in enumerate(names)]
    at = names.index(column)
    end = starts[at + 1] if at + 1 < len(starts) else None
    return row[starts[at] : end].strip()


def step_column(installation: Installation, namespace: str, job: str) -> str:
    return get_dj_column(installation, namespace, job, "STEP")


def head_service_account(installation: Installation, namespace: str, job: str) -> str:
    rayjob = wait_until(
        lambda: installation.get("rayjob", naming.rayjob_name(job), namespace), what="the RayJob"
    )
    return rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"]


def test_the_trainer_reports_progress_as_the_account_the_operator_made_for_its_job(
    installation: Installation, namespace: str, tmp_path: Path
) -> None:
    since = audit_offset(installation)
    with running_operator(installation, namespace, tmp_path / "operator.log"):
        apply(installation, namespace, example("quick"))  # as the quick start: no serviceAccountName
        apply(installation, namespace, example("other"))
        account = head_service_account(installation, namespace, "quick")
        assert account == naming.trainer_identity_name("quick")
        wait_until(
            lambda: installation.get("rolebinding", account, namespace), what="the trainer's RoleBinding"
        )
        wait_until(
            lambda: status(installation, namespace, "quick").get("phase"), what="the operator's status"
        )
        token = installation.token_kubeconfig(account, namespace)
        assert step_column(installation, namespace, "quick") == ""
        report_progress(token, namespace, "quick")
        assert step_column(installation, namespace, "quick") == "7"
        quick = status(installation, namespace, "quick")
        assert quick["lastCheckpoint"]["step"] == 7 and quick["progress"]["loss"] == 0.25
        # Its Role names its own job: the same account cannot touch another job's status.
        stderr = report_progress(token, namespace, "other")
        assert "403" in stderr or "Forbidden" in stderr, stderr
        assert step_column(installation, namespace, "other") == ""
        # The operator's own fields survived the runtime's patch (each writer names only its fields).
        assert quick["phase"] and quick["conditions"]
        # A teacher the trainer cannot reach: the runtime says so, the operator shows it on the job.
        report_progress(token, namespace, "quick", OUTAGE, "down")
        unavailable = wait_until(
            lambda: (
                (c := teachers_ready(installation, namespace, "quick")).get("reason") == "TeacherUnavailable"
                and c
            ),
            what="TeachersReady reason TeacherUnavailable",
        )
        assert "qwen-7b: the trainer cannot reach it: not answering since" in unavailable["message"]
        assert "no answer from http://qwen-7b within 120.0 s" in unavailable["message"]
        conditions = {c["type"]: c for c in status(installation, namespace, "quick")["conditions"]}
        assert conditions["TeacherUnavailable"]["status"] == "True"
        assert "qwen-7b: not answering since" in conditions["TeacherUnavailable"]["message"]
        wait_until(
            lambda: any(
                e["reason"] == "TeacherUnavailable" for e in events(installation, namespace, "quick")
            ),
            what="a TeacherUnavailable Event",
        )
        report_progress(token, namespace, "quick", OUTAGE, "back")
        wait_until(
            lambda: (
                teachers_ready(installation, namespace, "quick").get("reason")
                not in (None, "TeacherUnavailable")
            ),
            what="the outage to clear",
        )
        assert status(installation, namespace, "quick")["teacherOutages"] == []
        conditions = {c["type"]: c for c in status(installation, namespace, "quick")["conditions"]}
        assert conditions["TeacherUnavailable"]["status"] == "False"
    user = f"system:serviceaccount:{namespace}:{account}"
    used = {(r.grant, r.name, r.code) for r in audit_requests(installation, since, {user})}
    assert used == {
        (("patch", "distillery.io:distillationjobs/status"), "quick", 200),
        (("patch", "distillery.io:distillationjobs/status"), "other", 403),
    }  # the outage reports are status patches too: nothing more is needed


def test_a_job_naming_the_charts_runtime_account_reports_progress_through_the_charts_role(
    installation: Installation, namespace: str, tmp_path: Path
) -> None:
    # The chart as installed with this namespace in `runtime.namespaces`: its runtime objects here.
    runtime = [
        o
        for o in render_objects({"runtime": {"namespaces": [namespace]}})
        if o["metadata"].get("namespace") == namespace
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "runtime"
    ]
    assert sorted(o["kind"] for o in runtime) == ["Role", "RoleBinding", "ServiceAccount"]
    installation.admin("apply", "-f", "-", input=yaml_stream(runtime))
    with running_operator(installation, namespace, tmp_path / "operator.log"):
        apply(installation, namespace, example("own", serviceAccountName="distillery-runtime"))
        assert head_service_account(installation, namespace, "own") == "distillery-runtime"
        wait_until(lambda: status(installation, namespace, "own").get("phase"), what="the operator's status")
        report_progress(installation.token_kubeconfig("distillery-runtime", namespace), namespace, "own")
        assert step_column(installation, namespace, "own") == "7"
        # Nothing was made for a job that brings its own account.
        made = children(installation, namespace, "own")
        assert not made["serviceaccounts"] and not made["roles.rbac.authorization.k8s.io"], made
