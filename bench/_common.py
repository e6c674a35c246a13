"""What every bench/*.py shares: a folder of the run's own, and a last line of JSON whatever happens.

- `run_folder(base)`: `base/<UTC time>-<pid>`, new for each run, so a second run from the same checkout
  never finds the first's checkpoints (a job refuses to start over another's without --resume or
  --overwrite); `base/latest` points at the newest.
- `distillery_run(doc, folder)`: the manifest written as `folder/job.yaml` and the command of a
  `distillery run` of it into `folder/run`, in this Python.
- `tree_memory(pid, kind)`: the summed RSS or PSS of a process and every process under it;
  `process_memory(pid, kind)` the same by process title (a Ray actor's `ray::Class`), and `TreeMemory` the
  peak of both over a run, sampled on a thread.
- `machine()` and `provenance(argv)`: what a results file records of where and how it was measured: the
  CPU (model, cores, the vector flags that choose torch's kernels), the kernel path torch runs, the commit
  and the command.
- `json_main(name, main)`: runs the bench's `main` and makes sure its stdout ends with one JSON object:
  the bench's own summary when it printed one last, else `{"bench": name, "error": ...}` (an exception,
  a non-zero exit or a run that ended without its summary), so a caller reading the last line always
  gets a result or the reason there is none.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


def run_folder(base: Path) -> Path:
    """A new folder under `base` for this run (`<UTC time>-<pid>`), with `base/latest` pointing at it."""
    folder = base / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=False)
    latest = base / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(folder.name)
    except OSError:
        pass  # a convenience only
    return folder


def distillery_run(doc: dict[str, Any], folder: Path, *flags: str) -> list[str]:
    """The command of `distillery run` of the manifest `doc`, written here as `folder/job.yaml`, into
    `folder/run`, without the progress bar (`flags`: more of its arguments)."""
    import yaml

    manifest = folder / "job.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    run = [sys.executable, "-m", "distillery_cli", "run", str(manifest), "-o", str(folder / "run")]
    return [*run, "--no-progress", *flags]


def _title(process: Any) -> str:
    """A process as `process_memory` groups it: a Ray worker's title up to its method (`ray::TrainerWorker`
    for `ray::TrainerWorker.train_step`, which changes with each call), else its name."""
    command = process.cmdline()
    if command and command[0].startswith("ray::"):
        return command[0].split(".", 1)[0].split(" ", 1)[0]
    return str(process.name())


def process_memory(pid: int, kind: str = "rss") -> dict[str, int]:
    """`kind` (rss, or pss: shared pages split among the processes that map them) of process `pid` and every
    process under it, summed by title (`_title`); empty once it has exited."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out: dict[str, int] = {}
    for process in processes:
        try:
            info = process.memory_full_info() if kind == "pss" else process.memory_info()
            title = _title(process)
        except psutil.Error:
            continue
        out[title] = out.get(title, 0) + int(getattr(info, kind))
    return out


def tree_memory(pid: int, kind: str = "rss") -> int:
    """The summed `kind` (rss, or pss) of process `pid` and every process under it; 0 once it has exited."""
    return sum(process_memory(pid, kind).values())


class TreeMemory:
    """While a process runs: the peak of the summed `kind` of it and everything under it (`tree_memory`),
    and each title's own peak (`process_memory`; each at its own moment), sampled every `every` seconds on
    a thread. `stop()` ends the sampling and returns the peak."""

    def __init__(self, pid: int, kind: str = "pss", every: float = 1.0) -> None:
        import threading

        self.pid, self.kind, self.every = pid, kind, every
        self.peak = 0
        self.peaks: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            now = process_memory(self.pid, self.kind)
            self.peak = max(self.peak, sum(now.values()))
            for title, size in now.items():
                self.peaks[title] = max(self.peaks.get(title, 0), size)
            self.samples += 1
            self._stop.wait(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "avx_vnni")
"""The CPU flags that decide which kernels torch and oneDNN pick: a float32 reduction's order, and so a
learning curve, can differ between two machines that differ here."""


def machine() -> dict[str, Any]:
    """The CPU this process runs on: its model, cores, the vector flags it has of `VECTOR_FLAGS`, and the
    kernel path torch chose (`ATEN_CPU_CAPABILITY` narrows it; `torch.backends.cpu.get_cpu_capability`)."""
    import platform

    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        capability = None
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "flags": [f for f in VECTOR_FLAGS if f in flags],
        "torch_cpu_capability": capability,
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
    }


def commit() -> str | None:
    """The checkout's HEAD commit (with `+dirty` when it has uncommitted changes), None outside git."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """What a results file records of its run: the machine, the commit and the command."""
    command = " ".join(["python", *(argv if argv is not None else sys.argv)])
    return {"machine": machine(), "commit": commit(), "command": command}


def is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


class _LastLine(io.TextIOBase):
    """stdout as written through, remembering its last non-empty line."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last = ""
        self._partial = ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        lines = (self._partial + text).split("\n")
        self._partial = lines[-1]
        for line in reversed(lines):
            if line.strip():
                self.last = line
                break
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()


def error_line(name: str, error: str, **extra: Any) -> str:
    return json.dumps({"bench": name, "error": error, **extra})


def json_main(name: str, main: Callable[[], int | None], *, child_flags: tuple[str, ...] = ()) -> int:
    """`main()`'s exit code, after making sure stdout's last line is a JSON object (see the module).

    A process the bench started of itself (one of `child_flags` among its arguments) reports to its parent
    in its own way and runs `main` as it is.
    """
    if any(flag in sys.argv[1:] for flag in child_flags):
        return int(main() or 0)
    real = sys.stdout
    tracked = _LastLine(real)
    sys.stdout = tracked  # type: ignore[assignment]
    error: str | None = None
    code = 1
    try:
        result = main()
        code = int(result or 0)
        if code:
            error = f"exited {code}"
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if code:
            error = f"exited {code}" + (f": {exit_.code}" if isinstance(exit_.code, str) else "")
        elif not is_json_object(tracked.last):  # --help and the like: nothing measured, nothing failed
            sys.stdout = real
            return 0
    except KeyboardInterrupt:
        code, error = 130, "interrupted"
    except Exception as exc:
        traceback.print_exc()
        code, error = 1, f"{type(exc).__name__}: {exc}"
    finally:
        sys.stdout = real
    if error is not None and is_json_object(tracked.last):
        # The bench's own summary came last: say that it failed after it, keeping what it measured.
        summary = json.loads(tracked.last)
        if "error" not in summary:
            print(json.dumps({**summary, "error": error}), flush=True)
    elif error is not None:
        print(error_line(name, error), flush=True)
    elif not is_json_object(tracked.last):
        print(error_line(name, "ended without its JSON summary"), flush=True)
        code = code or 1
    sys.stdout.flush()
    return code
