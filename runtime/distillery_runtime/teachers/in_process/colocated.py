"""Colocated teacher: an in-process vLLM engine (`AsyncLLM`) on the student's devices.

It scores through the same tensor path as the teacher server's compact endpoint
(`engine_scoring`), on the caller's event loop: no second loop, no `asyncio.run` inside.

Sleep/wake: around training the trainer calls `sleep()` and `wake_up()` before scoring, at the
plan's level (`EngineSettings.sleep_level`: 1 on the student's GPUs, the weights offloaded to host
memory and the KV cache freed, as nothing reloads a teacher's weights; `distillery.plan.rollout.sleep`).
vLLM supports sleep mode on CUDA/ROCm/XPU only; on CPU the plan's level is 0 and both calls are
no-ops (`sleeps` is False), the engine keeping its memory. After a real
wake-up the teacher re-scores a fixed probe and compares it with the probe taken at start,
because a known failure mode is a woken teacher returning -ln(V) everywhere (weights not
restored); a mismatch raises instead of silently training on garbage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from distillery.plan.rollout.sleep import SleepLevel
from distillery.plan.teachers.engines import EngineSettings
from distillery_runtime.teachers.base import BatchTeacher, Rows
from distillery_runtime.teachers.checks.consistency import check_after_wake
from distillery_runtime.teachers.types import ScoreRequest, TeacherError
from distillery_runtime.teachers.wire import WireSequence


def probe(vocabulary: int) -> WireSequence:
    """The fixed sequence scored at start and after each wake-up: ids 1..16, folded into a vocabulary smaller
    than that (a tiny model's: vLLM refuses an id past its vocabulary)."""
    return WireSequence([i % vocabulary for i in range(1, 17)], 1, "probe")


class ColocatedTeacher(BatchTeacher):
    """`vllm.AsyncLLM` in this process; `await start()` before use, `await close()` after."""

    def __init__(
        self,
        model: str,
        engine: EngineSettings,
        *,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """`engine`: the plan's settings of this teacher (its sleep level among them: `plan.sleep`);
        `engine_kwargs`: vLLM arguments that override them."""
        if engine.sleep_level == SleepLevel.DISCARD_WEIGHTS:
            # Level 2 discards the weights and nothing reloads a teacher's: it would score garbage.
            raise ValueError(
                f"teacher {engine.served_model_name}: a teacher's engine cannot sleep at level 2"
            )
        self.name = engine.served_model_name
        self.model = model
        self.engine_settings = engine
        self.sleep_level = engine.sleep_level
        self.engine_kwargs = dict(engine_kwargs or {})
        self.engine: Any = None
        self.sleeps = False
        self.asleep = False
        self._probe: np.ndarray | None = None

    async def start(self) -> ColocatedTeacher:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        from distillery_runtime.teachers.in_process.engine_scoring import install_tensor_logprobs

        install_tensor_logprobs()
        # The plan's level where this device has a sleep mode (vLLM's CPU build has none).
        self.sleeps = self.sleep_level != SleepLevel.NONE and bool(current_platform.is_sleep_mode_available())
        kwargs = self.engine_options(on_gpu=bool(current_platform.is_cuda_alike()))
        args = AsyncEngineArgs(model=self.model, enable_sleep_mode=self.sleeps, **kwargs)
        self.engine = AsyncLLM.from_engine_args(args)
        self._probe_sequence = probe(self.engine.model_config.get_vocab_size())
        self._probe = (await self._rows([self._probe_sequence], 1))[0][2]
        return self

    def engine_options(self, *, on_gpu: bool) -> dict[str, Any]:
        """vLLM engine arguments beyond the model's: the plan's (on a GPU the teacher takes its budgeted
        share, not vLLM's default 0.9: the rollout engine is awake beside it), then the overrides."""
        return {**self.engine_settings.engine_kwargs(on_gpu=on_gpu), **self.engine_kwargs}

    async def _limits(self) -> tuple[int | None, int | None]:
        return self.engine_settings.max_model_len, self.engine_settings.max_logprobs

    async def _rows(self, seqs: Sequence[WireSequence], top_k: int) -> list[Rows]:
        from distillery_runtime.teachers.in_process.engine_scoring import score_one_sequence, scoring_params

        if self.engine is None:
            raise TeacherError(f"teacher {self.name}: call `await start()` first")
        if self.asleep:
            raise TeacherError(f"teacher {self.name} is asleep: call `await wake_up()` before scoring")
        params = scoring_params(top_k)
        return list(await asyncio.gather(*(score_one_sequence(self.engine, s, top_k, params) for s in seqs)))

    async def _score_rows(self, samples: Sequence[ScoreRequest], top_k: int) -> list[Rows]:
        seqs = [
            WireSequence([*s.prompt_ids, *s.response_ids], len(s.prompt_ids), s.sample_id) for s in samples
        ]
        return await self._rows(seqs, top_k)

    async def sleep(self) -> None:
        """Free the device for training (no-op where vLLM has no sleep mode, e.g. CPU)."""
        if self.sleeps and not self.asleep:
            await self.engine.sleep(int(self.sleep_level))
            self.asleep = True

    async def wake_up(self) -> None:
        """Restore the engine before scoring, and check that the weights came back."""
        if not self.asleep:
            return
        await self.engine.wake_up()
        self.asleep = False
        # Every wake, not a schedule: a wake that loses the weights scores -ln V from then on, and one
        # 16-token prefill is nothing beside a step's scoring (`teachers.consistency`).
        woken = (await self._rows([self._probe_sequence], 1))[0][2]
        if self._probe is not None:
            check_after_wake(self.name, self._probe.tolist(), woken.tolist())

    def vocabulary(self) -> dict[int, str]:
        """The id -> token map of the tokenizer the engine loaded (`tokenizer_compat`)."""
        from distillery_runtime.teachers.checks.tokenizer_compat import tokenizer_vocabulary

        if self.engine is None:
            raise RuntimeError("ColocatedTeacher.start() was not awaited")
        return tokenizer_vocabulary(self.engine.get_tokenizer())

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
