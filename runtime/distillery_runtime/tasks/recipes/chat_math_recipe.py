"""The chat-math task's recipe (`chat_math.py`): Qwen-like models over Qwen's real vocabulary, trained by SFT
on the rendered conversation with the loss on the assistant's answer.

The tokenizer is Qwen2.5-Instruct's (`qwen.py`: Qwen's BPE, ChatML template with its default system
prompt); a prompt is a row's conversation before the answer rendered with `add_generation_prompt`, as a job
renders it (`distillery_runtime.data.chat.render`), and the SFT target is the answer and `<|im_end|>`. The models
are tiny Qwen2s (hidden 64, tied embeddings: ~10M parameters, nearly all of them the 151,936 rows), trained
as a compact stand-in over the few hundred tokens the task's text uses (`compact_vocab.py`) and saved as
the full model. The teacher (4 layers) must reach `teacher_min_accuracy` on the development split; the
student (2 layers) stops at its first check past `student_start`. That start is past the student's early
plateau: SFT of the 2-layer student learns the answer's format in ~10 steps (~9% held out, chance at the
sums), stays there for ~150 steps, then climbs (22% at 175, 48% at 250: measured with lr 3e-3, batch 64).
A start on the plateau (version 1 stopped at 10%) leaves distillation 150 SFT steps' worth of samples
before anything moves; a start on the climb shows whether distillation climbs it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from distillery_runtime.tasks.base import Task
from distillery_runtime.tasks.build.cache import PREPARE_THREADS
from distillery_runtime.tasks.problems import chat_math
from distillery_runtime.tasks.recipes.compact_vocab import CompactVocab
from distillery_runtime.tasks.recipes.qwen import (
    MODEL_VOCAB_SIZE,
    build_qwen_model,
    build_qwen_tokenizer,
    save_qwen_files,
)


@dataclass(frozen=True)
class QwenShape:
    hidden: int = 64
    layers: int = 2
    heads: int = 2
    """Head size hidden / heads = 32, the least vLLM's CPU attention takes."""
    kv_heads: int = 1


def prompt_text(tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, str]]) -> str:
    """The conversation before its last (assistant) turn, rendered as a job renders a prompt."""
    return str(tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False))


class CompactQwenModels:
    """The task's models: compact stand-ins trained (`compact_vocab`), full Qwen-like models saved."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> None:
        self.tokenizer = tokenizer
        used = {tokenizer.pad_token_id, tokenizer.eos_token_id}
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            used.update(ids)
        self.vocab = CompactVocab.of(used, MODEL_VOCAB_SIZE)
        self.loss_fn = self.vocab.loss()
        self.shapes: dict[int, QwenShape] = {}

    def new_model(self, shape: QwenShape, seed: int) -> PreTrainedModel:
        model = self._build(shape, seed, self.vocab.size)
        self.shapes[id(model)] = shape
        return model

    def exported(self, model: PreTrainedModel) -> PreTrainedModel:
        """The full 151,936-row model of the stand-in (a fresh copy: the stand-in keeps training)."""
        full = self._build(self.shapes[id(model)], 0, MODEL_VOCAB_SIZE)
        return self.vocab.expand(model, full).eval()

    def save(self, model: PreTrainedModel, directory: Path) -> None:
        save_qwen_files(directory, model, self.tokenizer)  # type: ignore[arg-type]

    @staticmethod
    def _build(shape: QwenShape, seed: int, vocab_size: int) -> PreTrainedModel:
        return build_qwen_model(
            hidden=shape.hidden,
            layers=shape.layers,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            seed=seed,
            dtype=torch.float32,
            vocab_size=vocab_size,
        )


@dataclass(frozen=True)
class ChatMathRecipe:
    """Everything that determines the prepared artefacts (fields as in `prepare.AdditionRecipe`)."""

    version: int = 2
    seed: int = 0
    train_rows: int = 4096
    eval_rows: int = 512
    dev_rows: int = 128
    teacher: QwenShape = QwenShape(layers=4)
    teacher_steps: int = 800
    student: QwenShape = QwenShape(layers=2)
    student_max_steps: int = 1500
    student_start: float = 0.2
    batch_size: int = 64
    lr: float = 3e-3
    teacher_check_every: int = 200
    student_check_every: int = 25
    threads: int = field(default=PREPARE_THREADS, metadata={"hash_omitted_at": PREPARE_THREADS})
    teacher_max_rounds: int = field(default=3, metadata={"hash_omitted_at": 3})
    """Both as in `prepare.AdditionRecipe`."""

    task: ClassVar[Task] = chat_math.TASK
    teacher_min_accuracy: ClassVar[float] = 0.9
    max_new_tokens: ClassVar[int] = 24
    """The longest answer (two lines of sums and `#### N`: 21 tokens) and `<|im_end|>`, with room."""

    def build_tokenizer(self) -> PreTrainedTokenizerFast:
        return build_qwen_tokenizer("qwen2.5")

    def models(self, tokenizer: PreTrainedTokenizerFast, rows: list[dict]) -> CompactQwenModels:
        """The models, their compact vocabulary being every token of the rows' rendered conversations."""
        texts = [str(tokenizer.apply_chat_template(r["messages"], tokenize=False)) for r in rows]
        return CompactQwenModels(tokenizer, texts)

    def graded(self, rows: list[dict], tokenizer: PreTrainedTokenizerFast) -> list[dict[str, str]]:
        """Rows as `evaluate.accuracy` reads them: the rendered prompt, the reference answer (`#### N`)."""
        return [
            {"prompt": prompt_text(tokenizer, r["messages"]), "answer": r["messages"][-1]["content"]}
            for r in rows
        ]

    def held_out(self, n: int, seed: int) -> list[dict]:
        return [p.row() for p in chat_math.sample_problems(n, seed=seed, held_out=True)]

    def train(self, n: int, seed: int) -> list[dict]:
        return [p.row() for p in chat_math.sample_problems(n, seed=seed, held_out=False)]

    def training_pair(self, rng: random.Random, tokenizer: PreTrainedTokenizerFast) -> tuple[str, str]:
        """A fresh problem outside the held-out split: (rendered prompt, the assistant's answer)."""
        while True:
            p = chat_math.random_problem(rng)
            if not chat_math.is_held_out(p):
                messages = p.row()["messages"]
                return prompt_text(tokenizer, messages), p.response  # type: ignore[arg-type]

    def teacher_pair(self, rng: random.Random, tokenizer: PreTrainedTokenizerFast) -> tuple[str, str]:
        """The teacher learns from the same pairs as the student."""
        return self.training_pair(rng, tokenizer)

    def teacher_checks(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rows: list[dict[str, str]]
    ) -> dict[str, tuple[float, float]]:
        """Nothing beyond dev accuracy (`prepare.CharRecipe.teacher_checks`)."""
        return {}
