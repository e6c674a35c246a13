"""Where prepared synthetic tasks live, and how a preparation is made atomic.

A task is built once into `<root>/synthetic/<task>-<version hash>`, where root is `$DISTILLERY_CACHE`
or `~/.cache/distillery` and the hash covers the recipe, so changing a hyperparameter builds a new
directory instead of reusing stale models. The build writes into a temporary sibling directory that is
renamed into place only when complete: a killed preparation leaves no half cache (just a temporary
directory that the next build removes). A lock file serialises concurrent preparations (the trainer
and a teacher server resolving the same URI at once), so the second waits and reuses the first's work.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

CACHE_ENV = "DISTILLERY_CACHE"
COMPLETE_MARKER = "manifest.json"
PREPARE_THREADS = 2
"""The torch threads every preparation runs with (a recipe's `threads`), whatever the machine's cores: a
float32 reduction's order, and so the trained weights, depend on how many threads share it. 2 is the
thread count of the 2-core machines the earlier caches were built on (torch's default there)."""
HASH_OMITTED_AT = "hash_omitted_at"
"""Field metadata: the value at which a field added to a recipe after its caches were built stays out of the
hash, because at that value the field makes no difference to those caches (`recipe_hash`)."""


def cache_root() -> Path:
    """`$DISTILLERY_CACHE` if set, else `~/.cache/distillery`."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "distillery"


def recipe_hash(recipe: object) -> str:
    """A short stable hash of a (dataclass) recipe's fields.

    A field whose metadata names a `HASH_OMITTED_AT` value is left out while it has that value: the field
    was added to say what earlier builds did implicitly (the thread count they ran with, a bound that only
    matters when the first schedule misses the bar, where those builds failed), so their caches stay valid.
    Any other value is hashed like every other field.
    """
    fields = dataclasses.asdict(recipe)  # type: ignore[call-overload]
    for f in dataclasses.fields(recipe):  # type: ignore[arg-type]
        if HASH_OMITTED_AT in f.metadata and fields[f.name] == f.metadata[HASH_OMITTED_AT]:
            del fields[f.name]
    return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]


def task_dir(task: str, recipe: object, root: Path | None = None) -> Path:
    """The final directory of a prepared task (it may not exist yet)."""
    return (root or cache_root()) / "synthetic" / f"{task}-{recipe_hash(recipe)}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def is_complete(directory: Path) -> bool:
    return (directory / COMPLETE_MARKER).is_file()


def build_once(final: Path, build: Callable[[Path], dict]) -> Path:
    """Run `build(tmp_dir) -> manifest` unless `final` is complete, then move the result into place.

    The manifest is written last, inside the temporary directory, and the rename is atomic on one
    filesystem, so `final` either does not exist or is complete.
    """
    if is_complete(final):
        return final
    with _locked(final.with_name(final.name + ".lock")):
        if is_complete(final):  # another process built it while we waited
            return final
        for stale in final.parent.glob(final.name + ".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # incomplete leftovers from an older layout
            shutil.rmtree(final)
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        tmp.mkdir(parents=True)
        try:
            manifest = build(tmp)
            (tmp / COMPLETE_MARKER).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
