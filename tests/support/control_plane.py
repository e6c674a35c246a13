"""A real Kubernetes control plane for tests, started the envtest way.

`start()` runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler from a folder of binaries
(`KUBEBUILDER_ASSETS`, controller-runtime's convention) on loopback ports, with fresh certificates, RBAC,
ServiceAccount tokens, an audit log of every request, and the normal controllers (garbage collector,
Deployments, namespaces, ServiceAccounts). It is the real server code: CRD structural-schema and CEL
checks (cost budget included), defaulting, strict field validation, admission and RBAC are the ones a
user's cluster applies. There is no node: pods are scheduled nowhere.

Where the binaries come from (any one):
- CI (`.ci/run`): the v1.36.2 build shipped beside the repository, unpacked into `.k8s-assets/bin`;
- anywhere else: `setup-envtest use -p path 1.36.x` (controller-runtime) gives etcd and kube-apiserver; add
  kube-controller-manager and kube-scheduler from the Kubernetes release's server binaries
  (kubernetes-server-linux-amd64.tar.gz) to the same folder.
KubeRay's CRDs are read from `$KUBEBUILDER_ASSETS/kuberay-crds/` (KubeRay v1.7.0's `config/crd/bases`).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ASSETS_ENV = "KUBEBUILDER_ASSETS"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
KUBERAY_CRDS = "kuberay-crds"
SERVICE_CIDR = "10.0.0.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT = 120.0

# Every request, with its user and response code, but no bodies: the RBAC tests read which (verb,
# resource) pairs the operator used and whether any was refused.
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}


class MissingAssets(RuntimeError):
    """The folder of control-plane binaries is not configured or incomplete."""


def assets_dir() -> Path:
    """The folder named by KUBEBUILDER_ASSETS, checked to hold every binary; MissingAssets says what lacks."""
    value = os.environ.get(ASSETS_ENV)
    if not value:
        raise MissingAssets(
            f"{ASSETS_ENV} is not set: point it at a folder with {', '.join(BINARIES)} "
            "(tests/support/control_plane.py says where to get them)"
        )
    folder = Path(value)
    missing = [b for b in BINARIES if not os.access(folder / b, os.X_OK)]
    if missing:
        raise MissingAssets(f"{ASSETS_ENV}={folder} lacks {', '.join(missing)}")
    return folder


# ---------------------------------------------------------------------------------------------- certificates


@dataclass
class _Pki:
    folder: Path
    ca_key: ec.EllipticCurvePrivateKey = field(init=False)
    ca_cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "distillery-test-ca")])
        self.ca_cert = (
            self._builder(name, self.ca_key.public_key(), name)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.ca_key, hashes.SHA256())
        )
        self._write("ca.crt", self.ca_cert.public_bytes(serialization.Encoding.PEM))
        self._write("ca.key", _pem_key(self.ca_key))

    @staticmethod
    def _builder(subject: x509.Name, key: Any, issuer: x509.Name) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
        )

    def _write(self, name: str, data: bytes) -> Path:
        path = self.folder / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def issue(self, name: str, common_name: str, *, groups: Sequence[str] = (), server: bool = False) -> None:
        """Writes NAME.crt and NAME.key: a client certificate, or a loopback serving one."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        builder = self._builder(x509.Name(subject), key.public_key(), self.ca_cert.subject).add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        if server:
            names: list[x509.GeneralName] = [
                x509.DNSName(n)
                for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
            ]
            names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "10.0.0.1")]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
        self._write(f"{name}.key", _pem_key(key))

    def service_account_keys(self) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._write("sa.key", _pem_key(key))
        self._write(
            "sa.pub",
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )


