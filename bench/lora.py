"""LoRA against full fine-tuning of the same job, as the product runs it: the memory of the run's processes,
bytes synced per step, step time and held-out accuracy after the same steps.

The job: `distillery run` of examples/local-lora.yaml and of the same job training every weight
(examples/local-addition.yaml: the same task, student, teacher and schedule, at full training's own
learning rate), both with the vLLM rollout engine so that each step's weights really travel to it (this
tiny student's default engine samples inside the trainer, with nothing to sync). The two arms run
alternated, full LoRA LoRA full (A B B A), so that a drift of the shared host over the bench falls on both
alike; each run is reported, and each ratio is LoRA's mean over full training's.

- Memory (`MEMORY_METHOD`): the peak over the run of the summed proportional set size (PSS: shared pages
  split among the processes that map them) of `distillery run` and every process under it (Ray's daemons,
  the trainer, the rollout engine), sampled every `SAMPLE_SECONDS` by `_common.TreeMemory`; beside it each
  process title's own peak (the trainer actor's, `ray::TrainerWorker`, among them). The run's environment
  is this process's, allocator settings included: nothing here sets one that a run does not have.
- From each run's metrics.jsonl: `sync/bytes` (what trainer rank 0 sent per step) and the median
  `time/step_s`; from eval.jsonl the first and last held-out accuracy.

Each run is appended to `runs.jsonl` in the bench's folder as it ends. The last line is JSON: `memory_method`, `pss_ratio`, `trainer_pss_ratio`, `sync_bytes_ratio`,
`step_time_ratio` (each LoRA / full, ratios of means), `accuracy` (both), every run in its order, the
machine, commit and command (`_common.provenance`), and whether the targets (sync <= 5%, memory <= 0.6x)
hold. Usage: python bench/lora.py [--quick] [--steps N] [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import psutil
import yaml
from _common import TreeMemory, distillery_run, json_main, provenance, run_folder  # bench/, the script's own

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"lora": ROOT / "examples/local-lora.yaml", "full": ROOT / "examples/local-addition.yaml"}
ORDER = ("full", "lora", "lora", "full")
"""A B B A: each arm's mean has the same position in the bench on average."""
SAMPLE_SECONDS = 0.5
"""Between two samples of the run's PSS: a step is 0.2-0.3 s here, and one sample of the ~15 processes
reads their smaps (tens of ms)."""
MEMORY_METHOD = (
    f"peak over the run of the summed PSS of the `distillery run` process tree (psutil memory_full_info), "
    f"sampled every {SAMPLE_SECONDS} s, under the run's own allocator settings"
)
TRAINER_TITLES = ("ray::TrainerWorker", "ray::TrainerWithRollout")
"""The trainer actor's process title, alone or hosting the rollout engine."""
ALLOCATOR_ENV = ("MALLOC_", "LD_PRELOAD", "PYTORCH_", "OMP_NUM_THREADS")
"""The environment that decides how a run's processes allocate (recorded, not set)."""
SYNC_TARGET = 0.05
MEMORY_TARGET = 0.6


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def job(kind: str, steps: int) -> dict[str, Any]:
    """The example of `kind` with the vLLM engine, for `steps` steps."""
    doc = yaml.safe_load(EXAMPLES[kind].read_text())
    doc["spec"]["student"]["rollout"]["engine"] = "vllm"  # weights travel to an engine every step
    doc["spec"]["schedule"]["steps"] = steps
    doc["spec"]["schedule"]["evalEvery"] = max(1, steps // 4)
    return doc


def run_job(kind: str, steps: int, folder: Path) -> dict[str, Any]:
    """One `distillery run` of the `kind` arm, its process tree's PSS sampled throughout."""
    folder.mkdir(parents=True)
    command = distillery_run(job(kind, steps), folder)
    started = time.monotonic()
    with (folder / "run.log").open("w") as log:
        process = psutil.Popen(command, stdout=log, stderr=log, cwd=ROOT)
        memory = TreeMemory(process.pid, "pss", SAMPLE_SECONDS)
        code = process.wait()
        peak = memory.stop()
    if code != 0:
        text = (folder / "run.log").read_text()
        raise RuntimeError(f"{kind}: distillery run exited {code}: {text[-2000:]}")
    records = read_jsonl(folder / "run" / "metrics.jsonl")
    evals = read_jsonl(folder / "run" / "eval.jsonl")
    trainer = max((memory.peaks.get(title, 0) for title in TRAINER_TITLES), default=0)
    return {
        "arm": kind,
        "peak_pss_bytes": peak,
        "trainer_peak_pss_bytes": trainer,
        "peak_pss_by_process": dict(sorted(memory.peaks.items(), key=lambda item: -item[1])),
        "memory_samples": memory.samples,
        "steps": len(records),
        "sync_bytes_per_step": statistics.median(r["sync/bytes"] for r in records),
        "step_s_median": statistics.median(r["time/step_s"] for r in records),
        "accuracy_start": evals[0]["eval_accuracy"],
        "accuracy": evals[-1]["eval_accuracy"],
        "accuracy_curve": [(e["step"], e["eval_accuracy"]) for e in evals],
        "wall_s": time.monotonic() - started,
    }


def arm_means(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each arm's mean of every figure the ratios compare."""
    keys = ("peak_pss_bytes", "trainer_peak_pss_bytes", "sync_bytes_per_step", "step_s_median", "accuracy")
    return {
        kind: {key: statistics.fmean(r[key] for r in runs if r["arm"] == kind) for key in keys}
        for kind in ("full", "lora")
    }


def ratio(means: dict[str, dict[str, float]], key: str) -> float:
    full = means["full"][key]
    return means["lora"][key] / full if full else float("nan")


def table(runs: list[dict[str, Any]], means: dict[str, dict[str, float]]) -> str:
    rows = [
        "| run | arm | peak PSS of the run (MB) | trainer's peak PSS (MB) | synced per step (bytes) "
        "| step (median, s) | held-out accuracy at the end |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        rows.append(
            f"| {i} | {r['arm']} | {r['peak_pss_bytes'] / 1e6:,.0f} | {r['trainer_peak_pss_bytes'] / 1e6:,.0f} "
            f"| {r['sync_bytes_per_step']:,.0f} | {r['step_s_median']:.3f} | {r['accuracy']:.3f} |"
        )
    cells = [
        f"{ratio(means, 'peak_pss_bytes'):.3f}",
        f"{ratio(means, 'trainer_peak_pss_bytes'):.3f}",
        f"{ratio(means, 'sync_bytes_per_step'):.3f}",
        f"{ratio(means, 'step_s_median'):.3f}",
        f"{ratio(means, 'accuracy'):.3f}",
    ]
    rows.append(f"| LoRA / full (means) | | {' | '.join(cells)} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 steps a run (default 80)")
    parser.add_argument("--steps", type=int, help="steps a run (default 80, quick 40)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench/results/lora")
    args = parser.parse_args()
    steps = args.steps or (40 if args.quick else 80)
    folder = run_folder(args.output)
    load_start = os.getloadavg()[0]
    runs = []
    for i, kind in enumerate(ORDER, 1):
        runs.append(run_job(kind, steps, folder / f"{i}-{kind}"))
        with (folder / "runs.jsonl").open(
            "a"
        ) as out:  # each run kept as it ends: a bench cut short keeps them
            out.write(json.dumps(runs[-1]) + "\n")
    means = arm_means(runs)
    summary = {
        "bench": "lora",
        "quick": args.quick,
        "steps": steps,
        "order": list(ORDER),
        "memory_method": MEMORY_METHOD,
        "allocator_env": {k: v for k, v in os.environ.items() if k.startswith(ALLOCATOR_ENV)},
        "pss_ratio": ratio(means, "peak_pss_bytes"),
        "trainer_pss_ratio": ratio(means, "trainer_peak_pss_bytes"),
        "sync_bytes_ratio": ratio(means, "sync_bytes_per_step"),
        "step_time_ratio": ratio(means, "step_s_median"),
        "accuracy": {kind: [r["accuracy"] for r in runs if r["arm"] == kind] for kind in ("full", "lora")},
        "accuracy_start": {kind: [r["accuracy_start"] for r in runs if r["arm"] == kind] for kind in means},
        "means": means,
        "runs": runs,
        "load_1min": {"start": load_start, "end": os.getloadavg()[0]},
        **provenance(),
    }
    summary["targets_met"] = {
        f"sync_bytes_ratio <= {SYNC_TARGET}": summary["sync_bytes_ratio"] <= SYNC_TARGET,
        f"pss_ratio <= {MEMORY_TARGET}": summary["pss_ratio"] <= MEMORY_TARGET,
        "lora accuracy rises from its start": all(
            r["accuracy"] > r["accuracy_start"] for r in runs if r["arm"] == "lora"
        ),
    }
    report = table(runs, means)
    (folder / "report.md").write_text(report + "\n")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    print(report)
    print(json.dumps(summary))


if __name__ == "__main__":
    raise SystemExit(json_main("lora", main))
