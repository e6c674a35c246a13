"""The prepared addition task: a strong teacher, a weak but non-zero student, loadable by
transformers and by vLLM, reached through synthetic:// URIs."""

from __future__ import annotations

import json
import time

import pytest

from tests.tasks.prepared_checks import vllm_greedy_accuracy

# The first test of the session prepares the task (minutes; many more on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_teacher_is_strong_and_student_weak_but_not_zero(prepared_task):
    from distillery_runtime.tasks import model_accuracy

    manifest = json.loads((prepared_task / "manifest.json").read_text())
    evals = read_rows(prepared_task / "eval.jsonl")
    teacher = model_accuracy(prepared_task / "teacher", evals)
    student = model_accuracy(prepared_task / "student", evals)
    assert teacher >= 0.95, manifest
    assert 0.05 <= student <= 0.6, manifest
    assert teacher == pytest.approx(manifest["teacher"]["eval_accuracy"], abs=1e-9)  # saved == trained


def test_datasets_have_the_fields_a_job_reads(prepared_task):
    train, evals = read_rows(prepared_task / "train.jsonl"), read_rows(prepared_task / "eval.jsonl")
    assert len(train) == 4096 and len(evals) == 512
    for row in (train[0], evals[0]):
        assert set(row) == {"prompt", "answer", "response", "data_source"}
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in evals}


def test_uris_resolve_to_the_prepared_files_without_rebuilding(prepared_task, monkeypatch):
    from distillery_runtime.tasks import resolve_uri

    monkeypatch.setenv("DISTILLERY_CACHE", str(prepared_task.parent.parent))
    started = time.monotonic()
    assert resolve_uri("synthetic://addition/teacher") == prepared_task / "teacher"
    assert resolve_uri("synthetic://addition/eval") == prepared_task / "eval.jsonl"
    assert time.monotonic() - started < 5  # cached: no training


def test_vllm_serves_the_teacher_as_accurately_as_transformers(prepared_task):
    from distillery_runtime.tasks import model_accuracy

    served = vllm_greedy_accuracy(prepared_task, "addition", rows=128, max_tokens=8, max_model_len=32)
    hf = model_accuracy(prepared_task / "teacher", read_rows(prepared_task / "eval.jsonl")[:128])
    assert served == pytest.approx(hf, abs=0.02)
