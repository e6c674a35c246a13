"""One shared teacher for two jobs vs a dedicated teacher per job, on the same cores, in one invocation.

    python bench/shared_teacher.py --quick      # ~6 min on 2 cores: 80 steps a job, one round of each setup
    python bench/shared_teacher.py              # 200 steps a job, 2 rounds alternating the order

Both setups run the same two jobs at once: examples/local-addition.yaml (the bundled synthetic addition
task, tiny models built locally, vLLM CPU rollout, Ray trainer) with only the teacher's placement, the
step budget and evaluation (off: every second goes to training steps) changed.
- shared (the new path): `distillery serve-teacher` serves one DistillationTeacher of the task's teacher
  (examples/teachers/qwen-7b.yaml's shape, on CPU), and both jobs run with `placement: shared` and
  `--shared-teacher NAME=URL`, as jobs in a cluster reach a DistillationTeacher's Service;
- dedicated (the peer, what a job did before): `placement: standalone`, each run starts its own teacher
  server on loopback.

Measured: teacher replica-seconds per trained step. Shared: the one server's up time (from its launch
until both jobs have exited and it is stopped) over the steps both jobs trained. Dedicated: each job's
teacher is up from the run's launch to its exit (it starts with the run and stops with it), summed over
the two, over the same steps. The ratio shared/dedicated (target <= 0.6), and each job's median step time
(`time/step_s`, the first step excluded: warm-up) in both setups (target: shared within 1.3x of
dedicated). A table, then one JSON line.

Each run writes to a folder of its own, `--output`/<UTC time>-<pid> (`--output`/latest: the newest), so a
second run from the same checkout starts as the first did. The two setups run one after the other, so on
a machine shared with other work each sees its own neighbours: the JSON line records, per setup, how many
cores were busy on average, how many of them were this bench's own processes and how many others', with
the load average at its start and end (`cpu_use`), and when a target is missed beside other work, says
so (`why_not_met`). A failed part still ends the run with the JSON line, its `error` naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml
from _common import json_main, run_folder  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "local-addition.yaml"
TEACHER_NAME = "addition-teacher"
JOBS = ("job-a", "job-b")
RATIO_TARGET = 0.6
STEP_TIME_TARGET = 1.3


@dataclass
class JobRun:
    name: str
    launched: float
    exited: float
    code: int
    step_times: list[float]

    @property
    def steps(self) -> int:
        return len(self.step_times)

    @property
    def median_step_s(self) -> float | None:
        warm = self.step_times[1:] or self.step_times
        return statistics.median(warm) if warm else None


def _busy_cpu_s() -> float:
    """CPU seconds all cores have spent busy since boot."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class CpuMeter:
    """How busy the machine is over a window, and how much of that is this bench's own process tree."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.busy0 = _busy_cpu_s()
        self.load0 = os.getloadavg()[0]
        self.own0 = self._own()
        self.own = dict(self.own0)

    @staticmethod
    def _own() -> dict[int, float]:
        me = psutil.Process()
        out: dict[int, float] = {}
        for process in (me, *me.children(recursive=True)):
            try:
                t = process.cpu_times()
                out[process.pid] = t.user + t.system
            except psutil.Error:
                continue
        return out

    def sample(self) -> None:
        """Note the CPU time of the processes alive now (one that exits keeps its last sample)."""
        self.own.update(self._own())

    def result(self) -> dict[str, float]:
        self.sample()
        seconds = max(time.monotonic() - self.started, 1e-9)
        busy = (_busy_cpu_s() - self.busy0) / seconds
        own = sum(v - self.own0.get(pid, 0.0) for pid, v in self.own.items()) / seconds
        return {
            "seconds": round(seconds, 1),
            "busy_cores": round(busy, 2),
            "own_cores": round(own, 2),
            "others_cores": round(max(busy - own, 0.0), 2),
            "load_start": round(self.load0, 2),
            "load_end": round(os.getloadavg()[0], 2),
        }


@dataclass
class SetupRun:
    setup: str
    jobs: list[JobRun]
    teacher_up_s: list[float]
    """Up time of each teacher server of the setup."""
    machine: dict[str, float]
    """`CpuMeter.result()` over the setup's window."""

    @property
    def steps(self) -> int:
        return sum(j.steps for j in self.jobs)

    @property
    def replica_s_per_step(self) -> float:
        return sum(self.teacher_up_s) / max(self.steps, 1)


