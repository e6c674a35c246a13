"""An embedded Ray's start on a busy host: `ray.init` once, against a local run's start
(`distillery_runtime.run.local.start_embedded_ray`: made again, up to three times, where it timed out).

`--busy` processes spin on the host's cores while a fresh Python process starts an embedded Ray (no
dashboard, as a local run does), once each way, alternating for `--repeats` rounds. Ray's raylet aborts when
its dashboard agent has not written its ports within ~15 s (not configurable), and `ray.init` then fails
"The current node timed out during startup". Each start: OK or FAIL, and its seconds. Prints a table and
writes JSON (bench/results/ray_startup/DATE.json).

    python bench/ray_startup.py [--busy 40] [--repeats 1]
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

from _common import json_main  # bench/, the script's own folder

START = """
import sys, time
began = time.monotonic()
import ray
from distillery_runtime.run.local import start_embedded_ray

start = ray.init if sys.argv[1] == "once" else start_embedded_ray
try:
    start(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    print("OK", round(time.monotonic() - began, 1))
except Exception:
    print("FAIL", round(time.monotonic() - began, 1))
ray.shutdown()
"""
WAYS = {"ray.init once": "once", "a local run's": "retried"}


def start_once(way: str) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", START, way], capture_output=True, text=True, timeout=1200)
    words = (out.stdout.strip().splitlines() or ["FAIL 0"])[-1].split()
    return words[0] == "OK", float(words[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    spinners = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.busy)]
    runs: list[dict[str, object]] = []
    try:
        time.sleep(2)
        for round_ in range(args.repeats):
            for name, way in WAYS.items():
                ok, seconds = start_once(way)
                runs.append({"round": round_, "wait": name, "ok": ok, "seconds": seconds})
                print(f"{name:>14}  {'OK' if ok else 'FAIL':>4}  {seconds:6.1f} s", flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
    result = {"busy": args.busy, "cpus": os.cpu_count(), "runs": runs}
    out = Path(__file__).parent / "results" / "ray_startup" / f"{datetime.date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    print(json.dumps({"bench": "ray_startup", "path": str(out), **result}))


if __name__ == "__main__":
    raise SystemExit(json_main("ray_startup", main))
