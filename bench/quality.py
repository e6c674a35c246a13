"""Quality benchmark: how many steps (and seconds) the student needs to reach 90% of the teacher's
held-out accuracy, with on-policy distillation (each loss mode, run by `distillery run`) versus
supervised fine-tuning on teacher-generated answers (off-policy distillation), from the same start.

    python bench/quality.py --quick                    # k3 and forward_kl_topk vs SFT (~15 min on 2 cores)
    python bench/quality.py                            # every loss mode vs SFT
    python bench/quality.py --task fibonacci --quick   # the long-generation task (74-134-token traces)
    python bench/quality.py --protocol continue --quick  # past the SFT plateau (worked-sum, one seed)
    python bench/quality.py --task tools --protocol continue --quick  # a tool-using student's episodes

The task is a bundled synthetic one (`synthetic://TASK/*`, prepared and cached on first use):
addition (5-token answers, the default) or fibonacci (long traces graded on their last number). Each
on-policy run is a real `distillery run` of examples/local-TASK.yaml with only the loss (and the step
budget) changed: vLLM CPU rollout, the teacher as a loopback vLLM teacher server, Ray,
the same trainer as in a cluster. The SFT baseline uses the same prompts per step, optimizer,
learning rate and schedule, on the teacher's greedy answers to the same training prompts. "Steps to
target" is the first evaluation at or above the target; "train s" sums the step times up to it
(start-up and evaluation excluded). Each on-policy run also gets `OUTPUT/MODE/vs-sft/report.md`: its
accuracy plot with the teacher and the SFT baseline as the lines it is measured against. The last line
is a JSON summary.

`--protocol continue` is the field's claim (Thinking Machines' "On-Policy Distillation", GKD): the student
starts at its SFT plateau (the task's student, which the worked-sum build trains by SFT to the end of its
schedule; the SFT arm below says whether it is one) and, from that same checkpoint, for the same steps and
prompts per step, gets (a) more SFT on the teacher's answers, (b) on-policy distillation with the top-k
loss in each direction (forward and reverse KL) and with a sampled-token one, (c) the mix
(`onPolicyFraction` 0.5) under each top-k loss. Each method runs once per seed (`--seeds`; `--quick`:
one); the summary is each method's final held-out accuracy (mean and spread over seeds) and the share of
the plateau-to-teacher gap it closed, with `OUTPUT/accuracy.png` (mean accuracy per step, the teacher and
the plateau as lines). `--task tools` plays multi-turn episodes with the task's calculator: accuracy is
played, the SFT arm trains on the teacher's played episodes with the calculator's answers out of the loss,
there is no mix (an environment's job trains on-policy only), and `OUTPUT/episodes_turns_mean.png` and
`episodes_tool_errors.png` show each on-policy method's turns per episode and tool errors over steps (the
JSON's `episodes`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from _common import distillery_run, json_main, provenance  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("addition", "fibonacci", "worked-sum", "tools")
EPISODE_TASKS = ("tools",)
"""Tasks whose jobs play multi-turn episodes with a tool (`spec.environment`): their accuracy is played with
the task's environment, their SFT arm trains on the teacher's played episodes with the tool's answers out of
the loss, and they have no off-policy mix (an environment's job trains on-policy only)."""


def example_path(task: str) -> Path:
    """The task's quick-start manifest: the on-policy runs' job, and the budgets SFT shares with them."""
    return ROOT / "examples" / f"local-{task}.yaml"


# Loss blocks per mode; everything else comes from the example. k1 is a reward, so it needs the
# policy-gradient objective; the top-k modes read the teacher's top 8 log-probs per position.
LOSSES: dict[str, dict] = {
    "k3": {"mode": "k3"},
    "forward_kl_topk": {"mode": "forward_kl_topk", "topK": 8},
    "reverse_kl_topk": {"mode": "reverse_kl_topk", "topK": 8},
    "jsd": {"mode": "jsd", "topK": 8, "beta": 0.5},
    "k2": {"mode": "k2"},  # no per-token loss clamp unless asked (the API's default for k2)
    # k2 with the clamp every other mode gets by default: it zeroes k2's gradient past |s - t| > 4.5.
    "k2_clamp10": {"mode": "k2", "lossMaxClamp": 10},
    "abs": {"mode": "abs"},
    "k1_pg": {"mode": "k1", "objective": "policy_gradient"},
}
QUICK = ("k3", "forward_kl_topk")
# The continuation's on-policy methods: the top-k losses over the teacher's top 16 (the task's whole
# alphabet but the specials) in both directions, a sampled-token one, and GKD's mix of on- and off-policy
# steps (the rows' traces) under each top-k loss. Forward KL pulls up the teacher's token however little
# mass the student gives it; reverse KL's pull on a token is scaled by the student's own probability of it
# (bench/README.md, "Past the SFT plateau").
CONTINUE: dict[str, dict] = {
    "opd-forward-kl-topk": {"mode": "forward_kl_topk", "topK": 16},
    "opd-reverse-kl-topk": {"mode": "reverse_kl_topk", "topK": 16},
    "opd-k3": {"mode": "k3"},
    "mix-0.5-forward-kl-topk": {"mode": "forward_kl_topk", "topK": 16, "onPolicyFraction": 0.5},
    "mix-0.5-reverse-kl-topk": {"mode": "reverse_kl_topk", "topK": 16, "onPolicyFraction": 0.5},
}
SFT = "sft"
"""The continuation's SFT arm: more SFT on the teacher's greedy answers."""
QUICK_CONTINUE = (SFT, "opd-forward-kl-topk", "opd-reverse-kl-topk")
"""The continuation's methods in quick mode: the claim (more SFT against on-policy forward KL) and the
other direction, every seed and kernel path still run."""
KERNEL_PATHS = ("default", "avx2")
"""The CPU kernel paths a continuation runs under by default: torch's own choice for this CPU, and AVX2
(`ATEN_CPU_CAPABILITY=avx2`), a machine without AVX-512 emulated on this one. A kernel path changes the
summation order of every float32 reduction, and so the prepared task's trained models and every curve:
a result is a distribution over seeds and kernel paths, not one run (a worked-sum recipe that reached 97%
here reached 26% on an AMX machine, issue 62)."""


@dataclass
class Curve:
    """One method's held-out accuracy over steps, and the step time up to each evaluation."""

    method: str
    points: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, accuracy, training seconds so far)."""
    wall_s: float = 0.0
    note: str = ""

    def reach(self, target: float) -> tuple[int, float] | None:
        for step, acc, seconds in self.points:
            if acc >= target:
                return step, seconds
        return None


def job_manifest(
    example: Path,
    loss: dict,
    *,
    steps: int,
    eval_every: int,
    name: str,
    seed: int = 0,
    min_lr_ratio: float | None = 1.0,
) -> dict:
    """The example manifest with another loss, step budget and seed; `min_lr_ratio` None keeps the example's
    learning-rate schedule."""
    doc = yaml.safe_load(example.read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"]["name"] = name
    doc["spec"]["loss"] = loss
    doc["spec"]["schedule"]["steps"] = steps
    doc["spec"]["schedule"]["evalEvery"] = eval_every
    doc["spec"]["schedule"]["seed"] = seed
    if loss.get("onPolicyFraction", 1.0) < 1.0:
        doc["spec"]["data"]["responseField"] = "response"  # the off-policy steps' traces
    # From the start: a constant learning rate after warm-up (here and in the SFT baseline): with the
    # example's cosine decay, a method's step budget would set its learning rate, and steps-to-target would
    # compare schedules. The continuation runs the example's own schedule, the one its README line quotes.
    if min_lr_ratio is not None:
        doc["spec"]["student"]["optimizer"]["minLrRatio"] = min_lr_ratio
    return doc


def read_jsonl(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def run_distillery(doc: dict, out_dir: Path, method: str) -> Curve:
    """`distillery run` on `doc` in a subprocess; the curve from its eval.jsonl and metrics.jsonl."""
    out_dir.mkdir(parents=True, exist_ok=True)
    command = distillery_run(doc, out_dir, "--overwrite")  # a bench run starts fresh in its folder
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - started
    (out_dir / "run.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise RuntimeError(
            f"{method}: distillery run exited {result.returncode}:\n{(result.stdout + result.stderr)[-3000:]}"
        )
    step_s = {r["step"]: r["time/step_s"] for r in read_jsonl(out_dir / "run" / "metrics.jsonl")}
    curve = Curve(method, wall_s=wall)
    for entry in read_jsonl(out_dir / "run" / "eval.jsonl"):
        seconds = sum(s for step, s in step_s.items() if step <= entry["step"])
        curve.points.append((entry["step"], entry["eval_accuracy"], seconds))
    return curve


def run_sft(
    task_dir: Path,
    *,
    task: str,
    steps: int,
    batch: int,
    lr: float,
    warmup: int,
    eval_every: int,
    target: float,
    max_new_tokens: int,
    seed: int = 0,
    min_lr_ratio: float = 1.0,
) -> Curve:
    """SFT of the student on the teacher's greedy answers; stops at the target or after `steps`. `seed`
    shifts where in the training rows the batches start (the order a seed gives a distillation run);
    `min_lr_ratio` ends the learning rate's cosine decay (1.0: constant after warm-up)."""
    import functools

    import torch
    from distillery_runtime.tasks.build.sft import train_sft
    from distillery_runtime.tasks.measure import evaluate
    from distillery_runtime.tasks.uri import TASKS as GRADED
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(task_dir / "student")
    teacher = AutoModelForCausalLM.from_pretrained(task_dir / "teacher", dtype=torch.float32).eval()
    train = read_jsonl(task_dir / "train.jsonl")
    evals = read_jsonl(task_dir / "eval.jsonl")
    accuracy = functools.partial(evaluate.accuracy, task=GRADED[task], max_new_tokens=max_new_tokens)
    pairs: list[tuple[str, Any]]
    if task in EPISODE_TASKS:
        # The teacher's played episodes, each turn trained and each tool answer context (as the runtime's
        # loss treats them): imitation of the teacher's whole episodes.
        recipe = played_recipe(task)
        accuracy = recipe.accuracy
        episodes = recipe.play(teacher, tokenizer, train)
        answers = [e.response for e in episodes]
        pairs = episode_pairs(train, episodes)
    else:
        answers = evaluate.greedy_responses(
            teacher, tokenizer, [r["prompt"] for r in train], max_new_tokens=max_new_tokens
        )
        pairs = [(r["prompt"], a) for r, a in zip(train, answers, strict=True)]
    student = AutoModelForCausalLM.from_pretrained(task_dir / "student", dtype=torch.float32)
    curve = Curve("sft (teacher answers)")
    correct = sum(GRADED[task].grade(a, r["answer"]) for r, a in zip(train, answers, strict=True))
    curve.note = f"teacher answers correct on {correct}/{len(train)} train prompts"
    curve.points.append((0, accuracy(student, tokenizer, evals), 0.0))
    train_s = 0.0
    last = time.perf_counter()

    def on_step(step: int, _loss: float) -> bool:
        nonlocal train_s, last
        train_s += time.perf_counter() - last
        done = False
        if step % eval_every == 0:
            acc = accuracy(student, tokenizer, evals)
            student.train()
            curve.points.append((step, acc, train_s))
            done = acc >= target
        last = time.perf_counter()
        return done

    def batches(step: int) -> list[tuple[str, str]]:
        start = (step * batch + seed * 7919) % len(pairs)
        return (pairs + pairs)[start : start + batch]

    train_sft(
        student,
        tokenizer,
        batches,
        steps=steps,
        lr=lr,
        warmup=warmup,
        betas=(0.9, 0.999),
        min_lr_ratio=min_lr_ratio,
        on_step=on_step,
    )
    curve.wall_s = time.monotonic() - started
    return curve


