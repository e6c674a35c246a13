"""The CPU images, built once per CI run (docker/build-cpu-images.sh) and reused while their sources are
unchanged: a stamp beside the archives holds the hash of everything the Dockerfiles copy or say."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
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


def build_images(out: Path) -> list[BuiltImage]:
    """The runtime and operator images as docker-archives in `out` (built unless the stamp matches)."""
    stamp, summary = out / "sources.sha256", out / "images.json"
    digest = sources_digest()
    fresh = stamp.exists() and stamp.read_text() == digest and summary.exists()
    if not fresh:
        # A CI machine builds once: the layer cache would only take disk (~20 GB) the node needs.
        env = {**os.environ, "KEEP_STORAGE": "0"} if os.environ.get("CI") else None
        result = subprocess.run(
            [str(REPO / "docker" / "build-cpu-images.sh"), str(out)],
            capture_output=True,
            text=True,
            timeout=3000,
            env=env,
        )
        if result.returncode != 0:
            raise RuntimeError(f"image build failed:\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
        stamp.write_text(digest)
    images = json.loads(summary.read_text())["images"]
    return [
        BuiltImage(i["image"], Path(i["archive"]), i["build_seconds"], i["archive_bytes"]) for i in images
    ]
