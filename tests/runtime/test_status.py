"""Progress reaches the DistillationJob's status subresource through the official kubernetes client.

No API server can run here: the cluster is the operator tests' kmock-based emulator (a real HTTP server
that implements the API's merge patches and the status subresource), shared from tests/operator.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from distillery_runtime.status import StatusReporter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from operator_harness import running_cluster

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


async def test_progress_and_checkpoint_are_patched_into_the_status(tmp_path):
    from kubernetes import client, config

    async with running_cluster(tmp_path) as cluster:
        await cluster.create({**JOB, "status": {"phase": "Running"}})
        api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        reporter = StatusReporter(cluster.namespace, "demo", api=api, min_interval=3600)
        record = {"step": 3, "loss": 0.25, "kl": 0.5, "tokens_per_s": 1234.567}
        await asyncio.to_thread(reporter.eval_accuracy, 0.75)
        await asyncio.to_thread(reporter.progress, record, 10)
        await asyncio.to_thread(reporter.progress, {**record, "step": 4, "loss": 0.2}, 10)  # rate-limited
        await asyncio.to_thread(reporter.checkpoint, 3, "/ckpt/step-00000003")

        status = cluster.status("demo")
        assert status["phase"] == "Running"  # the operator's fields are left alone
        progress = status["progress"]
        assert progress["step"] == 3 and progress["totalSteps"] == 10 and progress["loss"] == 0.25
        assert progress["tokensPerSecond"] == 1234.57 and progress["evalAccuracy"] == 0.75
        assert (
            status["lastCheckpoint"]["step"] == 3
            and status["lastCheckpoint"]["path"] == "/ckpt/step-00000003"
        )

        await asyncio.to_thread(
            reporter.progress, {**record, "step": 10}, 10
        )  # the final step always goes out
        assert cluster.status("demo")["progress"]["step"] == 10


def test_a_failed_patch_is_logged_not_raised(caplog):
    class Broken:
        def patch_namespaced_custom_object_status(self, *args, **kwargs):
            raise ConnectionError("apiserver unreachable")

    reporter = StatusReporter("ns", "demo", api=Broken(), min_interval=0)
    reporter.progress({"step": 1, "tokens_per_s": 1.0}, 2)
    assert "apiserver unreachable" in caplog.text