def played_recipe(task: str):  # type: ignore[no-untyped-def]
    """The tools task's recipe: how its episodes are played (the calculator spliced in between turns)."""
    from distillery_runtime.tasks.build.prepare import RECIPES

    return RECIPES[task]()


def episode_pairs(rows: list[dict], episodes: list[Any]) -> list[tuple[str, list[tuple[str, bool]]]]:
    """SFT pairs of played episodes: each turn trained, each tool answer context (the runtime's loss reads
    episodes the same way); the EOS after the last turn is trained (`tasks/build/sft.py`)."""
    return [
        (
            row["prompt"],
            [
                piece
                for turn, seen in zip(episode.turns, episode.observations, strict=True)
                for piece in ((turn, True), (seen, False))
                if piece[0]
            ],
        )
        for row, episode in zip(rows, episodes, strict=True)
    ]


def task_accuracy(task: str, model_dir: Path, rows: list[dict], max_new_tokens: int) -> float:
    """A saved model's held-out accuracy: greedy answers graded by the task, or, for an episode task, greedy
    episodes with its environment."""
    from distillery_runtime.tasks.measure.evaluate import model_accuracy
    from distillery_runtime.tasks.uri import TASKS as GRADED

    if task not in EPISODE_TASKS:
        return model_accuracy(model_dir, rows, task=GRADED[task], max_new_tokens=max_new_tokens)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return played_recipe(task).accuracy(model, AutoTokenizer.from_pretrained(model_dir), rows)


