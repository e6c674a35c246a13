"""The preparation cache: built once, named by the recipe, never left half-written."""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from distillery_runtime.tasks.build.cache import build_once, cache_root, is_complete, recipe_hash, task_dir


@dataclass(frozen=True)
class Recipe:
    steps: int = 10
    lr: float = 1e-3


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    assert task_dir("addition", Recipe()).parent == tmp_path / "synthetic"
    monkeypatch.delenv("DISTILLERY_CACHE")
    assert cache_root() == Path.home() / ".cache" / "distillery"


@dataclass(frozen=True)
class Reordered:
    lr: float = 1e-3
    steps: int = 10


def test_the_recipe_names_the_directory():
    # The name is the recipe's fields, sorted, as JSON, hashed: written out here, so a name that changed
    # between versions or processes (CI keeps `$DISTILLERY_CACHE` between runs) fails, not only one that
    # changed within this process.
    expected = hashlib.sha256(b'{"lr":0.001,"steps":10}').hexdigest()[:12]
    assert expected == "56ff70088b19"
    assert recipe_hash(Recipe()) == expected
    assert recipe_hash(Reordered()) == expected  # the fields' values, not their order, name it
    # Any changed field names another directory.
    changed = {
        recipe_hash(Recipe(steps=11)),
        recipe_hash(Recipe(lr=2e-3)),
        recipe_hash(Recipe(steps=11, lr=2e-3)),
    }
    assert expected not in changed and len(changed) == 3
    assert task_dir("addition", Recipe(), Path("/c")) == Path("/c/synthetic/addition-56ff70088b19")


def test_built_once_then_reused(tmp_path):
    calls = []

    def build(out: Path) -> dict:
        calls.append(out)
        (out / "model.bin").write_text("weights")
        return {"ok": True}

    final = tmp_path / "t-1"
    assert build_once(final, build) == final
    assert build_once(final, build) == final
    assert len(calls) == 1 and calls[0] != final  # built elsewhere, then moved into place
    assert (final / "model.bin").read_text() == "weights" and is_complete(final)


def test_a_failed_build_leaves_nothing_and_the_next_one_builds(tmp_path):
    final = tmp_path / "t-1"

    def broken(out: Path) -> dict:
        (out / "half.bin").write_text("x")
        raise KeyboardInterrupt  # what Ctrl-C does in the middle of a preparation

    with pytest.raises(KeyboardInterrupt):
        build_once(final, broken)
    assert not final.exists() and not list(tmp_path.glob("t-1.tmp-*"))

    # A SIGKILLed build leaves its temporary directory behind: the next build removes it.
    (tmp_path / "t-1.tmp-99999").mkdir()
    build_once(final, lambda out: {"n": 1})
    assert is_complete(final) and not list(tmp_path.glob("t-1.tmp-*"))


def _slow_build(final: str, log: str) -> None:
    def build(out: Path) -> dict:
        with open(log, "a") as fh:
            fh.write("built\n")
        time.sleep(0.5)
        return {}

    build_once(Path(final), build)


def test_concurrent_preparations_build_once(tmp_path):
    final, log = tmp_path / "t-1", tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_slow_build, args=(str(final), str(log))) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert log.read_text() == "built\n" and is_complete(final)
