"""The loop grades with the job's grader (data.grader, decided by the plan): held-out accuracy, eval.jsonl
and the task reward. No Ray: the loop is built for real on the tiny job, and its rollout is a stand-in
that answers each prompt by echoing it with the right sum (`12+30=42`), which the last number of the
response gets right and an exact match gets wrong."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.run.loop.components import Components
from distillery_runtime.run.loop.loop import Loop
from distillery_runtime.run.loop.state import RunOptions
from distillery_runtime.tasks.graders import GraderError
from distillery_runtime.teachers.types import ScoreRequest, TeacherScores

from distillery.plan.rollout.generation import EVAL_SAMPLES_LOGGED
from distillery.runtime_config import resolve_runtime_config
from distillery.validation import parse_job
from tests.runtime.conftest import JobFiles, manifest


def loop_for(files: JobFiles, out: Path, grader: dict[str, Any] | None) -> Loop:
    data: dict[str, Any] = {"train": {"path": str(files.train)}, "eval": {"path": str(files.eval)}}
    if grader is not None:
        data["grader"] = grader
    doc = manifest(files, data=data | {"maxPromptTokens": 16})
    config = resolve_runtime_config(parse_job(doc), None, in_cluster=False)
    return Loop(config, RunOptions(output_dir=out))


class EchoRollout:
    """Answers every prompt with the prompt and its reference answer: `12+30=` -> `12+30=42`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def response(self, prompt_ids: Sequence[int], answer: str) -> list[int]:
        prompt = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=True)
        return list(self.tokenizer(prompt + answer, add_special_tokens=False)["input_ids"])

    async def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> list[RolloutSample]:
        assert sampling.greedy
        return [
            RolloutSample(
                sample_id=r.sample_id,
                prompt_ids=list(r.prompt_ids),
                response_ids=self.response(r.prompt_ids, r.answer or ""),
                logprobs=[STUDENT_LOGPROB] * len(self.response(r.prompt_ids, r.answer or "")),
                answer=r.answer,
                finish_reason="stop",
            )
            for r in requests
        ]


STUDENT_LOGPROB, TEACHER_LOGPROB = -0.5, -1.0
EVAL_KL = math.exp(-0.5) + 0.5 - 1.0
"""k3 of a log-ratio teacher - student of -0.5 on every token."""


class FixedTeacher:
    """Scores every token of a response at TEACHER_LOGPROB, as teacher `t`; counts the requests."""

    def __init__(self) -> None:
        self.requests = 0

    async def wake_up(self) -> None:
        return None

    async def score_one(self, request: ScoreRequest) -> tuple[str, TeacherScores]:
        self.requests += 1
        r = len(request.response_ids)
        return "t", TeacherScores(
            topk_ids=np.zeros((1, r, 0), np.int32),
            topk_logprobs=np.zeros((1, r, 0), np.float32),
            token_logprobs=np.full((1, r), TEACHER_LOGPROB, np.float32),
            mask=np.ones((1, r), bool),
        )


def components(loop: Loop, scoring: FixedTeacher | None = None) -> Components:
    return Components(
        trainers=[],
        rollout=EchoRollout(loop.tokenizer),  # type: ignore[arg-type]  # a stand-in for the RolloutPool
        scoring=scoring or FixedTeacher(),
        teachers=[],
        rollout_dtype="float32",
    )


@pytest.mark.parametrize(
    ("grader", "name", "accuracy"),
    [
        (None, "exact", 0.0),
        ({"name": "gsm8k"}, "gsm8k", 1.0),
        ({"name": "regex", "pattern": "=(.*)"}, "regex", 1.0),
    ],
    ids=["auto-is-exact", "gsm8k", "regex"],
)
async def test_eval_accuracy_is_the_graders_and_eval_jsonl_names_it(
    job_files: JobFiles, tmp_path: Path, grader: dict[str, Any] | None, name: str, accuracy: float
) -> None:
    loop = loop_for(job_files, tmp_path, grader)
    sample = (await EchoRollout(loop.tokenizer).generate([_request(loop)], SamplingSettings(greedy=True)))[0]
    assert loop.tokenizer.decode(sample.response_ids).endswith(
        "=" + (sample.answer or "x")
    )  # the echo is exact
    assert await loop.evaluate(components(loop), 0) == accuracy
    entries = [orjson.loads(line) for line in (tmp_path / "eval.jsonl").read_bytes().splitlines()]
    assert [(e["grader"], e["eval_accuracy"]) for e in entries] == [(name, accuracy)]