def sft_accuracy_at(sft: Curve, step: int) -> tuple[int, float]:
    """SFT's accuracy at its last evaluation up to `step` (SFT stops early once at the target)."""
    at = [(s, acc) for s, acc, _ in sft.points if s <= step]
    return at[-1] if at else (sft.points[0][0], sft.points[0][1])


def write_comparison(method_dir: Path, curve: Curve, sft: Curve, teacher_acc: float) -> Path:
    """An on-policy run's report with the teacher and the SFT baseline drawn as the lines it is measured
    against, in `method_dir/vs-sft/` (the run's own report stays as the run wrote it)."""
    from distillery_runtime.observe.report import write_report

    run = method_dir / "run"
    last_step = curve.points[-1][0]
    sft_step, sft_acc = sft_accuracy_at(sft, last_step)
    reached = sft.reach(0.9 * teacher_acc)
    return write_report(
        method_dir / "vs-sft",
        job_name=f"{curve.method} vs SFT on teacher answers",
        records=read_jsonl(run / "metrics.jsonl"),
        evals=read_jsonl(run / "eval.jsonl"),
        summary={
            "method": curve.method,
            "SFT on teacher answers": f"{sft_acc:.1%} at step {sft_step}; "
            + (f"90% of the teacher at step {reached[0]}" if reached else "did not reach 90% of the teacher"),
        },
        references={"teacher": teacher_acc, f"SFT baseline (step {sft_step})": sft_acc},
    )


