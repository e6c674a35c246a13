"""The bundled local examples, run as a user runs them, their held-out accuracy curves recorded.

Each named example (`examples/NAME.yaml`) runs as `distillery run examples/NAME.yaml -o DIR --no-progress`,
the command README.md and docs/guide/examples.md tell a user to type, with nothing changed. What the docs
quote of it (the start and end accuracy, the steps, the minutes) is then read from its results file
instead of from someone's terminal: `bench/results/examples/DATE-NAME.json` holds the run's eval.jsonl
entries (`eval`), the curve as {step: accuracy} (`curve`), `start_accuracy` / `end_accuracy` /
`end_step`, the teacher's and student's held-out accuracy from the prepared task's manifest (`task`),
the run's wall seconds and whether it prepared the task itself, and the machine, commit and command
(`_common.provenance`). The host's load average before and after is kept as well: on a shared 2-core
machine the minutes say more about the neighbours than about the run, the accuracies do not.

    python bench/examples.py local-addition [local-fibonacci ...] [--output DIR] [--no-write]

The last line is JSON: {"bench": "examples", "runs": [...]} (each run's summary and results path).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _common import json_main, provenance, run_folder  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "examples"
SYNTHETIC = "synthetic://"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def user_command(example: str, out: Path) -> list[str]:
    """The command a user types (the `distillery` script beside this Python, as `.venv/bin/distillery`)."""
    script = Path(sys.executable).parent / "distillery"
    program = [str(script)] if script.is_file() else [sys.executable, "-m", "distillery_cli"]
    return [*program, "run", f"examples/{example}.yaml", "-o", str(out), "--no-progress"]


def relative(path: Path) -> str:
    """`path` as from the checkout's root (as a user in it would type it), else as it is."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def synthetic_tasks(manifest: dict[str, Any]) -> list[str]:
    """The bundled tasks a manifest's models and data come from (`synthetic://TASK/...`)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and value.startswith(SYNTHETIC):
            task = value[len(SYNTHETIC) :].split("/", 1)[0]
            if task not in found:
                found.append(task)

    walk(manifest)
    return found


def task_record(task: str, started: float) -> dict[str, Any]:
    """The prepared task's own record of its models (held-out accuracy of teacher and student) and whether
    this run built it (its manifest written after the run started). Resolving is free once prepared: the
    run has just prepared it. Through the tasks package's public `resolve_uri`, as the runtime's own
    `teacher_accuracy` reads it, not the module that builds a task."""
    from distillery_runtime.tasks import resolve_uri

    directory = resolve_uri(f"{SYNTHETIC}{task}/teacher").parent
    manifest_file = directory / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    return {
        "directory": directory.name,
        "prepared_by_this_run": manifest_file.stat().st_mtime >= started,
        "prepare_seconds": manifest.get("seconds"),
        **{
            role: {k: manifest[role].get(k) for k in ("parameters", "eval_accuracy", "sft_steps")}
            for role in ("teacher", "student")
            if isinstance(manifest.get(role), dict)
        },
    }


def changed_files() -> list[str]:
    """The tracked files that differ from the commit (`commit` ends in +dirty then): other work in the same
    checkout, named so that a reader can tell whether it could have touched the run."""
    proc = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    return [line[3:] for line in proc.stdout.splitlines() if line.strip()]


def run_example(example: str, base: Path) -> dict[str, Any]:
    """Run one example as a user does; its record (see the module)."""
    manifest = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    out = run_folder(base / example) / "run"
    command = user_command(example, out)
    load_before = os.getloadavg()
    started = time.time()
    proc = subprocess.run(command, cwd=ROOT, check=False)
    seconds = time.time() - started
    evals = read_jsonl(out / "eval.jsonl")
    graded = [e for e in evals if e.get("eval_accuracy") is not None]
    curve = {str(e["step"]): e["eval_accuracy"] for e in graded}
    record: dict[str, Any] = {
        "bench": "examples",
        "example": example,
        "manifest": f"examples/{example}.yaml",
        "steps": manifest["spec"]["schedule"]["steps"],
        "exit_code": proc.returncode,
        "run_command": " ".join(["distillery", *command[-5:-2], relative(out), command[-1]]),  # as typed
        "seconds": round(seconds, 1),
        "niceness": os.nice(0),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "curve": curve,
        "start_accuracy": graded[0]["eval_accuracy"] if graded else None,
        "end_accuracy": graded[-1]["eval_accuracy"] if graded else None,
        "end_step": graded[-1]["step"] if graded else None,
        "task_cache": os.environ.get("DISTILLERY_CACHE"),  # CI's (.ci/run) when run as the docs say
        "task": {task: task_record(task, started) for task in synthetic_tasks(manifest)},
        "eval": evals,
        **provenance(),
        "changed_files": changed_files(),
    }
    return record


def write(record: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{datetime.date.today()}-{record['example']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", nargs="+", help="names in examples/ (local-addition, ...)")
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "bench-examples")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    failed = 0
    for example in args.examples:
        record = run_example(example, args.output)
        ok = record["exit_code"] == 0 and record["end_accuracy"] is not None
        # A failed run is no figure: its record would sit in bench/results/ beside the ones the docs quote.
        path = write(record) if ok and not args.no_write else None
        if path is not None:
            print(f"wrote {path}", file=sys.stderr)
        elif not ok:
            print(f"{example}: failed (exit {record['exit_code']}), nothing written", file=sys.stderr)
        failed += not ok
        curve = " -> ".join(f"{100 * acc:.1f}%" for acc in record["curve"].values())
        print(f"{example}: {curve} ({record['seconds']:.0f} s, exit {record['exit_code']})", flush=True)
        summary = {
            k: record[k] for k in ("example", "exit_code", "seconds", "start_accuracy", "end_accuracy")
        }
        runs.append({**summary, "end_step": record["end_step"], "path": str(path) if path else None})
    print(json.dumps({"bench": "examples", "runs": runs, **provenance()}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(json_main("examples", main))
