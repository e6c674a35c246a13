"""The observability tests reuse the operator area's emulator and harness (tests/operator), importable by name."""

from __future__ import annotations

import sys
from pathlib import Path

OPERATOR_TESTS = str(Path(__file__).resolve().parents[1] / "operator")
if OPERATOR_TESTS not in sys.path:
    sys.path.insert(0, OPERATOR_TESTS)
