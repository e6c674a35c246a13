"""What an embedded Ray costs a host while it waits: Ray's defaults against a local run's settings
(`distillery_runtime.run.local.EMBEDDED_RAY_SYSTEM_CONFIG`).

A fresh Python process starts an embedded Ray as `distillery run` does (`local.init_ray`), makes three
idle actors (a local run's trainer, rollout and teacher), waits `--settle` seconds and then measures, over
`--seconds`, the CPU time of every process of the Ray tree (the actors excluded: in a run they compute, here
they only wait), and counts Ray's idle workers and their memory. Each way once a round, alternating, for `--repeats` rounds. On a host whose few cores the run's
processes share, every wake-up of those processes takes a core from a kernel of the step. Prints a table and
writes JSON (bench/results/ray_idle/DATE.json).

    python bench/ray_idle.py [--seconds 30] [--repeats 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _common import json_main  # bench/, the script's own folder

MEASURE = """
import json, sys, time
import psutil, ray
from distillery_runtime.run import local

settle, seconds = float(sys.argv[2]), float(sys.argv[3])
if sys.argv[1] == "defaults":
    local.EMBEDDED_RAY_SYSTEM_CONFIG.clear()
local.init_ray(None)  # as `distillery run` starts it

@ray.remote(num_cpus=0)
class Waiting:
    def pid(self):
        import os
        return os.getpid()

actors = [Waiting.remote() for _ in range(3)]
actor_pids = set(ray.get([actor.pid.remote() for actor in actors]))
time.sleep(settle)
me = psutil.Process()
tree = [me, *(p for p in me.children(recursive=True) if p.pid not in actor_pids)]

def cpu_seconds():
    total = 0.0
    for process in tree:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total

before = cpu_seconds()
time.sleep(seconds)
busy = cpu_seconds() - before
idle = [p for p in me.children(recursive=True) if p.name().startswith("ray::IDLE")]
print(json.dumps({
    "cpu_percent_of_a_core": 100 * busy / seconds,
    "idle_workers": len(idle),
    "idle_workers_rss_mib": sum(p.memory_info().rss for p in idle) / 2**20,
}))
ray.shutdown()
"""
WAYS = {"Ray's defaults": "defaults", "a local run's": "ours"}


def measure(way: str, settle: float, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, way, str(settle), str(seconds)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--settle", type=float, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    runs: list[dict[str, object]] = []
    for round_ in range(args.repeats):
        for name, way in WAYS.items():
            found = measure(way, args.settle, args.seconds)
            runs.append({"round": round_, "settings": name, **found})
            print(
                f"round {round_}  {name:>14}  {found['cpu_percent_of_a_core']:5.1f}% of a core  "
                f"{found['idle_workers']:.0f} idle workers ({found['idle_workers_rss_mib']:.0f} MiB)",
                flush=True,
            )
    print(f"\n{'settings':>14}  {'median % of a core':>18}  {'idle workers':>12}  {'their MiB':>9}")
    summary = {}
    for name in WAYS:
        mine = [run for run in runs if run["settings"] == name]
        summary[name] = {
            key: statistics.median(float(run[key]) for run in mine)  # type: ignore[arg-type]
            for key in ("cpu_percent_of_a_core", "idle_workers", "idle_workers_rss_mib")
        }
        row = summary[name]
        print(
            f"{name:>14}  {row['cpu_percent_of_a_core']:18.1f}  {row['idle_workers']:12.0f}  "
            f"{row['idle_workers_rss_mib']:9.0f}"
        )
    result = {"cpus": os.cpu_count(), "seconds": args.seconds, "runs": runs, "median": summary}
    out = Path(__file__).parent / "results" / "ray_idle" / f"{datetime.date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    print(json.dumps({"bench": "ray_idle", "path": str(out), **result}))


if __name__ == "__main__":
    raise SystemExit(json_main("ray_idle", main))
