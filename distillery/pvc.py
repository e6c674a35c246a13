"""`pvc://CLAIM/PATH` locations: a model or dataset on a PersistentVolumeClaim of the job's namespace.

The operator mounts each claim a job names read-only at `MOUNT_ROOT/CLAIM` in the pods that read it (the
Ray head and workers; a standalone teacher's Deployment for its own model), and the runtime opens
`MOUNT_ROOT/CLAIM/PATH`. Outside a cluster, `$DISTILLERY_PVC_ROOT` says where the claims' files are, so
the same manifest runs locally. Shared by the operator and the runtime: no heavy imports.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable

SCHEME = "pvc://"
MOUNT_ROOT = "/mnt/distillery/pvc"
"""Where the operator mounts the claims, and where the runtime looks unless $DISTILLERY_PVC_ROOT says."""
PATTERN = "^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/.+$"
"""pvc://CLAIM/PATH: CLAIM is a PersistentVolumeClaim name (a DNS subdomain), PATH a non-empty path."""


def is_pvc(location: str | None) -> bool:
    return location is not None and location.startswith(SCHEME)


def is_valid(location: str) -> bool:
    """Not a pvc:// location, or a well-formed one (matched whole, as the API server's RE2 does: Python's `$`
    would also match before a trailing newline)."""
    return not is_pvc(location) or re.fullmatch(PATTERN, location) is not None


def claim_of(location: str) -> str:
    return location[len(SCHEME) :].split("/", 1)[0]


def mounted_path(location: str, root: str = MOUNT_ROOT) -> str:
    """Where the file of `pvc://CLAIM/PATH` is in a pod that mounts CLAIM under `root`."""
    claim, path = location[len(SCHEME) :].split("/", 1)
    return f"{root.rstrip('/')}/{claim}/{path.lstrip('/')}"


def local_path(location: str) -> str:
    """The path the runtime opens: under $DISTILLERY_PVC_ROOT if set, else where the operator mounts."""
    return mounted_path(location, os.environ.get("DISTILLERY_PVC_ROOT", MOUNT_ROOT))


def claims(locations: Iterable[str | None]) -> list[str]:
    """The distinct claims named by `locations`, sorted (so rendered objects are stable)."""
    return sorted({claim_of(loc) for loc in locations if loc is not None and is_pvc(loc)})


def volume_name(claim: str) -> str:
    """A pod volume name (a DNS label of at most 63 characters) for a claim name of up to 253."""
    if "." not in claim and len(claim) <= 59:
        return f"pvc-{claim}"
    # Dots are not allowed, and replacing them could make two claims one name: a hash keeps them apart.
    stem = claim[:40].replace(".", "-").rstrip("-")
    return f"pvc-{stem}-{hashlib.sha256(claim.encode()).hexdigest()[:10]}"
