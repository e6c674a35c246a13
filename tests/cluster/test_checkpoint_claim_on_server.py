"""The trained model outlives the pods (issue 25): a job that names no checkpoint claim gets the operator's,
on a real control plane whose PersistentVolume controller binds it and whose garbage collector decides
what `kubectl delete dj` takes with it.

- the claim is what the plan says (name, size, StorageClass, ReadWriteMany), mounted by the trainer's pods,
  bound by the real PV controller to a volume of that class, and named in `status.storage`;
- `kubectl delete dj` leaves it (no owner reference), and a job made again with the same name mounts the
  same claim, which the operator does not make again;
- with `checkpoint.deleteWithJob` the job owns it, and the garbage collector deletes it with the job.

No storage provisioner runs here: the test makes the volume a provisioner would (a PersistentVolume of the
claim's class, which the binder matches by class, size and access mode).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import Installation, wait_until, yaml_stream
from test_operator_on_server import Cluster, cluster, example

from distillery.plan.checkpoints.storage import checkpoint_storage
from distillery.validation import parse_job

__all__ = ["cluster"]  # the fixture, shared with test_operator_on_server

pytestmark = pytest.mark.timeout(180)

JOB = "colocated-teacher"
CLAIM = f"{JOB}-checkpoints"


@pytest.fixture
def storage_class(installation: Installation, namespace: str) -> Iterator[str]:
    """A StorageClass of the test's own (cluster-scoped: named after the namespace), with no provisioner and
    immediate binding, and a ReadWriteMany volume of it, as a provisioner would make for the claim."""
    name = f"rwx-{namespace}"
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "Immediate",
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "40Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": name,
                "hostPath": {"path": f"/tmp/{name}"},
            },
        },
    ]
    installation.admin("apply", "-f", "-", input=yaml_stream(objects))
    try:
        yield name
    finally:
        for kind in ("persistentvolume", "storageclass"):
            installation.admin("delete", kind, name, "--wait=false", check=False)


def job_without_claim(**checkpoint: Any) -> dict[str, Any]:
    doc = example(f"{JOB}.yaml")
    assert "checkpoint" not in doc["spec"]  # the example names no claim
    doc["spec"]["checkpoint"] = checkpoint
    return doc


def claim_creates(c: Cluster) -> list[dict[str, Any]]:
    return [
        w
        for w in c.operator_writes()
        if w["verb"] == "create" and w["objectRef"]["resource"] == "persistentvolumeclaims"
    ]


def mounted_claim(c: Cluster) -> set[str]:
    """The claim the trainer's pods (head and workers) mount at /checkpoints."""
    cluster_spec = c.rayjob(f"{JOB}-trainer")["spec"]["rayClusterSpec"]
    templates = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    return {
        v["persistentVolumeClaim"]["claimName"]
        for t in templates
        for v in t["template"]["spec"]["volumes"]
        if v["name"] == "checkpoints"
    }


def test_the_operators_claim_is_bound_kept_after_the_job_and_used_again(
    cluster: Cluster, storage_class: str
) -> None:
    c = cluster
    doc = job_without_claim(storageClassName=storage_class)
    planned = checkpoint_storage(JOB, parse_job(doc).spec).operator_claim
    assert planned is not None and planned.name == CLAIM
    c.apply(doc)

    # The claim the plan decided: its size from the student (Qwen2.5-0.5B, 31Gi), the class given,
    # ReadWriteMany (the head and the worker are two pods), no owner; the trainer's pods mount it.
    claim = wait_until(lambda: c.get("pvc", CLAIM), what="the checkpoint claim")
    assert claim["spec"]["resources"]["requests"]["storage"] == planned.size == "31Gi"
    assert claim["spec"]["storageClassName"] == storage_class
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "ownerReferences" not in claim["metadata"]
    assert claim["metadata"]["labels"]["distillery.io/job"] == JOB
    wait_until(lambda: f"{JOB}-trainer" in c.names("rayjobs"), what="the RayJob")
    assert mounted_claim(c) == {CLAIM}

    # The real PV controller binds it to the class's volume; the status says where the output lives.
    wait_until(lambda: (c.status(JOB).get("storage") or {}).get("phase") == "Bound", what="the claim bound")
    assert c.status(JOB)["storage"] == {
        "claim": CLAIM,
        "kept": True,
        "ephemeral": False,
        "size": "40Gi",
        "phase": "Bound",
    }
    kept = c.condition(JOB, "OutputKept")
    assert (kept["status"], kept["reason"]) == ("True", "ClaimKept") and CLAIM in kept["message"]
    c.kuberay.running(f"{JOB}-trainer")
    # What the runtime writes once the last step is saved: the model's folder, on the claim.
    model = {"path": "/checkpoints/final", "claim": CLAIM, "step": 100, "dtype": "bfloat16"}
    c.kubectl(
        "patch",
        "dj",
        JOB,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"model": model}}),
    )
    c.kuberay.finished(f"{JOB}-trainer")
    wait_until(lambda: c.phase(JOB) == "Succeeded", what="Succeeded")
    assert c.kubectl("get", "dj", JOB, "-o", "jsonpath={.status.model.claim}") == CLAIM

    # kubectl delete dj: the garbage collector takes the children, not the claim (nor its volume).
    first_uid = claim["metadata"]["uid"]
    c.kubectl("delete", "dj", JOB, "--wait=true")
    for resource in ("rayjobs", "configmaps", "serviceaccounts"):
        wait_until(
            lambda r=resource: [n for n in c.names(r) if n.startswith(JOB)] == [],
            what=f"the GC to delete the {resource}",
        )
    left = c.get("pvc", CLAIM)
    assert left is not None and left["metadata"]["uid"] == first_uid
    assert "deletionTimestamp" not in left["metadata"] and left["status"]["phase"] == "Bound"

    # The same job made again mounts the same claim; the operator does not make another.
    c.apply(doc)
    wait_until(lambda: f"{JOB}-trainer" in c.names("rayjobs"), what="the new RayJob")
    assert mounted_claim(c) == {CLAIM}
    wait_until(
        lambda: (c.status(JOB).get("storage") or {}).get("phase") == "Bound", what="the new job's status"
    )
    assert c.get("pvc", CLAIM)["metadata"]["uid"] == first_uid
    assert len(claim_creates(c)) == 1
    assert c.condition(JOB, "OutputKept")["reason"] == "ClaimKept"


def test_with_delete_with_job_the_garbage_collector_deletes_the_claim_with_the_job(cluster: Cluster) -> None:
    c = cluster
    c.apply(job_without_claim(deleteWithJob=True))
    claim = wait_until(lambda: c.get("pvc", CLAIM), what="the checkpoint claim")
    uid = c.job(JOB)["metadata"]["uid"]  # type: ignore[index]
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"], owner["blockOwnerDeletion"]) == (
        "DistillationJob", uid, True, True,
    )  # fmt: skip
    # No class named and none is the cluster's default: the claim waits for one, and the status says so.
    wait_until(lambda: (c.status(JOB).get("storage") or {}).get("phase") == "Pending", what="Pending")
    storage = c.status(JOB)["storage"]
    assert storage["kept"] is False and "not bound to a volume yet" in storage["message"]
    assert c.condition(JOB, "OutputKept")["reason"] == "DeletedWithJob"

    c.kubectl("delete", "dj", JOB, "--wait=true")
    wait_until(lambda: c.get("pvc", CLAIM) is None, what="the GC to delete the claim")
    assert [
        w["verb"] for w in c.operator_writes() if w["objectRef"]["resource"] == "persistentvolumeclaims"
    ] == ["create"]  # made once, deleted by the garbage collector, never by the operator
