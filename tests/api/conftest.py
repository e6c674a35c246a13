"""Fixtures of the API tests: a valid base manifest (tests/api/corpus.py) and the generated CRD's schema."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from api.corpus import BASE

from distillery.crd import build_crd


@pytest.fixture
def base_manifest() -> dict[str, Any]:
    return copy.deepcopy(BASE)


@pytest.fixture(scope="session")
def crd_schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
