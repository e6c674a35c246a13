"""The loop grades with the job's grader (data.grader, decided by the plan): held-out accuracy, eval.jsonl
and the task reward. No Ray: the loop is built for real on the tiny job, and its rollout is a stand-in
that answers each prompt by echoing it with the right sum (`12+30=42`), which the last number of the
response gets right and an exact match gets wrong."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from distillery_runtime.loop import Components, Loop, RunOptions
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.samples import RolloutSample
from distillery_runtime.tasks.graders import GraderError

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
                logprobs=None,
                answer=r.answer,
            )
            for r in requests
        ]


def components(loop: Loop) -> Components:
    return Components(
        trainers=[], rollout=EchoRollout(loop.tokenizer), scoring=None, colocated=[], rollout_dtype="float32"
    )  # type: ignore[arg-type]  # a stand-in for the RolloutPool


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
