"""Start-up benchmark: seconds from `distillery run` to its first training step, concurrent vs sequential.

    nice -n 19 python bench/startup.py --rounds 3

Each round runs the same local job twice, once per start-up order (`runtime/distillery_runtime/run/startup.py`):
concurrent (the default: teacher servers spawned first and booting while the job loads and then Ray
starts, the rollout engine and trainer started while the teachers finish booting) and sequential (`DISTILLERY_SEQUENTIAL_STARTUP=1`:
load the job, then spawn the teachers, then start Ray, then the actors: the order before issue 18).
The two alternate so that a busy machine slows both alike. Times are read from the run's own
`start-up:` line (seconds since the process was created); "first step" includes the step-0 evaluation
and one training step, which both orders do identically.

The job is examples/local-addition.yaml with `--steps 1` and, unless `--manifest` names another, its
models replaced by untrained ones of the same shape (the addition tokenizer, hidden 128, 2 layers) and
64 train/eval rows: start-up does not depend on the weights, and this needs no task preparation.
The last line is a JSON summary (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _common import json_main  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "local-addition.yaml"
MODES = ("sequential", "concurrent")
PHASES = ("job loaded", "ray", "teachers ready", "components ready", "first step")


def _paths() -> None:
    for sub in ("", "operator", "runtime", "cli"):
        path = str(ROOT / sub) if sub else str(ROOT)
        if path not in sys.path:
            sys.path.insert(0, path)


def untrained_job(directory: Path) -> Path:
    """The example's manifest pointing at untrained models of the task's shape and 64 rows of data."""
    _paths()
    import orjson
    from distillery_runtime.tasks.build.prepare import AdditionRecipe, _llama
    from distillery_runtime.tasks.build.tokenizer import build_char_tokenizer
    from distillery_runtime.tasks.problems.addition import ALPHABET, sample_problems

    recipe = AdditionRecipe()
    tokenizer = build_char_tokenizer(ALPHABET)
    for seed, role in enumerate(("teacher", "student")):
        model = _llama(tokenizer, recipe.student, seed=seed, max_positions=recipe.max_positions)
        model.save_pretrained(directory / role, safe_serialization=True)  # float32, like the task's
        tokenizer.save_pretrained(directory / role)
    for name, held_out in (("train", False), ("eval", True)):
        rows = [p.row() for p in sample_problems(64, digits=3, seed=7, held_out=held_out)]
        (directory / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["student"]["model"] = str(directory / "student")
    job["spec"]["teachers"][0]["model"] = str(directory / "teacher")
    job["spec"]["data"]["train"]["path"] = str(directory / "train.jsonl")
    job["spec"]["data"]["eval"]["path"] = str(directory / "eval.jsonl")
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def run_once(manifest: Path, mode: str, out: Path) -> dict[str, float]:
    """One `distillery run --steps 1`; its start-up marks plus the command's own wall time."""
    _paths()
    from distillery_runtime.run.startup import SEQUENTIAL_ENV, parse_line

    env = {**os.environ, SEQUENTIAL_ENV: "1" if mode == "sequential" else "0"}
    env["PYTHONPATH"] = os.pathsep.join(str(ROOT / sub) for sub in ("", "operator", "runtime", "cli"))
    command = [sys.executable, "-m", "distillery_cli", "run", str(manifest), "--steps", "1"]
    command += ["--no-progress", "--output", str(out), "--overwrite"]
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, check=False)
    wall = time.monotonic() - started
    marks = parse_line(done.stdout)
    if done.returncode != 0 or marks is None:
        raise RuntimeError(
            f"{mode} run failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return {**marks, "command wall": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--manifest", type=Path, help="a local job to start instead of the untrained example")
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        manifest = args.manifest or untrained_job(Path(tmp))
        for round_ in range(args.rounds):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                marks = run_once(manifest, mode, Path(tmp) / f"run-{mode}")
                results[mode].append(marks)
                print(f"round {round_ + 1} {mode}: {marks}", flush=True)
    medians = {
        mode: {k: statistics.median(r.get(k, float("nan")) for r in runs) for k in (*PHASES, "command wall")}
        for mode, runs in results.items()
    }
    print(f"\nmedian of {args.rounds} rounds, seconds since the process started (nproc {os.cpu_count()})")
    print(f"| phase | {' | '.join(MODES)} | ratio |")
    print("|---|---|---|---|")
    for phase in (*PHASES, "command wall"):
        seq, con = medians["sequential"][phase], medians["concurrent"][phase]
        print(f"| {phase} | {seq:.1f} | {con:.1f} | {seq / con:.2f}x |")
    speedup = medians["sequential"]["components ready"] / medians["concurrent"]["components ready"]
    summary = {
        "bench": "startup",
        "rounds": args.rounds,
        "medians": medians,
        "components_ready_speedup": speedup,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(json_main("startup", main))
