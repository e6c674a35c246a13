"""The repository stays ruff-clean and formatted, and the API, operator, runtime and CLI packages type-check with mypy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_clean() -> None:
    result = _run("ruff", "check", "--quiet", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_formatted() -> None:
    result = _run("ruff", "format", "--check", "--quiet", ".")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_api_operator_runtime_and_cli() -> None:
    result = _run(
        "mypy",
        "--no-error-summary",
        "-p",
        "distillery",
        "-p",
        "distillery_operator",
        "-p",
        "distillery_runtime",
        "-p",
        "distillery_cli",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_operator_does_not_import_ml_stacks() -> None:
    # The operator image has no torch, vLLM or Ray: importing every operator module must not load them.
    code = (
        "import pkgutil, importlib, sys, distillery_operator, distillery\n"
        "for m in pkgutil.walk_packages(distillery_operator.__path__, 'distillery_operator.'):\n"
        "    importlib.import_module(m.name)\n"
        "import distillery_cli.main, distillery.crd, distillery.validation, distillery.runtime_config\n"
        "bad = sorted(n for n in ('torch', 'vllm', 'ray', 'transformers') if n in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"operator imports {result.stdout.strip()}"
