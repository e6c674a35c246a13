"""End to end: the real kopf operator against the emulated API server, driven as a user drives a cluster.

The emulator has no controllers, so the tests play them where the story needs it: KubeRay (RayJob status),
the Deployment controller (readyReplicas), Kueue (unsuspending) and the garbage collector (in the
emulator). Everything the operator does, it does through the real HTTP API.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parent))

from kube_emulator import CONFIGMAPS, DEPLOYMENTS, DJ, EVENTS, RAYJOBS, SERVICES
from operator_harness import (
    FAST,
    REPO,
    Cluster,
    free_port,
    load_example,
    quiet,
    running_operator,
    spawn_operator,
    verbs_used,
    wait_for,
)

from distillery.api import API_VERSION

pytestmark = pytest.mark.timeout(120)

MOPD = "mopd-math-code"
MOPD_TEACHERS = [f"{MOPD}-teacher-{t}" for t in ("math", "code", "general")]


def events_for(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    out = []
    for event_name in cluster.emulator.object_names(EVENTS, cluster.namespace):
        event = cluster.emulator.obj(EVENTS, cluster.namespace, event_name) or {}
        if (event.get("involvedObject") or {}).get("name") == name:
            out.append(event)
    return out


def phase(cluster: Cluster, name: str) -> str | None:
    return cluster.status(name).get("phase")


def writes(cluster: Cluster) -> list[Any]:
    return [
        r
        for r in cluster.emulator.api_requests()
        if r.action is not None
        and str(getattr(r.action, "value", r.action)).lower() in ("create", "update")
        and r.resource is not None
        and r.resource.plural != "events"
    ]


async def test_lifecycle_with_kubectl(operator: Cluster) -> None:
    c = operator
    await c.kubectl("apply", "--validate=false", "-f", str(REPO / "examples" / "multi-teacher.yaml"))

    # Children appear, each owned by the job.
    await wait_for(lambda: c.emulator.obj(RAYJOBS, c.namespace, f"{MOPD}-trainer"), what="the RayJob")
    assert c.emulator.object_names(DEPLOYMENTS, c.namespace) == sorted(MOPD_TEACHERS)
    assert c.emulator.object_names(SERVICES, c.namespace) == sorted(MOPD_TEACHERS)
    assert c.emulator.object_names(CONFIGMAPS, c.namespace) == [f"{MOPD}-config"]
    uid = c.job(MOPD)["metadata"]["uid"]
    for resource, name in [(RAYJOBS, f"{MOPD}-trainer"), (CONFIGMAPS, f"{MOPD}-config")] + [
        (r, n) for r in (DEPLOYMENTS, SERVICES) for n in MOPD_TEACHERS
    ]:
        refs = c.emulator.obj(resource, c.namespace, name)["metadata"]["ownerReferences"]
        assert refs == [
            {"apiVersion": API_VERSION, "kind": "DistillationJob", "name": MOPD, "uid": uid,
             "controller": True, "blockOwnerDeletion": True}
        ]  # fmt: skip
    await wait_for(lambda: phase(c, MOPD) == "StartingTeachers", what="StartingTeachers")
    assert c.status(MOPD)["teachersReady"] == "0/3"
    assert c.status(MOPD)["observedGeneration"] == 1

    # The Deployment controller reports the teachers ready, one by one.
    for index, name in enumerate(MOPD_TEACHERS):
        await c.play_deployment(name, 1)
        await wait_for(
            lambda i=index: c.status(MOPD).get("teachersReady") == f"{i + 1}/3", what="teacher ready"
        )
    await wait_for(
        lambda: (c.condition(MOPD, "TeachersReady") or {}).get("status") == "True", what="TeachersReady"
    )
    await wait_for(lambda: phase(c, MOPD) == "Pending", what="Pending while the trainer starts")

    # KubeRay starts the job.
    await c.play_rayjob(f"{MOPD}-trainer", "RUNNING", "Running")
    await wait_for(lambda: phase(c, MOPD) == "Running", what="Running")
    assert c.condition(MOPD, "TrainerReady")["status"] == "True"
    assert c.status(MOPD)["startTime"]

    # The runtime reports progress through the status subresource; the operator keeps it.
    progress = {"step": 7, "totalSteps": 500, "loss": 0.25}
    await c.emulator.play(DJ, c.namespace, MOPD, {"status": {"progress": progress}})
    await c.play_deployment(MOPD_TEACHERS[0], 1)  # any child event makes the operator reconcile
    await asyncio.sleep(0.3)
    assert c.status(MOPD)["progress"] == progress
    assert phase(c, MOPD) == "Running"

    # KubeRay finishes it: Succeeded, Complete, teachers scaled to zero (their GPUs go back).
    await c.play_rayjob(f"{MOPD}-trainer", "SUCCEEDED", "Complete")
    await wait_for(lambda: phase(c, MOPD) == "Succeeded", what="Succeeded")
    assert c.condition(MOPD, "Complete")["status"] == "True"
    await wait_for(
        lambda: all(
            c.emulator.obj(DEPLOYMENTS, c.namespace, n)["spec"]["replicas"] == 0 for n in MOPD_TEACHERS
        ),
        what="teachers scaled to zero",
    )
    assert c.status(MOPD)["completionTime"]
    assert c.status(MOPD)["progress"] == progress

    # Events tell the story; kubectl sees the phase.
    expected = {"StartingTeachers", "Pending", "Running", "Succeeded", "AllTeachersReady", "RayJobRunning"}
    # kopf posts Events from a queue, a moment after the status write.
    await wait_for(lambda: expected <= {e["reason"] for e in events_for(c, MOPD)}, what=f"events {expected}")
    out = await c.kubectl("get", "dj", MOPD, "-o", "jsonpath={.status.phase}")
    assert out == "Succeeded"

    # Level-triggered and idempotent: more events change nothing once converged.
    await quiet(c)
    before = len(writes(c))
    await c.play_rayjob(f"{MOPD}-trainer", "SUCCEEDED", "Complete")  # KubeRay repeats itself
    await c.emulator.play(
        DJ, c.namespace, MOPD, {"metadata": {"annotations": {"touched": "yes"}}}, subresource=""
    )
    await asyncio.sleep(0.5)
    assert len(writes(c)) == before + 2  # only the two writes this test made
    assert phase(c, MOPD) == "Succeeded"


async def test_suspend_and_resume(operator: Cluster) -> None:
    c = operator
    await c.create(load_example("gkd.yaml"))
    deployment, rayjob = "gkd-jsd-teacher-teacher", "gkd-jsd-trainer"
    await wait_for(lambda: c.emulator.obj(RAYJOBS, c.namespace, rayjob), what="RayJob")
    assert c.emulator.obj(RAYJOBS, c.namespace, rayjob)["spec"]["suspend"] is False
    await c.play_deployment(deployment, 1)
    await c.play_rayjob(rayjob, "RUNNING", "Running")
    await wait_for(lambda: phase(c, "gkd-jsd") == "Running", what="Running")

    await c.kubectl("patch", "dj", "gkd-jsd", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    await wait_for(lambda: phase(c, "gkd-jsd") == "Suspended", what="Suspended")
    await wait_for(
        lambda: c.emulator.obj(RAYJOBS, c.namespace, rayjob)["spec"]["suspend"] is True, what="suspend"
    )
    await wait_for(
        lambda: c.emulator.obj(DEPLOYMENTS, c.namespace, deployment)["spec"]["replicas"] == 0, what="0"
    )
    assert c.condition("gkd-jsd", "Suspended")["status"] == "True"
    assert c.condition("gkd-jsd", "SpecApplied")["status"] == "True"  # suspend is a live field

    await c.kubectl("patch", "dj", "gkd-jsd", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    await wait_for(
        lambda: c.emulator.obj(RAYJOBS, c.namespace, rayjob)["spec"]["suspend"] is False, what="resume"
    )
    await wait_for(
        lambda: c.emulator.obj(DEPLOYMENTS, c.namespace, deployment)["spec"]["replicas"] == 1, what="1"
    )
    await wait_for(lambda: c.condition("gkd-jsd", "Suspended")["status"] == "False", what="not suspended")
    await wait_for(
        lambda: phase(c, "gkd-jsd") == "Running", what="Running again"
    )  # KubeRay still says RUNNING


async def test_kueue_owns_the_unsuspend(operator: Cluster) -> None:
    c = operator
    name, rayjob = "qwen-7b-to-1p5b", "qwen-7b-to-1p5b-trainer"
    await c.create(load_example("standalone-teacher.yaml"))
    await wait_for(lambda: c.emulator.obj(RAYJOBS, c.namespace, rayjob), what="RayJob")
    created = c.emulator.obj(RAYJOBS, c.namespace, rayjob)
    assert created["spec"]["suspend"] is True
    assert created["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert (
        c.emulator.obj(DEPLOYMENTS, c.namespace, f"{name}-teacher-qwen-7b")["metadata"]["labels"].get(
            "kueue.x-k8s.io/queue-name"
        )
        is None
    )  # teachers are not queued by Kueue
    await wait_for(lambda: (c.condition(name, "TrainerReady") or {}).get("reason") == "Queued", what="Queued")
    assert phase(c, name) == "Pending"

    # Kueue admits the workload: it unsuspends the RayJob. The operator must not suspend it again.
    await c.emulator.play(RAYJOBS, c.namespace, rayjob, {"spec": {"suspend": False}}, subresource="")
    await c.play_rayjob(rayjob, "RUNNING", "Running")
    await c.play_deployment(f"{name}-teacher-qwen-7b", 2)
    await wait_for(lambda: phase(c, name) == "Running", what="Running")
    assert c.emulator.obj(RAYJOBS, c.namespace, rayjob)["spec"]["suspend"] is False

    # Suspending the DistillationJob does force the RayJob's suspend.
    await c.patch_spec(name, {"suspend": True})
    await wait_for(
        lambda: c.emulator.obj(RAYJOBS, c.namespace, rayjob)["spec"]["suspend"] is True, what="forced"
    )


async def test_spec_update_live_and_refused(operator: Cluster) -> None:
    c = operator
    await c.create(load_example("multi-teacher.yaml"))
    await wait_for(lambda: c.emulator.obj(RAYJOBS, c.namespace, f"{MOPD}-trainer"), what="RayJob")
    config_before = c.emulator.obj(CONFIGMAPS, c.namespace, f"{MOPD}-config")["data"]

    # Replicas are live: the Deployment follows.
    teachers = c.job(MOPD)["spec"]["teachers"]
    teachers[0]["replicas"] = 3
    await c.patch_spec(MOPD, {"teachers": teachers})
    await wait_for(
        lambda: c.emulator.obj(DEPLOYMENTS, c.namespace, MOPD_TEACHERS[0])["spec"]["replicas"] == 3, what="3"
    )
    await wait_for(lambda: c.status(MOPD).get("observedGeneration") == 2, what="generation 2")
    assert c.condition(MOPD, "SpecApplied")["status"] == "True"

    # The loss is not: refused with the field path, nothing half-applied.
    await c.patch_spec(MOPD, {"loss": {"mode": "forward_kl_topk", "topK": 16}})
    await wait_for(lambda: c.condition(MOPD, "SpecApplied")["status"] == "False", what="SpecApplied False")
    cond = c.condition(MOPD, "SpecApplied")
    assert cond["reason"] == "SpecChangeRefused"
    assert "spec.loss.mode" in cond["message"] and "spec.loss.topK" in cond["message"]
    assert c.status(MOPD)["observedGeneration"] == 3
    config_after = c.emulator.obj(CONFIGMAPS, c.namespace, f"{MOPD}-config")["data"]
    assert '"mode":"k3"' in config_after["runtime-config.json"]
    warnings = await wait_for(
        lambda: [e for e in events_for(c, MOPD) if e["reason"] == "SpecChangeRefused"], what="a Warning event"
    )
    assert warnings and warnings[0]["type"] == "Warning" and "spec.loss.topK" in warnings[0]["message"]
    assert config_before != config_after  # the live replicas change was recorded

    # Reverting the refused change clears the condition.
    await c.patch_spec(MOPD, {"loss": {"mode": "k3", "topK": None}})
    await wait_for(lambda: c.condition(MOPD, "SpecApplied")["status"] == "True", what="SpecApplied True")


async def test_delete_cascades_and_nothing_is_recreated(operator: Cluster) -> None:
    c = operator
    await c.kubectl("apply", "--validate=false", "-f", str(REPO / "examples" / "multi-teacher.yaml"))
    await wait_for(lambda: c.emulator.obj(RAYJOBS, c.namespace, f"{MOPD}-trainer"), what="RayJob")
    await c.kubectl("delete", "-f", str(REPO / "examples" / "multi-teacher.yaml"))
    await asyncio.sleep(0.5)
    for resource in (DEPLOYMENTS, SERVICES, CONFIGMAPS, RAYJOBS):
        assert c.emulator.object_names(resource, c.namespace) == [], resource
    assert c.job(MOPD) is None


async def test_invalid_spec_gets_a_condition_an_event_and_no_children(operator: Cluster) -> None:
    c = operator
    bad = load_example("multi-teacher.yaml")
    bad["spec"]["teachers"][1]["endpoint"] = "http://somewhere:8000"  # not allowed for standalone
    await c.create(bad)
    await wait_for(lambda: phase(c, MOPD) == "Invalid", what="Invalid")
    valid = c.condition(MOPD, "Valid")
    assert valid["status"] == "False" and "spec.teachers[1].endpoint" in valid["message"]
    found = await wait_for(
        lambda: [e for e in events_for(c, MOPD) if e["reason"] == "InvalidSpec"], what="event"
    )
    event = found[0]
    assert event["type"] == "Warning" and "spec.teachers[1].endpoint" in event["message"]
    for resource in (DEPLOYMENTS, SERVICES, CONFIGMAPS, RAYJOBS):
        assert c.emulator.object_names(resource, c.namespace) == []

    # Fixing the spec brings the job up.
    teachers = c.job(MOPD)["spec"]["teachers"]
    teachers[1].pop("endpoint")
    await c.patch_spec(MOPD, {"teachers": teachers})
    await wait_for(lambda: phase(c, MOPD) == "StartingTeachers", what="StartingTeachers")
    assert c.condition(MOPD, "Valid")["status"] == "True"
    await wait_for(lambda: c.emulator.obj(RAYJOBS, c.namespace, f"{MOPD}-trainer"), what="RayJob")


async def start_fake_teacher(port: int) -> web.AppRunner:
    """A real HTTP server answering /health as a vLLM server does (the teacher's model is not needed here)."""

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_external_teacher_outage_and_recovery(operator: Cluster) -> None:
    c = operator
    port = free_port()
    server = await start_fake_teacher(port)
    job = load_example("external-teacher.yaml")
    job["spec"]["teachers"][0]["endpoint"] = f"http://127.0.0.1:{port}"
    await c.create(job)
    name = "external-teacher"
    await wait_for(lambda: (c.condition(name, "TeachersReady") or {}).get("status") == "True", what="ready")
    assert c.status(name)["teachers"][0]["endpoint"] == f"http://127.0.0.1:{port}"
    assert c.emulator.object_names(DEPLOYMENTS, c.namespace) == []  # external: no objects

    await server.cleanup()  # the teacher stops answering
    await wait_for(lambda: c.condition(name, "TeachersReady")["status"] == "False", what="not ready")
    cond = c.condition(name, "TeachersReady")
    assert cond["reason"] == "TeacherUnavailable" and f"127.0.0.1:{port}/health" in cond["message"]
    await wait_for(
        lambda: any(
            e["reason"] == "TeacherUnavailable" and e["type"] == "Warning" for e in events_for(c, name)
        ),
        what="a Warning event",
    )

    server = await start_fake_teacher(port)  # and recovers by itself
    await wait_for(lambda: c.condition(name, "TeachersReady")["status"] == "True", what="recovered")
    await server.cleanup()


async def test_api_errors_are_retried_and_shown(operator: Cluster) -> None:
    c = operator
    # The first two Deployment creates fail (422, then 500), and the first status write too.
    c.emulator.faults[("create", "apps/v1/deployments")] = [422, 500]
    c.emulator.faults[("update", f"{DJ}/status")] = [503]
    await c.create(load_example("gkd.yaml"))

    # The error is in the status between two retries (0.1 s apart): look for it in the job's history.
    def messages() -> list[str]:
        job = c.emulator.objects[kmock.resource(DJ), c.namespace, "gkd-jsd"]
        return [str((v.get("status") or {}).get("message") or "") for v in job.history if v is not None]

    errors = await wait_for(
        lambda: [m for m in messages() if "API error" in m], what="the error in the status"
    )
    assert "create Deployment/gkd-jsd-teacher-teacher" in errors[0]
    await wait_for(
        lambda: c.emulator.obj(DEPLOYMENTS, c.namespace, "gkd-jsd-teacher-teacher"), what="retried"
    )
    await wait_for(
        lambda: "API error" not in (c.status("gkd-jsd").get("message") or ""), what="message cleared"
    )
    await wait_for(lambda: any(e["reason"] == "ApiError" for e in events_for(c, "gkd-jsd")), what="event")
    assert c.emulator.faults[("create", "apps/v1/deployments")] == []


async def test_idle_jobs_cost_no_api_writes(cluster: Cluster) -> None:
    c = cluster
    settings = type(FAST)(**{**FAST.__dict__, "resync_seconds": 0.1})  # resync very often
    async with running_operator(c, settings):
        for index in range(3):
            await c.create(load_example("gkd.yaml", name=f"idle-{index}"))
        await wait_for(
            lambda: all(phase(c, f"idle-{i}") == "StartingTeachers" for i in range(3)), what="phases"
        )
        before = await quiet(c)
        await asyncio.sleep(1.0)  # about ten safety-net resyncs per job
        after = c.emulator.api_requests()[before:]
        assert [(r.method, str(r.url.path)) for r in after] == []


async def test_operator_killed_mid_reconcile_converges_without_duplicates(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    jobs = [f"crash-{i}" for i in range(4)]
    for name in jobs:
        await c.create(load_example("multi-teacher.yaml", name=name))
    metrics_port, health_port = free_port(), free_port()
    args = ("--metrics-port", str(metrics_port), "--health-port", str(health_port))
    proc = spawn_operator(c, *args, log=tmp_path / "operator-1.log")

    def child_posts() -> int:
        return sum(1 for r in writes(c) if str(r.action.value).lower() == "create")

    try:
        # Kill -9 once it has created some children but not all (4 jobs x 8 children).
        await wait_for(lambda: child_posts() >= 5, timeout=30, what="first creates", interval=0.001)
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert child_posts() < 32, "the operator finished before it was killed; the test proves nothing"

    proc = spawn_operator(c, *args, log=tmp_path / "operator-2.log")
    try:
        await wait_for(
            lambda: all(phase(c, n) == "StartingTeachers" for n in jobs), timeout=30, what="converged"
        )
        await wait_for(
            lambda: all(c.emulator.obj(RAYJOBS, c.namespace, f"{n}-trainer") for n in jobs), what="RayJobs"
        )
        # Every child exists exactly once and was never deleted or recreated.
        for resource, per_job in ((DEPLOYMENTS, 3), (SERVICES, 3), (CONFIGMAPS, 1), (RAYJOBS, 1)):
            assert len(c.emulator.object_names(resource, c.namespace)) == per_job * len(jobs), resource
        for (res, _ns, _name), obj in c.emulator.objects.items():
            assert None not in list(obj.history), (res, _name)

        # The process serves its metrics and health endpoints.
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{health_port}/healthz") as resp:
                assert resp.status == 200
            async with session.get(f"http://127.0.0.1:{health_port}/readyz") as resp:
                assert resp.status == 200
            async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                text = await resp.text()
        assert 'distillery_operator_jobs{phase="StartingTeachers"} 4.0' in text
        assert "distillery_operator_reconciles_total{" in text
        assert "distillery_operator_reconcile_duration_seconds_bucket" in text

        # SIGTERM (a pod's deletion) stops it promptly and cleanly. Waited for off the loop: the emulator
        # that serves the operator's last requests runs on this loop.
        proc.terminate()
        started = time.monotonic()
        assert await asyncio.to_thread(proc.wait, 30) == 0
        # kopf waits 5 s for tasks it left behind before it cancels them; the operator leaves none.
        assert time.monotonic() - started < 4.5, (tmp_path / "operator-2.log").read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def test_rbac_pairs_are_what_the_chart_grants(operator: Cluster) -> None:
    """The (verb, resource) pairs the operator really uses, as the chart's Role must grant them."""
    c = operator
    await c.create(load_example("multi-teacher.yaml"))
    await wait_for(lambda: c.emulator.obj(RAYJOBS, c.namespace, f"{MOPD}-trainer"), what="RayJob")
    await c.play_deployment(MOPD_TEACHERS[0], 1)
    await wait_for(lambda: events_for(c, MOPD), what="an event")
    operator_requests = [
        r for r in c.emulator.api_requests()[1:] if r.resource is not None
    ]  # [0]: our create
    pairs = verbs_used(operator_requests, writes_only=True)
    assert pairs >= {
        ("create", "core:configmaps"),
        ("create", "core:services"),
        ("create", "apps:deployments"),
        ("create", "ray.io:rayjobs"),
        ("patch", "distillery.io:distillationjobs/status"),
        ("create", "core:events"),
    }
    assert ("patch", "distillery.io:distillationjobs") not in pairs  # no finalizers, no annotations


async def test_a_deleted_or_edited_child_is_put_back(operator: Cluster) -> None:
    c = operator
    await c.create(load_example("gkd.yaml"))
    deployment = "gkd-jsd-teacher-teacher"
    await wait_for(lambda: c.emulator.obj(RAYJOBS, c.namespace, "gkd-jsd-trainer"), what="RayJob")
    first_uid = c.emulator.obj(DEPLOYMENTS, c.namespace, deployment)["metadata"]["uid"]

    await c.delete(DEPLOYMENTS, deployment)  # someone deletes the teacher
    await wait_for(
        lambda: (
            (c.emulator.obj(DEPLOYMENTS, c.namespace, deployment) or {}).get("metadata", {}).get("uid")
            not in (None, first_uid)
        ),
        what="the Deployment recreated",
    )
    # Someone edits its image: the operator restores what it rendered.
    original = c.emulator.obj(DEPLOYMENTS, c.namespace, deployment)["spec"]["template"]["spec"]["containers"]
    edited = [{**original[0], "image": "someone/else:latest"}]
    patch = {
        "metadata": {"annotations": {"distillery.io/spec-hash": "edited"}},
        "spec": {"template": {"spec": {"containers": edited}}},
    }
    await c.emulator.play(DEPLOYMENTS, c.namespace, deployment, patch, subresource="")
    await wait_for(
        lambda: (
            c.emulator.obj(DEPLOYMENTS, c.namespace, deployment)["spec"]["template"]["spec"]["containers"]
            == original
        ),
        what="the edit reverted",
    )
