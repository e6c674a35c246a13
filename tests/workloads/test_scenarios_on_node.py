"""A DistillationJob from `kubectl apply` to `Succeeded` on a real node: the operator in its pod, KubeRay's
operator, the runtime image's Ray head and worker, and the teachers' vLLM servers, all on CPU with tiny
models on a PersistentVolume. Each scenario watches `kubectl get dj -w` and reads the run's metrics from
the checkpoint claim. A fault is injected into a run of its own scenario where that costs no extra job
(each job costs about two minutes of start-up on two cores): the operator's pod into the reference run
that the killed head's run is then compared with, and a teacher's container into the one-step-off run (as
it first comes up), which is then deleted mid-run."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from distillery_operator import naming
from distillery_runtime.checkpoints.checkpoint import FINAL_DIR, step_dir_name
from harness import RELEASE_NAMESPACE, wait_until
from node_jobs import (
    GPU_TAINT,
    MANUAL_CLASS,
    MODELS_CLAIM,
    Workspace,
    node_name,
    standalone_teacher,
    tiny_job,
)
from prometheus_client.parser import text_string_to_metric_families

from distillery.api.spec import DistillationJobSpec

# The first scenario also waits for the session's images (built in ~7 min on a clean clone) and node.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

IMAGE = DistillationJobSpec.model_fields["image"].default
FINISH = 900.0
SAMPLES_PER_STEP = 4 * 2  # promptsPerStep x samplesPerPrompt of tiny_job
SIX_STEPS = {"steps": 6, "promptsPerStep": 4, "microBatchSize": 4, "checkpointEvery": 2}
# Long enough for a kill to land mid-run: a step of tiny_job takes ~0.2 s on the node, so six steps end ~1.3 s
# after the first (CI and here, 2026-12-03), sooner than a kubectl call lands.
SIXTY_STEPS = {**SIX_STEPS, "steps": 60, "checkpointEvery": 10}
OPERATOR = "app.kubernetes.io/component=operator"


def assert_succeeded(
    workspace: Workspace, name: str, steps: int = 4, checkpoints: Any = None, timeout: float = FINISH
) -> list[dict]:
    job = workspace.wait_finished(name, timeout=timeout)
    assert job["status"]["phase"] == "Succeeded", workspace.diagnose()
    seen = workspace.steps_seen(name)
    assert seen and seen[-1] == steps and len(seen) >= 2, (
        f"kubectl get dj -w never showed STEP advance: {seen}"
    )
    records = workspace.metrics(name, checkpoints)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    # Not a sample lost: every step trained on all of its prompts' samples.
    assert all(r["samples"] == SAMPLES_PER_STEP for r in records), [r["samples"] for r in records]
    return records


def test_the_operator_pod_replaced_mid_run_then_a_killed_head_resumes(workspace: Workspace) -> None:
    """A standalone teacher's run to Succeeded, whose operator pod is deleted at its first step: the
    Deployment makes a new one, and it (not the deleted one) finishes the job's status. Then the same spec
    with backoffLimit 1 whose head pod is killed mid-run: KubeRay makes a new head (a new Ray cluster) and
    its submitter's retry starts a driver there, which resumes from the newest checkpoint on the claim and
    ends with the uninterrupted run's steps and losses. (KubeRay v1.7.0 recovers a lost head within the
    attempt: its RayJob's `failed` stays 0 and backoffLimit is not spent.)"""
    workspace.apply(tiny_job("reference", teachers=[standalone_teacher()], schedule=SIXTY_STEPS))
    workspace.wait_step("reference", 1, timeout=FINISH)
    operators = workspace.pods_in(RELEASE_NAMESPACE, OPERATOR)
    for pod in operators:
        workspace.delete_pod(pod["metadata"]["name"], RELEASE_NAMESPACE)
    reference = assert_succeeded(workspace, "reference", steps=60)
    after = {p["metadata"]["name"] for p in workspace.pods_in(RELEASE_NAMESPACE, OPERATOR)}
    assert after and not after & {p["metadata"]["name"] for p in operators}
    assert any(p.name.startswith("step-") for p in workspace.checkpoints.iterdir())

    claim = "checkpoints-killed"
    folder = workspace.add_checkpoint_claim(claim)
    workspace.apply(tiny_job("killed", teachers=[standalone_teacher()], schedule=SIXTY_STEPS,
                             backoffLimit=1, checkpoint={"pvc": claim}))  # fmt: skip
    # The head dies the moment step 10's checkpoint is on the claim (read from the host, not from the job's
    # status): every process of its container SIGKILLed at once, as the OOM killer would, then the pod
    # force-deleted. Twice in CI (2026-12-03) the kill came too late: six steps, killed at STEP 3 of the
    # status by a force delete alone; the driver had trained all six before it died, and the retry found the
    # run finished, with nothing to resume. (Before runs that had finished started nothing, such a retry
    # "resumed" from the last step and trained none: the scenario had never seen a resume.)
    workspace.wait_step("killed", 1, timeout=FINISH)
    (head,) = workspace.pods("ray.io/node-type=head")
    name, container = head["metadata"]["name"], head["spec"]["containers"][0]["name"]
    wait_until(lambda: (folder / step_dir_name(10)).is_dir(), timeout=FINISH, what="step 10's checkpoint")
    workspace.exec(name, container, "kill -9 -1", check=False)  # all but PID 1, which then ends
    killed_at = time.time()
    workspace.delete_pod(name)
    assert not (folder / FINAL_DIR).exists(), "the run had finished before its head was killed"
    got = assert_succeeded(workspace, "killed", steps=60, checkpoints=folder)
    # A driver of the new cluster took over from the claim's checkpoint: the records of the steps before the
    # kill are the first driver's (a resumed driver keeps them, truncating only what came after its
    # checkpoint; one starting over would have rewritten step 1), and the steps after it are the new one's.
    assert got[0]["time"] < killed_at < got[-1]["time"], [(r["step"], r["time"] - killed_at) for r in got]
    for a, b in zip(reference, got, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7), (a["step"], a["loss"], b["loss"])


