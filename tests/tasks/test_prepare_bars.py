"""A preparation is reproducible and trains to its bar: seeded, on the recipe's thread count whatever the
machine's, the teacher in rounds of its schedule until it meets its bars (bounded, with a message naming the
task, the bar, the value and the bound), and the recipe hash covering what decides the result. Tiny recipes:
the plumbing, not the accuracies (the prepared tasks' tests build the real ones)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from distillery_runtime.tasks.build.cache import PREPARE_THREADS, recipe_hash
from distillery_runtime.tasks.build.prepare import (
    RECIPES,
    AdditionRecipe,
    FibonacciRecipe,
    ModelShape,
    WorkedSumRecipe,
    build_task,
)
from distillery_runtime.tasks.recipes.chat_math_recipe import ChatMathRecipe


def _tiny(recipe: WorkedSumRecipe | AdditionRecipe, **changes: object):
    return replace(
        recipe,
        train_rows=32,
        eval_rows=8,
        dev_rows=8,
        teacher=ModelShape(hidden=64, layers=1),
        student=ModelShape(hidden=64, layers=1),
        teacher_steps=3,
        student_max_steps=3,
        teacher_check_every=3,
        student_check_every=3,
        batch_size=4,
        **changes,
    )


def _open_bars(recipe):
    object.__setattr__(recipe, "teacher_min_accuracy", 0.0)
    object.__setattr__(recipe, "teacher_min_guess_accuracy", 0.0)
    return recipe


def test_the_earlier_tasks_keep_their_cache_names():
    """`threads` and `teacher_max_rounds` at their defaults say what the earlier builds did: the caches of
    addition, Fibonacci and chat-math (CI keeps them) stay valid; worked-sum's recipe changed (version 2)."""
    assert recipe_hash(AdditionRecipe()) == "4874569a9c6f"
    assert recipe_hash(FibonacciRecipe()) == "a0ce20b122fe"
    assert recipe_hash(ChatMathRecipe()) == "50fda9b75d78"
    assert WorkedSumRecipe().version == 2


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_what_decides_the_result_is_in_the_hash(name):
    recipe = RECIPES[name]()
    assert recipe.threads == (1 if name in ("worked-sum", "tools") else PREPARE_THREADS)
    names = {
        recipe_hash(recipe),
        recipe_hash(replace(recipe, threads=recipe.threads + 1)),
        recipe_hash(replace(recipe, teacher_max_rounds=1)),
        recipe_hash(replace(recipe, teacher_steps=recipe.teacher_steps + 1)),
        recipe_hash(replace(recipe, seed=recipe.seed + 1)),
    }
    assert len(names) == 5


def test_a_build_runs_on_the_recipes_threads_and_restores_the_callers(tmp_path):
    """In a fresh process: vLLM's CPU worker, once it has run in a process (other tests start it in the
    pytest worker), binds the threads and makes `torch.set_num_threads` a no-op there. The child first shows
    that `set_num_threads` takes effect in it (else the test could not tell a build on the recipe's threads
    from one on the caller's), then reads `torch.get_num_threads()` at every optimizer step of the build:
    each must run on the recipe's threads."""
    script = textwrap.dedent(
        f"""
        import torch
        from dataclasses import replace
        from pathlib import Path
        from distillery_runtime.tasks.build.prepare import ModelShape, WorkedSumRecipe, build_task
        recipe = replace(
            WorkedSumRecipe(), threads=2, train_rows=32, eval_rows=8, dev_rows=8,
            teacher=ModelShape(hidden=64, layers=1), student=ModelShape(hidden=64, layers=1),
            teacher_steps=3, student_max_steps=3, teacher_check_every=3, student_check_every=3, batch_size=4,
        )
        object.__setattr__(recipe, "teacher_min_accuracy", 0.0)
        object.__setattr__(recipe, "teacher_min_guess_accuracy", 0.0)
        for threads in (3, 1):  # the setting takes effect in this process (the caller's is then 1)
            torch.set_num_threads(threads)
            assert torch.get_num_threads() == threads, ("set_num_threads does nothing here", threads)
        from torch.optim.optimizer import register_optimizer_step_post_hook
        stepped = []  # the threads of every optimizer step of the build: the training itself
        register_optimizer_step_post_hook(
            lambda *_args: stepped.append(torch.get_num_threads())
        )
        manifest = build_task(Path({str(tmp_path)!r}), recipe, log=lambda _msg: None)
        print("THREADS", torch.get_num_threads(), sorted(set(stepped)), manifest["threads"])
        print("STEPS", len(stepped))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("THREADS ", "STEPS "))]
    assert result.returncode == 0 and len(lines) == 2, result.stderr[-3000:]
    # The caller's 1 thread restored after; every training step on the recipe's 2; the manifest says so.
    assert lines[0] == "THREADS 1 [2] 2"
    assert int(lines[1].split()[1]) >= 6  # the teacher's 3 steps and the student's 3 at least were seen


def test_the_same_recipe_trains_the_same_models_whatever_the_callers_threads(tmp_path):
    """Seeds, data order and thread count come from the recipe: two builds, one from a caller on 1 thread
    and one on 2, write the same weights."""
    recipe = _open_bars(_tiny(WorkedSumRecipe()))
    before = torch.get_num_threads()
    built: list[Path] = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = tmp_path / f"callers-{threads}"
            out.mkdir()
            build_task(out, recipe, log=lambda _msg: None)
            built.append(out)
    finally:
        torch.set_num_threads(before)
    for role in ("teacher", "student"):
        first, second = (b / role / "model.safetensors" for b in built)
        assert first.read_bytes() == second.read_bytes(), role
    assert (built[0] / "train.jsonl").read_bytes() == (built[1] / "train.jsonl").read_bytes()


def test_a_teacher_that_meets_its_bars_stops_after_its_first_round(tmp_path):
    manifest = build_task(tmp_path, _open_bars(_tiny(WorkedSumRecipe())), log=lambda _msg: None)
    assert manifest["teacher"]["sft_steps"] == 3


def test_a_teacher_below_its_bar_trains_more_rounds_then_fails_naming_the_bound(tmp_path):
    recipe = _tiny(WorkedSumRecipe(), teacher_max_rounds=2)
    object.__setattr__(recipe, "teacher_min_accuracy", 0.0)  # only the guess bar, out of a tiny model's reach
    rounds: list[str] = []

    def log(msg: str) -> None:
        if "teacher round" in msg:
            rounds.append(msg)

    with pytest.raises(RuntimeError) as raised:
        build_task(tmp_path, recipe, log=log)
    message = str(raised.value)
    assert message.startswith("the worked-sum teacher misses its bar after 6 SFT steps")
    assert "teacher_max_rounds 2 x teacher_steps 3" in message
    assert "guess_accuracy 0.000 < 0.8" in message
    assert len(rounds) == 2
    assert not (tmp_path / "teacher").exists() and not (tmp_path / "student").exists()


def test_a_student_that_ends_its_schedule_below_its_start_fails_the_build(tmp_path):
    recipe = _tiny(AdditionRecipe(), student_start=1.01)  # beyond any accuracy: the bound is always hit
    with pytest.raises(RuntimeError, match=r"addition student's dev accuracy is .* after 3 SFT steps"):
        build_task(tmp_path, recipe, log=lambda _msg: None)
