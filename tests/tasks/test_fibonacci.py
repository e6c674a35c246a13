"""The Fibonacci task's pure parts: the trace format, its arithmetic, the split, and the grader."""

from __future__ import annotations

import itertools
import random

import pytest
from distillery_runtime.tasks.problems.fibonacci import (
    CARRY,
    LINE_END,
    NO_CARRY,
    TASK,
    Problem,
    add_with_carries,
    final_answer,
    is_held_out,
    response_tokens,
    sample_problems,
)


def decode_line(text: str) -> tuple[str, int, int, int, list[bool]]:
    """(label, x, y, z, carries) of one line `k:` + per digit x y z carry."""
    label, _, body = text.removesuffix(LINE_END).partition(":")
    columns = [body[i : i + 4] for i in range(0, len(body), 4)]
    x, y, z = (int("".join(c[i] for c in columns)[::-1]) for i in range(3))
    return label, x, y, z, [c[3] == CARRY for c in columns]


def test_the_docstring_example():
    p = Problem(123, 459, 2)
    assert p.prompt == "2:639_325_314_;"  # the seed line: 336 + 123 = 459
    assert p.response == "1:392^258_145_;0:921^584^450^"  # 123 + 459 = 582; 459 + 582 = 041 (mod 1000)
    assert p.answer == "140"
    assert TASK.grade(p.response, p.answer)


def test_every_line_adds_the_two_numbers_before_it_with_its_carries():
    rng = random.Random(3)
    for _ in range(200):
        p = Problem(rng.randrange(1000), rng.randrange(1000), rng.randint(1, 14))
        lines = [decode_line(t) for t in (p.prompt + p.response).split(LINE_END)]
        assert [label for label, *_ in lines] == [format(k, "x") for k in range(p.m, -1, -1)]
        for (_, _, y, z, _), (_, nx, ny, _, _) in itertools.pairwise(lines):
            assert (nx, ny) == (y, z)  # each line takes the previous line's y and sum
        for _, x, y, z, carries in lines:
            assert z == (x + y) % 1000
            assert (z, carries) == add_with_carries(x, y, 3)
            # the carry out of digit i is whether that column reached 10
            carry_in = 0
            for i, carried in enumerate(carries):
                column = x // 10**i % 10 + y // 10**i % 10 + carry_in
                assert carried == (column >= 10)
                carry_in = int(carried)
        assert int(p.answer[::-1]) == lines[-1][3] == p.final()
        assert len(p.response) == response_tokens(p.m, 3)


def test_responses_are_long_generations():
    problems = sample_problems(300, digits=3, min_lines=5, max_lines=9, seed=0, held_out=False)
    lengths = {len(p.response) for p in problems}
    assert min(lengths) == response_tokens(5, 3) == 74 and max(lengths) == response_tokens(9, 3) == 134


def test_one_wrong_digit_spoils_the_answer():
    # A slip in an early line's sum, propagated by the recurrence, changes the final number
    # (mod 1000 a hundreds-digit slip can vanish; counted, not assumed).
    rng = random.Random(0)
    spoiled = total = 0
    for _ in range(300):
        p = Problem(rng.randrange(1000), rng.randrange(1000), 8)
        first_sum = (p.a + p.b) % 1000  # the first computed line's
        slip = (first_sum + rng.choice([1, 10, 100]) * rng.randint(1, 9)) % 1000
        a, b = p.b, slip
        for _ in range(p.m - 1):
            a, b = b, (a + b) % 1000
        total += 1
        spoiled += b != p.final()
    assert spoiled / total > 0.9


def test_splits_are_disjoint_and_deterministic():
    kw = {"digits": 3, "min_lines": 5, "max_lines": 9}
    train = sample_problems(2000, seed=0, held_out=False, **kw)
    held = sample_problems(300, seed=1, held_out=True, **kw)
    assert not set(train) & set(held)
    assert all(is_held_out(p) for p in held) and not any(is_held_out(p) for p in train)
    assert sample_problems(50, seed=1, held_out=True, **kw) == held[:50]


@pytest.mark.parametrize("m", [0, 16])
def test_line_counts_outside_the_labels_are_refused(m):
    with pytest.raises(ValueError, match="lines"):
        Problem(1, 2, m)


RESPONSE = Problem(123, 459, 2).response


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        (RESPONSE, True),
        (RESPONSE + LINE_END, True),  # a trailing line end before EOS
        (f" {RESPONSE}\n", True),
        (RESPONSE.split(LINE_END)[0], False),  # stopped a line early
        (RESPONSE + ";0:921^584^450^", True),  # the last line is still labelled 0 and right
        (RESPONSE + ";f:000_000_000_", False),  # ran on past the last line
        (RESPONSE.replace("450^", "451^"), False),  # a wrong last digit
        (RESPONSE.replace("0:921^584^450^", "0:921^584^450_"), True),  # a wrong carry after the last digit
        ("140", False),  # the bare answer, no trace
        ("", False),
    ],
)
def test_grader_reads_the_last_line_labelled_zero(response, ok):
    assert TASK.grade(response, "140") is ok


def test_final_answer_drops_the_carries():
    assert final_answer("0:921^584^450^") == "140"
    assert final_answer("1:921^584^450^") is None
    assert NO_CARRY not in (final_answer(RESPONSE) or "")