async def test_samples_jsonl_shows_each_eval_sample_with_its_grade_and_teacher_kl(
    job_files: JobFiles, tmp_path: Path
) -> None:
    loop = loop_for(job_files, tmp_path, {"name": "gsm8k"})
    teacher = FixedTeacher()
    await loop.evaluate(components(loop, teacher), 3)
    lines = [orjson.loads(line) for line in (tmp_path / "samples.jsonl").read_bytes().splitlines()]
    assert loop.eval_data is not None and len(lines) == len(loop.eval_data.records) == 16
    first = lines[0]
    assert first["step"] == 3 and first["grade"] == 1.0 and first["finish_reason"] == "stop"
    assert first["prompt"] == loop.tokenizer.decode(loop.eval_data.records[0].prompt_ids)
    assert first["response"].endswith("=" + first["reference"])  # the echo: prompt and reference answer
    assert first["kl"] == {"t": pytest.approx(EVAL_KL, rel=1e-5)}
    # Only the first EVAL_SAMPLES_LOGGED samples are scored by their teacher: the eval's cost is bounded.
    assert teacher.requests == min(EVAL_SAMPLES_LOGGED, 16)
    assert all(line["kl"] == {} for line in lines[EVAL_SAMPLES_LOGGED:])
    entry = orjson.loads((tmp_path / "eval.jsonl").read_bytes().splitlines()[-1])
    assert entry["kl_per_teacher"] == {"t": pytest.approx(EVAL_KL, rel=1e-5)}
    assert entry["response_length_mean"] > 0 and entry["truncated_fraction"] == 0.0


async def test_eval_without_reference_answers_reports_kl_and_lengths(
    job_files: JobFiles, tmp_path: Path
) -> None:
    unanswered = tmp_path / "eval-no-answers.jsonl"
    rows = [orjson.loads(line) for line in job_files.eval.read_bytes().splitlines()]
    unanswered.write_bytes(b"".join(orjson.dumps({"prompt": r["prompt"]}) + b"\n" for r in rows))
    loop = loop_for(dataclasses.replace(job_files, eval=unanswered), tmp_path / "out", None)
    assert math.isnan(await loop.evaluate(components(loop), 0))
    entry = orjson.loads((tmp_path / "out" / "eval.jsonl").read_bytes())
    assert entry["eval_accuracy"] is None and entry["graded"] == 0
    assert entry["kl_per_teacher"] == {"t": pytest.approx(EVAL_KL, rel=1e-5)}
    assert entry["response_length_mean"] > 0
    lines = [orjson.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_bytes().splitlines()]
    assert lines[0]["reference"] is None and lines[0]["grade"] is None


def _request(loop: Loop) -> GenerationRequest:
    assert loop.eval_data is not None
    record = loop.eval_data.records[0]
    return GenerationRequest(sample_id="s", prompt_ids=record.prompt_ids, seed=0, answer=record.answer)


@pytest.mark.parametrize(
    ("grader", "reward"), [(None, 0.0), ({"name": "gsm8k"}, 1.0)], ids=["exact", "gsm8k"]
)
async def test_the_task_reward_is_the_graders(
    job_files: JobFiles, tmp_path: Path, grader: dict[str, Any] | None, reward: float
) -> None:
    loop = loop_for(job_files, tmp_path, grader)
    sample = (await EchoRollout(loop.tokenizer).generate([_request(loop)], SamplingSettings(greedy=True)))[0]
    assert loop._reward(sample) == reward
    sample.answer = None  # a row without an answer earns nothing, whatever the grader
    assert loop._reward(sample) == 0.0


def test_a_grader_that_does_not_import_stops_the_job_before_it_loads(
    job_files: JobFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    def no_tokenizer(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the tokenizer loaded before the grader was checked")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_tokenizer)
    with pytest.raises(GraderError) as raised:
        loop_for(job_files, tmp_path, {"name": "module", "function": "no_such_graders:grade"})
    assert str(raised.value) == (
        "spec.data.grader.function: cannot import 'no_such_graders:grade' in the runtime: "
        "ModuleNotFoundError: No module named 'no_such_graders'"
    )
