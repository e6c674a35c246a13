"""Fixtures of the real-control-plane tests (the envtest way).

One control plane per test session (`control_plane`), the chart installed on it once (`installation`),
and a fresh namespace per test (`namespace`, with the claims the examples name). The binaries come from
`KUBEBUILDER_ASSETS`; without it these tests skip with that reason, except in CI (`CI=true`), where a
missing control plane fails the run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from control_plane import ControlPlane, MissingAssets, assets_dir
from harness import Installation, add_example_claims, install, temporary_namespace


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        assets = assets_dir()
    except MissingAssets as error:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the real control plane: {error}", pytrace=False)
        pytest.skip(f"no control plane: {error}")
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"), assets)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def installation(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Installation:
    return install(control_plane, tmp_path_factory.mktemp("installation"))


@pytest.fixture
def namespace(installation: Installation) -> Iterator[str]:
    with temporary_namespace(installation, "t") as name:
        add_example_claims(installation, name)
        yield name
