"""A teacher that is the LoRA student's own base model (`placement: student`), scored by the engine that
samples the student, with the adapter off: no second copy of the base (`distillery.plan.rollout.student_base`).

The transformers engine's model is a peft model (the trainer's own where the rollout runs in the trainer's
process): its forward with `disable_adapter()` is the base's, in eval mode so that no dropout touches it.
vLLM holds the base beside the adapter: a request without a LoRA request is scored by the base alone
(`VllmRolloutEngine.base_rows`). Either way the rows are what a teacher of the same model would return:
raw log-probs in float32, the exact top-k.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from distillery.plan.teachers.engines import EngineSettings
from distillery_runtime.teachers.base import BatchTeacher, Rows
from distillery_runtime.teachers.in_process.transformers_forward import TransformersTeacher
from distillery_runtime.teachers.types import ScoreRequest
from distillery_runtime.teachers.wire import WireSequence


@contextlib.contextmanager
def adapter_off(model: Any) -> Iterator[None]:
    """A peft model computing its base: the adapter disabled and eval mode for the forward, the model's mode
    restored after (the trainer's model trains between rollouts)."""
    training = model.training
    model.eval()
    try:
        with model.disable_adapter():
            yield
    finally:
        model.train(training)


class VllmBaseTeacher(BatchTeacher):
    """The base of a vLLM rollout engine that serves a LoRA student (`VllmRolloutEngine.base_rows`)."""

    def __init__(self, engine: Any, settings: EngineSettings) -> None:
        self.name = settings.served_model_name
        self.engine = engine
        self.engine_settings = settings

    async def _limits(self) -> tuple[int | None, int | None]:
        return self.engine_settings.max_model_len, self.engine_settings.max_logprobs

    async def _score_rows(self, samples: Sequence[ScoreRequest], top_k: int) -> list[Rows]:
        seqs = [
            WireSequence([*s.prompt_ids, *s.response_ids], len(s.prompt_ids), s.sample_id) for s in samples
        ]
        rows: list[Rows] = self.engine.base_rows(seqs, top_k)
        return rows

    def vocabulary(self) -> dict[int, str]:
        from distillery_runtime.teachers.checks.tokenizer_compat import tokenizer_vocabulary

        return tokenizer_vocabulary(self.engine.llm.get_tokenizer())

    async def sleep(self) -> None:
        """Nothing of its own: it sleeps and wakes with the rollout engine."""

    async def wake_up(self) -> None:
        """Nothing of its own."""


def student_base_teacher(engine: Any, settings: EngineSettings) -> BatchTeacher:
    """The teacher of the student's base on `engine`, a LoRA student's rollout engine: vLLM's base, or the
    transformers engine's peft model with the adapter off."""
    if hasattr(engine, "base_rows"):
        return VllmBaseTeacher(engine, settings)
    model = engine.model
    if not hasattr(model, "disable_adapter"):
        raise ValueError(
            f"teacher {settings.served_model_name}: placement student needs a LoRA student's engine (a peft model)"
        )
    return TransformersTeacher.of_model(model, engine.tokenizer, settings, lambda: adapter_off(model))
