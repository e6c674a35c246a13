"""The rollout engine in the trainer's process (`plan.rollout_in_trainer`): it samples with the trainer's own
module, so after every optimizer step it samples what an engine of its own would after a weight sync, and
it leaves the module in train mode. The worker class is driven directly here; the loop's path through Ray
runs in the local-run tests (`tests/tasks/test_quickstart.py`: the plan picks it for the addition example).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from distillery_runtime.rollout import GenerationRequest, SamplingSettings, build_engine
from distillery_runtime.run.workers import TrainerWithRollout
from distillery_runtime.training.trainer import step_normalizer

from distillery.api.spec import LossMode, Precision, RolloutEngine
from distillery.plan.loss import LossConfig
from distillery.plan.rollout.settings import RolloutSettings
from distillery.plan.training import TrainerSettings
from tests.runtime.helpers import make_samples

PROMPTS = [(5, 9, 13, 7), (3, 4), (8, 21, 17, 6, 2, 30)]


def _sampled(engine_or_worker, sampling: SamplingSettings) -> dict[str, tuple[list[int], list[float]]]:
    requests = [GenerationRequest(f"r{i}", PROMPTS[i % 3], seed=i) for i in range(6)]
    out = engine_or_worker.generate(requests, sampling)
    samples = [s for part in out for s in part] if not isinstance(out, list) else out
    return {s.sample_id: (s.response_ids, s.logprobs) for s in samples}


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key][0] == b[key][0], key
        assert a[key][1] == pytest.approx(b[key][1], abs=1e-4), key


def test_the_trainer_hosted_engine_samples_what_a_synced_engine_of_its_own_would(job_files):
    settings = TrainerSettings(
        lr=5e-2,
        precision=Precision.FLOAT32,
        micro_batch_size=4,
        loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK),
    )
    rollout = RolloutSettings(
        engine=RolloutEngine.TRANSFORMERS, precision=Precision.FLOAT32, max_model_len=64, seed=0,
        memory_fraction=0.5, enforce_eager=None, replicas=1, tensor_parallel=1, in_trainer=True,
        decode_attention="eager", decode_threads=1,
    )  # fmt: skip
    worker = TrainerWithRollout(str(job_files.student), settings, rollout)
    # the plan's decode settings reach the engine (test_generation checks what the engine does with them)
    assert (worker.engine.decode_attention, worker.engine.decode_threads) == ("eager", 1)
    own = build_engine("transformers", str(job_files.student), dtype=torch.float32, max_model_len=64)
    sampling = SamplingSettings(max_new_tokens=6, temperature=1.0)
    assert worker.dtype() == "float32" and worker.policy_version() == 0

    fixed = worker.sequence_logprobs(PROMPTS[2][:3], PROMPTS[2][3:])
    before = _sampled(worker, sampling)
    _same(before, _sampled(own, sampling))
    assert worker.trainer.model.training  # sampling switched it to eval mode and back

    samples = make_samples(8, 64, 4)
    for _ in range(3):
        worker.train_step(samples, step_normalizer(samples, settings.loss))
    assert worker.policy_version() == 3  # the engine's version is the trainer's, with no sync
    streamed = [s for part in worker.stream(
        [GenerationRequest("s", PROMPTS[0], seed=1)], sampling) for s in part]  # fmt: skip
    assert [s.policy_version for s in streamed] == [3]

    after = _sampled(worker, sampling)
    moved = worker.sequence_logprobs(PROMPTS[2][:3], PROMPTS[2][3:])
    assert max(abs(a - b) for a, b in zip(moved, fixed, strict=True)) > 0.05  # the steps moved the policy...
    own.update_weights(worker.trainer.weights(torch.float32), 3)
    _same(after, _sampled(own, sampling))  # ...to what a separate engine samples once synced
    assert worker.generate([GenerationRequest("g", PROMPTS[1], seed=0)], sampling)[0].policy_version == 3
    assert worker.trainer.model.training

    worker.set_version(7)
    assert worker.policy_version() == 7


@pytest.mark.slow
async def test_a_teacher_scored_in_the_trainer_process_answers_as_its_own_actor_would(job_files, ray_local):
    """The trainer's actor scores a teacher by name through the same client (`RayTeacher`, hosted) as a
    teacher actor of its own: the same scores, one Ray call for the samples the client gathers."""
    from distillery_runtime.run.workers import InProcessTeacherWorker
    from distillery_runtime.teachers.scoring import RayTeacher
    from distillery_runtime.teachers.types import ScoreRequest

    from distillery.api.spec import TeacherEngine
    from distillery.plan.teachers.engines import EngineSettings

    engine = EngineSettings(
        served_model_name="teacher", max_logprobs=4, max_model_len=64, memory_fraction=0.0,
        tensor_parallel=1, dtype="float32", engine=TeacherEngine.TRANSFORMERS,
    )  # fmt: skip
    rollout = RolloutSettings(
        engine=RolloutEngine.TRANSFORMERS, precision=Precision.FLOAT32, max_model_len=64, seed=0,
        memory_fraction=0.5, enforce_eager=None, replicas=1, tensor_parallel=1, in_trainer=True,
    )  # fmt: skip
    settings = TrainerSettings(lr=1e-3, precision=Precision.FLOAT32)
    teachers = {"teacher": (str(job_files.teacher), engine)}
    trainer = ray_local.remote(TrainerWithRollout).remote(str(job_files.student), settings, rollout, teachers)
    own = ray_local.remote(InProcessTeacherWorker).remote(str(job_files.teacher), engine)
    hosted, alone = RayTeacher("teacher", trainer, hosted=True), RayTeacher("teacher", own)
    requests = [ScoreRequest(PROMPTS[i % 3], (11, 30, 8)[: 1 + i % 3], f"s{i}") for i in range(5)]
    try:
        got = await asyncio.gather(*(hosted.score_one(r, 4) for r in requests))
        want = await asyncio.gather(*(alone.score_one(r, 4) for r in requests))
        for a, b in zip(got, want, strict=True):
            assert a.sample_ids == b.sample_ids
            assert (a.topk_ids == b.topk_ids).all()
            assert a.topk_logprobs == pytest.approx(b.topk_logprobs, abs=1e-5)
        batch = await hosted.score(requests, 4)
        assert batch.sample_ids == [r.sample_id for r in requests]
        assert await trainer.teacher_vocabulary.remote("teacher") == await own.vocabulary.remote()
        await hosted.sleep()  # nothing to put to sleep: no call reaches the trainer's actor
    finally:
        await hosted.close()
        await alone.close()
        ray_local.kill(trainer)
        ray_local.kill(own)
