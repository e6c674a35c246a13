"""The test cluster itself: each gap of kmock that kube_emulator.py closes behaves as the API server does.

If the emulator lied (say, bumped `generation` on status writes), the operator tests would prove less;
these tests pin the behaviour the operator tests rely on.
"""

from __future__ import annotations

from pathlib import Path

from distillery_operator.metrics import METRIC_NAMES, REGISTRY
from kube_emulator import CONFIGMAPS, DJ
from operator_harness import Cluster, load_example
from prometheus_client import generate_latest


async def patch(cluster: Cluster, path: str, body: object, content_type: str) -> int:
    async with cluster.emulator.patch(path, json=body, headers={"Content-Type": content_type}) as resp:
        return resp.status


JOB_URL = "/apis/distillery.io/v1alpha1/namespaces/test/distillationjobs/gkd-jsd"


async def test_metadata_generation_and_status_subresource(cluster: Cluster) -> None:
    c = cluster
    await c.create(load_example("gkd.yaml"))
    meta = c.job("gkd-jsd")["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["namespace"] == "test"
    assert meta["generation"] == 1
    rv = int(meta["resourceVersion"])

    # A status write changes only the status, never the generation.
    body = {"status": {"phase": "Running"}, "spec": {"suspend": True}}
    assert await patch(c, JOB_URL + "/status", body, "application/merge-patch+json") == 200
    job = c.job("gkd-jsd")
    assert job["status"] == {"phase": "Running"} and "suspend" not in job["spec"]
    assert job["metadata"]["generation"] == 1 and int(job["metadata"]["resourceVersion"]) > rv

    # A spec write bumps the generation and cannot touch the status.
    body = {"status": {"phase": "Hacked"}, "spec": {"suspend": True}}
    assert await patch(c, JOB_URL, body, "application/merge-patch+json") == 200
    job = c.job("gkd-jsd")
    assert job["spec"]["suspend"] is True and job["status"] == {"phase": "Running"}
    assert job["metadata"]["generation"] == 2
    # Metadata-only writes do not.
    assert (
        await patch(c, JOB_URL, {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json") == 200
    )
    assert c.job("gkd-jsd")["metadata"]["generation"] == 2


async def test_json_patch_with_a_stale_resource_version_is_refused(cluster: Cluster) -> None:
    c = cluster
    await c.create(load_example("gkd.yaml"))
    rv = c.job("gkd-jsd")["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/f"]},
    ]
    assert await patch(c, JOB_URL, ops, "application/json-patch+json") == 200
    assert c.job("gkd-jsd")["metadata"]["finalizers"] == ["example.com/f"]
    # The same test again: the resourceVersion moved on, so it fails with 422 and changes nothing.
    ops[1] = {"op": "remove", "path": "/metadata/finalizers"}
    assert await patch(c, JOB_URL, ops, "application/json-patch+json") == 422
    assert c.job("gkd-jsd")["metadata"]["finalizers"] == ["example.com/f"]


async def test_garbage_collection_follows_owner_references(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    await c.create(load_example("gkd.yaml"))
    uid = c.job("gkd-jsd")["metadata"]["uid"]
    owned = {"apiVersion": "v1", "kind": "ConfigMap", "data": {}}
    owner_ref = {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationJob",
        "name": "gkd-jsd",
        "uid": uid,
    }
    await c.create({**owned, "metadata": {"name": "owned", "ownerReferences": [owner_ref]}}, CONFIGMAPS)
    await c.create({**owned, "metadata": {"name": "free"}}, CONFIGMAPS)
    await c.delete(DJ, "gkd-jsd")
    assert c.emulator.object_names(CONFIGMAPS, "test") == ["free"]


def test_every_metric_name_is_exposed() -> None:
    import distillery_operator.reconcile.controller  # noqa: F401  # registers nothing new; metrics are module-level

    text = generate_latest(REGISTRY).decode()
    for name in METRIC_NAMES:
        assert f"# HELP {name} " in text, name
    assert "# HELP process_cpu_seconds_total " in text


def test_metrics_endpoint_serves_only_the_operators_registry() -> None:
    # A library that registers in prometheus-client's global registry (vLLM, Ray do) must not leak
    # into the operator's /metrics, where the chart's alerts and promtool's lint apply.
    from prometheus_client import REGISTRY as GLOBAL
    from prometheus_client import Counter

    foreign = Counter("some_library_events", "Registered globally by another library.", registry=GLOBAL)
    try:
        assert "some_library_events" in generate_latest(GLOBAL).decode()
        assert "some_library_events" not in generate_latest(REGISTRY).decode()
    finally:
        GLOBAL.unregister(foreign)
