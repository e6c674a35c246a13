"""A real one-node Kubernetes cluster on this machine, for tests whose pods must run.

`NodeCluster.start()` runs, from the folder named by `DISTILLERY_K8S_NODE_TOOLS` (the scripts shipped with
the v1.36.2 build: `control-plane.sh`, `node.sh`, `dns.sh`):
- the control plane with its API served on the node bridge (`POD_NETWORK=1`), so pods reach it through
  the `kubernetes` Service with their in-cluster config, as on any cluster;
- a real node: containerd + runc, a CNI bridge, the kubelet and kube-proxy (iptables);
- CoreDNS as cluster DNS (`kube-dns`, 10.0.0.10), so Service names resolve in pods;
- KubeRay's operator v1.7.0 (the real binary) with its CRDs.
No registry is reachable: images are built locally (docker/build-cpu-images.sh) and imported into the
node's containerd (`import_image`). Root is needed (namespaces, cgroups, iptables, mounts).

What differs from a production cluster, and why: one node (the scripts allow one per machine); no storage
provisioner (tests create hostPath PersistentVolumes); no GPUs; KubeRay's operator runs as a process
beside the control plane, not as a pod, and reaches the Ray dashboards through the API server's service
proxy (`--use-kubernetes-proxy`, as its README says for out-of-cluster operators).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

TOOLS_ENV = "DISTILLERY_K8S_NODE_TOOLS"
SCRIPTS = ("control-plane.sh", "node.sh", "dns.sh")
NETPOL_SCRIPT = "netpol.sh"
"""NetworkPolicy enforcement for the node (`NodeCluster.start_netpol`); only the tests of policies need it."""
HOST_COMMANDS = ("containerd", "runc", "buildah", "iptables", "debootstrap")
NODE_IP = "10.88.0.1"
LAST_STACK = Path(__file__).resolve().parents[2] / ".k8s-assets" / "node-stack"
"""The folder of the stack this machine last started (one per machine: one bridge, fixed node ports)."""


class MissingNodeTools(RuntimeError):
    """What a real node needs is not there; the message says what."""


def node_tools() -> Path:
    """The scripts' folder, checked along with root and the host packages node.sh needs."""
    value = os.environ.get(TOOLS_ENV)
    if not value:
        raise MissingNodeTools(
            f"{TOOLS_ENV} is not set: point it at the folder with {', '.join(SCRIPTS)} and bin/ "
            "(the v1.36.2 build; .ci/run sets it)"
        )
    folder = Path(value)
    missing = [s for s in SCRIPTS if not os.access(folder / s, os.X_OK)]
    if missing:
        raise MissingNodeTools(f"{TOOLS_ENV}={folder} lacks {', '.join(missing)}")
    if os.geteuid() != 0:
        raise MissingNodeTools("a node needs root (namespaces, cgroups, iptables)")
    absent = [c for c in HOST_COMMANDS if shutil.which(c) is None]
    if absent or not Path("/usr/lib/cni/bridge").exists():
        raise MissingNodeTools(
            f"host packages missing ({', '.join(absent) or 'containernetworking-plugins'}): "
            "scripts/setup.sh --dev installs them"
        )
    return folder


