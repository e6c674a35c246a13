"""The scenarios' wait on a job (node_jobs.Workspace): it reads again when the node's API server did not
answer (or kubectl timed out), and fails at once on any other kubectl error. A stand-in installation
answers here: what is checked is the wait's handling of kubectl's result, not a cluster."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from harness import KubectlError
from node_jobs import Workspace

TIMED_OUT = "(kubectl killed at its timeout)"


class Answers:
    """`admin(...)` that fails with each given stderr in turn, then returns the job."""

    def __init__(self, *failures: str) -> None:
        self.failures = list(failures)

    def admin(self, *args: str, **_: Any) -> subprocess.CompletedProcess[str]:
        if self.failures:
            failure = self.failures.pop(0)
            if failure == TIMED_OUT:
                raise subprocess.TimeoutExpired(["kubectl", *args], 60)
            raise KubectlError(args, subprocess.CompletedProcess(list(args), 1, "", failure))
        job = {"status": {"phase": "Succeeded"}}
        return subprocess.CompletedProcess(list(args), 0, json.dumps(job), "")


def workspace(answers: Answers) -> Workspace:
    return Workspace(installation=answers, namespace="ns", models=Path("."), checkpoints=Path("."))  # type: ignore[arg-type]


def test_a_wait_reads_again_when_the_api_server_did_not_answer() -> None:
    answers = Answers("Unable to connect to the server: net/http: TLS handshake timeout")
    job = workspace(answers).wait_finished("first", timeout=30)
    assert job["status"]["phase"] == "Succeeded" and not answers.failures


def test_a_wait_reads_again_when_kubectl_timed_out() -> None:
    answers = Answers(TIMED_OUT, TIMED_OUT)
    job = workspace(answers).wait_finished("first", timeout=30)
    assert job["status"]["phase"] == "Succeeded" and not answers.failures


def test_a_wait_fails_at_once_on_any_other_error() -> None:
    answers = Answers('Error from server (NotFound): distillationjobs.distillery.io "first" not found')
    with pytest.raises(KubectlError, match="NotFound"):
        workspace(answers).wait_finished("first", timeout=30)
