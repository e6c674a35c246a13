"""Test scaffolding: start and stop a local teacher server process (`python -m
distillery_runtime.teachers.server`) for benchmarks and tests: a small eager engine and the environment
for vLLM on CPU, wait for `/health`, stop the whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from distillery.api.spec import STANDALONE_MEMORY_FRACTION
from distillery.plan.env.vllm import vllm_env
from distillery.plan.teachers.engines import EngineSettings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_env(cache: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for vLLM on a CPU machine without a model hub (see VLLM_CPU.md)."""
    env = dict(os.environ if base is None else base)
    env.update(vllm_env(env))
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CACHE_ROOT=str(cache / "vllm"),
        HF_HOME=str(cache / "hf"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        TRITON_CACHE_DIR=str(cache / "triton"),
    )
    return env


def cpu_engine(name: str = "teacher", *, max_model_len: int = 512, max_logprobs: int = 64) -> EngineSettings:
    """The engine of a test or benchmark server: small, eager, on CPU, quiet."""
    return EngineSettings(
        served_model_name=name,
        max_logprobs=max_logprobs,
        max_model_len=max_model_len,
        memory_fraction=STANDALONE_MEMORY_FRACTION,
        tensor_parallel=1,
        dtype="bfloat16",
        extra_args=("--disable-uvicorn-access-log",),
        enforce_eager=True,
        on_gpu=False,
    )


@dataclass
class TeacherServerProcess:
    """A running teacher server (OpenAI API + compact endpoint) at `url`."""

    url: str
    model: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group (front end, engine core, workers), SIGKILL if it lingers."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def start_teacher_server(
    model_dir: str | Path,
    engine: EngineSettings,
    *,
    log_path: str | Path,
    cache: str | Path = ".cache",
    port: int | None = None,
    timeout: float = 240.0,
    env: dict[str, str] | None = None,
) -> TeacherServerProcess:
    """Start the teacher server of `engine` on 127.0.0.1 and return once `/health` answers 200."""
    port = port or free_port()
    address = ["--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    cmd = [sys.executable, "-m", "distillery_runtime.teachers.server", *address, *engine.server_args()]
    log_path = Path(log_path)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env or cpu_env(Path(cache)), start_new_session=True
        )
    server = TeacherServerProcess(f"http://127.0.0.1:{port}", engine.served_model_name, proc, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"teacher server exited with {proc.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(server.url + "/health", timeout=2) as r:
            if r.status == 200:
                return server
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"teacher server not healthy after {timeout:.0f} s:\n{server.log_tail()}")
