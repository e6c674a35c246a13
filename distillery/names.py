"""Deterministic Kubernetes names for a job's children: DNS-1123 labels of at most 63 characters, and
DNS-1035 labels (a leading letter) for the kinds that need them (Services, RayJobs)."""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 63


def child_name(job_name: str, *parts: str) -> str:
    """`<job>-<part>-...`; when too long, the job name is cut and a stable hash of the full name appended.

    The same inputs always give the same name, and two different long names never collide on the cut
    prefix alone, so an operator restarted at any point finds the children it created before.
    """
    full = "-".join((job_name, *parts))
    if len(full) <= MAX_NAME and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", full):
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    suffix = _clean("-".join(parts))
    head_budget = MAX_NAME - len(digest) - len(suffix) - 2
    head = _clean(job_name)[: max(head_budget, 0)].strip("-")
    name = "-".join(p for p in (head, suffix, digest) if p)
    return name if len(name) <= MAX_NAME else f"{_clean(full)[: MAX_NAME - 9].strip('-')}-{digest}"


def _clean(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def shorten(name: str, max_len: int) -> str:
    """`name` if it fits, else a cut of it plus a stable 8-character hash of the whole name."""
    if len(name) <= max_len:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: max_len - 9].rstrip('-.')}-{digest}"


def dns1035(name: str) -> str:
    """A DNS-1123 label made a DNS-1035 label: Services and RayJobs must start with a letter."""
    return name if name[:1].isalpha() else shorten(f"d{name}", MAX_NAME)
