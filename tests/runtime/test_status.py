"""The trainer's status reports survive an unreachable API server (the real reports: tests/cluster/
test_runtime_status_on_server.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
from distillery_runtime.observe.status import StatusReporter, model_patch

from distillery.api.status import RUNTIME_WRITES, DistillationJobStatus


def test_the_final_model_is_a_runtime_field_patched_alone() -> None:
    """status.model is the runtime's (the operator never writes it), and its patch names nothing else."""
    assert "model" not in DistillationJobStatus.operator_fields()
    assert RUNTIME_WRITES in DistillationJobStatus.model_fields["model"].metadata
    patch = model_patch(12, "/checkpoints/final", "bfloat16")
    assert list(patch["status"]) == ["model"]
    assert patch["status"]["model"] == {**patch["status"]["model"], "path": "/checkpoints/final", "step": 12}
    assert patch["status"]["model"]["dtype"] == "bfloat16"
    assert "claim" not in patch["status"]["model"]  # ephemeral checkpoints: on no claim


def test_the_final_model_names_the_claim_it_is_on() -> None:
    """In a cluster the runtime config says which claim is mounted at checkpoint.path (the operator's by
    default), and status.model names it with the folder."""
    sent: list[dict[str, Any]] = []

    class Api:
        def patch_namespaced_custom_object_status(self, *args: Any) -> None:
            sent.append(args[-1])

    reporter = StatusReporter("ns", "demo", claim="demo-checkpoints", api=Api(), min_interval=0)
    reporter.model(12, "/checkpoints/final", "bfloat16")
    (patch,) = sent
    assert patch["status"]["model"]["claim"] == "demo-checkpoints"
    assert patch["status"]["model"]["path"] == "/checkpoints/final"


def test_a_failed_patch_is_logged_not_raised(tmp_path: Path, caplog: Any) -> None:
    """Training must not stop because the API server is unreachable: a server that is not there."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = 0
    api = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(configuration))
    reporter = StatusReporter("ns", "demo", api=api, min_interval=0)
    reporter.progress({"step": 1, "tokens_per_s": 1.0}, 2)
    assert "status patch of ns/demo failed" in caplog.text and "Connection refused" in caplog.text
