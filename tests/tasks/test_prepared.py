"""The prepared addition task: a strong teacher, a weak but non-zero student, loadable by
transformers and by vLLM, reached through synthetic:// URIs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

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
    # A real vLLM engine (CPU build), in a child process: vLLM wants a fresh process and its own env.
    script = textwrap.dedent(
        f"""
        import json, os
        os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1")
        from vllm import LLM, SamplingParams
        from distillery_runtime.tasks.addition import TASK
        rows = [json.loads(l) for l in open({str(prepared_task / "eval.jsonl")!r})][:128]
        llm = LLM(model={str(prepared_task / "teacher")!r}, dtype="float32", enforce_eager=True, max_model_len=32)
        outs = llm.generate([r["prompt"] for r in rows], SamplingParams(temperature=0, max_tokens=8))
        print("ACC", sum(TASK.grade(o.outputs[0].text, r["answer"]) for o, r in zip(outs, rows)) / len(rows))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("ACC ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    from distillery_runtime.tasks import model_accuracy

    hf = model_accuracy(prepared_task / "teacher", read_rows(prepared_task / "eval.jsonl")[:128])
    assert float(lines[0].split()[1]) == pytest.approx(hf, abs=0.02)
