"""What the workload scenarios share: the job's volumes, a job manifest on tiny models, and a watcher that
records what `kubectl get dj` shows until the job ends."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import KUBECTL, Installation, KubectlError, yaml_stream

from distillery.plan.checkpoints.storage import checkpoint_storage
from distillery.validation import parse_job

UNREACHABLE = ("Unable to connect to the server", "TLS handshake timeout", "connection refused")
"""kubectl's words for an API server that did not answer (the request may be made again)."""

MODELS_CLAIM = "models"
CHECKPOINT_CLAIM = "checkpoints"
MANUAL_CLASS = "manual"
"""The StorageClass name of the test's volumes: no provisioner, no StorageClass object; a claim binds to the
volume pre-bound to it (`claimRef`) of the same class."""
TERMINAL = ("Succeeded", "Failed")
TEACHER_SERVER = (
    *("python", "-m", "distillery_runtime.teachers.server", "--model", "/models/teacher"),
    *(
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-logprobs",
        "8",
        "--max-model-len",
        "64",
        "--enforce-eager",
    ),
)
"""An external teacher's command: the runtime image's server on the `models` claim's teacher."""


RESTRICTED = "restricted"
QUOTA = {
    "requests.cpu": "16", "limits.cpu": "32", "requests.memory": "48Gi", "limits.memory": "96Gi",
    "requests.nvidia.com/gpu": "8",
}  # fmt: skip
"""A team namespace's ResourceQuota: with it, the API server refuses any pod without cpu and memory
requests and limits (the LimitRange below gives defaults only to containers that set none)."""
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
"""The taint GPU nodes usually carry (`kubectl taint node N nvidia.com/gpu=present:NoSchedule`)."""


def restricted_pod_spec(containers: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod spec of the tests' own pods (not the operator's) with what the namespace's Pod Security
    `restricted` asks of every pod and container, and no API token."""
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{**c, "securityContext": restricted} for c in containers],
    }


def production_namespace(installation: Installation, namespace: str) -> None:
    """Makes `namespace` what a platform team gives a team: Pod Security `restricted` enforced, a
    ResourceQuota on cpu, memory and GPUs, and a LimitRange. Every scenario's job runs in one."""
    installation.admin(
        "label", "namespace", namespace, f"pod-security.kubernetes.io/enforce={RESTRICTED}",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "team", "namespace": namespace},
        "spec": {"hard": QUOTA},
    }
    limits = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "team", "namespace": namespace},
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "default": {"cpu": "1", "memory": "1Gi"},
                    "defaultRequest": {"cpu": "100m", "memory": "256Mi"},
                    "max": {"cpu": "16", "memory": "48Gi"},
                }
            ]
        },
    }
    installation.admin("apply", "-f", "-", input=yaml_stream([quota, limits]))


def node_name(installation: Installation) -> str:
    (name,) = installation.admin("get", "nodes", "-o", "name").stdout.split()
    return name.removeprefix("node/")


def deployment_available(installation: Installation, namespace: str, name: str | None = None) -> bool:
    items = json.loads(installation.admin("get", "deployments", "-n", namespace, "-o", "json").stdout)[
        "items"
    ]
    items = [d for d in items if name is None or d["metadata"]["name"] == name]
    return bool(items) and all(
        any(
            c["type"] == "Available" and c["status"] == "True"
            for c in d.get("status", {}).get("conditions", [])
        )
        for d in items
    )


def _pre_bound_volume(
    name: str, claim: str, namespace: str, path: Path, mode: str, size: str = "2Gi"
) -> dict[str, Any]:
    """A hostPath PersistentVolume pre-bound (`claimRef`) to the claim `claim` (no provisioner runs here);
    its capacity is only declared: nothing enforces it on a host folder."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": [mode],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": MANUAL_CLASS,
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }


def _host_path_volume(name: str, claim: str, namespace: str, path: Path, mode: str) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume and the claim of the same name bound to it."""
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": [mode],
            "storageClassName": MANUAL_CLASS,
            "volumeName": name,
            "resources": {"requests": {"storage": "2Gi"}},
        },
    }
    return [_pre_bound_volume(name, claim, namespace, path, mode), pvc]


def step_cell(row: list[str]) -> str:
    """The STEP cell of a `kubectl get dj` row (NAME PHASE STEP STEPS TEACHERS AGE), where an empty cell
    leaves a column out: STEP is empty before step 1, TEACHERS (`ready/total`) until the operator counts."""
    if len(row) >= 6:
        return row[2]
    if len(row) == 5 and "/" not in row[3]:  # TEACHERS empty: the STEP is there
        return row[2]
    return ""