def spread(values: list[float]) -> dict:
    """Mean, sample standard deviation, min and max of one method's per-seed results."""
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "per_seed": values}


def mean_curve(curves: list[Curve]) -> tuple[list[int], list[float]]:
    """Accuracy per evaluated step, averaged over the seeds that evaluated it."""
    by_step: dict[int, list[float]] = {}
    for curve in curves:
        for step, acc, _seconds in curve.points:
            by_step.setdefault(step, []).append(acc)
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def kernel_cache(kernels: str, root: Path) -> Path:
    """The task cache a kernel path prepares into: the usual one for torch's own kernels, a folder of its own
    for another path (its models are another machine's: the same recipe trained with other reductions)."""
    return root if kernels == "default" else root / f"kernels-{kernels}"


def kernel_env(kernels: str, root: Path, threads: int | None = None) -> dict[str, str]:
    """This process's environment for a child that runs on `kernels` with that path's task cache, its
    runs on `threads` CPU threads each (`OMP_NUM_THREADS`, which torch and so a local run read) if given."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if kernels != "default":
        env["ATEN_CPU_CAPABILITY"] = kernels
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env["DISTILLERY_CACHE"] = str(kernel_cache(kernels, root))
    return env


def run_continue(args: argparse.Namespace, output: Path) -> int:
    """The continuation protocol over seeds and kernel paths: one child per kernel path (torch reads its
    kernel path once, at import), each running every method and seed from that path's own prepared task;
    the summary is each method's distribution over all of them."""
    from distillery_runtime.tasks.build.cache import cache_root

    if args.one_kernel_path:
        return run_continue_here(args, output)
    root = cache_root()
    # Side by side, the paths share the cores rather than each oversubscribing them.
    threads = max(1, (os.cpu_count() or 1) // len(args.kernels)) if args.parallel else None
    started: dict[str, subprocess.Popen[str]] = {}
    outputs: dict[str, str] = {}
    for kernels in args.kernels:
        command = [sys.executable, str(Path(__file__).resolve()), "--protocol", "continue", "--task", args.task,
                   "--steps", str(args.steps), "--eval-every", str(args.eval_every), "--seeds", *map(str, args.seeds),
                   "--methods", *args.methods, "--output", str(output / f"kernels-{kernels}"), "--one-kernel-path"]  # fmt: skip
        print(f"kernel path {kernels}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        started[kernels] = subprocess.Popen(
            command, env=kernel_env(kernels, root, threads), cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        if not args.parallel:  # read as it runs: a JSON line with every curve outgrows a pipe's buffer
            outputs[kernels] = started[kernels].communicate()[0]
    children: dict[str, dict] = {}
    for kernels, child in started.items():
        out = outputs[kernels] if kernels in outputs else child.communicate()[0]
        last = (out.strip().splitlines() or ["{}"])[-1]
        summary = json.loads(last) if last.startswith("{") else {}
        if child.returncode != 0 or "methods" not in summary:
            raise RuntimeError(f"kernel path {kernels}: the continuation failed: {last[-3000:]}")
        children[kernels] = summary
    return _print_continue(args, output, children)


def merged_methods(children: dict[str, dict]) -> dict[str, dict]:
    """Each method's runs over every kernel path and seed: the spread of their final accuracies (`mean`,
    `std`, `min`, `max`), each path's own spread (`by_kernels`), the share of the plateau-to-teacher gap
    closed (each path's gap, averaged), and every run's seed, kernel path, final accuracy and curve."""
    methods: dict[str, dict] = {}
    names = [m for child in children.values() for m in child["methods"] if m]
    for method in dict.fromkeys(names):
        runs: list[dict] = []
        closed: list[float] = []
        by_kernels: dict[str, dict] = {}
        for kernels, child in children.items():
            if method not in child["methods"]:
                continue
            result = child["methods"][method]
            by_kernels[kernels] = spread(result["per_seed"])
            gap = child["teacher"] - child["sft_plateau"]
            closed.extend((final - child["sft_plateau"]) / gap for final in result["per_seed"] if gap > 0)
            for seed, final, curve, wall in zip(
                child["seeds"], result["per_seed"], result["curves"], result["wall_seconds"], strict=True
            ):
                runs.append(
                    {"seed": seed, "kernels": kernels, "final": final, "wall_s": wall, "curve": curve}
                )
        merged = spread([run["final"] for run in runs])
        del merged["per_seed"]
        methods[method] = {
            **merged,
            "gap_closed": sum(closed) / len(closed) if closed else None,
            "seeds": sorted({run["seed"] for run in runs}),
            "kernels": list(by_kernels),
            "by_kernels": by_kernels,
            "runs": runs,
        }
    return methods


def _print_continue(args: argparse.Namespace, output: Path, children: dict[str, dict]) -> int:
    """The continuation's table (each method over every seed and kernel path), its plot and its JSON line."""
    from distillery_runtime.observe.report import plot

    methods = merged_methods(children)
    curves = {
        method: mean_curve([Curve(method, points=[tuple(p) for p in run["curve"]]) for run in r["runs"]])
        for method, r in methods.items()
    }
    first = next(iter(children.values()))
    figure = plot(
        output / "accuracy.png",
        f"{args.task}: from the SFT plateau, {args.steps} steps of {first['prompts_per_step']} prompts "
        f"(seeds {args.seeds} x kernel paths {args.kernels})",
        "held-out accuracy (mean over seeds and kernel paths)",
        curves,
        {f"teacher ({k})": c["teacher"] for k, c in children.items()}
        | {f"SFT plateau ({k})": c["sft_plateau"] for k, c in children.items()},
    )
    print(f"\nSynthetic {args.task}, {args.steps} steps, seeds {args.seeds}, kernel paths {args.kernels}")
    for kernels, child in children.items():
        print(f"  {kernels} ({child['cpu_capability']}): teacher {child['teacher']:.3f}, SFT plateau "
              f"{child['sft_plateau']:.3f}")  # fmt: skip
    print(f"{'method':<26} {'mean':>6} {'min':>6} {'max':>6} {'gap closed':>10}  per kernel path (min-max)")
    for method, r in methods.items():
        closed = f"{r['gap_closed']:.0%}" if r["gap_closed"] is not None else "-"
        paths = ", ".join(f"{k} {v['min']:.2f}-{v['max']:.2f}" for k, v in r["by_kernels"].items())
        print(f"{method:<26} {r['mean']:>6.3f} {r['min']:>6.3f} {r['max']:>6.3f} {closed:>10}  {paths}")
    if figure:
        print(f"plot: {figure}")
    print(json.dumps({
        "bench": "quality", "protocol": "continue", "task": f"synthetic://{args.task}", **provenance(),
        "steps": args.steps, "prompts_per_step": first["prompts_per_step"], "seeds": args.seeds,
        "kernels": args.kernels,
        "by_kernels": {k: {key: c[key] for key in ("cpu_capability", "threads", "teacher", "sft_plateau", "sft_plateau_steps",
                                                  "task_dir", "load_average_at_end")}
                       for k, c in children.items()},
        "methods": methods,
        **({"episodes": {k: c["episodes"] for k, c in children.items() if "episodes" in c}}),
    }))  # fmt: skip
    return 0


def run_continue_here(args: argparse.Namespace, output: Path) -> int:
    """The continuation protocol (module docstring) on this process's kernel path: every method and seed
    from the task's SFT checkpoint, prepared on this path (and cached) first if needed."""
    from distillery_runtime.observe.report import plot
    from distillery_runtime.tasks import resolve_uri

    example_file = example_path(args.task)
    example = yaml.safe_load(example_file.read_text())["spec"]
    max_new_tokens = example["student"]["rollout"]["maxNewTokens"]
    task_dir = resolve_uri(f"synthetic://{args.task}/student").parent
    evals = read_jsonl(task_dir / "eval.jsonl")
    teacher_acc = task_accuracy(args.task, task_dir / "teacher", evals, max_new_tokens)
    plateau = task_accuracy(args.task, task_dir / "student", evals, max_new_tokens)
    plateau_sft_steps = json.loads((task_dir / "manifest.json").read_text())["student"]["sft_steps"]
    batch = example["schedule"]["promptsPerStep"]
    lr = example["student"]["optimizer"]["lr"]
    warmup = example["student"]["optimizer"].get("warmupSteps", 0)
    min_lr_ratio = example["student"]["optimizer"].get("minLrRatio", 0.0)  # the API's default: decay to 0
    seeds = args.seeds
    chosen = args.methods
    curves: dict[str, list[Curve]] = {method: [] for method in (SFT, *CONTINUE) if method in chosen}
    episodes: dict[str, list[list[dict]]] = {method: [] for method in CONTINUE if method in chosen}
    """Each on-policy run's metrics.jsonl (an episode task's report: turns and tool errors over steps)."""
    for seed in seeds:
        for method, loss in CONTINUE.items():
            if method not in chosen:
                continue
            print(
                f"seed {seed}, {method}: distillery run, {args.steps} steps ...", file=sys.stderr, flush=True
            )
            name = f"continue-{method.replace('.', '')}-s{seed}"
            doc = job_manifest(
                example_file, loss, steps=args.steps, eval_every=args.eval_every, name=name, seed=seed,
                min_lr_ratio=None,
            )  # fmt: skip
            curves[method].append(run_distillery(doc, output / f"seed{seed}" / name, method))
            episodes[method].append(read_jsonl(output / f"seed{seed}" / name / "run" / "metrics.jsonl"))
        if SFT not in chosen:
            continue
        print(f"seed {seed}, more SFT: {args.steps} steps ...", file=sys.stderr, flush=True)
        curves[SFT].append(
            run_sft(
                task_dir,
                task=args.task,
                max_new_tokens=max_new_tokens,
                steps=args.steps,
                batch=batch,
                lr=lr,
                warmup=warmup,
                eval_every=args.eval_every,
                target=2.0,  # never stops early: the same budget as every other method
                seed=seed,
                min_lr_ratio=min_lr_ratio,  # and the same schedule
            )
        )

    gap = teacher_acc - plateau
    methods = {}
    for method, runs in curves.items():
        result = spread([run.points[-1][1] for run in runs])
        result["gap_closed"] = (result["mean"] - plateau) / gap if gap > 0 else None
        result["wall_seconds"] = [round(run.wall_s, 1) for run in runs]
        result["curves"] = [run.points for run in runs]
        methods[method] = result
    plot(  # this kernel path's own plot; the parent draws every path's mean
        output / "accuracy.png",
        f"{args.task}: from the SFT plateau, {args.steps} steps of {batch} prompts ({len(seeds)} seed(s))",
        "held-out accuracy (mean over seeds)",
        {method: mean_curve(runs) for method, runs in curves.items()},
        {"teacher": teacher_acc, "SFT plateau": plateau},
    )

    episode_curves = episode_summary(episodes) if args.task in EPISODE_TASKS else {}
    if episode_curves:
        for key, label in (("turns_mean", "turns per episode"), ("tool_errors", "tool errors per step")):
            plot(
                output / f"episodes_{key}.png",
                f"{args.task}: {label} (mean over seeds)",
                label,
                {m: (c["steps"], c[key]) for m, c in episode_curves.items()},
                {},
            )

    import torch

    print(
        f"\nSynthetic {args.task}: {os.cpu_count()} CPU cores (load average {os.getloadavg()[0]:.1f}), kernels "
        f"{torch.backends.cpu.get_cpu_capability()}; teacher {teacher_acc:.3f}; SFT plateau {plateau:.3f} (the "
        f"student after {plateau_sft_steps} SFT steps); then {args.steps} steps of {batch} prompts, lr {lr}, "
        f"seeds {seeds}",
        file=sys.stderr,
    )
    print(json.dumps({
        "bench": "quality", "protocol": "continue", "task": f"synthetic://{args.task}",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
        "task_dir": str(task_dir),
        "cpu_cores": os.cpu_count(), "load_average_at_end": os.getloadavg(), "steps": args.steps,
        "prompts_per_step": batch, "seeds": seeds, "teacher": teacher_acc, "sft_plateau": plateau,
        "sft_plateau_steps": plateau_sft_steps, "methods": methods,
        **({"episodes": episode_curves} if episode_curves else {}),
    }))  # fmt: skip
    return 0


def continue_methods(task: str) -> list[str]:
    """The continuation's on-policy methods for `task`: no off-policy mix for an episode task (its job trains
    on-policy only: a dataset response marks no tool output)."""
    return [
        m
        for m, loss in CONTINUE.items()
        if task not in EPISODE_TASKS or loss.get("onPolicyFraction", 1.0) == 1.0
    ]


def episode_summary(runs: dict[str, list[list[dict]]]) -> dict[str, dict[str, list[float]]]:
    """Per on-policy method, the mean over seeds of each step's turns per episode and tool errors (the
    calculator's `>E;` answers, a step's total)."""
    out: dict[str, dict[str, list[float]]] = {}
    for method, seeds in runs.items():
        by_step: dict[int, list[dict]] = {}
        for records in seeds:
            for r in records:
                if "episode/turns_mean" in r:
                    by_step.setdefault(r["step"], []).append(r)
        if not by_step:
            continue
        steps = sorted(by_step)
        out[method] = {
            "steps": steps,
            "turns_mean": [sum(r["episode/turns_mean"] for r in by_step[s]) / len(by_step[s]) for s in steps],
            "tool_errors": [
                sum(r["episode/tool_errors"] for r in by_step[s]) / len(by_step[s]) for s in steps
            ],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.protocol == "continue":
        args.task = args.task or "worked-sum"
        episode = args.task in EPISODE_TASKS  # the tools example's episodes: evaluated every 20 steps
        # The example's own budget, the one its README line quotes; quick mode half of it (and fewer methods),
        # every seed and kernel path still run.
        budget = yaml.safe_load(example_path(args.task).read_text())["spec"]["schedule"]["steps"]
        args.steps = args.steps or (budget // 2 if args.quick else budget)
        args.eval_every = args.eval_every or (20 if episode else 25)
        args.methods = args.methods or list(
            QUICK_CONTINUE if args.quick else [SFT, *continue_methods(args.task)]
        )
        args.kernels = args.kernels or list(KERNEL_PATHS)
        return run_continue(args, args.output or ROOT / "runs" / f"bench-quality-continue-{args.task}")
    args.task = args.task or "addition"
    args.steps = args.steps or 150
    args.eval_every = args.eval_every or 10
    output = args.output or ROOT / "runs" / (
        "bench-quality" + ("" if args.task == "addition" else f"-{args.task}")
    )

    from distillery_runtime.tasks import resolve_uri
    from distillery_runtime.tasks.measure.evaluate import model_accuracy
    from distillery_runtime.tasks.uri import TASKS as GRADED

    example_file = example_path(args.task)
    example = yaml.safe_load(example_file.read_text())["spec"]
    max_new_tokens = example["student"]["rollout"]["maxNewTokens"]
    task_dir = resolve_uri(f"synthetic://{args.task}/teacher").parent
    evals = read_jsonl(task_dir / "eval.jsonl")
    teacher_acc = model_accuracy(
        task_dir / "teacher", evals, task=GRADED[args.task], max_new_tokens=max_new_tokens
    )
    target = 0.9 * teacher_acc
    steps = args.steps
    batch = example["schedule"]["promptsPerStep"]
    lr = example["student"]["optimizer"]["lr"]
    warmup = example["student"]["optimizer"].get("warmupSteps", 0)
    modes = args.modes or (list(QUICK) if args.quick else list(LOSSES))

    curves: list[Curve] = []
    for mode in modes:
        print(f"on-policy {mode}: distillery run, {steps} steps ...", file=sys.stderr, flush=True)
        doc = job_manifest(
            example_file,
            LOSSES[mode],
            steps=steps,
            eval_every=args.eval_every,
            name=f"quality-{mode.replace('_', '-')}",
        )
        curves.append(run_distillery(doc, output / mode, f"opd {mode}"))
    sft_steps = args.sft_steps or 4 * steps
    print(f"SFT on teacher answers: up to {sft_steps} steps ...", file=sys.stderr, flush=True)
    curves.append(
        run_sft(
            task_dir,
            task=args.task,
            max_new_tokens=max_new_tokens,
            steps=sft_steps,
            batch=batch,
            lr=lr,
            warmup=warmup,
            eval_every=args.eval_every,
            target=target,
        )
    )

    sft_curve = curves[-1]
    for mode, curve in zip(modes, curves, strict=False):
        write_comparison(output / mode, curve, sft_curve, teacher_acc)

    _print_from_start(args.task, curves, teacher_acc, target, batch, lr)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task",
        choices=TASKS,
        default=None,
        help="the bundled synthetic task (addition; continue: worked-sum)",
    )
    parser.add_argument(
        "--protocol",
        choices=("from-start", "continue"),
        default="from-start",
        help="from-start: steps to 90%% of the teacher from the task's weak student; continue: from the SFT plateau",
    )
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="continue: one run per seed")
    parser.add_argument(
        "--methods", nargs="*", choices=[SFT, *CONTINUE], help="continue: the methods to run (default: all)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"from-start: only {', '.join(QUICK)} vs SFT; continue: {', '.join(QUICK_CONTINUE)}, half the steps",
    )
    parser.add_argument(
        "--kernels",
        nargs="*",
        choices=("default", "avx2", "avx512"),
        help=f"continue: the CPU kernel paths to run under (ATEN_CPU_CAPABILITY; default: {' '.join(KERNEL_PATHS)})",
    )
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="continue: run the kernel paths side by side (each run trains on one thread: 2 paths fit 2 cores)",
    )
    parser.add_argument("--one-kernel-path", action="store_true", help=argparse.SUPPRESS)  # a child's own run
    parser.add_argument("--modes", nargs="*", choices=sorted(LOSSES), help="loss modes to run (default: all)")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="on-policy step budget (150; continue: the example's, quick half)",
    )
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT step budget (default: 4x on-policy)")
    parser.add_argument(
        "--eval-every", type=int, default=None, help="steps between evaluations (10; continue: 25, tools 20)"
    )
    parser.add_argument("--output", type=Path, default=None, help="default: runs/bench-quality[-TASK]")
    return parser