def env() -> dict[str, str]:
    paths = [str(ROOT), str(ROOT / "runtime"), str(ROOT / "operator"), str(ROOT / "cli")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def distillery(*args: str) -> list[str]:
    return [sys.executable, "-m", "distillery_cli", *args]


def job_manifest(name: str, placement: str, steps: int) -> dict[str, Any]:
    """The quick-start job with the teacher placed as asked, `steps` steps, no evaluation."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["schedule"].update(steps=steps, evalEvery=0, checkpointEvery=0)
    spec["data"].pop("eval", None)
    teacher = spec["teachers"][0]
    teacher["placement"] = placement
    if placement == "shared":
        teacher["teacherRef"] = {"name": TEACHER_NAME}
        teacher.pop("inference", None)  # the DistillationTeacher's own
    return dict(doc)


def teacher_manifest(job: dict[str, Any]) -> dict[str, Any]:
    """The DistillationTeacher serving the task's teacher as the job's standalone teacher is served: on
    CPU, float32, with the job's topK as maxLogprobs and its sequence length as context."""
    spec = job["spec"]
    context = spec["data"]["maxPromptTokens"] + spec["student"]["rollout"]["maxNewTokens"] + 1
    return {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationTeacher",
        "metadata": {"name": TEACHER_NAME},
        "spec": {
            "model": spec["teachers"][0]["model"],
            "pool": {"gpusPerReplica": 0},
            "maxLogprobs": spec["loss"]["topK"],
            "inference": {"dtype": "float32", "maxModelLen": context},
        },
    }


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def step_times(metrics: Path) -> list[float]:
    if not metrics.exists():
        return []
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [float(r["time/step_s"]) for r in records]


def run_jobs(root: Path, placement: str, steps: int, extra: list[str], meter: CpuMeter) -> list[JobRun]:
    """Both jobs at once; each run's launch and exit times."""
    started: list[tuple[str, float, subprocess.Popen[bytes], Path]] = []
    for name in JOBS:
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(job_manifest(name, placement, steps)))
        out = root / name
        with open(root / f"{name}.log", "wb") as log:
            process = subprocess.Popen(
                distillery("run", str(path), "-o", str(out), "--no-progress", *extra),
                env=env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=root,
            )
        started.append((name, time.monotonic(), process, out))
    runs = []
    pending = {name: (launched, process, out) for name, launched, process, out in started}
    exited: dict[str, tuple[float, int]] = {}
    sampled = time.monotonic()
    while len(exited) < len(pending):
        for name, (_launched, process, _out) in pending.items():
            if name not in exited and process.poll() is not None:
                exited[name] = (time.monotonic(), process.returncode)
        if time.monotonic() - sampled > 2.0:
            meter.sample()
            sampled = time.monotonic()
        time.sleep(0.2)
    for name, (launched, _process, out) in pending.items():
        at, code = exited[name]
        runs.append(JobRun(name, launched, at, code, step_times(out / "metrics.jsonl")))
    return runs