@dataclass
class NodeCluster:
    """The running stack in `workdir` (control-plane.sh's DIR layout: kubeconfig, pki/, logs/, node/)."""

    tools: Path
    workdir: Path
    binaries: Path
    """An already unpacked, verified bin/ folder (KUBEBUILDER_ASSETS): linked as DIR/bin, nothing unpacked."""
    kuberay_crds: Path
    kuberay: subprocess.Popen[bytes] | None = None
    started: list[str] = field(default_factory=list)

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def ca(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def url(self) -> str:
        for line in self.admin_kubeconfig.read_text().splitlines():
            if line.strip().startswith("server:"):
                return line.split(":", 1)[1].strip()
        raise RuntimeError(f"no server in {self.admin_kubeconfig}")

    def _script(self, script: str, *args: str, timeout: float = 300) -> str:
        env = {
            **os.environ,
            "POD_NETWORK": "1",
            # The API server's address is local; a proxy in the environment must not be asked for it.
            "NO_PROXY": ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1,localhost", NODE_IP])),
        }
        env["no_proxy"] = env["NO_PROXY"]
        result = subprocess.run(
            [str(self.tools / script), *args], env=env, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{script} {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
            )
        return result.stdout

    def start(self) -> NodeCluster:
        self._stop_leftover()
        self.workdir.mkdir(parents=True, exist_ok=True)
        LAST_STACK.parent.mkdir(parents=True, exist_ok=True)
        LAST_STACK.write_text(str(self.workdir))
        bin_link = self.workdir / "bin"
        if not bin_link.exists():
            bin_link.symlink_to(self.binaries)
        try:
            self._script("control-plane.sh", "start", str(self.workdir))
            self.started.append("control-plane.sh")
            self._script("node.sh", "start", str(self.workdir))
            self.started.append("node.sh")
            self._script("dns.sh", "start", str(self.workdir))
            self.started.append("dns.sh")
            self._start_kuberay()
        except BaseException:
            self.stop()
            raise
        return self

    def _stop_leftover(self) -> None:
        """A session killed before its teardown leaves its stack running (an API server on the node bridge,
        the node's iptables rules): pods of the next one then time out reaching the API. Stop it first."""
        if not LAST_STACK.exists():
            return
        old = Path(LAST_STACK.read_text().strip())
        if old != self.workdir and (old / "kubeconfig").exists():
            for script in ("dns.sh", "node.sh", "control-plane.sh"):
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self._script(script, "stop", str(old))
        LAST_STACK.unlink()

    def _start_kuberay(self) -> None:
        kubectl = [str(self.workdir / "bin" / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}"]
        # KubeRay's CRDs exceed client-side apply's annotation limit: server-side, as its docs say.
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(self.kuberay_crds)], check=True,
                       capture_output=True, timeout=120)  # fmt: skip
        subprocess.run([*kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"],
                       check=True, capture_output=True, timeout=90)  # fmt: skip
        log = open(self.workdir / "logs" / "kuberay-operator.log", "wb")  # noqa: SIM115 - the process owns it
        self.kuberay = subprocess.Popen(
            [
                str(self.workdir / "bin" / "kuberay-operator"),
                f"--kubeconfig={self.admin_kubeconfig}",
                "--enable-leader-election=false",
                "--use-kubernetes-proxy",
                "--metrics-addr=127.0.0.1:0",
                "--health-probe-bind-address=127.0.0.1:18082",
                "--log-stdout-encoder=console",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "NO_PROXY": f"127.0.0.1,localhost,{NODE_IP}",
                "no_proxy": f"127.0.0.1,localhost,{NODE_IP}",
            },
        )
        deadline = time.monotonic() + 60
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen("http://127.0.0.1:18082/readyz", timeout=1),
            ):
                return
            if self.kuberay.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"KubeRay's operator did not become ready; see {log.name}")
            time.sleep(0.2)

    def start_netpol(self) -> None:
        """NetworkPolicy enforcement on the node: `netpol.sh` of the same tools folder runs
        kube-network-policies (nftables + nfqueue) as a host process (its README, "NetworkPolicy
        enforcement"). Without it policies are stored and nothing is dropped (the bridge CNI has no policy
        engine). MissingNodeTools where the script or `nft` is not there."""
        if not os.access(self.tools / NETPOL_SCRIPT, os.X_OK):
            raise MissingNodeTools(f"{TOOLS_ENV}={self.tools} lacks {NETPOL_SCRIPT}")
        if shutil.which("nft") is None:
            raise MissingNodeTools("nft is not installed (Debian package nftables): netpol.sh needs it")
        self._script(NETPOL_SCRIPT, "start", str(self.workdir))
        self.started.append(NETPOL_SCRIPT)

    def stop_netpol(self) -> None:
        """Enforcement off again (fail-open: everything passes; the script removes its nftables table)."""
        if NETPOL_SCRIPT in self.started:
            self.started.remove(NETPOL_SCRIPT)
            self._script(NETPOL_SCRIPT, "stop", str(self.workdir))

    def import_image(self, archive: Path) -> None:
        self._script("node.sh", "image-import", str(self.workdir), str(archive), timeout=600)

    def stop(self) -> None:
        if self.kuberay is not None and self.kuberay.poll() is None:
            self.kuberay.terminate()
            try:
                self.kuberay.wait(15)
            except subprocess.TimeoutExpired:
                self.kuberay.kill()
        # Reverse order: the enforcer before the node (netpol.sh's rule), dns before the node, the node before
        # the control plane (the API server otherwise waits for the kubelet's connections).
        for script in reversed(self.started):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._script(script, "stop", str(self.workdir))
        self.started.clear()
