"""The prepared chat-math task: a Qwen-like teacher accurate by the gsm8k grader, a weak but non-zero student,
vLLM serving the teacher's chat as transformers does, and `distillery run examples/chat-math.yaml` rising."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.tasks.prepared_checks import run_example, vllm_greedy_accuracy

# Preparation trains both models (~3.5 minutes on 2 cores; more on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def chat_math_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distillery_runtime.tasks.prepare import prepare

    cache = os.environ.get("DISTILLERY_CACHE")
    return prepare("chat-math", root=Path(cache) if cache else tmp_path_factory.mktemp("cache"))


def test_teacher_is_accurate_and_the_student_weak_but_not_zero(chat_math_task):
    manifest = json.loads((chat_math_task / "manifest.json").read_text())
    assert manifest["teacher"]["eval_accuracy"] >= 0.9, manifest
    assert 0.02 <= manifest["student"]["eval_accuracy"] <= 0.4, manifest
    for role in ("teacher", "student"):
        config = json.loads((chat_math_task / role / "config.json").read_text())
        assert config["vocab_size"] == 151936 and config["tie_word_embeddings"], config
        assert manifest[role]["parameters"] < 11_000_000


def test_vllm_serves_the_teachers_chat_as_accurately_as_transformers(chat_math_task):
    manifest = json.loads((chat_math_task / "manifest.json").read_text())
    served = vllm_greedy_accuracy(chat_math_task, "chat_math", rows=128, max_tokens=24, max_model_len=96)
    assert served == pytest.approx(manifest["teacher"]["eval_accuracy"], abs=0.05)


@pytest.mark.xfail(
    reason="measured flat so far (11.3% -> 10.9% in 20 steps): the rise is issue 25's open part"
)
def test_the_chat_math_example_rises_from_a_nonzero_start(chat_math_task, tmp_path):
    # `distillery run examples/chat-math.yaml`: messages rows through Qwen's ChatML template, graded by gsm8k.
    evals = run_example("chat-math.yaml", chat_math_task, tmp_path / "run")
    manifest = json.loads((chat_math_task / "manifest.json").read_text())
    start, final = evals[0], evals[-1]
    assert start["step"] == 0 and start["eval_accuracy"] > 0
    assert start["eval_accuracy"] == pytest.approx(
        manifest["student"]["eval_accuracy"], abs=0.03
    )  # vLLM == HF
    assert final["eval_accuracy"] >= start["eval_accuracy"] + 0.15, evals
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Held-out gsm8k accuracy" in report
