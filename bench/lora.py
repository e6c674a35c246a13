"""LoRA against full fine-tuning in one run: bytes synced per step, step time, held-out accuracy after the
same steps, and the trainer's peak memory.

Two parts, each LoRA beside full fine-tuning:

- the job: `distillery run` of examples/local-lora.yaml and of the same job training every weight
  (examples/local-addition.yaml: the same task, student, teacher and schedule, at full training's own
  learning rate), both with the vLLM rollout engine so that each step's weights really travel to it
  (this tiny student's default engine samples inside the trainer, with nothing to sync). From each run's
  metrics.jsonl: `sync/bytes` (what trainer rank 0 sent per step), the median `time/step_s`, and the
  last held-out accuracy of eval.jsonl.
- the trainer's memory: the bundled student is too small for its state to show beside the activations
  and the process itself, so a fresh process per layout trains a Llama-shaped student of ~12M parameters
  (hidden 512, 4 layers; built here, float32 on CPU as the job's trainer runs) for a few steps of
  synthetic samples with the trainer the job uses (`Trainer`, peft for LoRA). Peak memory: the kernel's
  high-water mark (ru_maxrss) less the resident set before the model is loaded, everything imported by
  then. The child runs with glibc's mmap threshold fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_): every tensor
  is then its own mapping, returned on free, so RSS follows the live tensors. With glibc's default, whose
  threshold rises to 32 MiB after the first large free, freed tensors stay in the heap and both layouts
  peaked at the same ~360 MB, which measures the allocator, not the trainer. Its step time is reported
  too (the median of the steps after the first; slower than the job's trainer for the same reason).

The last line is JSON: `sync_bytes_ratio` (LoRA / full), `trainer_memory_ratio`, `step_time_ratio` (the
job's), `accuracy` (both), each part's numbers, and whether the targets (sync <= 5%, memory <= 0.6x) hold.
Usage: python bench/lora.py [--quick] [--steps N] [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _common import distillery_run, json_main, run_folder  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"lora": ROOT / "examples/local-lora.yaml", "full": ROOT / "examples/local-addition.yaml"}
SYNC_TARGET = 0.05
MEMORY_TARGET = 0.6


# ------------------------------------------------------------------------------------------ the job


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_job(kind: str, steps: int, folder: Path) -> dict[str, Any]:
    """One `distillery run` of the example, with the vLLM engine, for `steps` steps."""
    doc = yaml.safe_load(EXAMPLES[kind].read_text())
    doc["spec"]["student"]["rollout"]["engine"] = "vllm"  # weights travel to an engine every step
    doc["spec"]["schedule"]["steps"] = steps
    doc["spec"]["schedule"]["evalEvery"] = max(1, steps // 4)
    folder.mkdir(parents=True)
    command = distillery_run(doc, folder)
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    (folder / "run.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"{kind}: distillery run exited {result.returncode}: {result.stderr[-2000:]}")
    records = read_jsonl(folder / "run" / "metrics.jsonl")
    evals = read_jsonl(folder / "run" / "eval.jsonl")
    return {
        "steps": len(records),
        "sync_bytes_per_step": statistics.median(r["sync/bytes"] for r in records),
        "step_s_median": statistics.median(r["time/step_s"] for r in records),
        "accuracy_start": evals[0]["eval_accuracy"],
        "accuracy": evals[-1]["eval_accuracy"],
        "accuracy_curve": [(e["step"], e["eval_accuracy"]) for e in evals],
        "wall_s": time.monotonic() - started,
    }


# ------------------------------------------------------------------------------------------ trainer memory


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def build_student(folder: Path) -> Path:
    """The memory part's student: Llama-shaped, ~12M parameters, float32."""
    import torch
    from distillery_runtime.testing.tiny import save_tiny_model

    texts = [f"{a}+{b}={a + b}" for a in range(100) for b in range(100)]
    return save_tiny_model(
        folder / "student", texts=texts, vocab_size=256, hidden=512, layers=4, heads=8, dtype=torch.float32
    )


