"""Distillery vs TRL on the same on-policy distillation, in one invocation, on this machine.

    .venv/bin/pip install -r bench/requirements-trl.txt     # TRL is the benchmark's, not the runtime's
    python bench/e2e_vs_trl.py --quick                      # a few minutes of steps per system, twice
    python bench/e2e_vs_trl.py                              # more steps, 3 alternating repeats

Systems, all from the same student initialisation, teacher, prompts, prompts per step, max new
tokens, sampling temperature, learning rate and schedule, with reverse KL as the loss:
- distillery: `distillery run` at its defaults (the rollout and teacher engines the plan picks on CPU:
  the transformers rollout for the 0.4-0.5M students, in the trainer's process with the teacher's
  forward, vLLM for small beside the teacher's forward in a Ray actor; Ray trainer), loss
  `reverse_kl_topk` over the teacher's top-k (k = the whole 16-token vocabulary on the addition task, 16
  of 1,031 on the speed task);
- trl-gkd: `trl.experimental.gkd.GKDTrainer`, lmbda=1 (always on-policy), beta=1 (reverse KL, full
  vocabulary), HF generate;
- trl-distill: `trl.DistillationTrainer`, beta=1 (reverse KL), HF generate.

Two parts:
1. speed: randomly initialised Llamas (`distillery_runtime.testing.tiny`) that rarely emit EOS, so
   every sample is ~max-new-tokens long and generation is a real share of each step; seconds per step
   (median and spread, first step excluded: warm-up) and peak memory of each system's process tree.
   Settings (`--speed-settings`): tiny (0.4M student / 1.6M teacher: fixed per-step costs dominate),
   small (11.5M / 37M), medium (37M / 86M), each in float32 or bfloat16 (`small:bfloat16`). Distillery
   compiles its rollout engine (`enforceEager: false`) except at the tiny scale.
2. learning: a bundled synthetic task (`--task`: addition, 5-token answers, or fibonacci, 74-134-token
   traces graded on their last number); held-out accuracy over steps, the training and wall seconds to
   reach an accuracy threshold, the final accuracy, and peak memory. Rollout length and temperature
   are the task's quick-start example's (examples/local-fibonacci.yaml samples at 0.5; addition keeps
   1.0 and 32 new tokens, as before).
Runs alternate between systems (repeat r starts with system r mod the number of systems): a speed
setting runs 2 repeats in quick mode, 3 in full, so two systems run A B B A (A B B A B A): this host's speed
drifts by up to 2x over minutes, and a system's steps taken on both sides of the other's cancel a drift
that is steady over the run (one repeat each measured whichever system the slow minutes fell to). The
medians pool every repeat's timed steps; `speedup_per_repeat_vs_*` gives each repeat's own ratio, to show
the spread. Each system runs in its own process tree, measured the same way (RSS of the tree, sampled every
0.2 s). The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from _common import distillery_run, json_main, tree_memory  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("distillery", "trl-gkd", "trl-distill")


@dataclass(frozen=True)
class Setting:
    """One comparison: what every system is given."""

    name: str
    student: str
    teacher: str
    train: str
    eval: str | None
    steps: int
    prompts_per_step: int = 32
    max_new_tokens: int = 128
    temperature: float = 1.0
    lr: float = 3e-4
    warmup: int = 5
    top_k: int = 16
    eval_every: int = 0
    eval_rows: int = 256
    enforce_eager: bool = True
    """Distillery's rollout engine: eager, or torch.compiled (worth its ~10 s start-up on longer steps)."""
    precision: str = "float32"
    """float32, or bfloat16: both systems keep float32 master weights and compute in bf16 (Distillery:
    bf16 rollout and teacher engines, autocast training; TRL: teacher in bf16, `bf16=True` autocast)."""
    eval_max_new_tokens: int = 8
    """Greedy budget of the TRL child's evaluations (Distillery's evaluate with the rollout's)."""
    rollout_engine: str | None = None
    """Distillery's `student.rollout.engine`; None leaves it to the job's default."""
    device: str = "cpu"
    """Both systems' device: cpu, or cuda (Distillery's student on one GPU with CUDA-graph rollout; its
    teacher server on the next GPU, or sharing the student's on a one-GPU machine)."""


# ------------------------------------------------------------------------------------------ measuring


