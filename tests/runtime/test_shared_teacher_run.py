"""Shared teachers with no cluster, end to end: `distillery serve-teacher` serves a DistillationTeacher (the
tiny teacher, on CPU) and two `distillery run --shared-teacher NAME=URL` runs score against that one server
at once, and both finish; a job asking for more log-probs than the teacher's maxLogprobs is refused naming
spec.loss.topK, and a job whose shared teacher has no server is refused before anything starts."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.runtime.conftest import JobFiles, distillery_command, manifest, run_env

TEACHER_NAME = "tiny-shared"
MAX_LOGPROBS = 8


def shared_manifest(files: JobFiles, name: str, top_k: int = 4) -> dict[str, Any]:
    return manifest(
        files,
        name=name,
        teachers=[
            {
                "name": "teacher",
                "model": str(files.teacher),
                "placement": "shared",
                "teacherRef": {"name": TEACHER_NAME},
            }
        ],
        loss={"mode": "forward_kl_topk", "topK": top_k},
        schedule={"steps": 2, "promptsPerStep": 4, "microBatchSize": 4, "checkpointEvery": 0, "evalEvery": 0},
    )


def write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document))
    return path


def run_once(job: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`distillery run JOB -o OUT ARGS...` to its end, its output captured."""
    command = distillery_command(str(job), "-o", str(out), *args)
    return subprocess.run(command, env=run_env(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def served_teacher(job_files: JobFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`distillery serve-teacher` of the tiny teacher on a free port; yields its URL as it prints it."""
    root = tmp_path_factory.mktemp("shared-teacher")
    teacher = {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationTeacher",
        "metadata": {"name": TEACHER_NAME},
        "spec": {
            "model": str(job_files.teacher),
            "pool": {"gpusPerReplica": 0},
            "maxLogprobs": MAX_LOGPROBS,
            "inference": {"dtype": "float32", "maxModelLen": 64},
        },
    }
    command = [sys.executable, "-m", "distillery_cli", "serve-teacher", str(write(root / "t.yaml", teacher))]
    process = subprocess.Popen(
        [*command, "--port", "0"], env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith(f"serving DistillationTeacher {TEACHER_NAME} at http://127.0.0.1:"), first
        yield first.split(" at ", 1)[1].strip()
    finally:
        process.terminate()  # SIGTERM: serve-teacher stops its server and exits 0
        assert process.wait(timeout=60) == 0


@pytest.mark.local_run
def test_two_local_runs_share_one_served_teacher_and_both_finish(
    job_files: JobFiles, served_teacher: str, tmp_path: Path
) -> None:
    runs = []
    for name in ("first", "second"):
        job = write(tmp_path / f"{name}.yaml", shared_manifest(job_files, name))
        args = [str(job), "-o", str(tmp_path / name), "--no-progress", "--shared-teacher"]
        runs.append(
            subprocess.Popen(
                distillery_command(*args, f"{TEACHER_NAME}={served_teacher}"),
                cwd=tmp_path,
                env=run_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for process in runs:
        out, _ = process.communicate(timeout=600)
        assert process.returncode == 0, out[-4000:]
    for name in ("first", "second"):
        assert "teacher (shared)" in (tmp_path / name / "report.md").read_text()
        steps = [line for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines() if line]
        assert len(steps) == 2


def test_a_top_k_above_the_teachers_max_logprobs_is_refused_naming_the_field(
    job_files: JobFiles, served_teacher: str, tmp_path: Path
) -> None:
    job = write(tmp_path / "greedy.yaml", shared_manifest(job_files, "greedy", top_k=MAX_LOGPROBS * 2))
    result = run_once(job, tmp_path / "out", "--shared-teacher", f"{TEACHER_NAME}={served_teacher}")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert (
        f"spec.loss.topK: {MAX_LOGPROBS * 2} is more than DistillationTeacher {TEACHER_NAME}" in result.stderr
    )
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_shared_teacher_without_a_local_server_is_refused_before_anything_starts(
    job_files: JobFiles, tmp_path: Path
) -> None:
    job = write(tmp_path / "alone.yaml", shared_manifest(job_files, "alone"))
    result = run_once(job, tmp_path / "out")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"{job}: spec.teachers[0].teacherRef: DistillationTeacher {TEACHER_NAME} has no local server; "
        f"start one with distillery serve-teacher and pass --shared-teacher {TEACHER_NAME}=URL"
    )
    assert not (tmp_path / "out").exists()


def test_a_student_whose_vocabulary_the_shared_teacher_does_not_extend_is_refused_alone(
    job_files: JobFiles, served_teacher: str, tmp_path: Path
) -> None:
    """The served teacher's tokenizer is checked for each job: one whose student spells its ids otherwise is
    refused naming the teacher and a token id, and the teacher goes on serving the others."""
    import torch
    from distillery_runtime.run.cli import EXIT_FAILED
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    letters = [" ".join(word) for word in ("distillation", "teacher", "student", "vocabulary")]
    other = build_tokenizer(letters, 64, full_byte_alphabet=False, chat_template=None)
    student = save_tiny_model(
        tmp_path / "student", tokenizer=other, hidden=32, layers=1, heads=2, dtype=torch.float32
    )
    document = shared_manifest(job_files, "foreign")
    document["spec"]["student"]["model"] = str(student)
    job = write(tmp_path / "foreign.yaml", document)
    result = run_once(job, tmp_path / "out", "--shared-teacher", f"{TEACHER_NAME}={served_teacher}")
    # EXIT_FAILED, as for any teacher whose tokenizer does not fit (the spec is valid; the pairing is not).
    assert result.returncode == EXIT_FAILED, result.stdout[-2000:] + result.stderr[-2000:]
    assert "teachers: spec.teachers[0] (teacher): token id " in result.stderr, result.stderr[-2000:]
    assert "vocabulary must extend the student's" in result.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
    with urllib.request.urlopen(f"{served_teacher}/health", timeout=10) as response:
        assert response.status == 200
