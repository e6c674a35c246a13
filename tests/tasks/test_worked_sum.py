"""The worked-sum task: the trace (a guess, then the working), its grader (the working, never the guess),
the split, the teacher's repair rows, and a build of its recipe cut to a few steps (the plumbing: what the
full build's accuracies are is `bench/quality.py --protocol continue`'s to measure)."""

from __future__ import annotations

import random
from dataclasses import replace

import orjson
import pytest
from distillery_runtime.tasks.build.prepare import ModelShape, WorkedSumRecipe, build_task
from distillery_runtime.tasks.problems import worked_sum
from distillery_runtime.tasks.problems.worked_sum import GUESS_END, TASK, Problem, worked_answer
from distillery_runtime.tasks.uri import task_for


def test_the_docstring_example():
    p = Problem(12345, 67890)
    assert p.prompt == "54321+09876="
    assert p.response() == "532080|505_493^382^270^168_"
    assert p.answer == "532080"
    assert TASK.grade(p.response(), p.answer)


def test_the_working_adds_every_column_with_its_carry():
    rng = random.Random(5)
    for _ in range(300):
        p = worked_sum.random_problem(rng, 5)
        body = p.response().partition(GUESS_END)[2]
        groups = [body[i : i + 4] for i in range(0, len(body), 4)]
        carry = 0
        for i, (x, y, z, mark) in enumerate(groups):
            assert int(x) == p.a // 10**i % 10 and int(y) == p.b // 10**i % 10
            column = int(x) + int(y) + carry
            assert (int(z), mark == "^") == (column % 10, column >= 10)
            carry = int(column >= 10)
        assert int(worked_answer(p.response())[::-1]) == p.a + p.b  # type: ignore[index]


@pytest.mark.parametrize(
    ("response", "graded"),
    [
        ("000000|505_493^382^270^168_", True),  # a wrong guess, a right working: right
        ("532080|505_493^382^270^169_", False),  # a right guess, a wrong working: wrong
        ("532080|505_493^382^270^168^", False),  # the final carry is the answer's last digit
        ("532080|505_493^382^270^168", False),  # a working cut short
        ("532080", False),  # no working at all
        ("532080|505_493^382^270^1x8_", False),
    ],
)
def test_only_the_working_is_graded(response, graded):
    assert TASK.grade(response, Problem(12345, 67890).answer) is graded


def test_a_wrong_guess_is_never_the_sum():
    rng = random.Random(0)
    for _ in range(500):
        p = worked_sum.random_problem(rng, 2)  # small numbers: a random guess often hits the sum
        guess = worked_sum.wrong_guess(rng, p)
        assert guess != p.answer and len(guess) == 3 and guess.isdigit()


def test_the_splits_are_disjoint_and_deterministic():
    train = worked_sum.sample_problems(3000, digits=5, seed=2, held_out=False)
    held_out = worked_sum.sample_problems(300, digits=5, seed=1, held_out=True)
    assert not set(train) & set(held_out)
    assert held_out == worked_sum.sample_problems(300, digits=5, seed=1, held_out=True)
    assert task_for("synthetic://worked-sum/train") is TASK


def test_half_the_teachers_rows_put_a_wrong_guess_in_the_prompt_and_learn_only_the_working():
    recipe, rng = WorkedSumRecipe(), random.Random(0)
    pairs = [recipe.teacher_pair(rng, None) for _ in range(2000)]  # type: ignore[arg-type]
    repairs = [(prompt, target) for prompt, target in pairs if prompt.endswith(GUESS_END)]
    assert 0.45 < len(repairs) / len(pairs) < 0.55
    for prompt, target in repairs:
        question, _, guess = prompt.rpartition("=")
        a, b = (int(n[::-1]) for n in question.split("+"))
        assert guess.removesuffix(GUESS_END) != Problem(a, b).answer  # the guess is wrong
        assert target == worked_sum.working(a, b, 5)  # the loss is on the working alone
    # the student's pairs are the reference traces: a right guess, then its working
    for prompt, target in (recipe.training_pair(rng, None) for _ in range(200)):  # type: ignore[arg-type]
        a, b = (int(n[::-1]) for n in prompt.removesuffix("=").split("+"))
        assert target == Problem(a, b).response()


def test_the_guess_grader_reads_the_guess_alone():
    p = Problem(12345, 67890)
    assert worked_sum.GUESS.grade(p.response(), p.answer)
    assert not worked_sum.GUESS.grade(p.response("000000"), p.answer)  # a right working does not count
    assert worked_sum.GUESS.grade("532080|999^", p.answer)  # nor does a wrong one
    assert not worked_sum.GUESS.grade("532080", p.answer)  # no `|`: no guess was made


def _cut_recipe() -> WorkedSumRecipe:
    recipe = replace(
        WorkedSumRecipe(),
        train_rows=64,
        eval_rows=16,
        dev_rows=8,
        teacher=ModelShape(hidden=64, layers=1),
        teacher_steps=4,
        student_max_steps=3,
        teacher_check_every=2,
        student_check_every=2,
        batch_size=4,
    )
    object.__setattr__(recipe, "teacher_min_accuracy", 0.0)  # a 4-step teacher: only the plumbing is tested
    return recipe


def test_a_build_refuses_a_teacher_whose_guess_is_mostly_wrong(tmp_path):
    """A 4-step teacher guesses nothing right, after each of its 3 rounds: its traces would show the repair
    in every row."""
    with pytest.raises(
        RuntimeError,
        match=r"teacher misses its bar after 12 SFT steps \(teacher_max_rounds 3 x teacher_steps 4\): "
        r"guess_accuracy 0\.000 < 0\.8",
    ):
        build_task(tmp_path, _cut_recipe(), log=lambda _msg: None)
    assert not (tmp_path / "student").exists()  # stopped before the student was trained


def test_a_build_trains_the_student_to_the_end_of_its_schedule(tmp_path):
    """No start target: the student is the SFT plateau, however the accuracy moves on the way."""
    recipe = _cut_recipe()
    object.__setattr__(recipe, "teacher_min_guess_accuracy", 0.0)
    manifest = build_task(tmp_path, recipe, log=lambda _msg: None)
    assert manifest["teacher"]["sft_steps"] == 4 and manifest["student"]["sft_steps"] == 3
    assert manifest["teacher"]["guess_accuracy"] == 0.0 and "guess_accuracy" not in manifest["student"]
    rows = [orjson.loads(line) for line in (tmp_path / "eval.jsonl").read_bytes().splitlines()]
    assert len(rows) == 16 and all(TASK.grade(r["response"], r["answer"]) for r in rows)
    assert (tmp_path / "student" / "config.json").exists()
    assert (tmp_path / "teacher" / "tokenizer.json").exists()
