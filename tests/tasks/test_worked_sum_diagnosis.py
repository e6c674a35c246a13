"""bench/worked_sum_diagnosis.py reads a worked-sum student's mistakes off its samples: a working that copies
a wrong guess, and one that does the column arithmetic right on a miscopied operand digit."""

from __future__ import annotations

import pytest
from distillery_runtime.tasks.problems.worked_sum import Problem, working
from support.bench_modules import bench_module


@pytest.fixture(scope="module")
def diagnosis():
    return bench_module("worked_sum_diagnosis")


def sample(problem: Problem, response: str) -> dict:
    from distillery_runtime.tasks.problems.worked_sum import grade

    return {"prompt": problem.prompt, "response": response, "reference": problem.answer,
            "grade": float(grade(response, problem.answer))}  # fmt: skip


def test_a_working_that_copies_its_wrong_guess(diagnosis):
    p = Problem(12345, 67890)  # sum 80235: "532080" little-endian
    copied = "999999|" + "".join(
        f"{g[0]}{g[1]}9{g[3]}" for g in (working(p.a, p.b, 5)[i : i + 4] for i in range(0, 20, 4))
    )
    r = diagnosis.step_diagnosis([sample(p, copied)])
    assert r["accuracy"] == 0.0 and r["copies_guess"] == 1.0 and r["guess"] == 0.0
    assert r["x_copied"] == [1.0] * 5 and r["y_copied"] == [1.0] * 5


def test_right_arithmetic_on_a_miscopied_digit(diagnosis):
    p = Problem(12345, 67890)
    right = p.response()
    assert diagnosis.step_diagnosis([sample(p, right)])["sum_from_own_digits"] == 1.0
    # y's last digit (6) miscopied as 5: the sum digit from it, 1 + 5 + carry 1 = 7, is the arithmetic done
    # right on what was written, and the answer wrong.
    groups = [right[7 + 4 * i : 11 + 4 * i] for i in range(5)]
    assert groups[4] == "168_"
    miscopied = right[:7] + "".join(groups[:4]) + "157_"
    r = diagnosis.step_diagnosis([sample(p, miscopied)])
    assert r["accuracy"] == 0.0 and r["sum_from_own_digits"] == 1.0
    assert r["y_copied"] == [1.0, 1.0, 1.0, 1.0, 0.0] and r["copies_guess"] == 0.0
