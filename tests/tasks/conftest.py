"""The prepared addition task, built once per session.

Preparation trains real models (a few minutes on 2 cores), so the session shares one. It goes to
`$DISTILLERY_CACHE` when that is set (CI can keep it between runs; the cache is keyed by the recipe,
so a changed recipe still rebuilds), else to a fresh temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def prepared_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distillery_runtime.tasks.build.prepare import prepare_addition

    root = (
        Path(os.environ["DISTILLERY_CACHE"])
        if os.environ.get("DISTILLERY_CACHE")
        else tmp_path_factory.mktemp("cache")
    )
    return prepare_addition(root=root)
