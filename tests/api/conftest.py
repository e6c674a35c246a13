"""Fixtures of the API tests: a valid base manifest and the generated CRD's schema."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from distillery.crd import build_crd

BASE: dict[str, Any] = {
    "apiVersion": "distillery.io/v1alpha1",
    "kind": "DistillationJob",
    "metadata": {"name": "base"},
    "spec": {
        "student": {"model": "Qwen/Qwen2.5-0.5B"},
        "teachers": [
            {"name": "math", "model": "Qwen/Qwen2.5-7B", "routes": ["math"]},
            {
                "name": "ext",
                "model": "big",
                "placement": "external",
                "endpoint": "http://t:8000",
                "default": True,
            },
        ],
        "data": {"train": {"path": "/data/train.jsonl"}},
        "loss": {"mode": "forward_kl_topk", "topK": 8},
    },
}


@pytest.fixture
def base_manifest() -> dict[str, Any]:
    return copy.deepcopy(BASE)


@pytest.fixture(scope="session")
def crd_schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
