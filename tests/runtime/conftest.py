"""Fixtures of the runtime tests: a tiny student and teacher sharing one tokenizer, a small addition
dataset, and a manifest writer. Built once per session (a few seconds); every model is float32 so that
CPU runs are deterministic, and heads of 64 dims, the smallest vLLM's CPU attention supports."""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from distillery.plan.env.vllm import vllm_env

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class JobFiles:
    student: Path
    teacher: Path
    train: Path
    eval: Path


def _rows(n: int, seed: int, with_response: bool) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        row = {"prompt": f"{a}+{b}=", "answer": str(a + b), "data_source": "add" if a % 2 else "sub"}
        if with_response:
            row["response"] = str(a + b)
        rows.append(row)
    return rows


@pytest.fixture(scope="session")
def job_files(tmp_path_factory: pytest.TempPathFactory) -> JobFiles:
    import torch
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    root = tmp_path_factory.mktemp("runtime-job")
    texts = [f"{a}+{b}={a + b}" for a in range(100) for b in range(0, 100, 7)]
    # A base model's tokenizer (its alphabet cannot spell a template's roles): prompts are raw text.
    tok = build_tokenizer(texts, 64, full_byte_alphabet=False, chat_template=None)
    student = save_tiny_model(
        root / "student", tokenizer=tok, hidden=128, layers=1, heads=2, seed=1, dtype=torch.float32
    )
    teacher = save_tiny_model(
        root / "teacher", tokenizer=tok, hidden=128, layers=2, heads=2, seed=2, dtype=torch.float32
    )
    for name, n, seed, resp in (("train", 64, 0, True), ("eval", 16, 1, False)):
        with open(root / f"{name}.jsonl", "w") as handle:
            for row in _rows(n, seed, resp):
                handle.write(json.dumps(row) + "\n")
    return JobFiles(student, teacher, root / "train.jsonl", root / "eval.jsonl")


def manifest(files: JobFiles, name: str = "tiny", **overrides: dict) -> dict:
    """A small valid DistillationJob for the tiny models; `overrides` replace top-level spec blocks."""
    spec = {
        "student": {
            "model": str(files.student),
            "precision": "float32",
            "rollout": {"engine": "vllm", "maxNewTokens": 6, "samplesPerPrompt": 2},
            "optimizer": {"lr": 1e-3},
            "pool": {"workers": 1, "gpusPerWorker": 0},
        },
        "teachers": [{"name": "teacher", "model": str(files.teacher), "placement": "colocated"}],
        "data": {
            "train": {"path": str(files.train)},
            "eval": {"path": str(files.eval)},
            "maxPromptTokens": 16,
        },
        "loss": {"mode": "forward_kl_topk", "topK": 4},
        "schedule": {
            "steps": 4,
            "promptsPerStep": 4,
            "microBatchSize": 4,
            "checkpointEvery": 2,
            "evalEvery": 2,
        },
    }
    spec.update(overrides)
    return {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationJob",
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.fixture
def write_manifest(tmp_path: Path) -> Callable[[dict], Path]:
    def write(document: dict) -> Path:
        path = tmp_path / f"{document['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(document))
        return path

    return write


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(ROOT),
            str(ROOT / "operator"),
            str(ROOT / "runtime"),
            str(ROOT / "cli"),
            env.get("PYTHONPATH", ""),
        ]
    )
    env.update(vllm_env(os.environ), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def distillery_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "distillery_cli", "run", *args]


@pytest.fixture(scope="session")
def ray_local():
    """An embedded Ray for the tests that run actors in-process (started once, ~5 s)."""
    import ray
    from distillery_runtime.run.local import init_ray

    init_ray(None)
    yield ray
    ray.shutdown()
