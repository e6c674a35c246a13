"""Fixtures of the operator tests: an emulated cluster per test and the real operator running against it.

The harness lives in `operator_harness.py` and `kube_emulator.py` (importable from this directory) so that
other areas (the observability stack, tests/chart/operator_scenario.py) can start the same cluster and
operator and read the request log.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

sys.path.insert(0, str(Path(__file__).parent))

from operator_harness import Cluster, running_cluster, running_operator


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path) as c:
        yield c


@pytest_asyncio.fixture
async def operator(cluster: Cluster) -> AsyncIterator[Cluster]:
    async with running_operator(cluster):
        yield cluster
