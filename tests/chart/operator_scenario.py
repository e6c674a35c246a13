"""One operator scenario that walks through what the operator does in a cluster, for the RBAC and metrics tests.

It uses the operator area's harness (tests/operator: the kmock emulator with its gaps closed, the real
operator in-process) and plays the missing controllers (Deployments, KubeRay) as its tests do. Jobs:
- `std`: a standalone teacher; its Deployment becomes ready, the RayJob runs, the spec is edited live
  (teacher replicas: a scale patch; then suspend: a RayJob patch), its Service is edited by hand (the
  operator repairs it); then it is deleted;
- `ext`: an external teacher at a loopback port where nothing listens (its health probes fail);
- `boom`: the trainer fails (RayJob FAILED), so the job ends Failed;
- `flaky`: creating its RayJob fails with injected 500s (reconcile errors), then succeeds.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

_OPERATOR_TESTS = str(Path(__file__).resolve().parents[1] / "operator")
if _OPERATOR_TESTS not in sys.path:  # also imported from tests/observability
    sys.path.insert(0, _OPERATOR_TESTS)

from distillery_operator import naming  # noqa: E402
from distillery_operator.k8s.leader import LeaseSettings  # noqa: E402
from kube_emulator import DEPLOYMENTS, RAYJOBS, SERVICES  # noqa: E402
from operator_harness import Cluster, load_example, running_cluster, running_operator, wait_for  # noqa: E402

NAMESPACE = "team-a"


def _phase(cluster: Cluster, name: str) -> str | None:
    return cluster.status(name).get("phase")


def _example(file: str, name: str) -> dict[str, Any]:
    doc = load_example(file)
    doc["metadata"]["name"] = name
    return doc


def closed_port() -> int:
    """A loopback port where nothing listens (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


TEST_USER_AGENT = "kmock/"
"""Requests the test sends (as the user, or playing controllers) go through kmock's own client."""


def operator_requests(requests: list[Any]) -> list[Any]:
    """The resource requests the operator sent (kopf's and the kubernetes client's), not the test's.

    API discovery (GET /apis/GROUP/VERSION) is left out: those are non-resource URLs that every
    authenticated user may read (the built-in system:discovery role), not something the chart grants.
    """
    return [
        r
        for r in requests
        if not r.headers.get("User-Agent", "").startswith(TEST_USER_AGENT)
        and r.resource is not None
        and r.resource.plural
    ]


async def drive(cluster: Cluster, *, flaky_failures: int = 2) -> dict[str, Any]:
    """Runs the scenario against an operator already watching `cluster`; returns what it saw.

    `flaky_failures`: how many create requests for flaky's RayJob fail before one succeeds.
    """
    std = _example("standalone-teacher.yaml", "std")
    std["metadata"]["labels"] = {}  # not queued by Kueue: the RayJob starts unsuspended
    await cluster.create(std)
    teacher = naming.teacher_name("std", "qwen-7b")
    rayjob = naming.rayjob_name("std")
    await wait_for(
        lambda: cluster.emulator.obj(DEPLOYMENTS, NAMESPACE, teacher), what="the teacher Deployment"
    )
    await cluster.play_deployment(teacher, ready=2)
    await wait_for(lambda: cluster.emulator.obj(RAYJOBS, NAMESPACE, rayjob), what="the RayJob")
    await cluster.play_rayjob(rayjob, "RUNNING", "Running")
    await wait_for(lambda: _phase(cluster, "std") == "Running", what="std Running")

    # Live edits: more teacher replicas (the Deployment is scaled), then suspend (the RayJob is patched).
    await cluster.patch_spec("std", {"teachers": [{**std["spec"]["teachers"][0], "replicas": 3}]})
    await wait_for(
        lambda: (
            (cluster.emulator.obj(DEPLOYMENTS, NAMESPACE, teacher) or {}).get("spec", {}).get("replicas") == 3
        ),
        what="the teacher scaled to 3",
    )
    # Someone rewrites the teacher's Service (spec and annotations): the operator puts its own back.
    service = cluster.emulator.obj(SERVICES, NAMESPACE, teacher) or {}
    rewrite = {"metadata": {"annotations": {naming.SPEC_HASH_ANNOTATION: None}}, "spec": {"ports": []}}
    await cluster.emulator.play(SERVICES, NAMESPACE, teacher, rewrite, subresource="")
    await wait_for(
        lambda: (
            (cluster.emulator.obj(SERVICES, NAMESPACE, teacher) or {}).get("spec", {}).get("ports")
            == service["spec"]["ports"]
        ),
        what="the Service repaired",
    )
    await cluster.patch_spec("std", {"suspend": True})
    await wait_for(
        lambda: (
            (cluster.emulator.obj(RAYJOBS, NAMESPACE, rayjob) or {}).get("spec", {}).get("suspend") is True
        ),
        what="the RayJob suspended",
    )

    ext = _example("external-teacher.yaml", "ext")
    ext["spec"]["teachers"][0]["endpoint"] = f"http://127.0.0.1:{closed_port()}"
    await cluster.create(ext)

    boom = _example("external-teacher.yaml", "boom")
    boom["spec"]["teachers"][0]["endpoint"] = f"http://127.0.0.1:{closed_port()}"
    await cluster.create(boom)
    boom_rayjob = naming.rayjob_name("boom")
    await wait_for(lambda: cluster.emulator.obj(RAYJOBS, NAMESPACE, boom_rayjob), what="boom's RayJob")
    await cluster.play_rayjob(boom_rayjob, "FAILED", "Failed", reason="AppFailed", message="exit code 1")
    await wait_for(lambda: _phase(cluster, "boom") == "Failed", what="boom Failed")

    cluster.emulator.faults[("create", RAYJOBS)] = [500] * flaky_failures
    flaky = _example("external-teacher.yaml", "flaky")
    await cluster.create(flaky)
    await wait_for(
        lambda: cluster.emulator.obj(RAYJOBS, NAMESPACE, naming.rayjob_name("flaky")),
        timeout=20,
        what="flaky's RayJob created after the injected 500s",
    )

    await cluster.delete("distillery.io/v1alpha1/distillationjobs", "std")
    await wait_for(lambda: cluster.job("std") is None, what="std deleted")
    return {"phases": {name: _phase(cluster, name) for name in ("ext", "boom", "flaky")}}


@asynccontextmanager
async def scenario_operator(tmp_path: Path, **operator_kwargs: Any) -> AsyncIterator[Cluster]:
    """An emulated cluster with the real operator watching NAMESPACE (stopped on exit), electing itself
    leader as the chart runs it (the Lease in NAMESPACE, standing in for the release namespace)."""
    lease = LeaseSettings(
        namespace=NAMESPACE, identity="scenario", lease_seconds=3, renew_deadline_seconds=2, retry_seconds=0.2
    )  # renewed (patched) several times during the scenario
    operator_kwargs.setdefault("leader_election", lease)
    async with (
        running_cluster(tmp_path, namespace=NAMESPACE) as cluster,
        running_operator(cluster, **operator_kwargs),
    ):
        yield cluster
