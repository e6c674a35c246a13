"""Import a bench script (`bench/NAME.py`) as a module, for the tests of its pure parts: the scripts import
their own folder's `_common` as a top-level module, so bench/ is on sys.path while the script loads."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """`bench/<name>.py`, imported (cached by Python after the first import)."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
