"""Checks every prepared synthetic task gets: its teacher served by a real vLLM engine, and its
quick-start example run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def task_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the prepared tasks are built: `$DISTILLERY_CACHE` (CI keeps it between runs), else one folder of
    this pytest session that both xdist workers share (the build's lock lets one build, the other wait)."""
    cache = os.environ.get("DISTILLERY_CACHE")
    return Path(cache) if cache else tmp_path_factory.getbasetemp().parent / "task-cache"


def vllm_greedy_accuracy(
    task_dir: Path, task: str, *, rows: int, max_tokens: int, max_model_len: int, model: Path | None = None
) -> float:
    """Greedy held-out accuracy of the task's teacher (or of `model`, a Hugging Face folder) under a real
    vLLM engine (CPU build, computing in float32 whatever the weights' dtype), graded by the task's own
    grader, on the first `rows` eval rows (chat rows: the conversation before the answer through the
    model's chat template, the answer turn the reference). In a child process: vLLM wants a fresh process
    and its own env."""
    model = model or task_dir / "teacher"
    script = textwrap.dedent(
        f"""
        import json, os
        os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1")
        from vllm import LLM, SamplingParams
        from transformers import AutoTokenizer
        from distillery_runtime.tasks.problems.{task} import TASK
        rows = [json.loads(l) for l in open({str(task_dir / "eval.jsonl")!r})][:{rows}]
        tok = AutoTokenizer.from_pretrained({str(model)!r})
        for r in rows:
            if "messages" in r:
                r["prompt"] = tok.apply_chat_template(r["messages"][:-1], add_generation_prompt=True, tokenize=False)
                r["answer"] = r["messages"][-1]["content"]
        llm = LLM(model={str(model)!r}, dtype="float32", enforce_eager=True, max_model_len={max_model_len})
        outs = llm.generate([r["prompt"] for r in rows], SamplingParams(temperature=0, max_tokens={max_tokens}))
        print("ACC", sum(TASK.grade(o.outputs[0].text, r["answer"]) for o, r in zip(outs, rows)) / len(rows))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("ACC ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return float(lines[0].split()[1])


def run_example(
    example: str, task_dir: Path, out: Path, *args: str, kernels: str | None = None
) -> list[dict]:
    """`distillery run examples/EXAMPLE -o OUT [ARGS]`, reusing the session's prepared task; its eval records.

    `kernels`: the CPU kernel path to run under (`ATEN_CPU_CAPABILITY`, e.g. "avx2" emulates a CPU without
    AVX-512 on this one); None leaves torch's own choice. Either way the run's report.md must name the path
    that computed it, and it is printed beside the curve: a float32 curve is one kernel path's."""
    env = {**os.environ, "DISTILLERY_CACHE": str(task_dir.parent.parent)}
    if kernels is not None:
        env["ATEN_CPU_CAPABILITY"] = kernels
    result = subprocess.run(
        [sys.executable, "-m", "distillery_cli", "run", str(ROOT / "examples" / example), "-o", str(out), "--no-progress", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    ran_on = report_kernels(out / "report.md")
    if kernels is not None:
        assert ran_on.lower() == kernels.lower(), f"asked for {kernels} kernels, report.md says {ran_on}"
    print(
        f"CPU kernels {ran_on}; held-out accuracy by step:", [(e["step"], e["eval_accuracy"]) for e in evals]
    )  # -rP
    return evals


def report_kernels(report: Path) -> str:
    """The CPU kernel path a run's report.md names in its summary (`| CPU kernels | AVX2 |`)."""
    rows = [
        line.split("|")[2].strip()
        for line in report.read_text().splitlines()
        if line.startswith("| CPU kernels |")
    ]
    assert rows, f"{report} names no CPU kernels"
    return rows[0]
