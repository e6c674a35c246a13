"""Turns a model or data location from a spec into a local path the runtime can open.

`synthetic://TASK/NAME` goes to the bundled synthetic tasks (built and cached on first use), plain
paths are used as they are, `pvc://CLAIM/PATH` is where the claim is mounted (`distillery.pvc`), and
other URI schemes (s3://, gs://, ...) are copied to a local cache through fsspec when it is installed.
Hugging Face ids are passed through: transformers and vLLM resolve them themselves.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from distillery import pvc

SYNTHETIC_SCHEME = "synthetic://"


class UnresolvableLocation(ValueError):
    """A location the runtime cannot open, with the reason and what would fix it."""


def cache_dir() -> Path:
    """Where remote files are copied to ($DISTILLERY_CACHE, default ~/.cache/distillery)."""
    return Path(os.environ.get("DISTILLERY_CACHE", Path.home() / ".cache" / "distillery"))


def _mounted_claim_path(location: str) -> str:
    path = pvc.local_path(location)
    if not Path(path).exists():
        raise UnresolvableLocation(
            f"{location}: nothing at {path}. In a cluster the operator mounts the claim there; on another "
            "machine, set DISTILLERY_PVC_ROOT to a directory holding CLAIM/PATH"
        )
    return path


def is_hub_id(location: str) -> bool:
    """A Hugging Face id (`org/name` or `name`): no scheme, not a path, and no folder of that name here."""
    if "://" in location or location.startswith(("/", ".", "~")):
        return False
    return location.count("/") <= 1 and not Path(location).exists()


def resolve_location(location: str) -> str:
    """A local path (or a Hugging Face id, unchanged) for a model or data location."""
    if location.startswith(SYNTHETIC_SCHEME):
        from distillery_runtime.tasks import resolve_uri

        return str(resolve_uri(location))
    if "://" not in location:
        return location
    scheme = location.split("://", 1)[0]
    if scheme in {"file"}:
        return location[len("file://") :]
    if scheme == "pvc":
        return _mounted_claim_path(location)
    return str(_fetch_with_fsspec(location))


def _fetch_with_fsspec(uri: str) -> Path:
    try:
        import fsspec
    except ImportError as error:  # pragma: no cover - fsspec ships with the runtime extra's deps
        raise UnresolvableLocation(f"{uri}: reading this scheme needs fsspec (pip install fsspec)") from error
    target = cache_dir() / "remote" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    done = target / ".complete"
    if done.exists():
        return target / Path(uri.rstrip("/")).name
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as error:
        raise UnresolvableLocation(
            f"{uri}: no fsspec filesystem for this scheme ({error}); install its fsspec plugin (s3fs, gcsfs, ...)"
        ) from error
    target.mkdir(parents=True, exist_ok=True)
    local = target / Path(uri.rstrip("/")).name
    fs.get(path, str(local), recursive=fs.isdir(path))
    done.touch()
    return local