def _print_from_start(
    task: str, curves: list[Curve], teacher_acc: float, target: float, batch: int, lr: float
) -> None:
    """The from-start protocol's table of methods, its notes and its JSON line."""
    print(
        f"\nSynthetic {task} (3 digits), {os.cpu_count()} CPU cores (load average {os.getloadavg()[0]:.1f}); teacher held-out accuracy {teacher_acc:.3f}, "
        f"target 90% of it = {target:.3f}; {batch} prompts per step, lr {lr}"
    )
    print(
        f"{'method':<24} {'start acc':>9} {'final acc':>9} {'steps to target':>15} {'train s to target':>17} {'wall s':>8}"
    )
    summary: dict = {}
    for c in curves:
        reached = c.reach(target)
        start_acc, final_acc = c.points[0][1], c.points[-1][1]
        steps_txt = str(reached[0]) if reached else f">{c.points[-1][0]}"
        secs_txt = f"{reached[1]:.1f}" if reached else "-"
        print(
            f"{c.method:<24} {start_acc:>9.3f} {final_acc:>9.3f} {steps_txt:>15} {secs_txt:>17} {c.wall_s:>8.0f}"
        )
        summary[c.method] = {
            "start_accuracy": start_acc, "final_accuracy": final_acc,
            "steps_to_target": reached[0] if reached else None,
            "train_seconds_to_target": reached[1] if reached else None,
            "wall_seconds": round(c.wall_s, 1), "curve": c.points, "note": c.note,
        }  # fmt: skip
    for c in curves:
        if c.note:
            print(f"note: {c.method}: {c.note}")
    sft = summary[curves[-1].method]["steps_to_target"]
    opd_best = min(
        (v["steps_to_target"] for k, v in summary.items() if k.startswith("opd") and v["steps_to_target"]),
        default=None,
    )
    ratio = (sft / opd_best) if sft and opd_best else None
    print(json.dumps({
        "bench": "quality", "task": f"synthetic://{task}", "cpu_cores": os.cpu_count(),
                "load_average_at_end": os.getloadavg(),
        "teacher_accuracy": teacher_acc, "target": target, "prompts_per_step": batch,
        "sft_steps_over_best_opd_steps": ratio, "results": summary,
    }))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(json_main("quality", main))
