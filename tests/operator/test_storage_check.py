"""The storage check (`distillery_operator.jobs.storage`): which pods mount which claim, which access modes serve
them, and what `decide` does with a claim that is missing or cannot serve its pods."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from distillery_operator.jobs.storage import (
    ACCESS_MODE_CONFLICT,
    CLAIM_MISSING,
    check_storage,
    claim_uses,
    claims_to_read,
)
from distillery_operator.observe.summaries import ClaimFacts
from test_operator_decide import World, job_body

from distillery.api import DistillationJob
from distillery.validation import parse_job

RWO, RWOP, ROX, RWX = "ReadWriteOnce", "ReadWriteOncePod", "ReadOnlyMany", "ReadWriteMany"


def job(example: str = "gkd.yaml", **spec: Any) -> DistillationJob:
    return parse_job(job_body(example, **spec))


def facts(name: str, *modes: str) -> ClaimFacts:
    return ClaimFacts(name, modes)


def test_every_claim_and_the_pods_that_mount_it() -> None:
    uses = {u.claim: u for u in claim_uses(job("standalone-teacher.yaml"))}
    # The user's checkpoint claim (written by the Ray head and worker); the datasets' claim (read by them).
    assert set(uses) == {"distill-checkpoints", "datasets"}
    assert uses["distill-checkpoints"].writes and not uses["datasets"].writes
    assert uses["distill-checkpoints"].pods == 2 and uses["datasets"].pods == 2
    assert claims_to_read(job("standalone-teacher.yaml")) == ["datasets", "distill-checkpoints"]
    # The operator's own claim is not read (its watch has it).
    assert claims_to_read(job("gkd.yaml")) == ["datasets"]


def test_a_teachers_model_claim_counts_its_replicas_and_the_ray_pods() -> None:
    doc = job_body("gkd.yaml")
    doc["spec"]["teachers"][0].update(model="pvc://models/teacher", replicas=3)
    (use,) = [u for u in claim_uses(parse_job(doc)) if u.claim == "models"]
    assert use.pods == 2 + 3 and not use.writes
    assert "teacher teacher's 3 replicas" in use.mounted_by()


@pytest.mark.parametrize(
    ("modes", "ok"),
    [((RWX,), True), ((RWO,), False), ((RWOP,), False), ((RWO, RWX), True), ((ROX,), False), ((), True)],
)
def test_the_checkpoint_claim_needs_many_nodes_and_writes(modes: tuple[str, ...], ok: bool) -> None:
    check = check_storage(
        job(checkpoint={"pvc": "ckpt"}),
        {"ckpt": facts("ckpt", *modes), "datasets": facts("datasets", RWX)},
        None,
    )
    assert check.ok is ok
    if not ok:
        cond = check.condition()
        assert cond.reason == ACCESS_MODE_CONFLICT and not cond.status
        assert "PersistentVolumeClaim ckpt" in cond.message and modes[0] in cond.message


def test_read_only_claims_may_be_read_only_many() -> None:
    check = check_storage(job(), {"datasets": facts("datasets", ROX)}, None)
    assert check.ok


def test_pods_pinned_to_one_node_may_share_a_read_write_once_claim_but_not_a_once_pod_one() -> None:
    doc = job_body("colocated-teacher.yaml", checkpoint={"pvc": "ckpt"})
    doc["spec"]["student"]["pool"]["nodeSelector"] = {"kubernetes.io/hostname": "node-1"}
    pinned = parse_job(doc)
    read = {"ckpt": facts("ckpt", RWO), "datasets": facts("datasets", RWO)}
    assert check_storage(pinned, read, None).ok
    once_pod = check_storage(pinned, {**read, "ckpt": facts("ckpt", RWOP)}, None)
    assert not once_pod.ok and "one pod" in once_pod.conflicts[0]
    # A standalone teacher on another node mounting the same claim breaks the pinning.
    doc = copy.deepcopy(doc)
    doc["spec"]["teachers"] = job_body("gkd.yaml")["spec"]["teachers"]
    doc["spec"]["teachers"][0]["model"] = "pvc://datasets/teacher"
    assert not check_storage(parse_job(doc), read, None).ok


def test_a_missing_claim_is_waited_for() -> None:
    check = check_storage(job(), {"datasets": None}, None)
    cond = check.condition()
    assert (cond.reason, cond.status) == (CLAIM_MISSING, False) and "datasets" in cond.message


def test_the_operators_own_claim_passes() -> None:
    assert check_storage(job(), {"datasets": facts("datasets", RWX)}, None).ok  # not made yet: as planned
    made = facts("gkd-jsd-checkpoints", RWX)
    assert check_storage(job(), {"datasets": facts("datasets", RWX)}, made).ok


# ---------------------------------------------------------------------------------------------- decide


def test_decide_refuses_a_read_write_once_checkpoint_claim_and_makes_nothing() -> None:
    world = World(job_body("gkd.yaml", checkpoint={"pvc": "ckpt"}))
    world.claims["ckpt"] = facts("ckpt", RWO)
    decision = world.step()
    assert decision.actions == [] and decision.held and not decision.wait
    status = world.body["status"]
    assert status["phase"] == "Invalid"
    cond = world.condition("StorageReady")
    assert (cond["status"], cond["reason"]) == ("False", ACCESS_MODE_CONFLICT)
    assert "ckpt is ReadWriteOnce" in cond["message"] and "different nodes" in cond["message"]
    assert status["message"] == cond["message"]
    warnings = [e for e in world.events if e.type == "Warning"]
    assert any(e.reason == ACCESS_MODE_CONFLICT for e in warnings)


def test_decide_waits_for_a_missing_claim_then_makes_everything() -> None:
    world = World(job_body("gkd.yaml", checkpoint={"pvc": "ckpt"}))
    decision = world.step()
    assert decision.actions == [] and decision.wait
    assert world.body["status"]["phase"] == "Pending"
    assert world.condition("StorageReady")["reason"] == CLAIM_MISSING
    assert "ckpt" in world.body["status"]["message"]

    world.claims["ckpt"] = facts("ckpt", RWX)
    decision = world.step()
    assert not decision.wait and ("create", "RayJob") in [(a.verb, a.kind) for a in decision.actions]
    assert world.condition("StorageReady")["status"] == "True"


def test_the_model_cache_claim_is_written_by_every_pod_that_downloads() -> None:
    doc = job_body("standalone-teacher.yaml")
    doc["spec"]["modelCache"] = {"pvc": "hf-cache"}
    (use,) = [u for u in claim_uses(parse_job(doc)) if u.claim == "hf-cache"]
    # The Ray head and worker, and the teacher's 2 replicas: a ReadWriteOnce cache cannot serve them.
    assert use.writes and use.pods == 1 + 1 + 2
    assert "hf-cache" in claims_to_read(parse_job(doc))
