"""Rendering: every example renders to valid objects, and each placement mode gives the right children.

Built-in kinds are validated with kubernetes-validate in strict mode (unknown fields are errors); RayJobs
with jsonschema against KubeRay v1.7.0's CRD schema, plus a walk that flags fields the schema does not
declare (the API server would silently prune them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from distillery_operator import naming
from distillery_operator.render import (
    ENTRYPOINT,
    RenderContext,
    render_job,
    spec_hash,
)
from support.requirements import unavailable

from distillery.api import DistillationJob, ExternalAccess, Placement
from distillery.runtime_config import CONFIG_KEY, RuntimeConfig
from distillery.validation import load_job, parse_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
KUBE_VERSION = "1.32"
CTX = RenderContext(namespace="team-a", owner_uid="0d3f5c2e-1111-2222-3333-444455556666")


def kuberay_rayjob_crd() -> Path:
    """KubeRay v1.7.0's RayJob CRD, from the assets folder the control-plane tests use (`.ci/run` fills it;
    see README): skipped with this reason without it, a failure in CI."""
    folder = os.environ.get("KUBEBUILDER_ASSETS")
    path = Path(folder or ".") / "kuberay-crds" / "ray.io_rayjobs.yaml"
    if folder and path.exists():
        return path
    unavailable(f"KubeRay's RayJob CRD not found at $KUBEBUILDER_ASSETS/kuberay-crds ({folder or 'unset'})")


@cache
def rayjob_schema() -> dict[str, Any]:
    text = kuberay_rayjob_crd().read_text()
    crd = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # a 2 MB file
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


@cache
def rayjob_validator() -> jsonschema.protocols.Validator:
    # One validator for all tests; KubeRay's generated schema is not re-checked against the meta-schema
    # (that alone takes seconds on this machine).
    schema = rayjob_schema()
    return jsonschema.validators.validator_for(schema)(schema)


def undeclared_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of `obj` that a structural schema does not declare (the API server would prune them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, dict) and "properties" in schema:
        out = []
        for key, value in obj.items():
            if key not in schema["properties"]:
                out.append(f"{path}.{key}")
            else:
                out.extend(undeclared_fields(value, schema["properties"][key], f"{path}.{key}"))
        return out
    if isinstance(obj, list) and "items" in schema:
        return [
            f for i, item in enumerate(obj) for f in undeclared_fields(item, schema["items"], f"{path}[{i}]")
        ]
    return []


def validate(obj: dict[str, Any]) -> None:
    if obj["kind"] == "RayJob":
        rayjob_validator().validate(obj)
        assert undeclared_fields(obj, rayjob_schema()) == []
    else:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_valid_objects(example: Path) -> None:
    job = load_job(example)
    objects = render_job(job, CTX)
    assert objects, example
    for obj in objects:
        validate(obj)
        meta = obj["metadata"]
        assert len(meta["name"]) <= 63
        assert meta["namespace"] == "team-a"
        assert meta["labels"][naming.JOB_LABEL] == job.metadata.name
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "distillery-operator"
        if obj["kind"] == "PersistentVolumeClaim":
            assert "ownerReferences" not in meta  # kept after the job: the model is on it
            continue
        assert meta["ownerReferences"][0]["uid"] == CTX.owner_uid
        assert meta["ownerReferences"][0]["controller"] is True


def load(name: str) -> DistillationJob:
    return load_job(ROOT / "examples" / name)


def kueue_labelled(name: str) -> DistillationJob:
    """An example with the Kueue label the README's example shows commented out."""
    job = load(name)
    return job.model_copy(
        update={
            "metadata": job.metadata.model_copy(update={"labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}})
        }
    )


def test_standalone_teacher_deployment_and_service() -> None:
    job = kueue_labelled("standalone-teacher.yaml")
    objects = render_job(job, CTX)
    (deployment,) = by_kind(objects, "Deployment")
    (service,) = by_kind(objects, "Service")
    name = "qwen-7b-to-1p5b-teacher-qwen-7b"
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == name
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    cmd = container["command"]
    assert cmd[:3] == ["python", "-m", "distillery_runtime.teachers.server"]

    def flag(name: str) -> str:
        return cmd[cmd.index(name) + 1]

    assert int(flag("--max-logprobs")) >= job.spec.loss.top_k == 64
    assert int(flag("--max-model-len")) >= 1024 + 1024 + 1
    assert flag("--tensor-parallel-size") == "2"
    assert flag("--gpu-memory-utilization") == "0.9"
    assert flag("--served-model-name") == "qwen-7b"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # The token is a reference to the Secret, never its value.
    assert container["env"][0] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
    }
    # The key every request must carry: the job's teacher key Secret, by reference too.
    assert container["env"][1] == {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "qwen-7b-to-1p5b-teacher-key", "key": "api-key"}},
    }
    assert all("value" in e and e["name"] not in ("HF_TOKEN", "VLLM_API_KEY") for e in container["env"][2:])
    # 16 GiB a GPU and 1.25 x the 7B teacher's bfloat16 weights; /dev/shm half of it (plan.pod_resources).
    assert (
        container["resources"]["limits"]["memory"] == container["resources"]["requests"]["memory"] == "50Gi"
    )
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "25Gi"}} in pod["volumes"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert service["spec"]["clusterIP"] == "None"  # headless: the runtime spreads load over replicas
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # The queue label goes to the RayJob only (Kueue would otherwise try to admit the Deployment too).
    assert "kueue.x-k8s.io/queue-name" not in deployment["metadata"]["labels"]
    # Its PodDisruptionBudget: the same pods, evicted one at a time by a drain, owned by the job.
    (budget,) = by_kind(objects, "PodDisruptionBudget")
    assert budget["apiVersion"] == "policy/v1" and budget["metadata"]["name"] == name
    assert budget["spec"] == {"maxUnavailable": 1, "selector": deployment["spec"]["selector"]}
    assert budget["metadata"]["ownerReferences"] == deployment["metadata"]["ownerReferences"]


def test_a_cpu_teacher_sizes_its_kv_cache_instead_of_a_memory_fraction() -> None:
    """Found on a real node: vLLM's CPU worker reads --gpu-memory-utilization as a fraction of the node's
    memory (0.9 of it) and exited when less was free; a KV cache size skips that."""
    doc = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())
    doc["spec"]["teachers"][0]["pool"] = {"gpusPerReplica": 0}
    (deployment,) = by_kind(render_job(DistillationJob.model_validate(doc), CTX), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--gpu-memory-utilization" not in container["command"]
    assert {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"} in container["env"]


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_teacher_never_reports_usage_statistics(gpus: int) -> None:
    """vLLM sends usage statistics to its maintainers unless told not to; the runtime's own engines turn
    it off, and the teacher pods must too (a cluster's egress is often closed, and it is the user's data)."""
    doc = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())
    doc["spec"]["teachers"][0]["pool"] = {"gpusPerReplica": gpus}
    (deployment,) = by_kind(render_job(DistillationJob.model_validate(doc), CTX), "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert ("VLLM_CPU_KVCACHE_SPACE" in env) == (gpus == 0)


def test_extra_args_node_selector_and_tolerations_pass_through() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "gkd.yaml").read_text())
    doc["spec"]["teachers"][0]["pool"].update(
        nodeSelector={"gpu": "h100"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    job = DistillationJob.model_validate(doc)
    (deployment,) = by_kind(render_job(job, CTX), "Deployment")
    validate(deployment)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["containers"][0]["command"][-1] == "--enable-prefix-caching"


@pytest.mark.parametrize("example", ["external-teacher.yaml", "colocated-teacher.yaml"])
def test_external_and_colocated_teachers_get_no_objects(example: str) -> None:
    objects = render_job(load(example), CTX)
    # The NetworkPolicies of the Ray pods, the head and the submitter: no teacher pods to isolate.
    policies = ["NetworkPolicy"] * 3
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", *policies, "PersistentVolumeClaim", "RayJob"]


def test_an_external_teachers_key_and_ca_reach_the_driver_by_reference_only() -> None:
    """The head (the driver scores) gets the key from a secretKeyRef and the CA bundle as a file of its
    Secret; the runtime config names the variable and the file, the workers get neither."""
    job = load("external-teacher.yaml")
    job.spec.teachers[0] = job.spec.teachers[0].model_copy(
        update={
            "endpoint": "https://teacher.example.com",
            "external": ExternalAccess.model_validate(
                {
                    "apiKeySecret": {"name": "teacher-key", "key": "api-key"},
                    "caBundle": {"secretName": "corp-ca"},
                }
            ),
        }
    )
    objects = render_job(job, CTX)
    (rayjob,) = by_kind(objects, "RayJob")
    cluster = rayjob["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "head"}, "spec": head},
        KUBE_VERSION,
        strict=True,
    )
    (container,) = head["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DISTILLERY_TEACHER_BIG_API_KEY"] == {
        "name": "DISTILLERY_TEACHER_BIG_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "teacher-key", "key": "api-key"}},
    }
    volumes = {v["name"]: v for v in head["volumes"]}
    assert volumes["teacher-ca-big"] == {
        "name": "teacher-ca-big",
        "secret": {"secretName": "corp-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["teacher-ca-big"] == {
        "name": "teacher-ca-big",
        "mountPath": "/etc/distillery-teachers/big",
        "readOnly": True,
    }
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    assert "teacher-ca-big" not in str(worker) and "API_KEY" not in str(worker)

    (config_map,) = by_kind(objects, "ConfigMap")
    config = RuntimeConfig.model_validate_json(config_map["data"][CONFIG_KEY])
    client = config.teachers[0].client
    assert client is not None and client.tls and not client.resolve_dns
    assert (client.api_key_env, client.ca_file) == (
        "DISTILLERY_TEACHER_BIG_API_KEY",
        "/etc/distillery-teachers/big/ca.crt",
    )
    # What a leaked key would look like: no header, no value, in any object made.
    assert "Bearer" not in str(objects) and "valueFrom" not in config_map["data"][CONFIG_KEY]


def test_multi_teacher_gets_one_deployment_and_service_each() -> None:
    job = load("multi-teacher.yaml")
    objects = render_job(job, CTX)
    names = sorted(o["metadata"]["name"] for o in by_kind(objects, "Deployment"))
    assert names == sorted(f"mopd-math-code-teacher-{t}" for t in ("math", "code", "general"))
    assert len(by_kind(objects, "Service")) == 3
    assert sorted(o["metadata"]["name"] for o in by_kind(objects, "PodDisruptionBudget")) == names
    (config_map,) = by_kind(objects, "ConfigMap")
    config = RuntimeConfig.model_validate_json(config_map["data"][CONFIG_KEY])
    assert [t.endpoints for t in config.teachers] == [
        [f"http://mopd-math-code-teacher-{t}.team-a.svc:8000"] for t in ("math", "code", "general")
    ]
    assert config.status_target is not None and config.status_target.name == "mopd-math-code"


def test_a_job_name_starting_with_a_digit_names_services_and_endpoints_alike() -> None:
    # The API server refuses a Service whose name starts with a digit (kubernetes-validate does not check
    # names), and the runtime must reach each teacher at its Service's name.
    doc = yaml.safe_load((ROOT / "examples" / "multi-teacher.yaml").read_text())
    doc["metadata"]["name"] = "7b-math-code"
    objects = render_job(DistillationJob.model_validate(doc), CTX)
    for obj in objects:
        validate(obj)
    services = sorted(o["metadata"]["name"] for o in by_kind(objects, "Service"))
    assert services == sorted(f"d7b-math-code-teacher-{t}" for t in ("math", "code", "general"))
    for obj in by_kind(objects, "Service") + by_kind(objects, "RayJob"):
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"]), obj["metadata"]["name"]
    (config_map,) = by_kind(objects, "ConfigMap")
    config = RuntimeConfig.model_validate_json(config_map["data"][CONFIG_KEY])
    hosts = sorted(urlsplit(e).hostname.split(".")[0] for t in config.teachers for e in t.endpoints)
    assert hosts == services


def test_rayjob_runs_the_runtime_with_the_config() -> None:
    job = kueue_labelled("standalone-teacher.yaml")
    (rayjob,) = by_kind(render_job(job, CTX), "RayJob")
    spec = rayjob["spec"]
    assert spec["entrypoint"] == ENTRYPOINT == "distillery run /etc/distillery/runtime-config.json"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["suspend"] is True  # queued by Kueue: created suspended
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    (workers,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 1
    worker = workers["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    for template in (spec["rayClusterSpec"]["headGroupSpec"]["template"], workers["template"]):
        mounts = {m["mountPath"] for m in template["spec"]["containers"][0]["volumeMounts"]}
        assert {"/etc/distillery", "/checkpoints"} <= mounts
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in template["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        ]
        assert claims == ["distill-checkpoints", "datasets"]  # its checkpoints, read-write; its data
        assert template["spec"]["terminationGracePeriodSeconds"] == job.spec.termination_grace_period_seconds
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    timeout = str(job.spec.termination_grace_period_seconds - 10)
    assert head["lifecycle"]["preStop"]["exec"]["command"] == [
        "python", "-m", "distillery_runtime.prestop", "--timeout", timeout
    ]  # fmt: skip
    assert "lifecycle" not in workers["template"]["spec"]["containers"][0]
    # KubeRay finds the dashboard (to submit the job) and the GCS by these names; found on a real node.
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports == {
        "gcs-server": 6379,
        "dashboard": 8265,
        "client": 10001,
        "metrics": 8080,
        "runtime-metrics": 9100,
    }


def checkpoint_volumes(rayjob: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The volume mounted at `path` in the Ray head and in each worker group."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    found = []
    for template in (
        cluster["headGroupSpec"]["template"],
        *(g["template"] for g in cluster["workerGroupSpecs"]),
    ):
        mounts = {m["mountPath"]: m["name"] for m in template["spec"]["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        found.append(volumes[mounts[path]])
    return found


def with_checkpoint(example: str, **checkpoint: Any) -> DistillationJob:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["spec"]["checkpoint"] = checkpoint
    return parse_job(doc)


def test_an_ephemeral_checkpoint_folder_is_a_writable_empty_dir() -> None:
    """Found on a real node: without a claim nothing was mounted at checkpoint.path, and the image's user
    (uid 1000) cannot create /checkpoints, so the first checkpoint failed the run."""
    job = with_checkpoint("gkd.yaml", ephemeral=True)
    objects = render_job(job, CTX)
    assert by_kind(objects, "PersistentVolumeClaim") == []
    (rayjob,) = by_kind(objects, "RayJob")
    assert checkpoint_volumes(rayjob, "/checkpoints") == [{"name": "checkpoints", "emptyDir": {}}] * 2


def test_a_job_that_names_no_claim_gets_the_operators_claim_kept_after_it() -> None:
    """The trained model outlives the pods (issue 25): the claim `<job>-checkpoints`, sized from the
    student, ReadWriteMany (the head and the worker are two pods), in the cluster's default class, and with
    no owner reference, so that deleting the job leaves it; the head and the workers mount it."""
    job = load("gkd.yaml")
    assert job.spec.checkpoint.pvc is None and not job.spec.checkpoint.ephemeral
    objects = render_job(job, CTX)
    assert [o["kind"] for o in objects][-2:] == ["PersistentVolumeClaim", "RayJob"]  # before its pods
    (claim,) = by_kind(objects, "PersistentVolumeClaim")
    validate(claim)
    assert claim["metadata"]["name"] == naming.checkpoint_claim("gkd-jsd") == "gkd-jsd-checkpoints"
    assert "ownerReferences" not in claim["metadata"]
    assert claim["metadata"]["labels"][naming.COMPONENT_LABEL] == "checkpoints"
    # Qwen2.5-0.5B: 0.49B parameters x (4 checkpoints x 14 + 2) bytes x 1.1 + 1 GiB = 30.1 GiB.
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "31Gi"}},
        "volumeMode": "Filesystem",
    }
    (rayjob,) = by_kind(objects, "RayJob")
    mounted = {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "gkd-jsd-checkpoints"}}
    assert checkpoint_volumes(rayjob, "/checkpoints") == [mounted] * 2


def test_the_claim_takes_the_size_and_class_given_and_the_job_owns_it_when_told() -> None:
    job = with_checkpoint(
        "gkd.yaml", size="250Gi", storageClassName="nfs-rwx", deleteWithJob=True, path="/out"
    )
    (claim,) = by_kind(render_job(job, CTX), "PersistentVolumeClaim")
    validate(claim)
    assert claim["spec"]["resources"] == {"requests": {"storage": "250Gi"}}
    assert claim["spec"]["storageClassName"] == "nfs-rwx"
    (owner,) = claim["metadata"]["ownerReferences"]
    assert owner["uid"] == CTX.owner_uid and owner["kind"] == "DistillationJob"
    # `distillery render` knows no uid: no owner there either.
    (unowned,) = by_kind(render_job(job, RenderContext(namespace="team-a")), "PersistentVolumeClaim")
    assert "ownerReferences" not in unowned["metadata"]


def test_a_claim_the_job_names_is_mounted_and_none_is_made() -> None:
    job = with_checkpoint("gkd.yaml", pvc="my-claim")
    objects = render_job(job, CTX)
    assert by_kind(objects, "PersistentVolumeClaim") == []
    (rayjob,) = by_kind(objects, "RayJob")
    mounted = {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "my-claim"}}
    assert checkpoint_volumes(rayjob, "/checkpoints") == [mounted] * 2


def test_suspend_deadline_backoff_and_service_account() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "gkd.yaml").read_text())
    doc["spec"].update(suspend=True, activeDeadlineSeconds=3600, backoffLimit=2, serviceAccountName="trainer")
    doc["spec"]["checkpoint"] = {"pvc": "ckpt"}  # retries resume from a claim
    doc["metadata"]["labels"] = {"team": "nlp"}
    doc["spec"]["labels"] = {"cost-center": "42"}
    job = DistillationJob.model_validate(doc)
    objects = render_job(job, RenderContext(namespace="x", owner_uid="u", teachers_scaled_to_zero=True))
    (rayjob,) = by_kind(objects, "RayJob")
    validate(rayjob)
    assert rayjob["spec"]["suspend"] is True
    assert rayjob["spec"]["activeDeadlineSeconds"] == 3600
    assert rayjob["spec"]["backoffLimit"] == 2
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "trainer"
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 0
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == "nlp"
        assert obj["metadata"]["labels"]["cost-center"] == "42"


def test_long_job_names_give_valid_distinct_names() -> None:
    base = yaml.safe_load((ROOT / "examples" / "multi-teacher.yaml").read_text())
    seen: set[str] = set()
    for suffix in ("a", "b"):
        base["metadata"]["name"] = "a-very-long-distillation-job-name-" + "x" * 150 + suffix
        job = DistillationJob.model_validate(base)
        objects = render_job(job, CTX)
        for obj in objects:
            validate(obj)
            name = obj["metadata"]["name"]
            assert len(name) <= (naming.MAX_RAYJOB_NAME if obj["kind"] == "RayJob" else 63)
            assert len(obj["metadata"]["labels"][naming.JOB_LABEL]) <= 63
            seen.add(f"{obj['kind']}/{name}")
        # Deterministic: rendering again gives the same names and hashes.
        assert [o["metadata"] for o in render_job(job, CTX)] == [o["metadata"] for o in objects]
    assert len(seen) == 2 * len(objects)


def test_spec_hash_ignores_live_fields_only() -> None:
    job = load("gkd.yaml")
    (deployment,) = by_kind(render_job(job, CTX), "Deployment")
    (scaled,) = by_kind(
        render_job(job, RenderContext("team-a", CTX.owner_uid, teachers_scaled_to_zero=True)), "Deployment"
    )
    assert scaled["spec"]["replicas"] == 0 != deployment["spec"]["replicas"]
    assert spec_hash(scaled) == spec_hash(deployment)
    changed = {**deployment, "spec": {**deployment["spec"], "progressDeadlineSeconds": 5}}
    assert spec_hash(changed) != spec_hash(deployment)


def test_placements_cover_all_modes() -> None:
    modes = {t.placement for path in EXAMPLES for t in load_job(path).spec.teachers}
    assert modes == set(Placement)


def test_render_cli_prints_a_yaml_stream() -> None:
    # A guard against a hang, not a speed bound: the command takes 0.6 s, and more than 60 s at load ~50
    # (a clean-clone run while the node's shared-teacher scenario ran nine pods, 2026-12-02).
    result = subprocess.run(
        [sys.executable, "-m", "distillery_cli", "render", str(ROOT / "examples" / "multi-teacher.yaml"), "-n", "ml"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    identity = ["ServiceAccount", "Role", "RoleBinding"]  # the trainer's, made by the operator
    claim = ["PersistentVolumeClaim"]  # the checkpoints': the example names none
    key = ["Secret"]  # the standalone teachers' key (the operator puts its value in as it makes it)
    policies = ["NetworkPolicy"] * 4  # the Ray pods', the head's, the submitter's, the teachers'
    assert [d["kind"] for d in docs] == identity + ["ConfigMap"] + policies + key + [
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    ] * 3 + claim + ["RayJob"]
    assert all(d["metadata"]["namespace"] == "ml" for d in docs)
    assert "&id" not in result.stdout  # no YAML anchors: kubectl users read this


def test_render_cli_reports_bad_manifests(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "examples" / "gkd.yaml").read_text().replace("topK: 64", "topK: 0"))
    result = subprocess.run(
        [sys.executable, "-m", "distillery_cli", "render", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "spec.loss.topK" in result.stderr


def test_the_validators_catch_bad_objects() -> None:
    # The checks above can fail: a wrong type, an undeclared field, an unknown field of a built-in kind.
    objects = render_job(load("gkd.yaml"), CTX)
    (rayjob,) = by_kind(objects, "RayJob")
    bad = yaml.safe_load(yaml.safe_dump(rayjob))
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    typo = yaml.safe_load(yaml.safe_dump(rayjob))
    typo["spec"]["shutdownAfterJobFinish"] = True
    assert undeclared_fields(typo, rayjob_schema()) == [".spec.shutdownAfterJobFinish"]
    (deployment,) = by_kind(objects, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)


def test_pvc_locations_mount_their_claims_read_only_where_they_are_read() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "multi-teacher.yaml").read_text())
    spec = doc["spec"]
    spec["student"]["model"] = "pvc://models/qwen-1.5b"
    spec["data"]["train"]["path"] = "pvc://datasets.team-a/train.jsonl"
    standalone = next(t for t in spec["teachers"] if t.get("placement", "standalone") == "standalone")
    standalone["model"] = "pvc://models/qwen-7b"
    spec["checkpoint"] = {"pvc": "models", "path": "/checkpoints"}  # the same claim, written there
    job = DistillationJob.model_validate(doc)
    objects = render_job(job, CTX)
    for obj in objects:
        validate(obj)

    (rayjob,) = by_kind(objects, "RayJob")
    cluster = rayjob["spec"]["rayClusterSpec"]
    for pod in (
        cluster["headGroupSpec"]["template"]["spec"],
        cluster["workerGroupSpecs"][0]["template"]["spec"],
    ):
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
        data_volume = mounts["/mnt/distillery/pvc/datasets.team-a"]["name"]
        assert volumes[data_volume]["persistentVolumeClaim"] == {
            "claimName": "datasets.team-a",
            "readOnly": True,
        }
        # The checkpoint claim is one volume, written at the checkpoint path and read where models are.
        assert mounts["/mnt/distillery/pvc/models"] == {
            "name": "checkpoints",
            "mountPath": "/mnt/distillery/pvc/models",
            "readOnly": True,
        }
        assert "readOnly" not in mounts["/checkpoints"]
        assert [
            v["persistentVolumeClaim"]["claimName"] for v in volumes.values() if "persistentVolumeClaim" in v
        ] == [
            "models",
            "datasets.team-a",
        ]

    deployments = {d["metadata"]["labels"][naming.TEACHER_LABEL]: d for d in by_kind(objects, "Deployment")}
    pod = deployments[standalone["name"]]["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[command.index("--model") + 1] == "/mnt/distillery/pvc/models/qwen-7b"
    assert {"name": "pvc-models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod[
        "volumes"
    ]
    # The other teachers read no claim.
    for name, deployment in deployments.items():
        if name != standalone["name"]:
            claims = [
                v for v in deployment["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v
            ]
            assert claims == []


def _trainer_env(job: DistillationJob) -> list[list[dict[str, Any]]]:
    (rayjob,) = by_kind(render_job(job, CTX), "RayJob")
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]]
    return [t["spec"]["containers"][0]["env"] for t in templates]


def test_student_hf_token_secret_reaches_the_head_and_the_workers() -> None:
    """student.hfTokenSecret (a gated student or tokenizer on the Hub) is the trainer pods' HF_TOKEN, a
    reference to the Secret; it wins over a colocated teacher's, which they get otherwise."""
    doc = yaml.safe_load((ROOT / "examples" / "colocated-teacher.yaml").read_text())
    doc["spec"]["teachers"][0]["inference"] = {"hfTokenSecret": {"name": "teacher-hf", "key": "token"}}
    for token, expected in (
        ({"name": "student-hf", "key": "hf"}, {"name": "student-hf", "key": "hf"}),
        (None, {"name": "teacher-hf", "key": "token"}),
    ):
        if token:
            doc["spec"]["student"]["hfTokenSecret"] = token
        job = DistillationJob.model_validate(doc)
        for env in _trainer_env(job):
            tokens = [e for e in env if e["name"] == "HF_TOKEN"]
            assert tokens == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": expected}}]
        doc["spec"]["student"].pop("hfTokenSecret", None)
    doc["spec"]["teachers"][0].pop("inference")
    for env in _trainer_env(DistillationJob.model_validate(doc)):
        assert "HF_TOKEN" not in {e["name"] for e in env}
