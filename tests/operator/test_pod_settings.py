"""Pod settings (issue 26): every pod kind the operator renders gets the placement, priority, metadata,
env, volumes and image pull secrets its section of the spec (or the chart) asks for; `student.head` wins
over the student pool for the head and the submitter; and the spec refuses, in one line naming the field,
what would clash with what the operator sets itself. (That the API server admits such pods under Pod
Security `restricted`: tests/cluster/test_pod_admission_on_server.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from distillery_operator import naming
from distillery_operator.reconcile.controller import cluster_pull_secrets, cluster_settings
from distillery_operator.render import ClusterSettings, RenderContext, pod_templates, render_job
from support.pod_settings import AFFINITY, ENV, MOUNTS, SPREAD, TOLERATION, VOLUMES, job_with_settings

from distillery.api import DistillationJob
from distillery.api.pod import (
    OPERATOR_ENV,
    OPERATOR_ENV_PREFIX,
    OPERATOR_LABEL_PREFIXES,
    OPERATOR_MOUNT_PATHS,
    OPERATOR_VOLUME_PREFIX,
    OPERATOR_VOLUMES,
    PodSettings,
)
from distillery.plan.access.network import DEFAULT_NETWORK_POLICY
from distillery.plan.pods.resources import pod_resources
from distillery.validation import InvalidManifest, load_jobs, parse_job

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "tests" / "golden" / "variants.yaml"]
JOBS = [job for source in SOURCES for job in load_jobs(source)]


def _plain(job: DistillationJob) -> bool:
    """The job sets no pod setting and no pull secret: every env, volume and label of its pods is ours."""
    spec = job.spec
    sections = [spec.student.pool, spec.student.head, *(t.pool for t in spec.teachers)]
    unset = all(getattr(s, name) is None for s in sections for name in PodSettings.model_fields)
    return unset and not spec.image_pull_secrets


PLAIN = [job for job in JOBS if _plain(job)]
CTX = RenderContext(namespace="team-a")


def shaped(doc: dict[str, Any], ctx: RenderContext = CTX) -> dict[str, dict[str, Any]]:
    """Each pod template by kind: head, worker, submitter, teacher."""
    out = {}
    for where, template in pod_templates(render_job(DistillationJob.model_validate(doc), ctx)):
        kind = where.rsplit(":", 1)[1]
        out["teacher" if kind == "pod" else kind.removeprefix("worker-").replace("student", "worker")] = (
            template
        )
    return out


def test_every_pod_kind_gets_every_setting() -> None:
    templates = shaped(
        job_with_settings(),
        RenderContext(namespace="team-a", cluster=ClusterSettings(image_pull_secrets=("cluster-registry",))),
    )
    assert set(templates) == {"head", "worker", "submitter", "teacher"}
    for kind, template in templates.items():
        pod, meta = template["spec"], template["metadata"]
        assert pod["priorityClassName"] == "training-high", kind
        assert pod["affinity"] == AFFINITY, kind
        assert pod["topologySpreadConstraints"] == SPREAD, kind
        assert meta["labels"]["team"] == "ml" and meta["labels"]["cost-center"] == "c42", kind
        assert meta["annotations"] == {"sidecar.istio.io/inject": "false", "example.com/owner": "ml platform"}
        # The operator's labels are still there (its Services and PodMonitor select by them).
        assert meta["labels"][naming.MANAGED_BY_LABEL] == naming.MANAGED_BY, kind
        # The cluster's first, then the job's, each once.
        assert pod["imagePullSecrets"] == [{"name": "cluster-registry"}, {"name": "team-registry"}], kind
        container = pod["containers"][0]
        if kind == "submitter":
            # The submitter runs only the Ray CLI: the head's placement, not the runtime's env and volumes.
            assert "env" not in container and "volumes" not in pod, kind
            continue
        assert container["env"][-len(ENV) :] == ENV, kind
        assert pod["volumes"][-len(VOLUMES) :] == VOLUMES, kind
        assert container["volumeMounts"][-len(MOUNTS) :] == MOUNTS, kind
    for kind in ("head", "worker", "submitter"):
        assert templates[kind]["spec"]["nodeSelector"] == {"gpu": "h100"}, kind
        assert templates[kind]["spec"]["tolerations"] == [TOLERATION], kind


def test_the_operators_own_env_and_volumes_stay_first_and_unchanged() -> None:
    plain, settled = (
        shaped(job_with_settings()),
        shaped(yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())),
    )
    for kind in ("head", "worker", "teacher"):
        ours = settled[kind]["spec"]
        assert plain[kind]["spec"]["volumes"][: len(ours["volumes"])] == ours["volumes"], kind
        container = ours["containers"][0]
        assert plain[kind]["spec"]["containers"][0]["env"][: len(container["env"])] == container["env"], kind


def test_no_settings_render_nothing_new() -> None:
    # Jobs that set none of the new fields: their pods are as before (tests/golden pins them too).
    assert len(PLAIN) >= len(JOBS) - 1
    for job in PLAIN:
        for where, template in pod_templates(render_job(job, CTX)):
            pod = template["spec"]
            for key in ("priorityClassName", "affinity", "topologySpreadConstraints", "imagePullSecrets"):
                assert key not in pod, (where, key)
            assert "annotations" not in template["metadata"], where


def test_student_head_wins_for_the_head_and_the_submitter() -> None:
    doc = job_with_settings()
    doc["spec"]["student"]["head"] = {
        # Empty: none for the head (the workers keep the GPU nodes' selector and toleration).
        "nodeSelector": {},
        "tolerations": [],
        "priorityClassName": "driver",
        "resources": {"requests": {"cpu": "3"}, "limits": {"memory": "12Gi"}},
        "env": [{"name": "LOG_LEVEL", "value": "debug"}],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "podLabels": {"role": "driver"},
    }
    templates = shaped(doc)
    head, submitter, worker = (
        templates["head"]["spec"],
        templates["submitter"]["spec"],
        templates["worker"]["spec"],
    )
    for pod in (head, submitter):
        assert "nodeSelector" not in pod and "tolerations" not in pod
        assert pod["priorityClassName"] == "driver"
        # Unset on the head: the pool's.
        assert pod["affinity"] == AFFINITY
    assert templates["head"]["metadata"]["labels"]["role"] == "driver"
    assert "team" not in templates["head"]["metadata"]["labels"]
    assert worker["nodeSelector"] == {"gpu": "h100"} and worker["priorityClassName"] == "training-high"
    container = head["containers"][0]
    assert container["env"][-1] == {"name": "LOG_LEVEL", "value": "debug"}
    assert not any(e["name"] == "HTTPS_PROXY" for e in container["env"])
    assert head["volumes"][-1] == {"name": "scratch", "emptyDir": {}}
    assert not any(v["name"] == "cache" for v in head["volumes"])
    assert container["volumeMounts"][-1] == {"name": "scratch", "mountPath": "/scratch"}
    resources = container["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == "3"
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == "12Gi"
    # The submitter keeps KubeRay's limits: head.resources is the head's only.
    plan = pod_resources(DistillationJob.model_validate(doc).spec)
    assert plan.submitter.limits == {"cpu": "1", "memory": "1Gi"}
    assert "student.head.resources override it" in plan.lines()[0]


def test_head_placement_alone_moves_the_head_and_the_submitter() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())
    doc["spec"]["student"]["pool"].update(nodeSelector={"gpu": "h100"}, tolerations=[TOLERATION])
    cpu_node = {"key": "dedicated", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}
    doc["spec"]["student"]["head"] = {"nodeSelector": {"pool": "cpu"}, "tolerations": [cpu_node]}
    templates = shaped(doc)
    for kind in ("head", "submitter"):
        assert templates[kind]["spec"]["nodeSelector"] == {"pool": "cpu"}, kind
        assert templates[kind]["spec"]["tolerations"] == [cpu_node], kind
    assert templates["worker"]["spec"]["tolerations"] == [TOLERATION]


def test_the_operators_names_are_the_ones_the_spec_refuses() -> None:
    """OPERATOR_ENV, OPERATOR_VOLUMES and the rest name what the renderers set: a new variable, volume or
    label of the operator's that the lists miss fails here, before a user's can shadow it."""
    for job in PLAIN:
        for where, template in pod_templates(render_job(job, CTX)):
            pod = template["spec"]
            for container in pod["containers"]:
                for env in container.get("env", []):
                    name = env["name"]
                    assert name in OPERATOR_ENV or name.startswith(OPERATOR_ENV_PREFIX), (where, name)
                for mount in container.get("volumeMounts", []):
                    path = mount["mountPath"]
                    ours = any(path == p or path.startswith(p + "/") for p in OPERATOR_MOUNT_PATHS)
                    assert ours or path == job.spec.checkpoint.path, (where, path)
            for volume in pod.get("volumes", []):
                name = volume["name"]
                assert name in OPERATOR_VOLUMES or name.startswith(OPERATOR_VOLUME_PREFIX), (where, name)
            user = {**job.metadata.labels, **job.spec.labels}
            for key in template["metadata"]["labels"]:
                assert key in user or key.startswith(OPERATOR_LABEL_PREFIXES), (where, key)


def test_cluster_pull_secrets_are_read_from_one_variable() -> None:
    assert cluster_pull_secrets({}) == ()
    assert cluster_pull_secrets({"DISTILLERY_IMAGE_PULL_SECRETS": "a, b,,c "}) == ("a", "b", "c")


def problems(doc: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(InvalidManifest) as raised:
        parse_job(doc)
    return [(p.path, p.reason) for p in raised.value.problems]


POOL = "spec.student.pool"


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"env": [{"name": "HF_TOKEN", "value": "x"}]}, f"{POOL}.env[0].name", "the operator sets"),
        (
            {"env": [{"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
            f"{POOL}.env[0].valueFrom",
            "not both",
        ),
        ({"env": [{"name": "A", "valueFrom": {}}]}, f"{POOL}.env[0].valueFrom", "exactly one"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, f"{POOL}.env", "unique"),
        ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, f"{POOL}.volumes[0].name", "the operator mounts"),
        (
            {"volumes": [{"name": "pvc-data", "emptyDir": {}}]},
            f"{POOL}.volumes[0].name",
            "the operator mounts",
        ),
        (
            {"volumes": [{"name": "a", "emptyDir": {}, "secret": {"secretName": "s"}}]},
            f"{POOL}.volumes[0]",
            "exactly one",
        ),
        ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, f"{POOL}.volumeMounts", "names a volume"),
        (
            {
                "volumes": [{"name": "a", "emptyDir": {}}],
                "volumeMounts": [{"name": "a", "mountPath": "/mnt/distillery/pvc/x"}],
            },
            f"{POOL}.volumeMounts[0].mountPath",
            "the operator mounts",
        ),
        (
            {"podLabels": {"app.kubernetes.io/component": "x"}},
            f"{POOL}.podLabels",
            "'app.kubernetes.io/component' is reserved for the operator",
        ),
        ({"podLabels": {"bad key": "x"}}, f"{POOL}.podLabels", "label keys"),
        ({"priorityClassName": "High"}, f"{POOL}.priorityClassName", "pattern"),
        (
            {"topologySpreadConstraints": [{**SPREAD[0], "maxSkew": 0}]},
            f"{POOL}.topologySpreadConstraints[0].maxSkew",
            "greater",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_settings_are_refused_in_one_line_naming_the_field(
    changes: dict[str, Any], field: str, words: str
) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())
    doc["spec"]["student"]["pool"].update(changes)
    found = problems(doc)
    assert any(path == field and words in reason for path, reason in found), found
    assert all("\n" not in reason for _, reason in found)


def test_the_applied_spec_renders_the_same_pods() -> None:
    """The operator renders from the applied spec (the ConfigMap's, every default written out): its pods
    must be the very ones a fresh spec gives, or every reconcile would see drift."""
    job = DistillationJob.model_validate(job_with_settings())
    applied = job.model_copy(update={"spec": type(job.spec).model_validate(job.spec.to_yaml_dict())})
    assert pod_templates(render_job(applied, CTX)) == pod_templates(render_job(job, CTX))


def test_the_network_policy_variable_is_parsed_once_and_a_bad_one_names_itself() -> None:
    assert cluster_settings({}).network_policy == DEFAULT_NETWORK_POLICY  # on unless the chart says off
    assert cluster_settings({"DISTILLERY_NETWORK_POLICY": "off"}).network_policy is None
    value = '{"kuberay": {"namespace": "ray"}, "monitoring": {"namespace": "prom"}}'
    parsed = cluster_settings({"DISTILLERY_NETWORK_POLICY": value}).network_policy
    assert parsed is not None and (parsed.kuberay.namespace, parsed.monitoring.namespace) == ("ray", "prom")
    with pytest.raises(ValueError, match=r"DISTILLERY_NETWORK_POLICY=.*neither `off` nor a JSON object"):
        cluster_settings({"DISTILLERY_NETWORK_POLICY": "kuberay=ray"})
