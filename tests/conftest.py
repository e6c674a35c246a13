"""Session-scoped fixtures shared by every test area.

- `tiny_model_factory` / `tiny_model_dir`: tiny Llama checkpoints built from scratch (no model
  hub here), cached on disk under `.cache/tiny-models/` (or `$DISTILLERY_TEST_CACHE`) keyed by
  their parameters, so later sessions reuse them.
- `vllm_server`: ONE real vLLM server for the whole session, started with Distillery's
  teacher server (`python -m distillery_runtime.teachers.server`), so it serves both the
  OpenAI API and the compact scoring endpoint. Every test that needs a vLLM server uses this
  one. If vLLM cannot start, the tests that need it fail with the server's log (never skip).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DISTILLERY_TEST_CACHE", ROOT / ".cache"))

# The session server's shape: small context and KV cache, eager mode (CPU is scarce).
SERVER_MODEL_NAME = "tiny-teacher"
SERVER_MAX_MODEL_LEN = 512
SERVER_MAX_LOGPROBS = 64


def vllm_env(cache: Path) -> dict[str, str]:
    """Environment for a vLLM process on these CPU machines (VLLM_CPU.md)."""
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(cache / "vllm"),
        HF_HOME=str(cache / "hf"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        TRITON_CACHE_DIR=str(cache / "triton"),
        PYTHONPATH=os.pathsep.join(
            [str(ROOT), str(ROOT / "operator"), str(ROOT / "runtime"), env.get("PYTHONPATH", "")]
        ),
    )
    return env


def build_tiny_model(directory: Path | None = None, **params: object) -> Path:
    """Build (or reuse from the cache) a tiny model; `params` go to `save_tiny_model`."""
    import distillery_runtime.models.tiny as recipe
    from distillery_runtime.models import save_tiny_model

    # the recipe's source is part of the key: changing how models are built invalidates the cache
    source = Path(recipe.__file__).read_bytes()
    key = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode() + source).hexdigest()[:12]
    target = directory or CACHE / "tiny-models" / key
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # build aside and rename: concurrent sessions never see a half-written model
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    save_tiny_model(tmp, **params)  # type: ignore[arg-type]
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another session won the race
    return target


@pytest.fixture(scope="session")
def tiny_model_factory() -> Callable[..., Path]:
    """`factory(**save_tiny_model_params) -> model dir`, cached across sessions."""
    return build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    """The default tiny teacher: vocab 1024, hidden 128, 2 layers, 4 heads, seed 0, bf16."""
    return tiny_model_factory(vocab_size=1024, hidden=128, layers=2, heads=4, seed=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VllmServer:
    """A running teacher server: OpenAI API and compact endpoint at `url`."""

    url: str
    model: str
    model_dir: Path
    max_model_len: int
    max_logprobs: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def start_teacher_server(
    model_dir: Path,
    *,
    name: str,
    max_model_len: int,
    max_logprobs: int,
    log_path: Path,
    port: int | None = None,
    timeout: float = 240.0,
    extra: tuple[str, ...] = (),
) -> VllmServer:
    """Start `python -m distillery_runtime.teachers.server` and wait for `/health`."""
    port = port or free_port()
    cmd = [
        sys.executable, "-m", "distillery_runtime.teachers.server",
        "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", name, "--max-model-len", str(max_model_len),
        "--max-logprobs", str(max_logprobs), "--dtype", "bfloat16", "--enforce-eager",
        "--disable-uvicorn-access-log", *extra,
    ]  # fmt: skip
    log = log_path.open("wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=vllm_env(CACHE), start_new_session=True
    )
    server = VllmServer(
        f"http://127.0.0.1:{port}", name, model_dir, max_model_len, max_logprobs, proc, log_path
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"teacher server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    stop_server(server)
    raise RuntimeError(f"teacher server not healthy after {timeout:.0f} s:\n{server.log_tail()}")


def stop_server(server: VllmServer) -> None:
    """SIGTERM the server's process group (front end, engine core, workers), then SIGKILL."""
    if server.process.poll() is None:
        try:
            os.killpg(server.process.pid, signal.SIGTERM)
            server.process.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The session's one real vLLM teacher server (OpenAI API + compact scoring endpoint)."""
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    server = start_teacher_server(
        tiny_model_dir,
        name=SERVER_MODEL_NAME,
        max_model_len=SERVER_MAX_MODEL_LEN,
        max_logprobs=SERVER_MAX_LOGPROBS,
        log_path=log_path,
    )
    try:
        yield server
    finally:
        stop_server(server)