def _pem_key(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


# ---------------------------------------------------------------------------------------------- kubeconfigs


def kubeconfig(
    path: Path, server: str, ca: Path, *, cert: Path | None = None, key: Path | None = None, token: str = ""
) -> Path:
    """A kubeconfig for one user: a client certificate, or a bearer token (a ServiceAccount's)."""
    user: dict[str, str] = (
        {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------------------------------- processes


def _free_ports(count: int) -> list[int]:
    """Loopback ports free right now (a start that loses a race to another process is retried)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class ControlPlane:
    """A running control plane: its URL, CA, admin kubeconfig and audit log."""

    workdir: Path
    assets: Path
    url: str = ""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.log"

    @property
    def kuberay_crds(self) -> Path:
        return self.assets / KUBERAY_CRDS

    def log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    # -------------------------------------------------------------------------------------- start/stop

    def start(self) -> ControlPlane:
        for attempt in range(3):
            try:
                self._start_once()
                return self
            except RuntimeError:
                clash = any(
                    "address already in use" in self.log(n).read_text(errors="replace")
                    for n in BINARIES
                    if self.log(n).exists()
                )
                self.stop()
                if not clash or attempt == 2:
                    raise
        return self

    def _start_once(self) -> None:
        for sub in ("etcd-data", "pki", "logs"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
        (self.workdir / "logs").mkdir(parents=True)
        pki = _Pki(self.pki)
        pki.issue("apiserver", "kube-apiserver", server=True)
        pki.issue("admin", "admin", groups=["system:masters"])
        pki.issue("controller-manager", "system:kube-controller-manager")
        pki.issue("scheduler", "system:kube-scheduler")
        pki.issue("controller-manager-serving", "kube-controller-manager", server=True)
        pki.issue("scheduler-serving", "kube-scheduler", server=True)
        pki.service_account_keys()
        etcd_port, peer_port, api_port, kcm_port, sched_port = _free_ports(5)
        self.url = f"https://127.0.0.1:{api_port}"
        p = self.pki
        kubeconfig(self.admin_kubeconfig, self.url, self.ca, cert=p / "admin.crt", key=p / "admin.key")
        kcm = kubeconfig(
            self.workdir / "controller-manager.kubeconfig",
            self.url,
            self.ca,
            cert=p / "controller-manager.crt",
            key=p / "controller-manager.key",
        )
        sched = kubeconfig(
            self.workdir / "scheduler.kubeconfig",
            self.url,
            self.ca,
            cert=p / "scheduler.crt",
            key=p / "scheduler.key",
        )
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))

        etcd = f"http://127.0.0.1:{etcd_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self._launch(
            "etcd",
            "--name=default",
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={etcd}",
            f"--advertise-client-urls={etcd}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-level=warn",
        )
        self._wait_ready("etcd", f"{etcd}/health")
        # OwnerReferencesPermissionEnforcement is on, as on OpenShift and many hardened clusters: setting
        # blockOwnerDeletion on a child then needs `update` on the owner's finalizers subresource.
        # SizeBasedListCostEstimate is off: with etcd 3.4 (no watch progress requests) it stalls lists.
        self._launch(
            "kube-apiserver",
            f"--etcd-servers={etcd}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--cert-dir={p / 'apiserver-certs'}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={self.ca}",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--endpoint-reconciler-type=none",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
            "--feature-gates=SizeBasedListCostEstimate=false",
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        )
        self._wait_ready("kube-apiserver", f"{self.url}/readyz")
        # The controller-manager reads a ConfigMap at start and exits if the apiserver does not answer.
        self._launch(
            "kube-controller-manager",
            f"--kubeconfig={kcm}",
            f"--authentication-kubeconfig={kcm}",
            f"--authorization-kubeconfig={kcm}",
            "--bind-address=127.0.0.1",
            f"--secure-port={kcm_port}",
            f"--tls-cert-file={p / 'controller-manager-serving.crt'}",
            f"--tls-private-key-file={p / 'controller-manager-serving.key'}",
            f"--client-ca-file={self.ca}",
            "--controllers=*,-service-ca-certificate-publisher-controller",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={self.ca}",
            f"--cluster-signing-cert-file={self.ca}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            # No kubelet runs here; a test that plays one for a Node object it created (marking pods
            # Ready) must not see that node declared unreachable and its pods evicted mid-test.
            "--node-monitor-grace-period=1h",
        )
        self._launch(
            "kube-scheduler",
            f"--kubeconfig={sched}",
            f"--authentication-kubeconfig={sched}",
            f"--authorization-kubeconfig={sched}",
            "--bind-address=127.0.0.1",
            f"--secure-port={sched_port}",
            f"--tls-cert-file={p / 'scheduler-serving.crt'}",
            f"--tls-private-key-file={p / 'scheduler-serving.key'}",
            f"--client-ca-file={self.ca}",
            "--leader-elect=false",
        )
        self._wait_ready("kube-controller-manager", f"https://127.0.0.1:{kcm_port}/healthz")
        self._wait_ready("kube-scheduler", f"https://127.0.0.1:{sched_port}/healthz")
        self._wait_ready(
            "the default ServiceAccount", f"{self.url}/api/v1/namespaces/default/serviceaccounts/default"
        )

    def _launch(self, name: str, *args: str) -> None:
        log = open(self.log(name), "wb")  # noqa: SIM115 - the process owns it
        self.processes[name] = subprocess.Popen(
            [str(self.assets / name), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, which stops us in order
        )

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _wait_ready(self, what: str, url: str) -> None:
        ctx = self._ssl() if url.startswith("https") else None
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url, context=ctx, timeout=2) as response,
            ):
                if response.status == 200:
                    return
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    tail = self.log(name).read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for {what}:\n{tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {START_TIMEOUT:.0f}s waiting for {what} ({url})")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM in reverse order of start, SIGKILL after 15 s."""
        for name in reversed(list(self.processes)):
            proc = self.processes.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)

    # -------------------------------------------------------------------------------------- reading

    def audit_events(self) -> Iterator[dict[str, Any]]:
        """The audit log so far, one dict per request stage (ResponseComplete holds the status code)."""
        with self.audit_log.open() as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)
