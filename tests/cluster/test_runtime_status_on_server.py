"""The trainer's status reports (distillery_runtime.observe.status) on a real API server: merge patches through the
status subresource, rate-limited progress, the final step and checkpoints always sent, teacher outages,
and the operator's own status fields left alone. (Which account may send them: test_rbac_on_server.py.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import kubernetes
from distillery_runtime.observe.status import StatusReporter

sys.path.insert(0, str(Path(__file__).parent))

from harness import Installation, yaml_stream

JOB = {
    "apiVersion": "distillery.io/v1alpha1",
    "kind": "DistillationJob",
    "metadata": {"name": "demo"},
    "spec": {
        "student": {"model": "m"},
        "teachers": [{"name": "t", "model": "m"}],
        "data": {"train": {"path": "/d.jsonl"}},
    },
}


def status(installation: Installation, namespace: str) -> dict[str, Any]:
    return (installation.get("distillationjob", "demo", namespace) or {}).get("status") or {}


def test_progress_checkpoints_and_outages_reach_the_status(
    installation: Installation, namespace: str
) -> None:
    installation.admin("apply", "-n", namespace, "-f", "-", input=yaml_stream([JOB]))
    # The operator's field, written as the operator writes it (through the status subresource).
    installation.admin(
        "patch", "dj", "demo", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", '{"status": {"phase": "Running"}}',
    )  # fmt: skip
    client = kubernetes.config.new_client_from_config(config_file=str(installation.plane.admin_kubeconfig))
    reporter = StatusReporter(
        namespace, "demo", api=kubernetes.client.CustomObjectsApi(client), min_interval=3600
    )
    record = {"step": 3, "loss": 0.25, "kl": 0.5, "tokens_per_s": 1234.567}
    reporter.eval_accuracy(0.75)
    reporter.progress(record, 10)
    reporter.progress({**record, "step": 4, "loss": 0.2}, 10)  # rate-limited: not sent
    reporter.checkpoint(3, "/ckpt/step-00000003")
    got = status(installation, namespace)
    assert got["phase"] == "Running"  # the operator's fields are left alone
    progress = got["progress"]
    assert progress["step"] == 3 and progress["totalSteps"] == 10 and progress["loss"] == 0.25
    assert progress["tokensPerSecond"] == 1234.57 and progress["evalAccuracy"] == 0.75
    assert got["lastCheckpoint"] == {**got["lastCheckpoint"], "step": 3, "path": "/ckpt/step-00000003"}

    reporter.progress({**record, "step": 10}, 10)  # the final step always goes out
    assert status(installation, namespace)["progress"]["step"] == 10
    reporter.model(10, "/ckpt/final", "bfloat16")  # the final model, once the last step is saved
    model = status(installation, namespace)["model"]
    assert model == {**model, "step": 10, "path": "/ckpt/final", "dtype": "bfloat16"} and model["time"]

    reporter.teacher_outage("t", True, "connection refused")
    (outage,) = status(installation, namespace)["teacherOutages"]
    assert outage["name"] == "t" and outage["message"] == "connection refused" and outage["since"]
    reporter.teacher_outage("t", False)
    assert status(installation, namespace)["teacherOutages"] == []
