"""A reusable harness: the emulated cluster, the real operator against it, and the user's tools (kubectl).

`running_cluster()` serves the emulator on loopback and writes a kubeconfig for it; `running_operator()`
runs the real kopf operator in the test's event loop (as `distillery operator` would, minus the process);
`spawn_operator()` runs `python -m distillery_cli operator` as a process (for kill -9 tests and the bench).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
import yaml
from distillery_operator.main import run
from distillery_operator.reconcile.controller import ControllerSettings
from kube_emulator import DJ, Emulator
from support.claims import EXAMPLE_CLAIMS, claim_manifest

REPO = Path(__file__).resolve().parents[2]
FAST = ControllerSettings(
    workers=4, resync_seconds=600, probe_interval=0.2, probe_timeout=1.0, backoff_base=0.05, backoff_cap=0.5
)
"""Controller settings for tests: fast probes and short backoff."""


@dataclass
class Cluster:
    emulator: Emulator
    kubeconfig: Path
    namespace: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def job(self, name: str) -> dict[str, Any] | None:
        return self.emulator.obj(DJ, self.namespace, name)

    def status(self, name: str) -> dict[str, Any]:
        job = self.job(name)
        return (job or {}).get("status") or {}

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == kind), None)

    async def create(self, manifest: Mapping[str, Any], resource: str = DJ) -> None:
        group_version, plural = resource.rsplit("/", 1)
        prefix = "/api" if "/" not in group_version else "/apis"
        url = f"{prefix}/{group_version}/namespaces/{self.namespace}/{plural}"
        async with self.emulator.post(url, json=dict(manifest)) as resp:
            assert resp.status < 300, await resp.text()

    async def patch_spec(self, name: str, patch: Mapping[str, Any]) -> None:
        await self.emulator.play(DJ, self.namespace, name, {"spec": dict(patch)}, subresource="")

    async def delete(self, resource: str, name: str) -> None:
        group_version, plural = resource.rsplit("/", 1)
        prefix = "/api" if "/" not in group_version else "/apis"
        url = f"{prefix}/{group_version}/namespaces/{self.namespace}/{plural}/{name}"
        async with self.emulator.delete(url) as resp:
            assert resp.status < 300, await resp.text()

    async def kubectl(self, *args: str, check: bool = True) -> str:
        """Runs the machine's kubectl against the emulator (no OpenAPI is served: --validate=false)."""
        proc = await asyncio.create_subprocess_exec(
            "kubectl", *args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await proc.communicate()
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {err.decode()}")
        return out.decode()

    async def play_rayjob(self, name: str, job_status: str, deployment_status: str, **extra: Any) -> None:
        """Plays KubeRay: sets the RayJob's status as its controller would."""
        status = {"jobStatus": job_status, "jobDeploymentStatus": deployment_status, **extra}
        await self.emulator.play("ray.io/v1/rayjobs", self.namespace, name, {"status": status})

    async def play_deployment(self, name: str, ready: int) -> None:
        """Plays the Deployment controller: reports `ready` ready replicas."""
        status = {"replicas": ready, "readyReplicas": ready, "availableReplicas": ready}
        await self.emulator.play("apps/v1/deployments", self.namespace, name, {"status": status})


async def wait_for(
    predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition", interval: float = 0.02
) -> Any:
    """Polls until `predicate()` is truthy; fails with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def quiet(cluster: Cluster, seconds: float = 0.5, timeout: float = 20.0) -> int:
    """Waits until the API server has received no request for `seconds`; returns the log length."""
    deadline = time.monotonic() + timeout
    count = len(cluster.emulator.request_log)
    while time.monotonic() < deadline:
        await asyncio.sleep(seconds)
        now = len(cluster.emulator.request_log)
        if now == count:
            return now
        count = now
    raise AssertionError(f"the API server did not go quiet within {timeout}s")


def write_kubeconfig(path: Path, url: str, namespace: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "test-token"}}],
        "contexts": [
            {"name": "emulator", "context": {"cluster": "emulator", "user": "tester", "namespace": namespace}}
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.asynccontextmanager
async def running_cluster(tmp_path: Path, namespace: str = "test", **kwargs: Any) -> AsyncIterator[Cluster]:
    async with Emulator(**kwargs) as emulator, kmock.Server(emulator):
        url = str(emulator.url).rstrip("/")
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url, namespace)
        cluster = Cluster(emulator, kubeconfig, namespace)
        for claim in EXAMPLE_CLAIMS:
            await cluster.create(claim_manifest(claim), "v1/persistentvolumeclaims")
        yield cluster


@contextlib.asynccontextmanager
async def running_operator(
    cluster: Cluster, settings: ControllerSettings = FAST, **kwargs: Any
) -> AsyncIterator[threading.Thread]:
    """The real operator in this process, watching the cluster's namespace; stopped on exit.

    It runs in a thread with its own event loop: on shutdown kopf cancels every task of its loop that
    it did not find at startup, which would include the emulator's and the test's own tasks.
    """
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)  # kopf's login reads it
    stop, ready = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(
                run(
                    namespaces=[cluster.namespace],
                    metrics_port=kwargs.get("metrics_port"),
                    health_port=kwargs.get("health_port"),
                    host="127.0.0.1",
                    controller_settings=settings,
                    stop_flag=stop,
                    ready_flag=ready,
                    kubeconfig=str(cluster.kubeconfig),
                    leader_election=kwargs.get("leader_election"),
                )
            )
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=main, name="operator", daemon=True)
    thread.start()
    try:
        await wait_for(lambda: ready.is_set() or errors, timeout=30, what="the operator to start")
        if errors:
            raise errors[0]
        yield thread
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_operator(cluster: Cluster, *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    """`python -m distillery_cli operator -n NS` as a child process (kill it for crash tests)."""
    env = cluster.env
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(REPO),
            str(REPO / "operator"),
            str(REPO / "runtime"),
            str(REPO / "cli"),
            env.get("PYTHONPATH", ""),
        ]
    )
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - the process owns it
    return subprocess.Popen(
        [sys.executable, "-m", "distillery_cli", "operator", "-n", cluster.namespace, *args],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def load_example(file: str, /, **metadata: Any) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / file).read_text())
    doc["metadata"].update(metadata)
    return doc
