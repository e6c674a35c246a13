"""Synthetic URIs: what parses, and the error a typo gets."""

from __future__ import annotations

import pytest
from distillery_runtime.tasks import is_synthetic, parse_uri


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
