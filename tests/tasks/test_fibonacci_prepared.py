"""The prepared Fibonacci task: a teacher at >= 90% held-out accuracy on 74-134-token traces, a smaller
student that is weak but not hopeless, and vLLM serving the teacher as accurately as transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Preparation trains both models (~2.5 minutes on 2 cores; more on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def fibonacci_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distillery_runtime.tasks.prepare import prepare

    cache = os.environ.get("DISTILLERY_CACHE")
    return prepare("fibonacci", root=Path(cache) if cache else tmp_path_factory.mktemp("cache"))


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_teacher_is_strong_and_the_smaller_student_weak_but_not_zero(fibonacci_task):
    from distillery_runtime.tasks import model_accuracy
    from distillery_runtime.tasks.fibonacci import TASK
    from distillery_runtime.tasks.prepare import FibonacciRecipe

    manifest = json.loads((fibonacci_task / "manifest.json").read_text())
    evals = read_rows(fibonacci_task / "eval.jsonl")
    budget = FibonacciRecipe().max_new_tokens
    teacher = model_accuracy(fibonacci_task / "teacher", evals, task=TASK, max_new_tokens=budget)
    student = model_accuracy(fibonacci_task / "student", evals, task=TASK, max_new_tokens=budget)
    assert teacher >= 0.9, manifest
    assert 0.02 <= student <= 0.5, manifest
    assert teacher == pytest.approx(manifest["teacher"]["eval_accuracy"], abs=1e-9)
    assert manifest["student"]["parameters"] < manifest["teacher"]["parameters"] / 2


def test_rows_hold_long_traces_and_the_final_answer(fibonacci_task):
    from distillery_runtime.tasks.fibonacci import TASK

    rows = read_rows(fibonacci_task / "train.jsonl")
    assert len(rows) == 4096
    assert min(len(r["response"]) for r in rows) >= 60 and max(len(r["response"]) for r in rows) <= 200
    assert all(TASK.grade(r["response"], r["answer"]) for r in rows)
    evals = read_rows(fibonacci_task / "eval.jsonl")
    assert not {r["prompt"] for r in rows} & {r["prompt"] for r in evals}


def test_vllm_serves_the_teacher_as_accurately_as_transformers(fibonacci_task):
    # A real vLLM engine (CPU build) in a child process, greedy over the full trace budget.
    script = textwrap.dedent(
        f"""
        import json, os
        os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1")
        from vllm import LLM, SamplingParams
        from distillery_runtime.tasks.fibonacci import TASK
        rows = [json.loads(l) for l in open({str(fibonacci_task / "eval.jsonl")!r})][:64]
        llm = LLM(model={str(fibonacci_task / "teacher")!r}, dtype="float32", enforce_eager=True, max_model_len=256)
        outs = llm.generate([r["prompt"] for r in rows], SamplingParams(temperature=0, max_tokens=136))
        print("ACC", sum(TASK.grade(o.outputs[0].text, r["answer"]) for o, r in zip(outs, rows)) / len(rows))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("ACC ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    from distillery_runtime.tasks import model_accuracy
    from distillery_runtime.tasks.fibonacci import TASK

    hf = model_accuracy(
        fibonacci_task / "teacher",
        read_rows(fibonacci_task / "eval.jsonl")[:64],
        task=TASK,
        max_new_tokens=136,
    )
    assert float(lines[0].split()[1]) == pytest.approx(hf, abs=0.05)


def test_the_long_generation_example_climbs_toward_the_teacher(fibonacci_task, tmp_path):
    # `distillery run examples/local-fibonacci.yaml`, real everything (vLLM rollout and teacher server,
    # Ray, the trainer); the loop grades with the task's own grader (the trace's last number).
    env = {**os.environ, "DISTILLERY_CACHE": str(fibonacci_task.parent.parent)}
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "distillery_cli", "run", str(root / "examples" / "local-fibonacci.yaml"), "-o", str(out), "--no-progress"],
        cwd=root, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    print("held-out accuracy by step:", [(e["step"], e["eval_accuracy"]) for e in evals])  # shown with -rP
    manifest = json.loads((fibonacci_task / "manifest.json").read_text())
    assert evals[0]["step"] == 0 and evals[0]["eval_accuracy"] == pytest.approx(
        manifest["student"]["eval_accuracy"], abs=0.03
    )
    # Measured: 0.14 -> 0.91 in 60 steps; a clear climb, not the exact curve, is what is asserted.
    assert evals[-1]["eval_accuracy"] >= evals[0]["eval_accuracy"] + 0.3
    # The report draws the teacher's held-out accuracy as the line the student climbs toward.
    assert f"teacher: {manifest['teacher']['eval_accuracy']:.1%}" in (out / "report.md").read_text()