@dataclass
class Workspace:
    """A test's namespace with the `models` claim (tiny models and data, read-only in the pods) and the
    `checkpoints` claim (written by the trainer's uid 1000), both on host folders the test can read."""

    installation: Installation
    namespace: str
    models: Path
    checkpoints: Path
    observed: list[dict[str, Any]] = field(default_factory=list)
    """Rows printed by `kubectl get dj -w` (NAME PHASE STEP STEPS TEACHERS AGE; STEP empty before step 1)."""
    watchers: list[subprocess.Popen[str]] = field(default_factory=list)
    closed: bool = False
    """Set when the test ends: its watchers are not started again."""

    @classmethod
    def create(cls, installation: Installation, namespace: str, model_files: Path, tmp: Path) -> Workspace:
        models, checkpoints = tmp / "models", tmp / "checkpoints"
        shutil.copytree(model_files, models)
        checkpoints.mkdir()
        # The pods run as uid 1000; the host folders belong to root.
        for path in (tmp, models, *models.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        checkpoints.chmod(0o777)
        objects = [
            *_host_path_volume(f"{namespace}-models", MODELS_CLAIM, namespace, models, "ReadOnlyMany"),
            # ReadWriteMany: the Ray head and worker are two pods, and the operator refuses a claim only one
            # node may mount for them (a hostPath volume on the one node serves either mode).
            *_host_path_volume(
                f"{namespace}-ckpt", CHECKPOINT_CLAIM, namespace, checkpoints, "ReadWriteMany"
            ),
        ]
        installation.admin("apply", "-f", "-", input=yaml_stream(objects))
        return cls(installation, namespace, models, checkpoints)

    def add_checkpoint_claim(self, claim: str, mode: str = "ReadWriteMany") -> Path:
        """Another writable claim (a second job's checkpoints, apart from the first's run)."""
        folder = self.checkpoints.parent / claim
        folder.mkdir(mode=0o777)
        folder.chmod(0o777)
        objects = _host_path_volume(f"{self.namespace}-{claim}", claim, self.namespace, folder, mode)
        self.installation.admin("apply", "-f", "-", input=yaml_stream(objects))
        return folder

    def add_operator_claim_volume(self, manifest: dict[str, Any]) -> tuple[str, Path]:
        """A volume for the checkpoint claim the operator will make for `manifest` (a job that names none):
        pre-bound to that claim's name, with the size and access mode the plan gives it (the job must name
        MANUAL_CLASS as its storageClassName). Returns the claim's name and the volume's host folder."""
        job = parse_job(manifest)
        planned = checkpoint_storage(job.metadata.name, job.spec).operator_claim
        assert planned is not None and planned.storage_class_name == MANUAL_CLASS, planned
        folder = self.checkpoints.parent / planned.name
        folder.mkdir(mode=0o777)
        folder.chmod(0o777)  # the pods run as uid 1000
        volume = _pre_bound_volume(
            f"{self.namespace}-{planned.name}",
            planned.name,
            self.namespace,
            folder,
            planned.access_mode,
            planned.size,
        )
        self.installation.admin("apply", "-f", "-", input=yaml_stream([volume]))
        return planned.name, folder

    def claim(self, name: str) -> dict[str, Any] | None:
        """The claim `name` of the test's namespace, or None if it does not exist."""
        return self.installation.get("pvc", name, self.namespace)

    def delete_job(self, name: str) -> None:
        """`kubectl delete dj NAME`, waiting for the job to go (its children go through the garbage collector)."""
        self.installation.admin("delete", "dj", name, "-n", self.namespace, timeout=300)

    def apply(self, manifest: dict[str, Any]) -> None:
        """`kubectl apply` of the manifest; a job's with `kubectl get dj -w` on it from before it exists."""
        if manifest["kind"] == "DistillationJob":
            self.watch(manifest["metadata"]["name"])
        self.installation.admin("apply", "-n", self.namespace, "-f", "-", input=yaml_stream([manifest]))

    def job(self, name: str) -> dict[str, Any]:
        return json.loads(
            self.installation.admin("get", "dj", name, "-n", self.namespace, "-o", "json").stdout
        )

    def watch(self, name: str) -> None:
        """Starts `kubectl get dj NAME -w`, as a user would leave it running: every row it prints (one per
        change of the job) is kept in `observed`, so no STEP the job showed is missed between polls. A watch
        the API server ends (its request timeout, or a dropped connection on a loaded node: in a clean-clone
        run one ended before the job's first step and its STEP column was never seen) is started again, as a
        user would; its first row is the job as it is then."""
        command = [str(KUBECTL), f"--kubeconfig={self.installation.plane.admin_kubeconfig}"]
        # By field selector: `get dj NAME -w` exits at once when the job does not exist yet.
        args = [
            "get",
            "dj",
            "-n",
            self.namespace,
            f"--field-selector=metadata.name={name}",
            "-w",
            "--no-headers",
        ]

        def start() -> subprocess.Popen[str]:
            watcher = subprocess.Popen(
                [*command, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
            self.watchers.append(watcher)
            return watcher

        def read() -> None:
            watcher = start()
            while True:
                assert watcher.stdout is not None
                for line in watcher.stdout:
                    self.observed.append({"t": time.monotonic(), "row": line.split()})
                time.sleep(1.0)
                if self.closed:
                    return
                watcher = start()

        threading.Thread(target=read, daemon=True).start()

    def close(self) -> None:
        self.closed = True
        for watcher in self.watchers:
            watcher.kill()
            watcher.wait()

    def _wait(
        self, name: str, done: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                job: dict[str, Any] | None = self.job(name)
            except KubectlError as error:
                # The node's API server, on the loaded 2-core host, once let a read's TLS handshake time out
                # mid-scenario (CI, 2026-12-02): a wait reads again; any other error fails at once.
                if not any(words in str(error) for words in UNREACHABLE):
                    raise
                job = None
            except subprocess.TimeoutExpired:
                # kubectl itself gave up after 60 s, at load ~50 on the 2-core host (a clean-clone run,
                # 2026-12-02): the same unanswered read, made again within the wait's own deadline.
                job = None
            if job is not None and done(job):
                return job
            if time.monotonic() > deadline:
                rows = [o["row"] for o in self.observed]
                raise AssertionError(
                    f"job {name}: not {what} after {timeout}s; seen {rows}\n{self.diagnose()}"
                )
            time.sleep(1)

    def wait_finished(self, name: str, timeout: float) -> dict[str, Any]:
        """Until the job is Succeeded or Failed."""
        return self._wait(name, lambda j: j.get("status", {}).get("phase") in TERMINAL, timeout, "finished")

    def wait_step(self, name: str, at_least: int, timeout: float) -> None:
        """Until the job's status shows step >= `at_least`."""
        self._wait(
            name,
            lambda j: (j.get("status", {}).get("progress", {}).get("step") or 0) >= at_least,
            timeout,
            f"at step {at_least}",
        )

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return self.pods_in(self.namespace, selector)

    def pods_in(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods matching `selector`, without those already being deleted."""
        out = self.installation.admin("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
        return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]

    def delete_pod(self, name: str, namespace: str | None = None) -> None:
        """Deleted without a grace period: the process is killed, as a node or OOM kill would."""
        self.installation.admin(
            "delete",
            "pod",
            name,
            "-n",
            namespace or self.namespace,
            "--grace-period=0",
            "--force",
            "--wait=false",
        )

    def events_of(self, name: str) -> list[dict[str, Any]]:
        """The Events of the namespace's objects named `name`."""
        out = self.installation.admin(
            "get",
            "events",
            "-n",
            self.namespace,
            "-o",
            "json",
            f"--field-selector=involvedObject.name={name}",
        ).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def exec(self, pod: str, container: str, script: str, check: bool = True) -> str:
        """`kubectl exec` of a shell script in the container; its stdout."""
        return self.installation.admin(
            "exec", pod, "-n", self.namespace, "-c", container, "--", "sh", "-c", script, check=check
        ).stdout

    def metrics(self, name: str, checkpoints: Path | None = None) -> list[dict[str, Any]]:
        """The run's metrics.jsonl, read from the checkpoint claim (the runtime writes it there in a cluster)."""
        path = (checkpoints or self.checkpoints) / "runs" / name / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def intruder(self, image: str) -> str:
        """A pod of the namespace with none of a job's credentials or labels (the attacker of docs/security.md):
        the job's own image (Ray's and HTTP clients), idle until `probe` runs in it. Returns its name."""
        name = "intruder"
        container = {
            "name": name,
            "image": image,
            "command": ["sleep", "infinity"],
            "resources": {
                "requests": {"cpu": "50m", "memory": "256Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            },
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "labels": {"app": name}},
            "spec": {**restricted_pod_spec([container]), "terminationGracePeriodSeconds": 0},
        }
        self.installation.admin("apply", "-f", "-", input=yaml_stream([pod]))
        self.installation.admin(
            "wait",
            "--for=condition=Ready",
            f"pod/{name}",
            "-n",
            self.namespace,
            "--timeout=300s",
            timeout=320,
        )
        return name

    def probe(self, targets: dict[str, Any]) -> dict[str, str]:
        """What the intruder's tries at `targets` got (`intruder_probe.py`, run in its pod)."""
        source = (Path(__file__).parent / "intruder_probe.py").read_text()
        out = self.installation.admin(
            "exec", "-i", "intruder", "-n", self.namespace, "--", "python", "-", json.dumps(targets),
            input=source, timeout=120,
        ).stdout  # fmt: skip
        result: dict[str, str] = json.loads(out.strip().splitlines()[-1])
        return result

    def pod_ip(self, selector: str) -> str:
        """The address of the one pod matching `selector`."""
        (pod,) = self.pods(selector)
        ip: str = pod["status"]["podIP"]
        return ip

    def external_teacher(self, name: str, image: str) -> str:
        """A teacher server of the job's own image that no DistillationJob owns (a Deployment + Service of
        the test's), serving the `models` claim's teacher; returns the endpoint a job names."""
        labels = {"app": name}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        **restricted_pod_spec(
                            [
                                {
                                    "name": "teacher",
                                    "image": image,
                                    "command": [*TEACHER_SERVER, "--served-model-name", name],
                                    "resources": {
                                        "requests": {"cpu": "500m", "memory": "2Gi"},
                                        "limits": {"cpu": "2", "memory": "4Gi"},
                                    },
                                    "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}],
                                    "ports": [{"name": "http", "containerPort": 8000}],
                                    "readinessProbe": {
                                        "httpGet": {"path": "/health", "port": "http"},
                                        "periodSeconds": 2,
                                    },
                                    "volumeMounts": [
                                        {"name": "models", "mountPath": "/models", "readOnly": True}
                                    ],
                                }
                            ]
                        ),
                        "volumes": [
                            {
                                "name": "models",
                                "persistentVolumeClaim": {"claimName": MODELS_CLAIM, "readOnly": True},
                            }
                        ],
                    },
                },
            },
        }
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
        }
        self.installation.admin("apply", "-f", "-", input=yaml_stream([deployment, service]))
        return f"http://{name}.{self.namespace}.svc.cluster.local:8000"

    def steps_seen(self, name: str) -> list[int]:
        """The STEP column's values, in the order `kubectl get dj` showed them."""
        steps: list[int] = []
        for entry in self.observed:
            # Before step 1 the STEP cell is empty and the row has a column fewer.
            row = entry["row"]
            if row[0] != name:
                continue
            cell = step_cell(row)
            if cell.isdigit() and (not steps or steps[-1] != int(cell)):
                steps.append(int(cell))
        return steps

    def diagnose(self) -> str:
        admin = self.installation.admin
        parts = [
            admin(
                "get", "pods,rayjobs,raycluster,deploy", "-n", self.namespace, "-o", "wide", check=False
            ).stdout
        ]
        parts.append(
            admin("get", "events", "-n", self.namespace, "--sort-by=.lastTimestamp", check=False).stdout[
                -4000:
            ]
        )
        pods = json.loads(
            admin("get", "pods", "-n", self.namespace, "-o", "json", check=False).stdout or '{"items": []}'
        )
        for pod in pods["items"]:
            name = pod["metadata"]["name"]
            logs = admin("logs", name, "-n", self.namespace, "--all-containers", "--tail=60", check=False)
            parts.append(f"--- {name}\n{logs.stdout}{logs.stderr}")
        return "\n".join(parts)


def tiny_job(name: str, *, teachers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A DistillationJob on the `models` claim's tiny models, checkpointing to the `checkpoints` claim."""
    body: dict[str, Any] = {
        "student": {
            "model": f"pvc://{MODELS_CLAIM}/student",
            "precision": "float32",
            "rollout": {"engine": "vllm", "maxNewTokens": 6, "samplesPerPrompt": 2},
            "optimizer": {"lr": 1e-3},
            "pool": {"workers": 1, "gpusPerWorker": 0},
        },
        "teachers": teachers,
        "data": {"train": {"path": f"pvc://{MODELS_CLAIM}/train.jsonl"}, "maxPromptTokens": 16},
        "loss": {"mode": "forward_kl_topk", "topK": 4},
        "schedule": {"steps": 4, "promptsPerStep": 4, "microBatchSize": 4, "checkpointEvery": 2},
        "checkpoint": {"pvc": CHECKPOINT_CLAIM},
        # The teachers' load on the loaded 2-core node took up to 10 minutes (CI, 2026-12-02).
        "teacherReadyTimeoutSeconds": 900,
    }
    body.update(spec)
    return {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationJob",
        "metadata": {"name": name},
        "spec": body,
    }


def standalone_teacher(name: str = "teacher", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": f"pvc://{MODELS_CLAIM}/teacher",
        "placement": "standalone",
        "pool": {"gpusPerReplica": 0},
        # Eager mode: on CPU, torch.compile doubles a server's start-up (~30 s against ~65 s).
        "inference": {"extraArgs": ["--enforce-eager"]},
        **extra,
    }
