"""Held-out accuracy of a model on a synthetic task: greedy decoding with transformers, each response
graded by the task's grader (the addition task's by default)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from distillery_runtime.tasks.base import Task
from distillery_runtime.tasks.problems.addition import TASK as ADDITION


@torch.inference_mode()
def greedy_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 8,
    batch_size: int = 256,
) -> list[str]:
    """Greedy completions of `prompts` (left-padded batches), decoded without special tokens."""
    out: list[str] = []
    tokenizer.padding_side = "left"
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(
            list(prompts[i : i + batch_size]), return_tensors="pt", padding=True, add_special_tokens=False
        )
        gen = model.generate(  # type: ignore[operator]  # transformers' stubs type `generate` as a Tensor
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        out.extend(tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    return out


def accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, str]],
    *,
    task: Task = ADDITION,
    **kw: int,
) -> float:
    """Fraction of rows whose greedy response `task` grades correct against the row's `answer`."""
    responses = greedy_responses(model, tokenizer, [r["prompt"] for r in rows], **kw)
    return sum(task.grade(resp, r["answer"]) for resp, r in zip(responses, rows, strict=True)) / len(rows)


def model_accuracy(
    model_dir: str | Path, rows: Sequence[dict[str, str]], *, task: Task = ADDITION, **kw: int
) -> float:
    """Held-out accuracy of the model saved in `model_dir` (loaded in float32 on CPU)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return accuracy(model, tokenizer, rows, task=task, **kw)