def shared_teacher(name: str, **scaling: Any) -> dict[str, Any]:
    """A DistillationTeacher on the `models` claim's teacher, one scoring sequence in its engine at a time
    (`--distillery-max-in-flight 1`: two jobs' requests queue in its fair queue, what the operator scales
    on)."""
    return {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationTeacher",
        "metadata": {"name": name},
        "spec": {
            "model": f"pvc://{MODELS_CLAIM}/teacher",
            "pool": {"gpusPerReplica": 0},
            "inference": {
                "maxModelLen": 64,
                "extraArgs": ["--enforce-eager", "--distillery-max-in-flight", "1"],
            },
            "maxLogprobs": 8,
            "scaling": scaling,
            # A replica's load on the loaded 2-core node took up to 10 minutes (CI, 2026-12-02); the kubelet
            # restarting it at 300 s never let it finish.
            "startupTimeoutSeconds": int(FINISH),
        },
    }


class ReplicaSeries:
    """The Deployment's desired replicas, read every second in a thread while the test runs: the count over
    time, as `kubectl get deploy -w` would show it (consecutive repeats dropped)."""

    def __init__(self, workspace: Workspace, name: str) -> None:
        self.workspace, self.name = workspace, name
        self.counts: list[int] = []
        # The count before the test acts: the thread's first read comes a second later, and a job applied
        # meanwhile had already scaled the teacher to 1 on an unloaded node (the series began [1, 2, 0]).
        self._read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._read()

    def _read(self) -> None:
        out = self.workspace.installation.admin(
            "get", "deployment", self.name, "-n", self.workspace.namespace, "-o",
            "jsonpath={.spec.replicas}", check=False,
        ).stdout.strip()  # fmt: skip
        if out.isdigit() and (not self.counts or self.counts[-1] != int(out)):
            self.counts.append(int(out))

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        self._read()  # the count as it is now, which the thread's last second may not have seen
        return self.counts


