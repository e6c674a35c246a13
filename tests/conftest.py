"""Session-scoped fixtures shared by every test area.

- `tiny_model_factory` / `tiny_model_dir`: tiny Llama checkpoints built from scratch (no model
  hub here), cached on disk under `.cache/tiny-models/` (or `$DISTILLERY_TEST_CACHE`) keyed by
  their parameters, so later sessions reuse them.
- `tiny_qwen_factory`: the same for tiny Qwen2.5-like and Qwen3-like models (Qwen's real vocabulary).
- `qwen_tokenizer`: those models' tokenizers, each loaded once per session for the tests that read them.
- `quick_bench_runs`: the first run of a quick bench (bench/*.py) in the session, shared by the tests
  that check it (`support.bench_runs`).
- `vllm_server`: ONE real vLLM server for the whole session, started with Distillery's
  teacher server (`python -m distillery_runtime.teachers.server`), so it serves both the
  OpenAI API and the compact scoring endpoint. Every test that needs a vLLM server uses this
  one. If vLLM cannot start, the tests that need it fail with the server's log (never skip).

The suite runs on two pytest-xdist workers, split into work units by the hooks of
`tests/support/work_groups.py`: the tests that share a server or cluster run on one worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
from support.bench_runs import BenchRun, first_runs

# The split of the suite between its xdist workers (hooks found here by name).
from support.work_groups import (  # noqa: F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_configure_node,
    pytest_terminal_summary,
    pytest_xdist_make_scheduler,
)

if TYPE_CHECKING:
    from distillery_runtime.testing.teacher_server import TeacherServerProcess
    from transformers import PreTrainedTokenizerBase

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DISTILLERY_TEST_CACHE", ROOT / ".cache"))

# The session server's shape: small context and KV cache, eager mode (CPU is scarce).
SERVER_MODEL_NAME = "tiny-teacher"
SERVER_MAX_MODEL_LEN = 512
SERVER_MAX_LOGPROBS = 64


def cpu_env(cache: Path) -> dict[str, str]:
    from distillery_runtime.testing.teacher_server import cpu_env as _cpu_env

    return _cpu_env(cache)


def _build_cached(
    recipes: tuple[ModuleType, ...], save: Callable[..., Path], directory: Path | None, **params: object
) -> Path:
    """`save(dir, **params)` once: later calls (and sessions) reuse the folder, keyed by `params` and the
    source of the modules that build it (changing how models are built invalidates the cache)."""
    source = b"".join(Path(str(recipe.__file__)).read_bytes() for recipe in recipes)
    key = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode() + source).hexdigest()[:12]
    target = directory or CACHE / "tiny-models" / key
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # build aside and rename: concurrent sessions never see a half-written model
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    save(tmp, **params)
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another session won the race
    return target


def build_tiny_model(directory: Path | None = None, **params: object) -> Path:
    """Build (or reuse from the cache) a tiny model; `params` go to `save_tiny_model`."""
    import distillery_runtime.testing.tiny as recipe

    return _build_cached((recipe,), recipe.save_tiny_model, directory, **params)


def build_tiny_qwen(flavour: str = "qwen2.5", seed: int = 0) -> Path:
    """Build (or reuse from the cache) a tiny Qwen-like model (`tasks.qwen`: Qwen's real vocabulary)."""
    import distillery_runtime.tasks.recipes.qwen as recipe
    import distillery_runtime.tasks.recipes.qwen_templates as templates

    return _build_cached((recipe, templates), recipe.save_tiny_qwen, None, flavour=flavour, seed=seed)


@pytest.fixture(scope="session")
def tiny_model_factory() -> Callable[..., Path]:
    """`factory(**save_tiny_model_params) -> model dir`, cached across sessions."""
    return build_tiny_model


@pytest.fixture(scope="session")
def tiny_qwen_factory() -> Callable[..., Path]:
    """`factory(flavour="qwen2.5" | "qwen3", seed=0) -> model dir`: tiny Qwen2 models with Qwen's real
    tokenizer (151,936 embedding rows, ~10M parameters), cached across sessions."""
    return build_tiny_qwen


@pytest.fixture(scope="session")
def qwen_tokenizer(tiny_qwen_factory: Callable[..., Path]) -> Callable[[str], PreTrainedTokenizerBase]:
    """`tokenizer(flavour)`: the tokenizer of `tiny_qwen_factory(flavour)`, loaded once per session (1.3-2.6 s
    each: Qwen's 151,665 tokens), shared by the tests that only read it; a test that changes a tokenizer
    loads its own (`AutoTokenizer.from_pretrained(shared.name_or_path)`)."""
    from transformers import AutoTokenizer

    loaded: dict[str, PreTrainedTokenizerBase] = {}

    def load(flavour: str) -> PreTrainedTokenizerBase:
        if flavour not in loaded:
            loaded[flavour] = AutoTokenizer.from_pretrained(tiny_qwen_factory(flavour))
        return loaded[flavour]

    return load


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    """The default tiny teacher: vocab 1024, hidden 128, 2 layers, 4 heads, seed 0, bf16."""
    return tiny_model_factory(vocab_size=1024, hidden=128, layers=2, heads=4, seed=0)


@pytest.fixture(scope="session")
def quick_bench_runs() -> BenchRun:
    """`run(bench, args)`: bench/`bench`.py's first run with `args` in this session (`support.bench_runs`)."""
    return first_runs()


@dataclass
class VllmServer:
    """The session's teacher server: OpenAI API and compact endpoint at `url`."""

    url: str
    model: str
    model_dir: Path
    max_model_len: int
    max_logprobs: int
    handle: TeacherServerProcess


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The session's one real vLLM teacher server (OpenAI API + compact scoring endpoint)."""
    from distillery_runtime.testing.teacher_server import cpu_engine, start_teacher_server

    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    env = cpu_env(CACHE)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "runtime"), env.get("PYTHONPATH", "")])
    handle = start_teacher_server(
        tiny_model_dir,
        cpu_engine(SERVER_MODEL_NAME, max_model_len=SERVER_MAX_MODEL_LEN, max_logprobs=SERVER_MAX_LOGPROBS),
        log_path=log_path,
        env=env,
    )
    try:
        yield VllmServer(
            handle.url, SERVER_MODEL_NAME, tiny_model_dir, SERVER_MAX_MODEL_LEN, SERVER_MAX_LOGPROBS, handle
        )
    finally:
        handle.stop()
