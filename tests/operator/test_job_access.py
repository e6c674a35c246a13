"""Who may use a job's endpoints (`distillery.plan.access.auth`), as rendered and as the operator acts on it:
Ray token authentication of the trainer's cluster (on unless the platform or the job turns it off), and the
standalone teachers' key, a Secret made with the job's children, owned by the job, taken by secretKeyRef by
the teacher pods and the trainer's head, its value nowhere else."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from distillery_operator.reconcile.controller import RAY_AUTH_ENV, cluster_ray_auth, cluster_settings
from distillery_operator.render import ClusterSettings, RenderContext, render_job, with_new_key
from distillery_operator.teachers.loop import INTERVAL_ENV
from kube_emulator import DEPLOYMENTS, DJ, TEACHERS
from operator_harness import Cluster, load_example, running_operator, wait_for
from test_operator_decide import World, job_body

from distillery.api import RayAuth
from distillery.plan.access.auth import RAY_VERSION, key_digest
from distillery.validation import load_job

ROOT = Path(__file__).resolve().parents[2]
CTX = RenderContext(namespace="ml", owner_uid="uid-1")
SECRETS = "v1/secrets"


def rendered(example: str, *, spec: dict[str, Any] | None = None, ctx: RenderContext = CTX) -> list[dict]:
    job = load_job(ROOT / "examples" / example)
    if spec:
        job = job.model_copy(update={"spec": job.spec.model_copy(update=spec)})
    return render_job(job, ctx)


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def env_of(pod_template: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_template["spec"]["containers"]
    return {e["name"]: e for e in container.get("env", [])}


# ------------------------------------------------------------------------------------------------- Ray


def test_ray_token_authentication_is_on_by_default() -> None:
    cluster = one(rendered("gkd.yaml"), "RayJob")["spec"]["rayClusterSpec"]
    # KubeRay makes the token's Secret and gives it to the head, the workers and the submitter.
    assert cluster["authOptions"] == {"mode": "token"}
    # And refuses the RayJob without a rayVersion of at least 2.52 (KubeRay v1.7 on the test node).
    assert tuple(int(p) for p in cluster["rayVersion"].split(".")) >= (2, 52, 0)


def test_the_declared_ray_version_is_the_runtimes_floor() -> None:
    """The rayVersion KubeRay gates features by is the least Ray the runtime installs (pyproject.toml)."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    every = [
        *project["dependencies"],
        *(d for extra in project["optional-dependencies"].values() for d in extra),
    ]
    floors = [d.split(">=")[1] for d in every if d.startswith("ray[")]
    assert floors == [RAY_VERSION]


@pytest.mark.parametrize(
    ("platform", "job", "on"),
    [
        (RayAuth.DISABLED, None, False),  # the platform's choice where the job makes none
        (RayAuth.DISABLED, RayAuth.TOKEN, True),  # the job's choice wins
        (RayAuth.TOKEN, RayAuth.DISABLED, False),  # the documented opt-out
    ],
)
def test_the_jobs_choice_wins_over_the_platforms(platform: RayAuth, job: RayAuth | None, on: bool) -> None:
    ctx = RenderContext(namespace="ml", cluster=ClusterSettings(ray_auth=platform))
    cluster = one(rendered("gkd.yaml", spec={"ray_auth": job}, ctx=ctx), "RayJob")["spec"]["rayClusterSpec"]
    # Off: no authOptions at all, the RayJob of a KubeRay that predates them.
    assert cluster.get("authOptions") == ({"mode": "token"} if on else None)


def test_the_platforms_choice_is_read_from_the_charts_variable() -> None:
    assert cluster_settings({}).ray_auth == RayAuth.TOKEN
    assert cluster_ray_auth({RAY_AUTH_ENV: "disabled"}) == RayAuth.DISABLED
    with pytest.raises(ValueError, match=r"^DISTILLERY_RAY_AUTH='off': not one of token, disabled$"):
        cluster_ray_auth({RAY_AUTH_ENV: "off"})


# ---------------------------------------------------------------------------------------- teacher key


