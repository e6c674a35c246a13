"""The CPU images, built by docker/build-cpu-images.sh and reused while their sources are unchanged: a stamp
beside the archives holds the hash of everything the Dockerfiles copy or say. The folder is the clone's, or the
one `$DISTILLERY_IMAGES_DIR` names, which `.ci/run` keeps on the machine between runs.

On a clean clone the build takes ~6 minutes, most of it downloads and layer writes, so a session that
will run the node scenarios starts it in the background when collection ends (`start_build`, from
tests/conftest.py) and the scenarios' fixture waits for it (`build_images`): the earlier tests' own waits
on servers and pods hide most of it. In one process the build runs niced, so it takes the cores the tests
leave idle. On xdist workers it does not: the node's scenarios are the first unit handed out
(tests/support/work_groups.py), so their fixture waits on the build at once, and a niced build beside the
other worker's tests held it up 12 minutes (751 s of fixture set-up, 2026-11-29).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "distillery", "operator", "runtime", "cli", "docker")


@dataclass(frozen=True)
class BuiltImage:
    image: str
    archive: Path
    build_seconds: int
    archive_bytes: int


def sources_digest() -> str:
    digest = hashlib.sha256()
    for source in SOURCES:
        path = REPO / source
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            digest.update(str(file.relative_to(REPO)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


_started: dict[Path, Future[list[BuiltImage]]] = {}
_lock = threading.Lock()


def start_build(out: Path) -> Future[list[BuiltImage]]:
    """`build_images(out)` in a background thread (once per session and folder); its result, or error,
    is what a later `build_images(out)` returns, or raises."""
    with _lock:
        if out not in _started:
            future: Future[list[BuiltImage]] = Future()

            def run() -> None:
                try:
                    future.set_result(_build(out, niced="PYTEST_XDIST_WORKER" not in os.environ))
                except BaseException as error:  # handed to the waiting fixture, which fails with it
                    future.set_exception(error)

            threading.Thread(target=run, name="build-cpu-images", daemon=True).start()
            _started[out] = future
        return _started[out]


def build_images(out: Path) -> list[BuiltImage]:
    """The runtime and operator images as docker-archives in `out` (built unless the stamp matches); a
    build `start_build` began is waited for instead of started again."""
    with _lock:
        started = _started.get(out)
    return started.result() if started is not None else _build(out, niced=False)


def _build(out: Path, niced: bool) -> list[BuiltImage]:
    out.mkdir(parents=True, exist_ok=True)
    # Each pytest-xdist worker starts the build when it collects the scenarios: the first holds the lock
    # and builds; the others wait for it and find the stamp fresh.
    with open(out / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(out, niced)


def _build_locked(out: Path, niced: bool) -> list[BuiltImage]:
    stamp, summary = out / "sources.sha256", out / "images.json"
    digest = sources_digest()
    fresh = stamp.exists() and stamp.read_text() == digest and summary.exists()
    if not fresh:
        # buildah's layer cache stays beside the archives (~6 GB): CI builds after each change of the sources,
        # and with the dependency layers cached that took 127 s instead of 571 s here (2026-12-02).
        command = [str(REPO / "docker" / "build-cpu-images.sh"), str(out)]
        result = subprocess.run(
            ["nice", "-n", "10", *command] if niced else command,
            capture_output=True,
            text=True,
            timeout=3000,
        )
        if result.returncode != 0:
            raise RuntimeError(f"image build failed:\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
        stamp.write_text(digest)
    images = json.loads(summary.read_text())["images"]
    return [
        BuiltImage(i["image"], Path(i["archive"]), i["build_seconds"], i["archive_bytes"]) for i in images
    ]
