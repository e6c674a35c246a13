"""Kubernetes memory quantities as bytes and back (pure): what the plan computes and the API server
writes back must be the same strings."""

from __future__ import annotations

import math
import re

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 10**-3, "": 1}
_QUANTITY = re.compile(r"^([0-9.]+(?:[eE][-+]?[0-9]+)?)([A-Za-z]*)$")


def memory_bytes(quantity: str | int) -> int:
    """A Kubernetes memory quantity (`8Gi`, `500M`, `1073741824`) in bytes."""
    match = _QUANTITY.match(str(quantity).strip())
    if not match or match.group(2) not in {**_BINARY, **_DECIMAL}:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    number, suffix = float(match.group(1)), match.group(2)
    return math.ceil(number * {**_BINARY, **_DECIMAL}[suffix])


def canonical_memory(n_bytes: int) -> str:
    """`n_bytes` as the API server writes it back (the largest binary suffix that divides it: `25Gi`, not
    `25600Mi`), so that a live object holds the very string the operator rendered."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if n_bytes % _BINARY[suffix] == 0:
            return f"{n_bytes // _BINARY[suffix]}{suffix}"
    return str(n_bytes)
