"""The addition task's pure parts: problem format, answers, the held-out split, grading."""

from __future__ import annotations

import pytest
from distillery_runtime.tasks.problems.addition import (
    TASK,
    Problem,
    is_held_out,
    little_endian,
    sample_problems,
)


def decode(text: str) -> int:
    return int(text[::-1])


@pytest.mark.parametrize(
    ("value", "width", "text"), [(582, 4, "2850"), (0, 3, "000"), (7, 3, "700"), (1998, 4, "8991")]
)
def test_little_endian(value, width, text):
    assert little_endian(value, width) == text


def test_answers_are_the_sums_of_the_prompts():
    for p in sample_problems(300, digits=3, seed=5, held_out=False):
        left, right = p.prompt.removesuffix("=").split("+")
        assert len(left) == len(right) == 3 and len(p.answer) == 4
        assert decode(p.answer) == decode(left) + decode(right) == p.a + p.b


def test_row_fields():
    row = Problem(123, 459).row()
    assert row == {"prompt": "321+954=", "answer": "2850", "response": "2850", "data_source": "addition"}


def test_splits_are_disjoint_deterministic_and_distinct():
    train = sample_problems(2000, digits=3, seed=0, held_out=False)
    held = sample_problems(300, digits=3, seed=1, held_out=True)
    assert not set(train) & set(held)
    assert all(is_held_out(p) for p in held) and not any(is_held_out(p) for p in train)
    assert len(set(train)) == len(train)
    assert sample_problems(50, digits=3, seed=1, held_out=True) == held[:50]
    assert sample_problems(50, digits=3, seed=2, held_out=True) != held[:50]
    # about 5% of all problems are held out
    share = sum(is_held_out(Problem(a, b)) for a in range(100) for b in range(100)) / 10_000
    assert 0.03 < share < 0.07


def test_asking_for_more_held_out_problems_than_exist_fails():
    with pytest.raises(ValueError, match="too small"):
        sample_problems(1000, digits=1, seed=0, held_out=True)


@pytest.mark.parametrize(
    ("response", "answer", "ok"),
    [
        ("2850", "2850", True),
        (" 2850\n", "2850", True),
        ("2851", "2850", False),
        ("28500", "2850", False),
        ("", "2850", False),
    ],
)
def test_the_task_grades_by_exact_match(response, answer, ok):
    assert TASK.grade(response, answer) is ok