def test_standalone_teachers_and_the_head_take_the_jobs_key_by_reference() -> None:
    objects = rendered("gkd.yaml")
    secret = one(objects, "Secret")
    name = secret["metadata"]["name"]
    assert name == "gkd-jsd-teacher-key"
    # Owned by the job (the garbage collector deletes it with it), and rendered without any value.
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert "data" not in secret and "stringData" not in secret
    ref = {"secretKeyRef": {"name": name, "key": "api-key"}}
    teacher = one(objects, "Deployment")["spec"]["template"]
    assert env_of(teacher)["VLLM_API_KEY"] == {"name": "VLLM_API_KEY", "valueFrom": ref}
    rayjob = one(objects, "RayJob")["spec"]
    head = env_of(rayjob["rayClusterSpec"]["headGroupSpec"]["template"])
    assert head["DISTILLERY_TEACHER_TEACHER_API_KEY"] == {
        "name": "DISTILLERY_TEACHER_TEACHER_API_KEY",
        "valueFrom": ref,
    }
    # The driver alone talks to teachers: the workers and the submitter get no key.
    for group in rayjob["rayClusterSpec"]["workerGroupSpecs"]:
        assert not any("API_KEY" in name for name in env_of(group["template"]))
    assert not any("API_KEY" in name for name in env_of(rayjob["submitterPodTemplate"]))
    # The trainer's client settings name the variable and the Secret, as for an external teacher's key.
    config = orjson.loads(one(objects, "ConfigMap")["data"]["runtime-config.json"])
    client = config["teachers"][0]["client"]
    assert client["apiKeyEnv"] == "DISTILLERY_TEACHER_TEACHER_API_KEY"
    assert client["apiKeySecret"] == {"name": name, "key": "api-key"} and client["jobKey"] is True
    # The probes stay on /health, which answers without a key.
    (container,) = teacher["spec"]["containers"]
    assert {container[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")} == {
        "/health"
    }


@pytest.mark.parametrize("example", ["external-teacher.yaml", "colocated-teacher.yaml"])
def test_no_key_secret_without_a_teacher_the_operator_runs(example: str) -> None:
    assert not [o for o in rendered(example) if o["kind"] == "Secret"]


def test_a_job_sends_its_own_key_to_the_shared_teacher_it_references() -> None:
    objects = rendered("shared-teacher.yaml")
    name = one(objects, "Secret")["metadata"]["name"]
    assert name == "shared-teacher-teacher-key"
    assert not [o for o in objects if o["kind"] == "Deployment"]  # the teacher's replicas are not the job's
    head = env_of(one(objects, "RayJob")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"])
    (variable,) = [v for v in head if v.endswith("_API_KEY")]
    assert head[variable]["valueFrom"] == {"secretKeyRef": {"name": name, "key": "api-key"}}
    config = orjson.loads(one(objects, "ConfigMap")["data"]["runtime-config.json"])
    client = config["teachers"][0]["client"]
    assert client["apiKeyEnv"] == variable and client["jobKey"] is True
    # The shared teacher learns the job's key from its clients Secret a little after the job starts: the
    # trainer waits out its refusals at start-up (`local.wait_for_teachers`), where a standalone one's is final.
    assert client["keyArrivesLate"] is True
    standalone = orjson.loads(one(rendered("gkd.yaml"), "ConfigMap")["data"]["runtime-config.json"])
    assert standalone["teachers"][0]["client"].get("keyArrivesLate", False) is False


def test_the_key_is_made_at_creation_only_and_random() -> None:
    secret = one(rendered("gkd.yaml"), "Secret")
    first, second = with_new_key(secret), with_new_key(secret)
    key = base64.b64decode(first["data"]["api-key"]).decode()
    assert len(key) >= 43 and key != base64.b64decode(second["data"]["api-key"]).decode()
    assert "data" not in secret  # the rendered object is left as it was


def test_the_secret_is_created_with_the_pods_that_take_it_and_not_again() -> None:
    world = World(job_body("gkd.yaml"))
    first = world.step()
    kinds = [a.kind for a in first.actions if a.verb == "create"]
    # Made in the same step as the children, before the teacher Deployment and the RayJob.
    assert kinds.index("Secret") < kinds.index("Deployment") < kinds.index("RayJob")
    secret = world.objects[("Secret", "gkd-jsd-teacher-key")]
    assert secret["metadata"]["ownerReferences"][0] == {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationJob",
        "name": "gkd-jsd",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    world.settle()
    assert not [a for a in world.decide("2026-01-01T00:00:10Z").actions if a.kind == "Secret"]
    # A teacher Deployment deleted: made again, and the key with it (found made, a 409 the controller checks).
    del world.objects[("Deployment", "gkd-jsd-teacher-teacher")]
    again = world.decide("2026-01-01T00:00:20Z")
    assert [(a.verb, a.kind) for a in again.actions] == [("create", "Secret"), ("create", "Deployment")]


def test_a_teacher_made_before_keys_gets_the_secret_before_its_pods_roll_onto_it() -> None:
    """An operator upgraded under a running job whose children it made before teacher keys existed: the
    Deployment is patched to take the key, and the Secret is made first, so its new pods never wait on a
    Secret nothing makes (the trainer's head, which predates the key, is then refused by its teacher with
    one line naming the key: docs/security.md says to let such jobs finish or restart them)."""
    world = World(job_body("gkd.yaml"))
    world.settle()
    deployment = world.objects[("Deployment", "gkd-jsd-teacher-teacher")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container["env"] = [e for e in container["env"] if e["name"] != "VLLM_API_KEY"]
    deployment["metadata"]["annotations"]["distillery.io/spec-hash"] = "from-an-operator-before-keys"
    del world.objects[("Secret", "gkd-jsd-teacher-key")]
    upgraded = world.decide("2026-01-01T00:00:30Z")
    writes = [(a.verb, a.kind) for a in upgraded.actions]
    assert writes.index(("create", "Secret")) < writes.index(("patch", "Deployment")), writes


# ------------------------------------------------------------------------------- the operator, acting


async def test_the_operator_makes_the_key_with_the_children_owned_by_the_job(operator: Cluster) -> None:
    job = load_example("gkd.yaml")
    await operator.create(job)
    name = "gkd-jsd-teacher-key"
    secret = await wait_for(lambda: operator.emulator.obj(SECRETS, operator.namespace, name), what="key")
    uid = operator.job(job["metadata"]["name"])["metadata"]["uid"]  # type: ignore[index]
    assert [ref["uid"] for ref in secret["metadata"]["ownerReferences"]] == [uid]
    key = base64.b64decode(secret["data"]["api-key"]).decode()
    assert len(key) >= 43
    # The key is in the Secret alone: not in the job's status, its children or its Events.
    await wait_for(lambda: operator.emulator.obj(DEPLOYMENTS, operator.namespace, "gkd-jsd-teacher-teacher"))
    everything = orjson.dumps(
        [r.data for r in operator.emulator.api_requests() if not r.url.path.endswith("/secrets")]
    )
    assert b'"kind":"Deployment"' in everything and key.encode() not in everything
    # Deleted with the Deployment, the key is found made again: the same value, nothing refused.
    await operator.delete(DEPLOYMENTS, "gkd-jsd-teacher-teacher")
    await wait_for(lambda: operator.emulator.obj(DEPLOYMENTS, operator.namespace, "gkd-jsd-teacher-teacher"))
    after = operator.emulator.obj(SECRETS, operator.namespace, name)
    assert after is not None and after["data"] == secret["data"]
    assert "API error" not in (operator.status(job["metadata"]["name"]).get("message") or "")


async def test_a_key_secret_of_someone_else_holds_the_pods_back(operator: Cluster) -> None:
    job = load_example("gkd.yaml")
    planted = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gkd-jsd-teacher-key"}}
    await operator.create(copy.deepcopy(planted), SECRETS)
    await operator.create(job)
    message = await wait_for(
        lambda: (
            "not this job's" in (operator.status(job["metadata"]["name"]).get("message") or "")
            and operator.status(job["metadata"]["name"])["message"]
        ),
        what="the refusal",
    )
    assert "Secret gkd-jsd-teacher-key exists and is not this job's" in message
    # Nothing that would take a key it does not own is made.
    assert operator.emulator.obj(DEPLOYMENTS, operator.namespace, "gkd-jsd-teacher-teacher") is None


async def test_a_shared_teacher_knows_each_of_its_jobs_by_its_own_key(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs use one DistillationTeacher: its clients Secret holds the digest of each one's key (read from
    the job's key Secret), the keys themselves nowhere; a job deleted leaves it, the other stays."""
    monkeypatch.setenv(INTERVAL_ENV, "1")
    c = cluster
    await c.create(load_example("teachers/qwen-7b.yaml", name="shared"), TEACHERS)
    jobs = []
    for name in ("uses-a", "uses-b"):
        job = load_example("shared-teacher.yaml", name=name)
        job["spec"]["teachers"][0]["teacherRef"] = {"name": "shared"}
        jobs.append(job)

    def clients() -> dict[str, str]:
        secret = c.emulator.obj(SECRETS, c.namespace, "shared-clients") or {}
        data = (secret.get("data") or {}).get("clients.json")
        return orjson.loads(base64.b64decode(data))["jobs"] if data else {}

    def key_of(job: str) -> str:
        secret = c.emulator.obj(SECRETS, c.namespace, f"{job}-teacher-key") or {}
        return base64.b64decode(secret["data"]["api-key"]).decode()

    async with running_operator(c):
        for job in jobs:
            await c.create(job)
        both = {f"{c.namespace}/uses-a", f"{c.namespace}/uses-b"}
        found = await wait_for(lambda: clients() if set(clients()) == both else None, what="both clients")
        assert found == {f"{c.namespace}/{j}": key_digest(key_of(j)) for j in ("uses-a", "uses-b")}
        assert key_of("uses-a") != key_of("uses-b")
        # Only digests left the job's Secret: no key in any write but the Secrets' own creation.
        writes = orjson.dumps(
            [r.data for r in c.emulator.api_requests() if "teacher-key" not in str(r.url.path)]
        )
        assert key_of("uses-a").encode() not in writes and key_of("uses-b").encode() not in writes
        deployment = c.emulator.obj(DEPLOYMENTS, c.namespace, "shared") or {}
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert {"name": "teacher-clients", "secret": {"secretName": "shared-clients"}} in volumes
        # Job a deleted: its key is revoked at the teacher, b keeps its own.
        await c.delete(DJ, "uses-a")
        await wait_for(lambda: set(clients()) == {f"{c.namespace}/uses-b"}, what="a's key revoked")
