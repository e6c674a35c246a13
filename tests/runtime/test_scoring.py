"""Teacher wiring of the loop: routing by the spec, per-teacher counts, retries surfaced for the metrics."""

from __future__ import annotations

import pytest
from distillery_runtime.scoring import TeacherScoring, build_client
from distillery_runtime.teachers.compact_http import CompactTeacher
from distillery_runtime.teachers.retry import RetryPolicy
from distillery_runtime.teachers.types import ScoreRequest, TeacherUnavailableError, UnknownRouteError
from distillery_runtime.workers import free_port

from distillery.runtime_config import resolve_runtime_config
from distillery.validation import parse_job
from tests.runtime.conftest import manifest


def two_teacher_config(job_files):
    teachers = [
        {
            "name": "adder",
            "model": "m",
            "placement": "external",
            "endpoint": "http://127.0.0.1:1",
            "routes": ["add"],
        },
        {
            "name": "subber",
            "model": "m",
            "placement": "external",
            "endpoint": "http://127.0.0.1:2",
            "routes": ["sub"],
        },
    ]
    return resolve_runtime_config(parse_job(manifest(job_files, teachers=teachers)), None, in_cluster=False)


def test_routes_follow_the_spec_and_unknown_routes_are_named(job_files):
    config = two_teacher_config(job_files)
    clients = {t.name: build_client(t, 4) for t in config.teachers}
    scoring = TeacherScoring(config, clients)
    assert scoring.teacher_name(ScoreRequest([1], [2], "a", "add")) == "adder"
    assert scoring.teacher_name(ScoreRequest([1], [2], "b", "sub")) == "subber"
    with pytest.raises(UnknownRouteError, match=r"route 'mul'.*\['add', 'sub'\]"):
        scoring.teacher_name(ScoreRequest([1], [2], "c", "mul"))


async def test_retries_reach_the_metrics(job_files):
    config = two_teacher_config(job_files)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every attempt fails and is retried
    policy = RetryPolicy(base_delay=0.01, max_delay=0.02, total_timeout=0.5, connect_timeout=0.2)
    clients = {
        "adder": CompactTeacher([dead], name="adder", max_logprobs=4, max_model_len=64, retry=policy),
        "subber": build_client(config.teachers[1], 4),
    }
    scoring = TeacherScoring(config, clients)
    with pytest.raises(TeacherUnavailableError):
        await scoring.score_one(ScoreRequest([1, 2], [3], "a", "add"))
    retries = scoring.retries()
    assert retries["adder"] >= 2 and retries["subber"] == 0
    await scoring.close()
