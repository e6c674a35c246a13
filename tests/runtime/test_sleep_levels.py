"""The plan's sleep levels as the engines translate them and the loop orders them. The rollout engine
(rollout/sleep_mode.py, vllm_engine.py): at level 2 the weights are undefined from the sleep until the
weight sync, so a wake-up wakes the weights alone, the sync loads them, the KV cache wakes after it, and
sampling before the sync is refused; the loop wakes, syncs, and only then samples. A colocated teacher
(teachers/in_process/colocated.py) sleeps at the plan's level 1 and refuses level 2, which nothing would undo.

vLLM's CPU build has no sleep mode (`enable_sleep_mode` needs a GPU), so no real engine can sleep here:
`VllmSleepDouble` stands in for `vllm.LLM` in these calls only, keeping the state vLLM keeps (its
executor's sleeping tags; weights undefined after a level-2 sleep until a load) and logging each call.
The engine's methods under test are the real ones."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.rollout.sleep_mode import EngineSleep
from distillery_runtime.rollout.vllm_engine import VllmRolloutEngine
from distillery_runtime.run.loop.components import Components
from distillery_runtime.run.loop.loop import Loop
from distillery_runtime.run.loop.state import RunOptions
from distillery_runtime.teachers.scoring import TeacherStats
from distillery_runtime.teachers.types import ScoreRequest, TeacherScores

from distillery.plan.rollout.sleep import SleepLevel
from distillery.plan.teachers.engines import EngineSettings
from distillery.runtime_config import resolve_runtime_config
from distillery.validation import parse_job
from tests.runtime.conftest import JobFiles, manifest

SAMPLING = SamplingSettings(max_new_tokens=4)


class VllmSleepDouble:
    """`vllm.LLM`'s sleep mode, sync and scheduler calls, where vLLM's GPU sleep mode would run (see the
    module's docstring): the executor's sleeping tags, whether the weights are defined, a log of calls."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.sleeping: set[str] = set()
        self.weights_defined = True
        self.llm_engine = self

    def sleep(self, level: int = 1) -> None:
        assert not self.sleeping, "vLLM cannot put a sleeping engine to sleep"
        self.log.append(f"sleep level {level}")
        self.sleeping = {"weights", "kv_cache"}
        if level == 2:
            self.weights_defined = False

    def wake_up(self, tags: list[str] | None = None) -> None:
        woken = set(tags) if tags else set(self.sleeping)
        assert woken <= self.sleeping, f"waking {woken}, asleep {self.sleeping}"
        self.sleeping -= woken
        self.log.append("wake " + ",".join(sorted(woken)))

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> list[Any]:
        assert "weights" not in self.sleeping, f"{method}: loading weights into memory that is asleep"
        self.log.append(method)
        if method in ("finish_weight_update", "reload_weights"):
            self.weights_defined = True
        return []

    def reset_prefix_cache(self) -> None:
        self.log.append("reset_prefix_cache")

    def has_unfinished_requests(self) -> bool:
        return False


def engine_over(llm: VllmSleepDouble, level: SleepLevel) -> VllmRolloutEngine:
    """The real engine's methods over the double (its `__init__` would start vLLM, which sleeps on no CPU)."""
    engine = VllmRolloutEngine.__new__(VllmRolloutEngine)
    engine.llm = llm  # type: ignore[assignment]
    engine.engine = llm.llm_engine  # type: ignore[assignment]
    engine.policy_version = 0
    engine._counter = 0
    engine.sleep_mode = EngineSleep(llm, level)
    engine.lora, engine.adapter, engine.sync_group = None, None, None  # a full student's engine
    return engine


def sample_now(engine: VllmRolloutEngine) -> None:
    """What a rollout does first (no requests: the double decodes nothing)."""
    for _ in engine.generate([], SAMPLING):
        pass


def test_level_2_wakes_the_weights_syncs_them_then_wakes_the_kv_cache() -> None:
    log: list[str] = []
    llm = VllmSleepDouble(log)
    engine = engine_over(llm, SleepLevel.DISCARD_WEIGHTS)
    sample_now(engine)  # the engine loaded its weights at start and has not slept: it samples at once
    engine.sleep()
    engine.wake_up()
    engine.receive_weights([], 1024, version=1)
    assert log == [
        "sleep level 2",
        "wake weights",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
        "wake kv_cache",
        "reset_prefix_cache",
    ]
    assert not llm.sleeping and llm.weights_defined and engine.policy_version == 1
    sample_now(engine)


def test_sampling_between_a_level_2_wake_up_and_the_sync_is_refused() -> None:
    llm = VllmSleepDouble([])
    engine = engine_over(llm, SleepLevel.DISCARD_WEIGHTS)
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        sample_now(engine)
    engine.wake_up()
    with pytest.raises(RuntimeError, match="sleep level 2, which discards its weights: sync them"):
        sample_now(engine)
    with pytest.raises(RuntimeError, match="sync them before sampling"):
        engine.sequence_logprobs([1, 2], [3])
    engine.sleep()  # half awake: vLLM cannot put its KV cache to sleep twice, so nothing is called
    assert llm.sleeping == {"kv_cache"}
    engine.update_weights([], version=2)  # the object store's path loads them as well
    assert not llm.sleeping and llm.weights_defined
    sample_now(engine)


def test_level_1_wakes_everything_at_once_and_none_never_sleeps() -> None:
    log: list[str] = []
    engine = engine_over(VllmSleepDouble(log), SleepLevel.OFFLOAD_WEIGHTS)
    engine.sleep()
    engine.wake_up()
    sample_now(engine)  # the weights came back from host memory
    engine.receive_weights([], 1024, version=1)
    assert log == [
        "sleep level 1",
        "wake kv_cache,weights",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
        "reset_prefix_cache",
    ]
    log.clear()
    engine = engine_over(VllmSleepDouble(log), SleepLevel.NONE)
    engine.sleep()
    engine.wake_up()
    assert log == []


class AsyncSleepDouble:
    """`vllm.AsyncLLM.sleep`, for the same reason as VllmSleepDouble: the levels it is put to sleep at."""

    def __init__(self) -> None:
        self.levels: list[int] = []

    async def sleep(self, level: int = 1) -> None:
        self.levels.append(level)


async def test_a_colocated_teacher_sleeps_at_the_plans_level_and_refuses_level_2() -> None:
    from distillery_runtime.teachers.in_process.colocated import ColocatedTeacher

    def settings(level: SleepLevel) -> EngineSettings:
        return EngineSettings("teacher", 4, 64, 0.4, 1, "bfloat16", sleep_level=level)

    with pytest.raises(ValueError, match="cannot sleep at level 2"):
        ColocatedTeacher("model", settings(SleepLevel.DISCARD_WEIGHTS))
    teacher = ColocatedTeacher("model", settings(SleepLevel.OFFLOAD_WEIGHTS))
    double = AsyncSleepDouble()
    teacher.engine, teacher.sleeps = double, True  # what `start()` sets where vLLM has a sleep mode
    await teacher.sleep()
    await teacher.sleep()  # asleep already: one call
    assert double.levels == [1] and teacher.asleep


# ------------------------------------------------------------------------------------------ the loop


class _Remote:
    """A Ray actor method's `.remote(...)`, awaited in place."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        async def call() -> Any:
            return self.fn(*args)

        return call()


class StandInTrainer:
    """Trainer rank 0's calls the loop makes: a step, its side of the streamed sync, a checkpoint."""

    def __init__(self, log: list[str]) -> None:
        def train(samples: list[Any], normalizer: float) -> dict[str, float]:
            log.append("train")
            return {"distill/loss": 0.0}

        self.train_step = _Remote(train)
        self.stream_weights = _Remote(lambda dtype, bucket: 0)
        self.save_checkpoint = _Remote(lambda *args: ("checkpoint", None))


class StandInPool:
    """RolloutPool's calls over the one engine (the pool only forwards them to its actors)."""

    def __init__(self, engine: VllmRolloutEngine, log: list[str]) -> None:
        self.engine, self.log = engine, log

    async def stream(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> AsyncIterator[RolloutSample]:
        sample_now(self.engine)  # the engine's own check that its weights are defined
        assert self.engine.llm.weights_defined  # type: ignore[attr-defined]
        self.log.append("generate")
        for r in requests:
            yield RolloutSample(
                sample_id=r.sample_id, prompt_ids=list(r.prompt_ids), response_ids=[5, 6],
                logprobs=[-0.5, -0.5], answer=r.answer, finish_reason="length",
            )  # fmt: skip

    async def sleep(self) -> None:
        self.engine.sleep()

    async def wake_up(self) -> None:
        self.engine.wake_up()

    async def receive_weights(self, metas: list[Any], bucket_bytes: int, version: int) -> None:
        self.engine.receive_weights(metas, bucket_bytes, version)


class StandInScoring:
    """The teachers' scoring: each response token at -1."""

    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    def teacher_name(self, request: ScoreRequest) -> str:
        return "teacher"

    async def score_one(self, request: ScoreRequest) -> tuple[str, TeacherScores]:
        r = len(request.response_ids)
        return "teacher", TeacherScores(
            topk_ids=np.zeros((1, r, 0), np.int32), topk_logprobs=np.zeros((1, r, 0), np.float32),
            token_logprobs=np.full((1, r), -1.0, np.float32), mask=np.ones((1, r), bool),
        )  # fmt: skip

    def take_stats(self) -> TeacherStats:
        return TeacherStats()

    def retries(self) -> dict[str, int]:
        return {}


async def test_the_loop_wakes_syncs_then_samples_at_the_plans_level(
    job_files: JobFiles, tmp_path: Path
) -> None:
    doc = manifest(job_files)
    doc["spec"]["teachers"] = [
        {"name": "teacher", "model": "t", "placement": "external", "endpoint": "http://teacher.example:8000"}
    ]
    doc["spec"]["student"]["pool"]["gpusPerWorker"] = 1
    del doc["spec"]["data"]["eval"], doc["spec"]["schedule"]["evalEvery"]
    loop = Loop(resolve_runtime_config(parse_job(doc), None, in_cluster=False), RunOptions(tmp_path, steps=3))
    assert loop.plan.rollout.sleeps and loop.plan.rollout.sleep_level == SleepLevel.DISCARD_WEIGHTS
    log: list[str] = []
    engine = engine_over(VllmSleepDouble(log), loop.plan.rollout.sleep_level)
    c = Components(
        trainers=[StandInTrainer(log)],
        rollout=StandInPool(engine, log),  # type: ignore[arg-type]
        scoring=StandInScoring(),
        teachers=[],
        rollout_dtype="float32",
        weight_metas=[],  # the streamed sync
    )
    result = await loop.run(c)
    assert result.steps_done == 3
    step = [
        "generate",
        "sleep level 2",
        "train",
        "wake weights",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
        "wake kv_cache",
        "reset_prefix_cache",
    ]
    assert log == step * 3
