"""The storage check on a real control plane (issue 26): before the operator makes a job's pods, it reads
every claim they mount (with the chart's RBAC: `get` on persistentvolumeclaims).

- a checkpoint claim that only one node may mount (ReadWriteOnce), named by a job whose Ray head and worker
  are two pods, is refused: StorageReady False (AccessModeConflict) naming the claim, phase Invalid, a
  Warning Event, and nothing made (the operator's only writes are the job's status);
- a job naming a claim that does not exist waits (StorageReady False, ClaimMissing, phase Pending), reads
  it again with backoff, and is made whole once the user creates the claim.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import wait_until
from support.claims import claim_manifest
from test_operator_on_server import OPERATOR_USER, Cluster, cluster, example

__all__ = ["cluster"]  # the fixture, shared with test_operator_on_server

pytestmark = pytest.mark.timeout(150)

JOB = "colocated-teacher"


def job_naming(claim: str) -> dict[str, Any]:
    """The colocated example (its data on the claim `datasets`, which the namespace has) writing its
    checkpoints to `claim`."""
    doc = example(f"{JOB}.yaml")
    doc["spec"]["checkpoint"] = {"pvc": claim}
    return doc


def claim_reads(c: Cluster, claim: str) -> int:
    """How many times the operator read `claim` (GET), from the API server's audit log."""
    return sum(
        1
        for e in c.installation.plane.audit_events()
        if e.get("stage") == "ResponseComplete"
        and e["user"]["username"] == OPERATOR_USER
        and e["verb"] == "get"
        and (e.get("objectRef") or {}).get("resource") == "persistentvolumeclaims"
        and e["objectRef"].get("namespace") == c.namespace
        and e["objectRef"].get("name") == claim
    )


def test_a_read_write_once_checkpoint_claim_is_refused_and_nothing_is_made(cluster: Cluster) -> None:
    c = cluster
    c.apply(claim_manifest("single-node", "ReadWriteOnce"))
    c.apply(job_naming("single-node"))

    cond = wait_until(
        lambda: (
            c.condition(JOB, "StorageReady").get("reason") == "AccessModeConflict"
            and c.condition(JOB, "StorageReady")
        ),
        what="the AccessModeConflict condition",
    )
    assert cond["status"] == "False"
    assert "PersistentVolumeClaim single-node is ReadWriteOnce" in cond["message"]
    assert "the Ray head and 1 Ray worker" in cond["message"]
    assert c.phase(JOB) == "Invalid" and c.status(JOB)["message"] == cond["message"]
    wait_until(
        lambda: any(e["type"] == "Warning" and e["reason"] == "AccessModeConflict" for e in c.events(JOB)),
        what="the Warning Event",
    )
    # Nothing was made: the operator's only writes are the job's status.
    writes = {
        (w["verb"], w["objectRef"]["resource"], w["objectRef"].get("subresource", ""))
        for w in c.operator_writes()
    }
    assert writes == {("patch", "distillationjobs", "status")}
    assert c.names("rayjobs") == [] and c.names("configmaps") == ["kube-root-ca.crt"]


def test_a_missing_claim_is_waited_for_and_the_job_goes_on_once_it_exists(cluster: Cluster) -> None:
    c = cluster
    c.apply(job_naming("made-later"))

    cond = wait_until(
        lambda: (
            c.condition(JOB, "StorageReady").get("reason") == "ClaimMissing"
            and c.condition(JOB, "StorageReady")
        ),
        what="the ClaimMissing condition",
    )
    assert cond["status"] == "False" and "made-later" in cond["message"]
    assert c.phase(JOB) == "Pending" and "made-later" in c.status(JOB)["message"]
    # It looks again, with backoff (no watch tells the operator of a claim it does not make).
    wait_until(lambda: claim_reads(c, "made-later") >= 3, what="the claim read again")
    assert c.names("rayjobs") == []

    c.apply(claim_manifest("made-later"))
    wait_until(lambda: f"{JOB}-trainer" in c.names("rayjobs"), timeout=90, what="the RayJob")
    ready = wait_until(
        lambda: c.condition(JOB, "StorageReady").get("status") == "True" and c.condition(JOB, "StorageReady"),
        what="StorageReady True",
    )
    assert ready["reason"] == "ClaimsMountable" and "made-later" in ready["message"]
