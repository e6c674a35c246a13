"""Prepare the synthetic addition task: tokenizer, SFT-trained teacher, weak student, datasets.

Run once, cached (see `cache.py`); `resolve_uri("synthetic://addition/...")` calls it on first use.
By hand: `python -m distillery_runtime.tasks.prepare` prints the directory and the accuracies.

The teacher is a small Llama trained by SFT on fresh random problems for its full schedule (the
cosine decay to zero matters: stopped while the learning rate is high, accuracy swings by tens of
points between checks). The student has the same shape and another initialisation, trained the same
way but stopped as soon as its accuracy on a development split (held-out problems disjoint from the
evaluation set) passes `student_start`: a weak, non-zero start, so that on-policy distillation has
both a signal (the student already emits well-formed answers the teacher can grade) and room to
improve. A smaller student (hidden 64) learned too slowly to reach the teacher in a quick-start run.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from distillery_runtime.tasks.addition import ALPHABET, Problem, is_held_out, sample_problems
from distillery_runtime.tasks.cache import build_once, task_dir
from distillery_runtime.tasks.evaluate import accuracy
from distillery_runtime.tasks.sft import train_sft
from distillery_runtime.tasks.tokenizer import build_char_tokenizer

TASK = "addition"


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    head_dim: int = 64  # the smallest head size vLLM's CPU attention supports


@dataclass(frozen=True)
class AdditionRecipe:
    """Everything that determines the prepared artefacts; its hash names the cache directory."""

    version: int = 1
    digits: int = 3
    seed: int = 0
    train_rows: int = 4096
    eval_rows: int = 512
    dev_rows: int = 256
    teacher: ModelShape = ModelShape(hidden=128, layers=2)
    teacher_steps: int = 1200
    student: ModelShape = ModelShape(hidden=128, layers=2)
    student_max_steps: int = 1200
    student_start: float = 0.15
    batch_size: int = 64
    lr: float = 1e-3
    max_positions: int = 256
    """Context length of the models: maxPromptTokens + maxNewTokens + 1 must fit (vLLM refuses more)."""
    teacher_check_every: int = 200
    student_check_every: int = 10


def _llama(
    tokenizer: PreTrainedTokenizerFast, shape: ModelShape, seed: int, max_positions: int
) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    heads = shape.hidden // shape.head_dim
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.hidden * 4,
        num_hidden_layers=shape.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    return LlamaForCausalLM(config)


def _train_until(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    recipe: AdditionRecipe,
    dev: list[dict[str, str]],
    *,
    max_steps: int,
    target: float | None,
    seed: int,
    check_every: int,
    log: Callable[[str], None],
    name: str,
) -> tuple[int, float]:
    """SFT on fresh non-held-out problems for `max_steps`, or until dev accuracy >= `target` when given.

    Returns (steps done, last dev accuracy).
    """
    rng = random.Random(seed)
    hi = 10**recipe.digits

    def batch(_step: int) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while len(out) < recipe.batch_size:
            p = Problem(rng.randrange(hi), rng.randrange(hi), recipe.digits)
            if not is_held_out(p):
                out.append((p.prompt, p.answer))
        return out

    state = {"steps": 0, "acc": 0.0}

    def on_step(step: int, loss: float) -> bool:
        state["steps"] = step
        if step % check_every and step != max_steps:
            return False
        state["acc"] = accuracy(model, tokenizer, dev)
        model.train()
        log(f"  {name} step {step:5d}  loss {loss:.3f}  dev accuracy {state['acc']:.3f}")
        return target is not None and state["acc"] >= target

    train_sft(model, tokenizer, batch, steps=max_steps, lr=recipe.lr, on_step=on_step)
    return int(state["steps"]), state["acc"]


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def build_addition(out: Path, recipe: AdditionRecipe, log: Callable[[str], None] = print) -> dict:
    """Write tokenizer+teacher, student, train.jsonl, eval.jsonl into `out`; return the manifest."""
    t0 = time.monotonic()
    torch.manual_seed(recipe.seed)
    tokenizer = build_char_tokenizer(ALPHABET)
    held_out = sample_problems(
        recipe.eval_rows + recipe.dev_rows, digits=recipe.digits, seed=recipe.seed + 1, held_out=True
    )
    eval_rows = [p.row() for p in held_out[: recipe.eval_rows]]
    dev_rows = [p.row() for p in held_out[recipe.eval_rows :]]
    train_rows = [
        p.row()
        for p in sample_problems(
            recipe.train_rows, digits=recipe.digits, seed=recipe.seed + 2, held_out=False
        )
    ]
    _write_jsonl(out / "train.jsonl", train_rows)
    _write_jsonl(out / "eval.jsonl", eval_rows)

    manifest: dict = {"task": TASK, "recipe": repr(recipe)}
    for role, shape, max_steps, target, check_every in (
        (
            "teacher",
            recipe.teacher,
            recipe.teacher_steps,
            None,
            recipe.teacher_check_every,
        ),
        (
            "student",
            recipe.student,
            recipe.student_max_steps,
            recipe.student_start,
            recipe.student_check_every,
        ),
    ):
        started = time.monotonic()
        model = _llama(
            tokenizer,
            shape,
            seed=recipe.seed + (0 if role == "teacher" else 1),
            max_positions=recipe.max_positions,
        )
        steps, dev_acc = _train_until(
            model,
            tokenizer,
            recipe,
            dev_rows,
            max_steps=max_steps,
            target=target,
            seed=recipe.seed + (10 if role == "teacher" else 11),
            check_every=check_every,
            log=log,
            name=role,
        )
        model.save_pretrained(out / role, safe_serialization=True)
        tokenizer.save_pretrained(out / role)
        manifest[role] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "sft_steps": steps,
            "dev_accuracy": dev_acc,
            "eval_accuracy": accuracy(model, tokenizer, eval_rows),
            "seconds": round(time.monotonic() - started, 1),
        }
        log(f"{role}: {manifest[role]}")
    manifest["seconds"] = round(time.monotonic() - t0, 1)
    return manifest


def prepare_addition(
    recipe: AdditionRecipe | None = None,
    *,
    root: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The prepared task directory, building it first if needed (minutes, once)."""
    recipe = recipe or AdditionRecipe()
    final = task_dir(TASK, recipe, root)
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def build(tmp: Path) -> dict:
        say(f"preparing the synthetic addition task in {final} (once; a few minutes on 2 cores)")
        return build_addition(tmp, recipe, say)

    return build_once(final, build)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", default=TASK, choices=[TASK])
    parser.parse_args(argv)
    directory = prepare_addition()
    print(directory)
    print((directory / "manifest.json").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
