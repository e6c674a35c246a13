"""The users' claims the examples name, as the test clusters (emulated and real) are given them."""

from __future__ import annotations

from typing import Any

EXAMPLE_CLAIMS = ("datasets", "distill-checkpoints")
"""The users' claims the examples name (`pvc://datasets/...`, `checkpoint.pvc`). The operator checks that a
job's claims exist (and serve its pods) before it makes them, so the tests' namespaces have them."""


def claim_manifest(name: str, *modes: str) -> dict[str, Any]:
    """A claim of the user's, ReadWriteMany unless `modes` (no StorageClass binds it: nothing needs it
    bound)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": list(modes or ["ReadWriteMany"]),
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