def scored_sequences(workspace: Workspace, selector: str) -> dict[str, float]:
    """`distillery_teacher_scored_sequences_total` by client_job, summed over the teacher's ready pods (each
    replica's own /metrics, read from inside its container)."""
    read = "python -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/metrics').read().decode())\""
    totals: dict[str, float] = {}
    for pod in workspace.pods(selector):
        conditions = pod["status"].get("conditions") or []
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            continue  # a replica still loading has served nothing (and does not answer yet)
        for family in text_string_to_metric_families(
            workspace.exec(pod["metadata"]["name"], "teacher", read)
        ):
            for sample in family.samples:
                if sample.name == "distillery_teacher_scored_sequences_total":
                    job = sample.labels["client_job"]
                    totals[job] = totals.get(job, 0.0) + sample.value
    return totals


@pytest.mark.timeout(3000)
def test_two_jobs_share_a_teacher_that_scales_with_them_and_routes_by_a_data_field(
    workspace: Workspace,
) -> None:
    """A DistillationTeacher that two jobs use at once: 0 replicas until the first starts, 1 for it, 2 under
    the load of both, 0 again after both end (its idle time). Both jobs succeed with all their samples, and
    the teacher scored for each exactly the samples its steps sent it. The second job routes by its
    prompts' data field: its `add` samples to the shared teacher, its `sub` samples to an external one (a
    server of the test's own Deployment, which no DistillationJob owns)."""
    # Idle for 60 s before it scales down: the replicas' counters are read after both jobs have ended, and
    # with 20 s an unloaded node's operator took the replica away mid-read (kubectl exec exited 137).
    workspace.apply(
        shared_teacher("shared", minReplicas=0, maxReplicas=2, targetWaitingPerReplica=0, idleSeconds=60)
    )
    wait_until(lambda: workspace.installation.get("deployment", "shared", workspace.namespace),
               what="the teacher's Deployment")  # fmt: skip
    series = ReplicaSeries(workspace, "shared")
    intruder = workspace.intruder(IMAGE)
    try:
        ref = {"name": "teacher", "model": "shared", "placement": "shared", "teacherRef": {"name": "shared"}}
        workspace.apply(tiny_job("first", teachers=[ref]))
        # A server, not colocated: a colocated teacher loads in the trainer after its Ray cluster is up,
        # and the routed job then started scoring after the first had ended (the replicas went 0, 1, 0).
        external: dict[str, Any] = {"name": "subber", "model": "subber", "placement": "external"}
        external.update(routes=["sub"], endpoint=workspace.external_teacher("subber", IMAGE))
        routed = [{**ref, "name": "adder", "routes": ["add"]}, external]
        # Its own checkpoint claim: two runs never write one folder (the second would refuse the first's).
        folder = workspace.add_checkpoint_claim("checkpoints-routed")
        workspace.apply(tiny_job("routed", teachers=routed, checkpoint={"pvc": "checkpoints-routed"}))
        # Nine pods start at once here (two Ray clusters and their submitters, three teacher servers): on a
        # 2-core node beside the other worker's tests the teachers took 10 minutes to load (CI, 2026-12-02).
        first = assert_succeeded(workspace, "first", timeout=2 * FINISH)
        second = assert_succeeded(workspace, "routed", checkpoints=folder)
        sent = {
            "first": sum(r["samples_per_teacher"].get("teacher", 0) for r in first),
            "routed": sum(r["samples_per_teacher"].get("adder", 0) for r in second),
        }
        per_teacher: dict[str, int] = {}
        for record in second:
            for teacher, count in record["samples_per_teacher"].items():
                per_teacher[teacher] = per_teacher.get(teacher, 0) + count
        # The prompts' data_source picks the teacher: both scored, and nothing else did.
        assert set(per_teacher) == {"adder", "subber"} and sum(per_teacher.values()) == 4 * SAMPLES_PER_STEP
        assert sent["first"] == 4 * SAMPLES_PER_STEP
        # A pod of the namespace without a job's key (docs/security.md): refused, whether or not it claims to be
        # one of the teacher's jobs; and nothing of it is counted for a job (the scored totals below).
        tried = workspace.probe({"teacher": "http://shared:8000", "claim": f"{workspace.namespace}/first"})
        assert tried == {
            "teacher_no_key": "401", "teacher_claiming_a_job": "401", "teacher_wrong_key": "401"
        }, (intruder, tried)  # fmt: skip
        # Read before the idle time takes the replicas away.
        scored = scored_sequences(workspace, "app.kubernetes.io/component=shared-teacher")
        assert scored == {f"{workspace.namespace}/{job}": count for job, count in sent.items()}, (
            scored,
            sent,
        )
        wait_until(
            lambda: (
                workspace.installation.get("deployment", "shared", workspace.namespace)["spec"]["replicas"]
                == 0
            ),
            timeout=180,
            what="the teacher scaled to 0 after both jobs",
        )
    finally:
        counts = series.stop()
    assert counts[0] == 0 and counts[-1] == 0 and 2 in counts, counts
    assert counts.index(1) < counts.index(2), counts
    reasons = [e["reason"] for e in workspace.events_of("shared")]
    assert {"ScaledFromZero", "QueueAboveTarget", "Idle"} <= set(reasons), reasons


