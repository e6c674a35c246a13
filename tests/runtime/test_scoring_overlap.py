"""When a step's samples are scored: as each leaves the rollout, or once the rollout is done where the
teacher computes on the rollout's own CPU cores (`distillery.plan.teachers.scoring_overlap`).

The plan's choice is checked on specs; the loop's use of it with a stand-in rollout that streams samples
one at a time and a stand-in teacher that logs when each request reaches it (no engine is needed to see
the order: the real engines' effect on speed is measured in bench/README.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.run.loop.components import Components
from distillery_runtime.run.loop.loop import Loop
from distillery_runtime.run.loop.state import RunOptions
from distillery_runtime.teachers.types import ScoreRequest, TeacherScores

from distillery.plan.teachers.scoring_overlap import teachers_scoring_after_rollout
from distillery.runtime_config import resolve_runtime_config
from distillery.validation import parse_job
from tests.runtime.conftest import JobFiles, manifest

EXTERNAL = {"placement": "external", "endpoint": "http://teacher.example:8000"}


def spec_with(files: JobFiles, teacher: dict[str, Any], gpus: int = 0) -> Any:
    doc = manifest(files)
    doc["spec"]["teachers"] = [{"name": "teacher", "model": str(files.teacher), **teacher}]
    doc["spec"]["student"]["pool"]["gpusPerWorker"] = gpus
    return parse_job(doc)


@pytest.mark.parametrize(
    ("teacher", "gpus", "local", "after"),
    [
        ({"placement": "standalone"}, 0, True, True),  # a server on this host's cores
        ({"placement": "standalone"}, 0, False, False),  # its own pods
        ({"placement": "colocated"}, 0, False, True),  # an actor beside the rollout
        ({"placement": "colocated"}, 1, True, False),  # the rollout decodes on a GPU
        ({"placement": "standalone"}, 1, True, False),
        (EXTERNAL, 0, True, False),  # someone else's server
    ],
)
def test_teachers_on_the_rollouts_cpu_cores_score_after_it(
    job_files: JobFiles, teacher: dict[str, Any], gpus: int, local: bool, after: bool
) -> None:
    spec = spec_with(job_files, teacher, gpus).spec
    assert teachers_scoring_after_rollout(spec, local=local) == (
        frozenset({"teacher"}) if after else frozenset()
    )


class TrickleRollout:
    """Streams one sample at a time, each response one token longer than the one before, logging each."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log

    async def stream(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> AsyncIterator[RolloutSample]:
        # out of request order, as samples finish: scores must still be paired with their own sample
        for n, r in enumerate(reversed(requests)):
            await asyncio.sleep(0.01)  # decoding: scoring tasks started so far get to run
            self.log.append(("sampled", r.sample_id))
            yield RolloutSample(
                sample_id=r.sample_id, prompt_ids=list(r.prompt_ids), response_ids=[5] * (n + 1),
                logprobs=[-0.5] * (n + 1), answer=r.answer, finish_reason="length",
            )  # fmt: skip


class LoggingTeacher:
    """Logs when each request reaches it; scores each response token at -1."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log

    async def wake_up(self) -> None:
        return None

    def teacher_name(self, request: ScoreRequest) -> str:
        return "teacher"

    async def score_one(self, request: ScoreRequest) -> tuple[str, TeacherScores]:
        self.log.append(("scored", request.sample_id))
        r = len(request.response_ids)
        return "teacher", TeacherScores(
            topk_ids=np.zeros((1, r, 0), np.int32), topk_logprobs=np.zeros((1, r, 0), np.float32),
            token_logprobs=np.full((1, r), -1.0, np.float32), mask=np.ones((1, r), bool),
        )  # fmt: skip


@pytest.mark.parametrize("teacher", [{"placement": "colocated"}, EXTERNAL], ids=["on-cpu-cores", "elsewhere"])
async def test_the_loop_holds_a_sharing_teachers_samples_until_the_rollout_ends(
    job_files: JobFiles, tmp_path: Path, teacher: dict[str, Any]
) -> None:
    loop = Loop(
        resolve_runtime_config(spec_with(job_files, teacher), None, in_cluster=False), RunOptions(tmp_path)
    )
    log: list[tuple[str, str]] = []
    c = Components(
        trainers=[],
        rollout=TrickleRollout(log),  # type: ignore[arg-type]  # a stand-in for the RolloutPool
        scoring=LoggingTeacher(log),
        teachers=[],
        rollout_dtype="float32",
    )
    rolled = await loop.rollout_and_score(c, 1)

    events = [kind for kind, _ in log]
    last_sampled = len(events) - 1 - events[::-1].index("sampled")
    first_scored = events.index("scored")
    if teacher["placement"] == "colocated":
        assert first_scored > last_sampled, log
    else:
        assert first_scored < last_sampled, log  # scoring overlaps the rollout
    assert events.count("scored") == events.count("sampled") == len(rolled["samples"]) == 8
    # request order, and each sample with its own scores (the responses' lengths differ)
    sampled = [sample_id for kind, sample_id in log if kind == "sampled"]
    assert [s.sample_id for s in rolled["samples"]] == sampled[::-1]
    for sample, (name, scores) in zip(rolled["samples"], rolled["scored"], strict=True):
        assert name == "teacher"
        assert scores.token_logprobs.shape == (1, len(sample.response_ids))
