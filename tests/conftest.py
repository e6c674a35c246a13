"""Session-scoped fixtures shared by every test area.

- `tiny_model_factory` / `tiny_model_dir`: tiny Llama checkpoints built from scratch (no model
  hub here), cached on disk under `.cache/tiny-models/` (or `$DISTILLERY_TEST_CACHE`) keyed by
  their parameters, so later sessions reuse them.
- `tiny_qwen_factory`: the same for tiny Qwen2.5-like and Qwen3-like models (Qwen's real vocabulary).
- `vllm_server`: ONE real vLLM server for the whole session, started with Distillery's
  teacher server (`python -m distillery_runtime.teachers.server`), so it serves both the
  OpenAI API and the compact scoring endpoint. Every test that needs a vLLM server uses this
  one. If vLLM cannot start, the tests that need it fail with the server's log (never skip).

The suite runs on two pytest-xdist workers (`-n 2 --dist loadgroup`, pyproject.toml): most of its time is
spent waiting on servers, pods and training runs, and two groups of such waits side by side fill the two
cores one group leaves idle. `pytest_collection_modifyitems` puts the tests that share an expensive session
fixture (the node, the control plane, the vLLM server, the prepared addition task) in one group, so each
starts once, and every other module in a group of its own (its module fixtures start once too); the
longest groups are handed out first, so none is left to run alone at the end.
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

if TYPE_CHECKING:
    from distillery_runtime.testing.teacher_server import TeacherServerProcess

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
    import distillery_runtime.tasks.qwen as recipe
    import distillery_runtime.tasks.qwen_templates as templates

    return _build_cached((recipe, templates), recipe.save_tiny_qwen, None, flavour=flavour, seed=seed)


# A test that uses one of these session fixtures runs in the fixture's group (the first that matches).
SHARED_FIXTURE_GROUPS = {
    "node_cluster": "node",
    "control_plane": "control-plane",
    "vllm_server": "vllm",
    "prepared_task": "addition-task",
}
# The groups handed out first, longest first (minutes each in `--durations`): the two task builds, then
# the node's scenarios (~20 minutes, which also gives the image build started at collection its time).
FIRST_GROUPS = (
    "tests/tasks/test_fibonacci_prepared.py",
    "tests/tasks/test_chat_math_prepared.py",
    "node",
    "vllm",
    "control-plane",
    "addition-task",
    "tests/runtime/test_run.py",
)


def xdist_group(item: pytest.Item) -> str:
    """The work unit a test runs in: its shared fixture's group, else its module."""
    names = set(getattr(item, "fixturenames", ()))
    shared = [group for fixture, group in SHARED_FIXTURE_GROUPS.items() if fixture in names]
    return shared[0] if shared else item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: each test's group as its `xdist_group` mark, and the items in the order the
    groups are handed out (every worker collects, and reorders, the same way)."""
    if not hasattr(config, "workerinput"):
        return  # one process: the order as collected (the image build hides behind the earlier tests)
    groups = {item.nodeid: xdist_group(item) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    rank = {group: index for index, group in enumerate(FIRST_GROUPS)}
    items.sort(key=lambda item: rank.get(groups[item.nodeid], len(FIRST_GROUPS)))


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
def tiny_model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    """The default tiny teacher: vocab 1024, hidden 128, 2 layers, 4 heads, seed 0, bf16."""
    return tiny_model_factory(vocab_size=1024, hidden=128, layers=2, heads=4, seed=0)


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