@contextlib.contextmanager
def gpu_node(workspace: Workspace) -> Iterator[str]:
    """The node as a GPU node is: `nvidia.com/gpu` capacity advertised (a status patch; the scheduler and
    quotas count it, the containers run on the CPU) and tainted `nvidia.com/gpu=present:NoSchedule`.
    Untainted afterwards, so later scenarios' pods (and a replaced operator pod) place as before."""
    admin, node = workspace.installation.admin, node_name(workspace.installation)
    taint = f"{GPU_TAINT['key']}={GPU_TAINT['value']}:{GPU_TAINT['effect']}"
    gpus = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"}]
    admin("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(gpus))
    admin("taint", "node", node, taint, "--overwrite")
    try:
        yield node
    finally:
        admin("taint", "node", node, f"{GPU_TAINT['key']}:{GPU_TAINT['effect']}-", check=False)


def test_colocated_teacher_on_a_tainted_gpu_node(workspace: Workspace) -> None:
    """The teacher in the trainer's Ray workers, on a node tainted as GPU nodes are, in a namespace with
    Pod Security restricted and a quota (every scenario's). A job whose student pool tolerates the taint
    runs to Succeeded: its Ray head and KubeRay's submitter take the pool's tolerations. One that does not
    waits, and says why (PodsScheduled, from the scheduler's own message).

    The job names no checkpoint claim: it writes to the one the operator makes (bound to the volume the
    test pre-binds to its name, as no provisioner runs here), which holds the final model after the job is
    gone (issue 25).

    Its rollouts are multi-turn episodes (issue 55): a turn that writes "1" calls a tool of the runtime
    image (`distillery_runtime.testing.environments:Counter`), whose answer is appended on vLLM's rollout."""
    teacher = {"name": "teacher", "model": "pvc://models/teacher", "placement": "colocated"}
    job = tiny_job(
        "colocated",
        teachers=[teacher],
        checkpoint={"storageClassName": MANUAL_CLASS},
        environment={
            "module": "distillery_runtime.testing.environments:Counter",
            "toolCallFormat": "stop_sequence",
            "stop": ["1"],
            "maxTurns": 3,
        },
    )
    toleration = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}
    job["spec"]["student"]["pool"]["tolerations"] = [toleration]
    claim, folder = workspace.add_operator_claim_volume(job)
    assert claim == naming.checkpoint_claim("colocated")
    # A claim one pod may mount, for a job whose Ray head and worker are two: refused before anything is
    # made, on the node as on the bare API server (tests/cluster/test_storage_check_on_server.py).
    workspace.add_checkpoint_claim("one-pod", mode="ReadWriteOncePod")
    workspace.apply(tiny_job("one-pod", teachers=[teacher], checkpoint={"pvc": "one-pod"}))
    with gpu_node(workspace):
        untolerated = tiny_job("untolerated", teachers=[teacher], checkpoint={"ephemeral": True})
        workspace.apply(untolerated)
        workspace.apply(job)
        wait_until(
            lambda: workspace.job("one-pod").get("status", {}).get("phase") == "Invalid",
            timeout=120,
            what="the one-pod claim's job to be refused",
        )
        refused = workspace.job("one-pod")["status"]
        storage = next(c for c in refused["conditions"] if c["type"] == "StorageReady")
        assert storage["reason"] == "AccessModeConflict" and "ReadWriteOncePod" in storage["message"], storage
        assert not workspace.pods(f"{naming.JOB_LABEL}=one-pod")
        workspace.delete_job("one-pod")

        def waits() -> dict[str, Any]:
            conds = workspace.job("untolerated").get("status", {}).get("conditions", [])
            return next((c for c in conds if c["type"] == "PodsScheduled" and c["status"] == "False"), {})

        wait_until(waits, timeout=300, what="the untolerating job's PodsScheduled False")
        # The scheduler's own words (v1.36 counts the taints, it does not name them).
        assert "untolerated taint" in waits()["message"], waits()
        assert "pod untolerated-trainer-" in waits()["message"], waits()
        assert workspace.job("untolerated")["status"]["phase"] == "Pending"
        workspace.delete_job("untolerated")
        records = assert_succeeded(workspace, "colocated", checkpoints=folder)
    # The episodes' calls were answered and their observations appended, with no environment failing.
    assert sum(r["episode/tool_calls_mean"] for r in records) > 0, records
    assert sum(r["episode/observation_token_fraction"] for r in records) > 0, records
    assert all(r["episode/environment_failures"] == 0 for r in records), records
    assert max(r["episode/turns_mean"] for r in records) > 1, records
    placed = workspace.installation.admin(
        "get", "pods", "-n", workspace.namespace, "-o", "jsonpath={.items[*].spec.tolerations[*].key}",
    ).stdout  # fmt: skip
    assert GPU_TAINT["key"] in placed, placed
    status = workspace.job("colocated")["status"]
    assert status["storage"] == {**status["storage"], "claim": claim, "kept": True, "phase": "Bound"}
    # The runtime names the final model and its claim; its files are on the volume.
    assert status["model"]["claim"] == claim and status["model"]["path"] == "/checkpoints/final"
    final = folder / Path(status["model"]["path"]).relative_to("/checkpoints")
    files = {p.name for p in final.iterdir()}
    assert {"config.json", "generation_config.json"} <= files and any(
        n.endswith(".safetensors") for n in files
    )

    # kubectl delete dj: the trainer and its Ray cluster go; the claim and the model stay.
    workspace.delete_job("colocated")

    def gone() -> bool:
        kinds = "rayjobs,rayclusters,jobs,pods,configmaps"
        names = workspace.installation.admin("get", kinds, "-n", workspace.namespace, "-o", "name").stdout
        return not [n for n in names.split() if "colocated" in n]

    wait_until(gone, timeout=180, what="the job's RayJob, Ray cluster, config and pods to go")
    kept = workspace.claim(claim)
    assert kept is not None and "deletionTimestamp" not in kept["metadata"], kept
    assert kept["status"]["phase"] == "Bound"
    assert (final / "config.json").is_file() and any(final.glob("*.safetensors"))


