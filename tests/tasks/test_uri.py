"""Synthetic URIs: what parses, and the error a typo gets."""

from __future__ import annotations

import pytest
from distillery_runtime.tasks import is_synthetic, parse_uri, task_for
from distillery_runtime.tasks.base import ANSWER_MATCH
from distillery_runtime.tasks.problems.addition import TASK as ADDITION
from distillery_runtime.tasks.problems.fibonacci import TASK as FIBONACCI


@pytest.mark.parametrize(
    ("uri", "parsed"),
    [
        ("synthetic://addition/teacher", ("addition", "teacher")),
        ("synthetic://addition/student", ("addition", "student")),
        ("synthetic://addition/train/", ("addition", "train")),
        ("synthetic://addition/eval", ("addition", "eval")),
    ],
)
def test_parse(uri, parsed):
    assert is_synthetic(uri) and parse_uri(uri) == parsed


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("synthetic://subtraction/train", "unknown synthetic task 'subtraction'.*known: addition"),
        ("synthetic://addition/test", "unknown artefact 'test'.*known: teacher, student, train, eval"),
        ("/data/train.jsonl", "not a synthetic:// URI"),
    ],
)
def test_errors_name_what_is_allowed(uri, message):
    with pytest.raises(ValueError, match=message):
        parse_uri(uri)


@pytest.mark.parametrize(
    ("path", "task"),
    [
        ("synthetic://addition/train", ADDITION),
        ("synthetic://fibonacci/eval", FIBONACCI),
        ("/data/train.jsonl", ANSWER_MATCH),
        ("s3://bucket/train.parquet", ANSWER_MATCH),
    ],
)
def test_a_jobs_task_comes_from_its_training_data(path, task):
    assert task_for(path) is task