def run_shared(root: Path, steps: int) -> SetupRun:
    root.mkdir(parents=True, exist_ok=True)
    teacher = root / "teacher.yaml"
    teacher.write_text(yaml.safe_dump(teacher_manifest(job_manifest(JOBS[0], "standalone", steps))))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(root / "teacher.log", "wb") as log:
        server = subprocess.Popen(
            distillery("serve-teacher", str(teacher), "--port", str(port)),
            env=env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    launched = time.monotonic()
    meter = CpuMeter()
    try:
        # The jobs start with the server, as jobs do whose DistillationTeacher scales from zero; they wait
        # for it to answer (spec.teacherReadyTimeoutSeconds).
        jobs = run_jobs(root, "shared", steps, ["--shared-teacher", f"{TEACHER_NAME}={url}"], meter)
    finally:
        meter.sample()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    return SetupRun("shared", jobs, [time.monotonic() - launched], meter.result())


def run_dedicated(root: Path, steps: int) -> SetupRun:
    root.mkdir(parents=True, exist_ok=True)
    meter = CpuMeter()
    jobs = run_jobs(root, "standalone", steps, [], meter)
    return SetupRun("dedicated", jobs, [j.exited - j.launched for j in jobs], meter.result())


def prepare_task() -> None:
    """The synthetic task's models and data, built once (cached) before anything is timed."""
    code = "from distillery_runtime.data.uris import resolve_location as r; r('synthetic://addition/teacher')"
    subprocess.run([sys.executable, "-c", code], env=env(), check=True)


BUSY_OTHERS_CORES = 0.25
"""Other processes' average use (cores) over a setup's window above which the bench counts it as run beside
other work."""


def why_not_met(
    machine: dict[str, list[dict[str, float]]], ratio: float, step_ratio: dict[str, float]
) -> str:
    """Why the targets were missed, as far as this run can tell: other work beside a setup, or not."""
    cpus = os.cpu_count() or 1
    others = {s: max(m["others_cores"] for m in runs) for s, runs in machine.items()}
    busy = {s: max(m["busy_cores"] for m in runs) for s, runs in machine.items()}
    missed = [f"replica-s per step ratio {ratio:.2f} > {RATIO_TARGET}"] if ratio > RATIO_TARGET else []
    missed += [
        f"{n} step time {v:.2f}x > {STEP_TIME_TARGET}x" for n, v in step_ratio.items() if v > STEP_TIME_TARGET
    ]
    where = ", ".join(
        f"{s}: {busy[s]:.2f} of {cpus} cores busy, {others[s]:.2f} by other processes" for s in machine
    )
    if any(v > BUSY_OTHERS_CORES for v in others.values()):
        return (
            f"{'; '.join(missed)}, run beside other work ({where}): the setups ran one after the other, each "
            "with its own neighbours, and on a machine with no idle core the jobs, the teacher(s) and the "
            "neighbours take turns, so the targets, measured on an idle machine, do not hold here"
        )
    return f"{'; '.join(missed)} with no other work measured beside it ({where})"


def run_setups(output: Path, steps: int, rounds: int) -> dict[str, list[SetupRun]]:
    """Each setup `rounds` times, the order alternating; RuntimeError naming the jobs of a setup that failed."""
    results: dict[str, list[SetupRun]] = {"shared": [], "dedicated": []}
    for r in range(rounds):
        # Alternate which setup goes first, so that neither always runs on a warmer machine.
        order = ("shared", "dedicated") if r % 2 == 0 else ("dedicated", "shared")
        for setup in order:
            folder = output / f"round-{r}" / setup
            run = run_shared(folder, steps) if setup == "shared" else run_dedicated(folder, steps)
            failed = [j.name for j in run.jobs if j.code != 0]
            if failed:
                raise RuntimeError(f"{setup}: {', '.join(failed)} failed (see {folder})")
            results[setup].append(run)
    return results


def runs_json(results: dict[str, list[SetupRun]]) -> dict[str, list[dict[str, Any]]]:
    """Every run of each setup: its teachers' up time and each job's steps, wall time and median step."""
    return {
        s: [
            {
                "teacher_up_s": run.teacher_up_s,
                "jobs": [
                    {
                        "name": j.name,
                        "steps": j.steps,
                        "wall_s": j.exited - j.launched,
                        "median_step_s": j.median_step_s,
                    }
                    for j in run.jobs
                ],
            }
            for run in runs
        ]
        for s, runs in results.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, one round")
    parser.add_argument("--steps", type=int, default=None, help="steps per job (quick 80, full 200)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of both setups (quick 1, full 2)")
    parser.add_argument(
        "--output",
        type=Path,
        default=ROOT / "runs" / "bench-shared-teacher",
        help="each run: a new folder in it",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON summary here")
    args = parser.parse_args(argv)
    # Enough steps that the jobs' steady state, not only their start-up, is under the teacher's up time.
    steps = args.steps or (80 if args.quick else 200)
    rounds = args.rounds or (1 if args.quick else 2)
    output = run_folder(args.output)
    print(f"writing to {output}", file=sys.stderr, flush=True)
    prepare_task()
    results = run_setups(output, steps, rounds)

    def median(values: list[float]) -> float:
        return statistics.median(values)

    per_step = {s: median([run.replica_s_per_step for run in runs]) for s, runs in results.items()}
    up = {s: median([sum(run.teacher_up_s) for run in runs]) for s, runs in results.items()}
    wall = {s: median([max(j.exited for j in run.jobs) - min(j.launched for j in run.jobs) for run in runs]) for s, runs in results.items()}  # fmt: skip
    step_s = {
        s: {
            name: median([j.median_step_s or 0.0 for run in runs for j in run.jobs if j.name == name])
            for name in JOBS
        }
        for s, runs in results.items()
    }
    ratio = per_step["shared"] / per_step["dedicated"]
    step_ratio = {name: step_s["shared"][name] / step_s["dedicated"][name] for name in JOBS}
    print("| setup | teachers | teacher replica-s | trained steps | replica-s / step | wall s (both jobs) | "
          + " | ".join(f"{n} median step s" for n in JOBS) + " |")  # fmt: skip
    print("|---|---|---|---|---|---|" + "---|" * len(JOBS))
    for s, runs in results.items():
        cells = " | ".join(f"{step_s[s][n]:.2f}" for n in JOBS)
        teachers = len(runs[0].teacher_up_s)
        print(
            f"| {s} | {teachers} | {up[s]:.0f} | {runs[0].steps} | {per_step[s]:.2f} | {wall[s]:.0f} | {cells} |"
        )
    print(
        f"\nshared/dedicated replica-s per step: {ratio:.2f} (target <= {RATIO_TARGET}); "
        + ", ".join(f"{n} step time shared/dedicated {v:.2f}x" for n, v in step_ratio.items())
        + f" (target <= {STEP_TIME_TARGET}x)"
    )
    machine = {s: [run.machine for run in runs] for s, runs in results.items()}
    met = ratio <= RATIO_TARGET and all(v <= STEP_TIME_TARGET for v in step_ratio.values())
    why = None if met else why_not_met(machine, ratio, step_ratio)
    if why:
        print(f"not met: {why}")
    summary = {
        "bench": "shared_teacher",
        "mode": "quick" if args.quick else "full",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at end",
        "steps_per_job": steps,
        "rounds": rounds,
        "teacher_replica_s": up,
        "replica_s_per_step": per_step,
        "wall_s": wall,
        "median_step_s": step_s,
        "replica_s_per_step_ratio": ratio,
        "step_time_ratio": step_ratio,
        "targets": {"replica_s_per_step_ratio": RATIO_TARGET, "step_time_ratio": STEP_TIME_TARGET},
        "met": met,
        "cpus": os.cpu_count(),
        "cpu_use": machine,
        "why_not_met": why,
        "output": str(output),
        "runs": runs_json(results),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(json_main("shared_teacher", main))