def child(kind: str, model_dir: str, steps: int) -> None:
    """One layout's trainer in this fresh process: its peak memory and step time, as a JSON line."""
    import torch
    from distillery_runtime.training.trainer import Trainer, step_normalizer

    from distillery.api.spec import LossMode, Precision
    from distillery.plan.lora import LoraSettings
    from distillery.plan.loss import LossConfig
    from distillery.plan.training import TrainerSettings

    torch.set_num_threads(1)  # one thread a process: the two layouts measured alike on a shared host
    lora = LoraSettings(rank=8, alpha=16) if kind == "lora" else None
    settings = TrainerSettings(
        lr=1e-3, micro_batch_size=8, precision=Precision.FLOAT32, total_steps=steps,
        loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK), lora=lora,
    )  # fmt: skip
    from gpu_check import train_samples  # bench/: the GPU check's synthetic samples

    batches = [train_samples(16, 256, 8, seed=step, lengths=(32, 32)) for step in range(steps)]
    # Everything imported before the baseline (transformers and peft alone are hundreds of MB), so that
    # the difference is the trainer's tensors: its weights, gradients, optimizer state and activations.
    import peft.tuners.lora  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    baseline = _rss_bytes()
    trainer = Trainer(model_dir, settings, device="cpu")
    times = []
    for batch in batches:
        started = time.perf_counter()
        trainer.train_step(batch, step_normalizer(batch, settings.loss))
        times.append(time.perf_counter() - started)
    synced = sum(t.numel() * t.element_size() for _, t in trainer.weights(torch.float32))
    trained = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
    print(
        json.dumps(
            {
                "kind": kind,
                "peak_bytes": _maxrss_bytes() - baseline,
                "step_s_median": statistics.median(times[1:]),
                "synced_bytes": synced,
                "trained_params": trained,
                "params": sum(p.numel() for p in trainer.model.parameters()),
            }
        )
    )


def measure_memory(model_dir: Path, steps: int) -> dict[str, dict[str, Any]]:
    out = {}
    for kind in ("full", "lora"):
        command = [sys.executable, __file__, "--child", kind, str(model_dir), str(steps)]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}  # see the module docstring
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"memory {kind}: exit {result.returncode}: {result.stderr[-2000:]}")
        out[kind] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


# ------------------------------------------------------------------------------------------ report


def table(job: dict[str, dict[str, Any]], memory: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| | full fine-tuning | LoRA | LoRA / full |",
        "|---|---|---|---|",
    ]

    def row(name: str, full: float, lora: float, fmt: str) -> None:
        rows.append(f"| {name} | {full:{fmt}} | {lora:{fmt}} | {lora / full if full else float('nan'):.3f} |")

    row(
        "job: bytes synced per step",
        job["full"]["sync_bytes_per_step"],
        job["lora"]["sync_bytes_per_step"],
        ",.0f",
    )
    row("job: step time (median, s)", job["full"]["step_s_median"], job["lora"]["step_s_median"], ".3f")
    row("job: held-out accuracy at the end", job["full"]["accuracy"], job["lora"]["accuracy"], ".3f")
    row(
        "trainer (12M): peak memory (MB)",
        memory["full"]["peak_bytes"] / 1e6,
        memory["lora"]["peak_bytes"] / 1e6,
        ".1f",
    )
    row(
        "trainer (12M): step time (median, s)",
        memory["full"]["step_s_median"],
        memory["lora"]["step_s_median"],
        ".3f",
    )
    row(
        "trainer (12M): trained parameters",
        memory["full"]["trained_params"],
        memory["lora"]["trained_params"],
        ",.0f",
    )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 steps of the job, 4 trainer steps")
    parser.add_argument("--steps", type=int, help="the job's steps (default 80, quick 40)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench/results/lora")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    steps = args.steps or (40 if args.quick else 80)
    folder = run_folder(args.output)
    job = {kind: run_job(kind, steps, folder / kind) for kind in ("full", "lora")}
    memory = measure_memory(build_student(folder), 4 if args.quick else 8)
    summary = {
        "bench": "lora",
        "quick": args.quick,
        "steps": steps,
        "sync_bytes_ratio": job["lora"]["sync_bytes_per_step"] / job["full"]["sync_bytes_per_step"],
        "trainer_memory_ratio": memory["lora"]["peak_bytes"] / memory["full"]["peak_bytes"],
        "step_time_ratio": job["lora"]["step_s_median"] / job["full"]["step_s_median"],
        "accuracy": {kind: job[kind]["accuracy"] for kind in ("full", "lora")},
        "accuracy_start": {kind: job[kind]["accuracy_start"] for kind in ("full", "lora")},
        "job": job,
        "memory": memory,
        "load_1min": os.getloadavg()[0],
    }
    summary["targets_met"] = {
        f"sync_bytes_ratio <= {SYNC_TARGET}": summary["sync_bytes_ratio"] <= SYNC_TARGET,
        f"trainer_memory_ratio <= {MEMORY_TARGET}": summary["trainer_memory_ratio"] <= MEMORY_TARGET,
        "lora accuracy rises from its start": job["lora"]["accuracy"] > job["lora"]["accuracy_start"],
    }
    report = table(job, memory)
    (folder / "report.md").write_text(report + "\n")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    print(report)
    print(json.dumps(summary))


if __name__ == "__main__":
    raise SystemExit(json_main("lora", main, child_flags=("--child",)))