def test_one_step_off_with_a_restarted_teacher_container_then_delete_mid_run_leaves_nothing_behind(
    workspace: Workspace,
) -> None:
    """Rollout one policy version behind, with a teacher whose server is killed as soon as it is first
    ready: the kubelet restarts its container in the same pod, the trainer waits for it and no sample is
    lost. The restarted container finds what the first one left in its model cache (`HF_HOME`, the pod's
    volume, not the container's layer): here a file the test writes there, as nothing is downloaded from a
    hub; a real teacher finds its downloaded weights the same way. (Killed at first readiness, not at a
    step: the trainer's wait for a teacher lost mid-run is tests/runtime/test_teacher_outage.py's.)

    Then `kubectl delete dj` mid-run: every object the job made, and every pod, goes. One job serves both
    (each job costs minutes of the loaded 2-core node); the job is long enough (50 steps) to still be
    running when it is deleted."""
    schedule = {**SIX_STEPS, "steps": 50, "checkpointEvery": 10, "oneStepOff": True}
    # The tiny models are on a claim, which is not downloaded: a sized cache is every pod's all the same.
    cache = {"sizeLimit": "1Gi"}
    workspace.apply(tiny_job("offset", teachers=[standalone_teacher()], schedule=schedule, modelCache=cache))
    workspace.intruder(IMAGE)  # started beside the job's pods: probed once the job runs

    def teacher_container() -> tuple[str, dict[str, Any]] | None:
        pods = workspace.pods("app.kubernetes.io/component=teacher")
        statuses = [
            c for p in pods for c in p["status"].get("containerStatuses", []) if c["name"] == "teacher"
        ]
        return (pods[0]["metadata"]["name"], statuses[0]) if len(pods) == 1 and statuses else None

    pod: str = wait_until(
        lambda: (found := teacher_container()) is not None and found[1]["ready"] and found[0],
        timeout=FINISH,
        what="the teacher's container to be ready",
    )
    marker = "$HF_HOME/downloaded-by-the-first-container"
    workspace.exec(pod, "teacher", f"touch {marker}")
    # SIGTERM, which vLLM's server handles (the kernel drops the signals a PID namespace's first process
    # has no handler for, SIGKILL included). The session ends with the container: its status says nothing.
    workspace.exec(pod, "teacher", "kill -TERM 1", check=False)

    def restarted() -> bool:
        found = teacher_container()
        assert found is not None and found[0] == pod, f"the teacher's pod is gone: {workspace.diagnose()}"
        return found[1]["restartCount"] >= 1 and found[1]["ready"]

    wait_until(restarted, timeout=300, what="the teacher's container to restart and be ready")
    assert workspace.exec(pod, "teacher", f"test -f {marker} && echo cached").strip() == "cached"

    # Three steps on the claim: the first samples with the initial policy, the next ones a version behind.
    def three_steps() -> list[dict[str, Any]] | None:
        with contextlib.suppress(FileNotFoundError):  # before the run's first step
            records = workspace.metrics("offset")
            return records if len(records) >= 3 else None
        return None

    records = wait_until(three_steps, timeout=FINISH, what="three steps in the run's metrics")
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    assert all(r["samples"] == SAMPLES_PER_STEP for r in records), [r["samples"] for r in records]
    assert records[0]["staleness"] == 0 and max(r["staleness"] for r in records) == 1, records
    assert workspace.job("offset")["status"]["phase"] == "Running"

    # The attacker of docs/security.md while the job runs: a pod of its namespace, the job's image, none of its
    # credentials. Ray's token refuses it the Jobs API (code on the student's GPUs) and the GCS; the job's
    # teacher key, its teacher. The metrics port has no credential (Prometheus scrapes it): on this node, whose
    # bridge CNI enforces no NetworkPolicy, it answers; the job's policy drops it where one is enforced
    # (tests/workloads/test_network_policy_on_node.py, intruder -> head 9100).
    head = workspace.pod_ip("ray.io/node-type=head")
    teacher = workspace.pod_ip("app.kubernetes.io/component=teacher")
    tried = workspace.probe(
        {
            "dashboard": f"{head}:8265",
            "gcs": f"{head}:6379",
            "teacher": f"http://{teacher}:8000",
            "claim": f"{workspace.namespace}/offset",
            "metrics": f"http://{head}:9100/metrics",
        }
    )
    assert tried == {
        "dashboard_submit": "401",
        "gcs": "UNAUTHENTICATED",
        "teacher_no_key": "401",
        "teacher_claiming_a_job": "401",
        "teacher_wrong_key": "401",
        "metrics": "200",
    }, tried
    # The job goes on, unaffected: another step lands after the tries.
    tried_at = len(workspace.metrics("offset"))
    wait_until(
        lambda: len(workspace.metrics("offset")) > tried_at, timeout=FINISH, what="a step after the tries"
    )
    assert workspace.job("offset")["status"]["phase"] == "Running"
    workspace.delete_pod(
        "intruder"
    )  # not the job's: what the deletion below must leave is nothing of the job's

    workspace.installation.admin("delete", "dj", "offset", "-n", workspace.namespace, timeout=300)
    kinds = "pods,deployments,services,configmaps,rayjobs,rayclusters,jobs,serviceaccounts,roles,rolebindings"

    def leftovers() -> list[str]:
        out = workspace.installation.admin(
            "get", kinds, "-n", workspace.namespace, "-o", "name"
        ).stdout.split()
        # What every namespace has, not the job's.
        return [
            o for o in out if not o.endswith(("/default", "/kube-root-ca.crt", "/openshift-service-ca.crt"))
        ]

    wait_until(lambda: not leftovers(), timeout=180, what="the job's objects and pods to go")
