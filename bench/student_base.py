"""A teacher of the LoRA student's own base (`placement: student`) against the same base loaded again as a
colocated teacher (the path before it), in one run: memory of the whole run, start-up, step time, and the
KL each teacher reports (the same base with the same context: the curves must agree).

The job is context distillation on the bundled addition task (examples/local-lora.yaml's student, LoRA
rank 4): the teacher is the student's base with a system turn the student does not see. Both runs sample
with the vLLM rollout engine, as a GPU run does, so the base teacher is scored by that engine's requests
without the adapter (`VllmRolloutEngine.base_rows`); the colocated teacher is a second vLLM engine of the
same model (`inference.engine: vllm`, what it is on a GPU). Memory: the peak over the run of the summed
proportional set size (PSS, shared pages split among the processes that map them) of `distillery run` and
every process under it (Ray's daemons and actors), sampled each second. Start-up: the run's own "first step"
seconds; step time: the median `time/step_s`; the KL: `kl_per_teacher` of each eval.

The last line is JSON: `pss_ratio` (student / colocated), `startup_ratio`, `step_time_ratio`, `kl` (both
curves) and `kl_max_gap`. Usage: python bench/student_base.py [--quick] [--steps N] [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import psutil
import yaml
from _common import TreeMemory, distillery_run, json_main, run_folder  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples/local-lora.yaml"
CONTEXT = "Add the two numbers."
PLACEMENTS = ("colocated", "student")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def job(placement: str, steps: int) -> dict[str, Any]:
    """The context-distillation job with its teacher as the student's base in `placement`."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    doc["metadata"]["name"] = f"context-{placement}"
    spec["student"]["rollout"]["engine"] = "vllm"  # the engine a GPU run samples with
    teacher: dict[str, Any] = {
        "name": "base",
        "model": spec["student"]["model"],
        "placement": placement,
        "systemPrompt": CONTEXT,
    }
    if placement == "colocated":
        teacher["inference"] = {"engine": "vllm"}  # a colocated teacher's engine on a GPU
    spec["teachers"] = [teacher]
    spec["data"]["maxPromptTokens"] = 32  # the teacher's prompt with its system turn fits too
    spec["schedule"].update(steps=steps, evalEvery=max(1, steps // 4), promptsPerStep=32, microBatchSize=32)
    return doc


def run_job(placement: str, steps: int, folder: Path) -> dict[str, Any]:
    """One `distillery run` of the job, its memory sampled throughout."""
    folder.mkdir(parents=True)
    command = distillery_run(job(placement, steps), folder)
    log = (folder / "run.log").open("w")
    started = time.monotonic()
    process = psutil.Popen(command, stdout=log, stderr=log, cwd=ROOT)
    memory = TreeMemory(process.pid)
    code = process.wait()
    peak = memory.stop()
    log.close()
    text = (folder / "run.log").read_text()
    if code != 0:
        raise RuntimeError(f"{placement}: distillery run exited {code}: {text[-2000:]}")
    first_step = re.search(r"first step ([0-9.]+) s", text)
    records = read_jsonl(folder / "run" / "metrics.jsonl")
    evals = read_jsonl(folder / "run" / "eval.jsonl")
    return {
        "peak_pss_bytes": peak,
        "first_step_s": float(first_step.group(1)) if first_step else None,
        "wall_s": time.monotonic() - started,
        "step_s_median": statistics.median(r["time/step_s"] for r in records),
        "teacher_s_median": statistics.median(r["time/teacher_s"] for r in records),
        "kl": [(e["step"], e["kl_per_teacher"]["base"]) for e in evals],
        "accuracy": [(e["step"], e["eval_accuracy"]) for e in evals],
    }


def table(runs: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| | colocated (the base loaded again) | student (the rollout engine's base) | student / colocated |",
        "|---|---|---|---|",
    ]

    def row(name: str, key: str, scale: float, fmt: str) -> None:
        a, b = runs["colocated"][key], runs["student"][key]
        ratio = f"{b / a:.3f}" if a else "-"
        rows.append(f"| {name} | {a * scale:{fmt}} | {b * scale:{fmt}} | {ratio} |")

    row("peak PSS of the run's processes (MB)", "peak_pss_bytes", 1e-6, ",.0f")
    row("seconds to the first step", "first_step_s", 1, ".1f")
    row("step time (median, s)", "step_s_median", 1, ".3f")
    row("teacher time a step (median, s)", "teacher_s_median", 1, ".3f")
    for (step, a), (_, b) in zip(runs["colocated"]["kl"], runs["student"]["kl"], strict=True):
        rows.append(
            f"| KL to the teacher at step {step} | {a:.4f} | {b:.4f} | {b / a if a else float('nan'):.3f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 steps (default 20)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--output", type=Path, default=ROOT / "bench/results/student_base")
    args = parser.parse_args()
    steps = args.steps or (8 if args.quick else 20)
    folder = run_folder(args.output)
    runs = {placement: run_job(placement, steps, folder / placement) for placement in PLACEMENTS}
    student, colocated = runs["student"], runs["colocated"]
    summary = {
        "bench": "student_base",
        "quick": args.quick,
        "steps": steps,
        "pss_ratio": student["peak_pss_bytes"] / colocated["peak_pss_bytes"],
        "startup_ratio": (student["first_step_s"] or 0) / (colocated["first_step_s"] or 1),
        "step_time_ratio": student["step_s_median"] / colocated["step_s_median"],
        "kl": {placement: runs[placement]["kl"] for placement in PLACEMENTS},
        "kl_max_gap": max(abs(a - b) for (_, a), (_, b) in zip(colocated["kl"], student["kl"], strict=True)),
        "runs": runs,
        "load_1min": os.getloadavg()[0],
    }
    report = table(runs)
    (folder / "report.md").write_text(report + "\n")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    print(report)
    print(json.dumps(summary))


if __name__ == "__main__":
    raise SystemExit(json_main("student_base", main))
