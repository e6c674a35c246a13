"""The controllers that cannot run on the test's control plane, played faithfully by the tests.

The control plane runs the real kube-apiserver, controller-manager (garbage collector, Deployment and
ReplicaSet controllers) and scheduler, but no node and no KubeRay. Two controllers are played here, each
writing only what the real one writes, through the same API (status subresources, pod bindings made by
the real scheduler):

- `PlayedKubeRay`: KubeRay v1.7.0's RayJob controller, as far as the operator can see it: the RayJob's
  `status` (jobDeploymentStatus, jobStatus, and the bookkeeping fields it fills in beside them). The
  kuberay-operator binary is not run: it would need Ray head pods that answer its dashboard client.
- `PlayedKubelet`: the kubelet of one Node object with GPUs, so that the real scheduler binds teacher pods
  to it and the real ReplicaSet/Deployment controllers compute readyReplicas from pod readiness.

Played controllers are machinery, not users: they use the `kubernetes` client as admin, while the tests
drive the cluster as a user does, with the project's kubectl.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

MERGE_PATCH = "application/merge-patch+json"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_client(kubeconfig: Path) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=config)
    return kubernetes.client.ApiClient(config)


class PlayedKubeRay:
    """KubeRay v1.7.0's RayJob controller, played through the RayJob's status subresource.

    What KubeRay writes, step by step (ray-operator/controllers/ray/rayjob_controller.go):
    - a new RayJob with `spec.suspend: true` goes straight to jobDeploymentStatus `Suspended`;
    - otherwise `Initializing` (it creates the RayCluster, names it in rayClusterName, sets startTime and a
      jobId), then `Running` once the cluster is ready and the job submitted (jobStatus from the Ray
      dashboard: PENDING, then RUNNING);
    - the job ends: jobStatus SUCCEEDED (or FAILED), jobDeploymentStatus `Complete`, endTime, succeeded;
    - `spec.suspend` set on a running RayJob: `Suspending` (it deletes the RayCluster and the submitter),
      then `Suspended` with the job's fields reset (jobStatus, jobId, rayClusterName, dashboardURL,
      startTime cleared); unsuspended, it starts over from `Initializing`.

    Each method checks what KubeRay would check first: it never starts a RayJob whose spec says suspend
    (that is Kueue's or the owner's decision), and suspends only one whose spec asks for it.
    """

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str):
        self.api = kubernetes.client.CustomObjectsApi(client)
        self.namespace = namespace

    def rayjob(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.api.get_namespaced_custom_object(
            "ray.io", "v1", self.namespace, "rayjobs", name
        )
        return obj

    def _status(self, name: str, status: Mapping[str, Any]) -> None:
        self.api.patch_namespaced_custom_object_status(
            "ray.io", "v1", self.namespace, "rayjobs", name, {"status": dict(status)},
            _content_type=MERGE_PATCH,
        )  # fmt: skip

    def _suspended_in_spec(self, name: str) -> bool:
        return bool(self.rayjob(name)["spec"].get("suspend"))

    def initializing(self, name: str) -> None:
        """It creates the RayCluster for an unsuspended RayJob."""
        assert not self._suspended_in_spec(name), f"KubeRay does not start the suspended RayJob {name}"
        self._status(
            name,
            {
                "jobDeploymentStatus": "Initializing",
                "jobId": f"{name}-{uuid.uuid4().hex[:5]}",
                "rayClusterName": f"{name}-raycluster-{uuid.uuid4().hex[:5]}",
                "startTime": now(),
                "observedGeneration": self.rayjob(name)["metadata"]["generation"],
            },
        )

    def running(self, name: str) -> None:
        """The cluster is up and the Ray job runs."""
        assert not self._suspended_in_spec(name), f"KubeRay does not run the suspended RayJob {name}"
        if not self.rayjob(name).get("status", {}).get("rayClusterName"):
            self.initializing(name)
        self._status(
            name,
            {
                "jobDeploymentStatus": "Running",
                "jobStatus": "RUNNING",
                "dashboardURL": f"{name}-head-svc.{self.namespace}.svc.cluster.local:8265",
            },
        )

    def finished(self, name: str, job_status: str = "SUCCEEDED") -> None:
        """The Ray job ends; with shutdownAfterJobFinishes KubeRay then deletes the RayCluster."""
        self._status(
            name,
            {
                "jobDeploymentStatus": "Complete",
                "jobStatus": job_status,
                "endTime": now(),
                "succeeded" if job_status == "SUCCEEDED" else "failed": 1,
            },
        )

    def suspend(self, name: str) -> None:
        """`spec.suspend` became true: Suspending, the cluster deleted, then Suspended with fields reset."""
        assert self._suspended_in_spec(name), f"KubeRay suspends {name} only when its spec says so"
        self._status(name, {"jobDeploymentStatus": "Suspending"})
        reset = dict.fromkeys(
            ("jobStatus", "jobId", "rayClusterName", "dashboardURL", "startTime", "endTime")
        )
        self._status(name, {"jobDeploymentStatus": "Suspended", **reset})


NODE_CAPACITY = {
    "cpu": "256", "memory": "2Ti", "ephemeral-storage": "4Ti", "pods": "110", "nvidia.com/gpu": "64",
}  # fmt: skip
"""What a GPU node reports; a real kubelet always reports `ephemeral-storage` (its disk), which pods with a
model cache request."""


class PlayedKubelet:
    """The kubelet of one Node object: it has GPUs and is Ready, so the real scheduler binds pods to it.

    It runs no container. For every pod bound to its node it reports what a kubelet reports once the
    container runs: phase Running, a running container status, the Ready conditions (only for pods whose
    readiness probe passes: those matching a label set given to `pass_readiness`, as a vLLM server whose
    /health answers once the model is loaded). A pod deleted while bound to the node stays Terminating
    until its kubelet confirms the containers stopped: this one force-deletes it at once (grace 0).
    The controller-manager runs with --node-monitor-grace-period=1h, so the node's heartbeat, set once,
    is never too old.
    """

    def __init__(self, client: kubernetes.client.ApiClient, node: str):
        self.core = kubernetes.client.CoreV1Api(client)
        self.node = node
        self.ready_labels: list[dict[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kubelet {node}", daemon=True)
        self.errors: list[BaseException] = []

    # ------------------------------------------------------------------------------------------ node

    def _node_status(self) -> dict[str, Any]:
        stamp = now()
        conditions = [
            {"type": t, "status": "False", "reason": f"KubeletHasNo{t}", "message": "",
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
            for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
        ]  # fmt: skip
        conditions.append(
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
        )  # fmt: skip
        return {
            "capacity": NODE_CAPACITY,
            "allocatable": NODE_CAPACITY,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        }

    def start(self) -> PlayedKubelet:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node}},
            "status": self._node_status(),
        }
        self.core.create_node(node)
        # What a kubelet posts after registering (a create may drop status on some versions).
        self.core.patch_node_status(self.node, {"status": self._node_status()})
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with contextlib.suppress(ApiException):
            self.core.delete_node(self.node)

    # ------------------------------------------------------------------------------------------ pods

    def pass_readiness(self, labels: Mapping[str, str]) -> None:
        """From now on, the readiness probe of pods with these labels passes."""
        self.ready_labels.append(dict(labels))

    def _probe_passes(self, pod: Any) -> bool:
        labels = pod.metadata.labels or {}
        return any(all(labels.get(k) == v for k, v in want.items()) for want in self.ready_labels)

    def pods(self) -> list[Any]:
        items: list[Any] = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}"
        ).items
        return items

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                for pod in self.pods():
                    self._sync(pod)
            except ApiException as error:
                if error.status not in (404, 409):
                    self.errors.append(error)
            except Exception as error:
                self.errors.append(error)

    def _sync(self, pod: Any) -> None:
        meta = pod.metadata
        if meta.deletion_timestamp is not None:
            self.core.delete_namespaced_pod(meta.name, meta.namespace, grace_period_seconds=0)
            return
        ready = self._probe_passes(pod)
        conditions = {c.type: c.status for c in (pod.status.conditions or [])}
        if pod.status.phase == "Running" and conditions.get("Ready") == ("True" if ready else "False"):
            return
        self.core.patch_namespaced_pod_status(
            meta.name, meta.namespace, {"status": self._pod_status(pod, ready)}, _content_type=MERGE_PATCH
        )

    def _pod_status(self, pod: Any, ready: bool) -> dict[str, Any]:
        stamp = now()
        flag = "True" if ready else "False"
        started = pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if pod.status.start_time else stamp
        return {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "startTime": started,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
                {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": stamp},
                {"type": "Ready", "status": flag, "lastTransitionTime": stamp},
            ],
            "containerStatuses": [
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": ready,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started}},
                }
                for c in pod.spec.containers
            ],
        }


@contextlib.contextmanager
def played_kubelet(client: kubernetes.client.ApiClient, node: str) -> Iterator[PlayedKubelet]:
    kubelet = PlayedKubelet(client, node).start()
    try:
        yield kubelet
    finally:
        kubelet.stop()
    assert not kubelet.errors, f"the played kubelet failed: {kubelet.errors[:3]}"