def matmul_gflops(dtype: str = "float32", n: int = 1024, seconds: float = 1.0) -> float:
    """This machine's matmul throughput right now: shared machines vary by 1.5x between runs, so the
    summary records it at the start and the end (compare runs by ratio, not by seconds). Timed for about
    `seconds`: a host without native bf16 (AVX2 only) runs bf16 matmuls ~80x slower than float32."""
    import torch

    a = torch.randn(n, n).to(getattr(torch, dtype))
    a @ a  # warm-up
    reps, started = 0, time.perf_counter()
    while reps < 2 or time.perf_counter() - started < seconds:
        a @ a
        reps += 1
    return reps * 2 * n**3 / (time.perf_counter() - started) / 1e9


def run_measured(
    command: list[str], log: Path, env: dict[str, str] | None = None
) -> tuple[int, float, int, float]:
    """(exit code, wall seconds, peak RSS of the process tree in bytes, start time as time.time())."""
    started, started_at = time.monotonic(), time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        peak = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, tree_memory(proc.pid))
                stop.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait()
        stop.set()
        sampler.join()
    return code, time.monotonic() - started, peak, started_at


def read_jsonl(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


# ------------------------------------------------------------------------------------------ distillery


def distillery_manifest(s: Setting) -> dict:
    spec: dict = {
        "student": {
            "model": s.student,
            "precision": s.precision,
            "rollout": {
                "temperature": s.temperature,
                "maxNewTokens": s.max_new_tokens,
                "enforceEager": s.enforce_eager and s.device != "cuda",
            },
            "optimizer": {"lr": s.lr, "warmupSteps": s.warmup, "minLrRatio": 1.0},
            "pool": {"workers": 1, "gpusPerWorker": 1 if s.device == "cuda" else 0},
        },
        "teachers": [
            {
                "name": "teacher",
                "model": s.teacher,
                "placement": "standalone",
                "inference": {"dtype": s.precision},
            }
        ],
        "data": {"train": {"path": s.train}, "maxPromptTokens": 16 if s.eval else 64},
        "loss": {"mode": "reverse_kl_topk", "topK": s.top_k},
        "schedule": {
            "steps": s.steps,
            "promptsPerStep": s.prompts_per_step,
            "microBatchSize": s.prompts_per_step,
            "checkpointEvery": 0,
        },
    }
    if s.rollout_engine:
        spec["student"]["rollout"]["engine"] = s.rollout_engine
    if s.eval:
        spec["data"]["eval"] = {"path": s.eval}
        spec["schedule"]["evalEvery"] = s.eval_every
    return {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationJob",
        "metadata": {"name": f"bench-{s.name}"},
        "spec": spec,
    }


def run_distillery(s: Setting, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    command = distillery_run(
        distillery_manifest(s), out, "--overwrite"
    )  # a bench run starts fresh in its folder
    code, wall, peak, started_at = run_measured(command, out / "log.txt")
    if code != 0:
        raise RuntimeError(f"distillery run failed ({code}); see {out / 'log.txt'}")
    metrics = read_jsonl(out / "run" / "metrics.jsonl")
    steps = [(r["step"], r["time/step_s"], r.get("generated_tokens", 0)) for r in metrics]
    phases = [(r["step"], distillery_phases(r)) for r in metrics]
    finished_at = {r["step"]: r["time"] for r in metrics}  # each step's record is written before its eval
    evals = []
    for e in read_jsonl(out / "run" / "eval.jsonl"):
        train_s = sum(sec for step, sec, _ in steps if step <= e["step"])
        entry = {"step": e["step"], "accuracy": e["eval_accuracy"], "train_s": train_s}
        if e["step"] in finished_at:
            entry["wall_s"] = finished_at[e["step"]] + e["seconds"] - started_at
        evals.append(entry)
    return {"steps": steps, "phases": phases, "evals": evals, "wall_s": wall, "peak_rss": peak}


def distillery_phases(record: dict) -> dict[str, float]:
    """One Distillery step taken apart (seconds), from its metrics.jsonl record: the rollout; the teacher's
    scoring after the last sample is out (scoring overlaps the rollout); the trainer's forward, loss and
    backward, then its optimizer step (measured inside the trainer); the weight sync; and the rest: Ray
    calls and serialisation of the samples to the trainer, metrics and status, waits."""
    inner = record.get("metrics", {})
    parts = {
        "rollout": record["time/rollout_s"],
        "teacher_tail": record["time/teacher_s"],
        "forward_backward": inner.get("train/forward_backward_s", 0.0),
        "optimizer": inner.get("train/optimizer_s", 0.0),
        "sync": record["time/sync_s"],
    }
    parts["rest"] = record["time/step_s"] - sum(parts.values())
    return parts


# ------------------------------------------------------------------------------------------ TRL (child)


def trl_child(system: str, s: Setting, out: Path) -> None:
    """Runs inside its own process: one TRL trainer on the setting, steps and evals written as jsonl."""
    import torch
    from distillery_runtime.tasks import is_synthetic, resolve_uri, task_for
    from distillery_runtime.tasks.measure import evaluate
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    def local(path: str) -> Path:
        return resolve_uri(path) if is_synthetic(path) else Path(path)

    def accuracy(model, tokenizer, rows):  # type: ignore[no-untyped-def]
        # The same grader as Distillery's loop: the task its training data belongs to.
        return evaluate.accuracy(
            model, tokenizer, rows, task=task_for(s.train), max_new_tokens=s.eval_max_new_tokens
        )

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(local(s.student))
    student = AutoModelForCausalLM.from_pretrained(local(s.student), dtype=torch.float32)
    teacher_dtype = torch.bfloat16 if s.precision == "bfloat16" else torch.float32
    teacher = AutoModelForCausalLM.from_pretrained(local(s.teacher), dtype=teacher_dtype).eval()
    rows = read_jsonl(local(s.train))
    eval_rows = read_jsonl(local(s.eval))[: s.eval_rows] if s.eval else []
    steps_file, evals_file = open(out / "steps.jsonl", "w"), open(out / "evals.jsonl", "w")  # noqa: SIM115
    cuda = s.device == "cuda"
    generate_s = [0.0]  # seconds inside HF generate: the rollout share of each step
    generated = [0]  # tokens HF generate sampled (each row's up to its first end token): the step's work
    from transformers.generation.utils import GenerationMixin

    plain_generate = GenerationMixin.generate

    def timed_generate(self, *a, **kw):  # type: ignore[no-untyped-def]
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = plain_generate(self, *a, **kw)
        if cuda:
            torch.cuda.synchronize()
        generate_s[0] += time.perf_counter() - t0
        prompt = kw.get("input_ids", a[0] if a else None)
        # generate fills what the given config leaves unset (GKD's sets no end token) from the model's own.
        given = kw.get("generation_config")
        ends = (given.eos_token_id if given is not None else None) or self.generation_config.eos_token_id
        generated[0] += sampled_tokens(getattr(result, "sequences", result), prompt, ends)
        return result

    GenerationMixin.generate = timed_generate  # type: ignore[method-assign]

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = 0.0
            self.train_s = 0.0

        def on_step_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            if cuda:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()
            generate_s[0] = 0.0
            generated[0] = 0

        def on_step_end(self, args, state, control, model=None, **kw):  # type: ignore[no-untyped-def]
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - self.t0
            self.train_s += dt
            record = {
                "step": state.global_step,
                "seconds": dt,
                "generate_s": generate_s[0],
                "generated_tokens": generated[0],
                "time": time.time(),
            }
            steps_file.write(json.dumps(record) + "\n")
            steps_file.flush()
            if eval_rows and s.eval_every and state.global_step % s.eval_every == 0:
                acc = accuracy(model, tokenizer, eval_rows)
                model.train()
                evals_file.write(
                    json.dumps(
                        {
                            "step": state.global_step,
                            "accuracy": acc,
                            "train_s": self.train_s,
                            "time": time.time(),
                        }
                    )
                    + "\n"
                )
                evals_file.flush()

    if eval_rows:
        acc0 = accuracy(student, tokenizer, eval_rows)
        evals_file.write(json.dumps({"step": 0, "accuracy": acc0, "train_s": 0.0}) + "\n")
    trainer = _trl_trainer(system, s, out, student, teacher, tokenizer, rows, Timer())
    trainer.train()
    steps_file.close()
    evals_file.close()


def _trl_trainer(
    system: str,
    s: Setting,
    out: Path,
    student: Any,
    teacher: Any,
    tokenizer: Any,
    rows: list[dict],
    timer: Any,
) -> Any:
    """The TRL trainer of `system` on the setting: GKD on chat rows (lmbda 1: on-policy), or the distillation
    trainer on prompts; reverse KL (beta 1) in both, `timer` its callback."""
    from datasets import Dataset

    common = dict(
        output_dir=str(out / "trainer"), per_device_train_batch_size=s.prompts_per_step, gradient_accumulation_steps=1,
        max_steps=s.steps, learning_rate=s.lr, lr_scheduler_type="constant_with_warmup", warmup_steps=s.warmup,
        max_grad_norm=1.0, use_cpu=s.device == "cpu", bf16=s.precision == "bfloat16", gradient_checkpointing=False, report_to="none",
        save_strategy="no", logging_steps=1, seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    if system == "trl-gkd":
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        data = Dataset.from_list(
            [
                {
                    "messages": [
                        {"role": "user", "content": r["prompt"]},
                        {"role": "assistant", "content": r.get("response", "")},
                    ]
                }
                for r in rows
            ]
        )
        args = GKDConfig(
            **common,
            lmbda=1.0,
            beta=1.0,
            temperature=s.temperature,
            max_new_tokens=s.max_new_tokens,
            disable_dropout=True,
        )
        trainer = GKDTrainer(
            model=student,
            teacher_model=teacher,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[timer],
        )
    else:
        from trl import DistillationConfig, DistillationTrainer

        data = Dataset.from_list([{"prompt": r["prompt"]} for r in rows])
        args = DistillationConfig(
            **common,
            beta=1.0,
            temperature=s.temperature,
            max_completion_length=s.max_new_tokens,
            disable_dropout=True,
        )
        trainer = DistillationTrainer(
            model=student,
            teacher_model=teacher,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[timer],
        )
    return trainer


def sampled_tokens(sequences: Any, prompt: Any, end_ids: int | list[int] | None) -> int:
    """Tokens sampled after `prompt` in HF generate's `sequences` [B, P + T]: each row's up to and including
    its first end token (generate pads the rest), as a Distillery sample's response counts them."""
    import torch

    new = sequences[:, prompt.shape[1] :] if prompt is not None else sequences
    ends = torch.tensor([end_ids] if isinstance(end_ids, int) else list(end_ids or []), device=new.device)
    ended = torch.isin(new, ends)
    # A row's first end at index i: i + 1 tokens; a row that never ended: all of its T.
    first = torch.where(ended.any(-1), ended.int().argmax(-1) + 1, new.shape[1])
    return int(first.sum())


def run_trl(system: str, s: Setting, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "setting.json").write_text(json.dumps(asdict(s)))
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        system,
        "--setting",
        str(out / "setting.json"),
        "--out",
        str(out),
    ]
    code, wall, peak, started_at = run_measured(command, out / "log.txt")
    if code != 0:
        raise RuntimeError(f"{system} failed ({code}); see {out / 'log.txt'}")
    records = read_jsonl(out / "steps.jsonl")
    steps = [(r["step"], r["seconds"], r.get("generated_tokens", 0)) for r in records]
    evals = [
        {**e, "wall_s": e["time"] - started_at} if "time" in e and e["step"] > 0 else e
        for e in read_jsonl(out / "evals.jsonl")
    ]
    # TRL's step: HF generate (the rollout), then the teacher's forward, the student's forward, loss,
    # backward and the optimizer step, which its trainer does not time apart.
    phases = [
        (r["step"], {"rollout": r.get("generate_s", 0.0), "rest": r["seconds"] - r.get("generate_s", 0.0)})
        for r in records
    ]
    return {"steps": steps, "phases": phases, "evals": evals, "wall_s": wall, "peak_rss": peak}


# ------------------------------------------------------------------------------------------ settings


SPEED_MODELS = {
    # name: (student hidden, layers, heads), (teacher hidden, layers, heads)
    "tiny": ((128, 2, 2), (256, 2, 4)),  # 0.4M / 1.6M parameters: fixed per-step costs dominate
    "mini": ((256, 3, 4), (512, 4, 8)),  # 2.3M / 11.5M: about where the CPU rollout engines cross
    "small": ((512, 4, 8), (768, 6, 12)),  # 11.5M / 37M: the model's compute dominates
    "medium": ((768, 6, 12), (1024, 8, 16)),  # 37M / 86M
    # GPU scales (bench/gpu_breakdown.py): far too slow to train on a 2-core CPU.
    "large": ((1024, 12, 16), (1536, 16, 16)),  # 128M / 380M
    "xl": ((2048, 16, 16), (2560, 24, 20)),  # 0.68B / 1.6B: about Qwen2.5-0.5B / 1.5B
}


def speed_setting(
    out: Path, steps: int, scale: str, precision: str = "float32", device: str = "cpu"
) -> Setting:
    """Random Llamas of the given scale (SPEED_MODELS) and 512 short prompts."""
    import torch
    from distillery_runtime.testing.tiny import build_tokenizer, default_texts, save_tiny_model

    root = out / f"speed-models-{scale}"
    if not (root / "train.jsonl").exists():
        tok = build_tokenizer(vocab_size=1031)
        for name, (hidden, layers, heads), seed in zip(
            ("student", "teacher"), SPEED_MODELS[scale], (1, 2), strict=True
        ):
            save_tiny_model(
                root / name, tokenizer=tok, hidden=hidden, layers=layers, heads=heads, seed=seed,
                dtype=torch.float32,
            )  # fmt: skip
        prompts = [
            " ".join(t.split()[:6]) for t in default_texts(512, seed=3)[:512]
        ]  # the last text is string.printable
        (root / "train.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    name = f"speed-{scale}" + ("-bf16" if precision == "bfloat16" else "")
    return Setting(
        name, str(root / "student"), str(root / "teacher"), str(root / "train.jsonl"), None, steps,
        enforce_eager=scale == "tiny", precision=precision, device=device,
    )  # fmt: skip


def learning_setting(task: str, steps: int, eval_every: int) -> Setting:
    """The task's synthetic URIs (Distillery grades with the task they name; the TRL child resolves them)."""
    uri = f"synthetic://{task}/"
    if task == "addition":
        budget = {"max_new_tokens": 32, "eval_max_new_tokens": 8}
        temperature = 1.0
    else:
        rollout = yaml.safe_load((ROOT / "examples" / f"local-{task}.yaml").read_text())["spec"]["student"][
            "rollout"
        ]
        budget = {"max_new_tokens": rollout["maxNewTokens"], "eval_max_new_tokens": rollout["maxNewTokens"]}
        temperature = rollout["temperature"]
    return Setting(
        task, uri + "student", uri + "teacher", uri + "train", uri + "eval", steps, eval_every=eval_every,
        eval_rows=512, temperature=temperature, **budget,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ report


def step_stats(runs: list[dict]) -> dict:
    times = [sec for run in runs for step, sec, _ in run["steps"] if step > 1]
    if not times:
        return {"median_s": None, "p10_s": None, "p90_s": None}
    q = statistics.quantiles(times, n=10) if len(times) > 1 else [times[0]] * 9
    return {"median_s": statistics.median(times), "p10_s": q[0], "p90_s": q[-1], "n": len(times)}


def repeat_speedups(ours: list[dict], theirs: list[dict]) -> list[float]:
    """Each repeat's own speed-up (their median step over ours), for the repeats both systems finished: how
    far one repeat's ratio strays from the pooled one on this host."""
    theirs_by_repeat = {run["repeat"]: step_stats([run])["median_s"] for run in theirs}
    speedups = []
    for run in ours:
        mine, their = step_stats([run])["median_s"], theirs_by_repeat.get(run["repeat"])
        if mine and their:
            speedups.append(their / mine)
    return speedups


def tokens_per_step(runs: list[dict]) -> float | None:
    """The median of the tokens a step sampled (the first step excluded, as its time is): the systems' steps
    compare only where they sampled about as much."""
    tokens = [n for run in runs for step, _, n in run["steps"] if step > 1 and n]
    return statistics.median(tokens) if tokens else None


def phase_medians(runs: list[dict]) -> dict[str, float]:
    """Each phase's median seconds a step (the first step excluded: warm-up)."""
    per_phase: dict[str, list[float]] = {}
    for run in runs:
        for step, parts in run.get("phases", []):
            if step > 1:
                for name, seconds in parts.items():
                    per_phase.setdefault(name, []).append(seconds)
    return {name: statistics.median(values) for name, values in per_phase.items()}


def reach(evals: list[dict], threshold: float) -> dict | None:
    for e in evals:
        if e["accuracy"] >= threshold:
            return e
    return None


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child:
        trl_child(args.child, Setting(**json.loads(args.setting.read_text())), args.out)
        return 0

    # Speed settings: 2 repeats even in quick mode, so that two systems run A B B A (module docstring).
    repeats = 2 if args.quick else 3
    # 12 quick steps, the first excluded: Distillery's next two or three are still warming up (new row
    # widths for oneDNN's kernels, the heap's growth), and of 7 timed steps they could move the median.
    speed_steps, learn_steps, eval_every = (12, 100, 5) if args.quick else (16, 150, 5)
    args.output.mkdir(parents=True, exist_ok=True)
    settings = _settings(args, parser, speed_steps, learn_steps, eval_every)
    machine_before = {dtype: matmul_gflops(dtype) for dtype in ("float32", "bfloat16")}
    results = _run_all(settings, args.systems, repeats, args.output)
    summary: dict = {
        "bench": "e2e_vs_trl",
        "cpu_cores": os.cpu_count(),
        "mode": "quick" if args.quick else "full",
        "load_average_at_end": os.getloadavg(),
        "matmul_gflops": {
            "start": machine_before,
            "end": {dtype: matmul_gflops(dtype) for dtype in ("float32", "bfloat16")},
        },
    }
    # Other work on the machine slows every system; the load says how busy it was.
    print(f"\n{os.cpu_count()} CPU cores; load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    flops = summary["matmul_gflops"]
    print(
        "matmul GFLOPS (2048^2, float32 / bfloat16): "
        f"start {flops['start']['float32']:.0f} / {flops['start']['bfloat16']:.0f}, "
        f"end {flops['end']['float32']:.0f} / {flops['end']['bfloat16']:.0f}"
    )
    for s in settings:
        summary[s.name] = _setting_report(s, results[s.name], args.threshold)
    print(json.dumps(summary))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", nargs="*", default=["speed", "learning"], choices=["speed", "learning"])
    parser.add_argument(
        "--speed-settings", nargs="*", default=["tiny", "small", "small:bfloat16"], metavar="SCALE[:PRECISION]",
        help=f"speed part: model scale ({', '.join(SPEED_MODELS)}) and precision (float32, bfloat16)",
    )  # fmt: skip
    parser.add_argument("--systems", nargs="*", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument(
        "--task", choices=["addition", "fibonacci"], default="addition", help="the learning part's task"
    )
    parser.add_argument(
        "--threshold", type=float, default=0.5, help="held-out accuracy for time-to-threshold"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both systems run")
    parser.add_argument(
        "--rollout-engine",
        choices=["vllm", "transformers"],
        help="Distillery's rollout engine (default: the job's)",
    )
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "bench-e2e")
    parser.add_argument("--child", choices=SYSTEMS[1:], help=argparse.SUPPRESS)
    parser.add_argument("--setting", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser


def _settings(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    speed_steps: int,
    learn_steps: int,
    eval_every: int,
) -> list[Setting]:
    """The settings the command line asks for: the speed part's scales and precisions, the learning part."""
    settings = []
    if "speed" in args.parts:
        for item in args.speed_settings:
            scale, _, precision = item.partition(":")
            if scale not in SPEED_MODELS or precision not in ("", "float32", "bfloat16"):
                parser.error(
                    f"--speed-settings {item}: expected SCALE[:float32|bfloat16], SCALE in {list(SPEED_MODELS)}"
                )
            settings.append(
                speed_setting(args.output, speed_steps, scale, precision or "float32", args.device)
            )
    if "learning" in args.parts:
        settings.append(replace(learning_setting(args.task, learn_steps, eval_every), device=args.device))
    settings = [replace(s, rollout_engine=args.rollout_engine) for s in settings]

    return settings


def _run_all(
    settings: list[Setting], systems: list[str], repeats: int, output: Path
) -> dict[str, dict[str, list[dict]]]:
    """Every system on every setting (the speed settings `repeats` times, in rotated order): their runs by
    setting and system; a system that fails is left out of its setting's runs."""
    results: dict[str, dict[str, list[dict]]] = {}
    for s in settings:
        results[s.name] = {system: [] for system in systems}
        n_rep = repeats if s.name.startswith("speed") else 1
        for r in range(n_rep):
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            for system in order:
                print(f"[{s.name}] repeat {r + 1}/{n_rep}: {system} ...", file=sys.stderr, flush=True)
                out = output / s.name / f"{system}-{r}"
                try:
                    run = run_distillery(s, out) if system == "distillery" else run_trl(system, s, out)
                except RuntimeError as error:  # one system failing must not lose the others' numbers
                    print(f"  {error}", file=sys.stderr, flush=True)
                    continue
                results[s.name][system].append({**run, "repeat": r})
    return results


def _setting_report(s: Setting, runs_by_system: dict[str, list[dict]], threshold: float) -> dict:
    """One setting's table on the terminal and its part of the summary."""
    print(
        f"\n[{s.name}] {s.prompts_per_step} prompts/step, max {s.max_new_tokens} new tokens, temperature {s.temperature}, "
        f"{s.steps} steps, lr {s.lr}, loss reverse KL (distillery: reverse_kl_topk k={s.top_k}; TRL: beta=1, full vocab)"
    )
    print(
        f"{'system':<12} {'median s/step':>13} {'p10-p90 s':>13} {'steps/s':>8} {'tokens/step':>11} "
        f"{'peak RSS GiB':>12} {'wall s':>7}",
        end="",
    )
    print(
        f" {'final acc':>9} {'steps to thr':>12} {'train s to thr':>14} {'wall s to thr':>13}"
        if s.eval
        else ""
    )
    part: dict = {"setting": asdict(s), "systems": {}}
    for system, runs in runs_by_system.items():
        if not runs:
            print(f"{system:<12} failed (see its log.txt)")
            part["systems"][system] = {"failed": True}
            continue
        st = step_stats(runs)
        peak = max(r["peak_rss"] for r in runs) / 2**30
        wall = statistics.median(r["wall_s"] for r in runs)
        row = {
            **st,
            "steps_per_s": (1 / st["median_s"]) if st["median_s"] else None,
            "peak_rss_gib": peak,
            "wall_s": wall,
            "phases_s": phase_medians(runs),
            "sampled_tokens_per_step": tokens_per_step(runs),
        }
        line = (
            f"{system:<12} {st['median_s'] or 0:>13.3f} {st['p10_s'] or 0:>6.3f}-{st['p90_s'] or 0:<6.3f} "
            f"{row['steps_per_s'] or 0:>8.2f} {row['sampled_tokens_per_step'] or 0:>11.0f} {peak:>12.2f} "
            f"{wall:>7.0f}"
        )
        if s.eval:
            evals = runs[0]["evals"]
            hit = reach(evals, threshold)
            row.update(
                final_accuracy=evals[-1]["accuracy"] if evals else None, start_accuracy=evals[0]["accuracy"] if evals else None,
                steps_to_threshold=hit["step"] if hit else None, train_s_to_threshold=hit["train_s"] if hit else None,
                wall_s_to_threshold=hit.get("wall_s") if hit else None,
                curve=[(e["step"], e["accuracy"]) for e in evals],
            )  # fmt: skip
            thr_steps = str(hit["step"]) if hit else "-"
            thr_secs = f"{hit['train_s']:.1f}" if hit else "-"
            thr_wall = f"{hit['wall_s']:.1f}" if hit and "wall_s" in hit else "-"
            line += f" {row['final_accuracy'] or 0:>9.3f} {thr_steps:>12} {thr_secs:>14} {thr_wall:>13}"
        print(line)
        part["systems"][system] = row
    for system, row in part["systems"].items():
        if row.get("phases_s"):
            print(
                f"  {system} step, median s: " + ", ".join(f"{k} {v:.3f}" for k, v in row["phases_s"].items())
            )
    d = part["systems"].get("distillery", {})
    for system in ("trl-gkd", "trl-distill"):
        t = part["systems"].get(system)
        if d.get("median_s") and t and t.get("median_s"):
            part[f"speedup_vs_{system}"] = t["median_s"] / d["median_s"]
            per_repeat = repeat_speedups(runs_by_system["distillery"], runs_by_system[system])
            if len(per_repeat) > 1:
                part[f"speedup_per_repeat_vs_{system}"] = per_repeat
                print(f"  speed-up vs {system}, each repeat: " + ", ".join(f"{r:.2f}x" for r in per_repeat))
        for kind in ("train_s", "wall_s"):
            key = f"{kind}_to_threshold"
            if s.eval and t and d.get(key) and t.get(key):
                part[f"{key}_ratio_vs_{system}"] = d[key] / t[key]
    if s.eval:
        part["threshold"] = threshold
    return part


if __name__ == "__main__":
    raise SystemExit(json_main("e2e_vs_trl", main, child_flags=("--child",)))
