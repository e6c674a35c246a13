"""`python -m distillery_runtime.prestop`: the Ray head pod's preStop hook.

When the head pod is deleted or evicted, the kubelet signals only the container's PID 1, which in a
KubeRay pod is the `bash -lc "...; ray start --block"` wrapper: as PID 1, bash ignores SIGTERM, and the
driver (`distillery run`, a child of Ray's job supervisor) would be SIGKILLed at the end of the grace
period with its step's work lost. The hook runs first: it sends SIGTERM to the driver, which finishes
(or abandons) its step, saves a checkpoint and exits, and waits for it within the pod's
terminationGracePeriodSeconds; then it stops Ray, so the pod ends at once instead of at the deadline.
The retry (spec.backoffLimit) resumes from that checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from distillery.runtime_config import CONFIG_KEY, CONFIG_MOUNT_DIR

CONFIG = f"{CONFIG_MOUNT_DIR}/{CONFIG_KEY}"
"""The runtime config the RayJob's entrypoint runs: `distillery run CONFIG`."""


def is_driver(argv: Sequence[str], config: str = CONFIG) -> bool:
    """`distillery run CONFIG`, however it was started (console script or -m)."""
    words = [Path(a).name for a in argv]
    if "run" not in words:
        return False
    at = words.index("run")
    launcher = "distillery" in words[:at] or any(a == "distillery_cli" for a in argv[:at])
    return launcher and config in argv[at + 1 :]


def driver_pids(config: str = CONFIG, proc: Path = Path("/proc")) -> list[int]:
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if is_driver([a.decode(errors="replace") for a in argv if a], config):
            pids.append(int(entry.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def stop_driver(timeout: float, config: str = CONFIG, proc: Path = Path("/proc")) -> tuple[list[int], bool]:
    """SIGTERM to every driver, then wait until they are gone; (the pids, whether they all exited)."""
    pids = driver_pids(config, proc)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # gone meanwhile
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return pids, False
        time.sleep(0.5)
    return pids, True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, required=True, help="seconds to wait for the driver")
    parser.add_argument("--config", default=CONFIG, help="the driver's runtime config (default: %(default)s)")
    parser.add_argument("--no-ray-stop", action="store_true", help="leave Ray running afterwards")
    args = parser.parse_args(argv)
    pids, done = stop_driver(args.timeout, args.config)
    print(
        f"prestop: driver {pids or 'not running'}: {'stopped' if done else 'still running at the deadline'}"
    )
    if not args.no_ray_stop:
        subprocess.run(["ray", "stop", "--force"], check=False)
    return 0 if done else 1


if __name__ == "__main__":
    raise SystemExit(main())
