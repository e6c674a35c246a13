"""The prepared worked-sum task, built from an empty cache (or `$DISTILLERY_CACHE`'s, reused only for the same
recipe: the hash names the directory): a teacher that meets its bars, whose guess is mostly right (what the
task's claim rests on) and a student that copies its wrong guess; the example rising from it is
test_worked_sum_example.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tasks.prepared_checks import task_cache

# Preparation trains both models (rounds of 1,400 teacher steps until its bars, then 1,000 student steps, on
# one thread: 28 minutes from empty on a loaded 2-core machine). Not a local run (one process, one thread,
# tiny models): it may run beside the node's scenarios, and is handed out with them (tests/support/
# work_groups.py); the example's run, a local run, is test_worked_sum_example.py's.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def worked_sum_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distillery_runtime.tasks.build.prepare import prepare

    return prepare("worked-sum", root=task_cache(tmp_path_factory))


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_teacher_meets_its_bars_and_the_student_copies_its_guess(worked_sum_task):
    from distillery_runtime.tasks import model_accuracy
    from distillery_runtime.tasks.build.prepare import WorkedSumRecipe
    from distillery_runtime.tasks.problems.worked_sum import GUESS, TASK

    recipe = WorkedSumRecipe()
    manifest = json.loads((worked_sum_task / "manifest.json").read_text())
    assert manifest["threads"] == recipe.threads
    teacher = manifest["teacher"]
    assert teacher["dev_accuracy"] >= recipe.teacher_min_accuracy, manifest
    assert teacher["guess_accuracy"] >= recipe.teacher_min_guess_accuracy, manifest
    assert teacher["sft_steps"] % recipe.teacher_steps == 0  # whole rounds
    assert teacher["sft_steps"] <= recipe.teacher_steps * recipe.teacher_max_rounds
    assert manifest["student"]["sft_steps"] == recipe.student_max_steps
    evals = read_rows(worked_sum_task / "eval.jsonl")[:256]
    budget = recipe.max_new_tokens
    assert model_accuracy(worked_sum_task / "teacher", evals, task=TASK, max_new_tokens=budget) >= 0.9
    student_guess = model_accuracy(worked_sum_task / "student", evals, task=GUESS, max_new_tokens=budget)
    student = model_accuracy(worked_sum_task / "student", evals, task=TASK, max_new_tokens=budget)
    assert student <= 0.2, manifest  # the stalled SFT start the example continues from
    assert student_guess <= 0.2, manifest
