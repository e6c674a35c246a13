"""A LoRA student's rollout: the trainer's adapter, after a real optimizer step (B no longer zero), reaches the
transformers engine (peft on its own copy of the base) and the vLLM engine (vLLM's LoRA, the adapter written
as a peft folder and loaded under a new id), streamed over a sync group (`receive_weights`) and through the
object store's path (`update_weights`); each engine's log-probs of a fixed sequence then equal the trainer's,
and differ from the base model's. A sync carries the adapter alone: a small fraction of the model's bytes.
The plan: a vLLM engine receives the adapter in its own process (one sync rank per replica, whatever its
tensor parallelism), and modules trained whole send `engine: auto` to the transformers engine."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from distillery_runtime.rollout import GenerationRequest, SamplingSettings, build_engine
from distillery_runtime.sync.weight_sync import SyncGroup, tensor_metas
from distillery_runtime.teachers.in_process.student_base import student_base_teacher
from distillery_runtime.teachers.in_process.transformers_forward import TransformersTeacher
from distillery_runtime.teachers.types import ScoreRequest
from distillery_runtime.training.lora import is_adapter_key
from distillery_runtime.training.trainer import Trainer, step_normalizer

from distillery.api.spec import LossMode, Precision, RolloutEngine
from distillery.plan import resolve
from distillery.plan.lora import LoraSettings
from distillery.plan.loss import LossConfig
from distillery.plan.placement.rollout import rollout_line
from distillery.plan.rollout.settings import rollout_engine
from distillery.plan.rollout.sleep import SleepLevel
from distillery.plan.training import TrainerSettings
from distillery.validation import parse_job
from tests.runtime.conftest import JobFiles, manifest
from tests.runtime.helpers import make_samples

PROMPT = [5, 9, 13, 7]
RESPONSE = [11, 30, 8, 21, 17, 6]
LORA = LoraSettings(rank=8, alpha=16)
BUCKET = 4 * 1024
"""Bytes: several buckets for the tiny model's adapter, so that the shared-memory slots are reused."""
TOLERANCE = 1e-4
"""float32 on both sides, as the full-weight sync's test (test_rollout_sync.py)."""
TOP_K = 4
"""The manifest's loss.topK."""
SCORED = [ScoreRequest(PROMPT, RESPONSE, "a"), ScoreRequest([3, 4], [12, 9, 1, 25, 2], "b")]
"""Two samples of different lengths for a teacher of the student's base."""


def _trainer(job_files: JobFiles) -> Trainer:
    settings = TrainerSettings(
        lr=5e-2,
        total_steps=10,  # the schedule's lr stays up for the test's steps
        precision=Precision.FLOAT32,
        micro_batch_size=4,
        loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK),
        lora=LORA,
    )
    return Trainer(str(job_files.student), settings, device="cpu")


def _train(trainer: Trainer) -> list[float]:
    """One optimizer step, which moves the adapter's B off zero; the log-probs of the fixed sequence after."""
    samples = make_samples(8, 64, 4)
    trainer.train_step(samples, step_normalizer(samples, trainer.settings.loss))
    return trainer.sequence_logprobs(PROMPT, RESPONSE)


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


class Sender:
    """Trainer rank 0 of a sync group (a thread here) with one engine as rank 1."""

    def __init__(self, trainer: Trainer, engine: Any) -> None:
        assert engine.sync_ranks == 1
        names = ["trainer rank 0", "rollout engine 0"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.trainer, self.engine = trainer, engine
        self.pool = ThreadPoolExecutor(1)
        sender = self.pool.submit(SyncGroup, "127.0.0.1", port, 0, names)
        engine.join_weight_sync("127.0.0.1", port, 1, names, timeout_s=60)
        self.group = sender.result(timeout=60)

    def sync(self, version: int) -> list[Any]:
        """One streamed sync; the metas it sent."""
        metas = self.trainer.weight_metas(torch.float32)
        sent = self.pool.submit(self.trainer.stream_weights, self.group, torch.float32, BUCKET)
        self.engine.receive_weights(metas, BUCKET, version)
        assert sent.result(timeout=60) == sum(m.nbytes for m in metas)
        return metas

    def close(self) -> None:
        self.group.close()
        self.pool.shutdown(wait=False)


def _check_follows(trainer: Trainer, engine: Any, measured: dict[str, float]) -> None:
    """The engine from its start (the base) through a streamed sync and an object-store one, each after a
    train step, its log-probs the trainer's at each point."""
    base = trainer.sequence_logprobs(PROMPT, RESPONSE)
    assert _gap(engine.sequence_logprobs(PROMPT, RESPONSE), base) < TOLERANCE  # B is zero: the base

    sender = Sender(trainer, engine)
    try:
        streamed = _train(trainer)
        assert _gap(streamed, base) > 0.05  # the step moved the adapter
        assert _gap(engine.sequence_logprobs(PROMPT, RESPONSE), base) < TOLERANCE  # not synced yet
        metas = sender.sync(version=1)
        assert engine.policy_version == 1
        measured["streamed"] = _gap(engine.sequence_logprobs(PROMPT, RESPONSE), streamed)
        assert measured["streamed"] < TOLERANCE

        # What a sync carries: the adapter's A and B, by peft's saved names, and nothing of the base.
        model_state = trainer.model.state_dict()
        assert {m.name for m in metas} == {
            name.replace(".default", "") for name in model_state if is_adapter_key(name)
        }
        assert all(m.name.endswith((".lora_A.weight", ".lora_B.weight")) for m in metas)
        base_metas = tensor_metas(
            [(k, t) for k, t in model_state.items() if not is_adapter_key(k)], torch.float32
        )
        measured["adapter_bytes"] = sum(m.nbytes for m in metas)
        measured["model_bytes"] = sum(m.nbytes for m in base_metas)
        assert measured["adapter_bytes"] < 0.15 * measured["model_bytes"]

        stored = _train(trainer)
        assert _gap(stored, streamed) > 0.01
        engine.update_weights(trainer.weights(torch.float32), 2)
        assert engine.policy_version == 2
        measured["object_store"] = _gap(engine.sequence_logprobs(PROMPT, RESPONSE), stored)
        assert measured["object_store"] < TOLERANCE
        assert _gap(engine.sequence_logprobs(PROMPT, RESPONSE), base) > 0.05  # the adapter applied

        # Sampled responses carry the adapted policy's log-probs: the trainer's own, token by token.
        requests = [GenerationRequest(f"r{i}", tuple(PROMPT), seed=i) for i in range(3)]
        sampling = SamplingSettings(max_new_tokens=5, temperature=1.0)
        out = [s for done in engine.generate(requests, sampling) for s in done]
        assert sorted(s.sample_id for s in out) == ["r0", "r1", "r2"]
        for sample in out:
            assert sample.policy_version == 2
            expected = trainer.sequence_logprobs(sample.prompt_ids, sample.response_ids)
            assert sample.logprobs == pytest.approx(expected, abs=1e-3)
    finally:
        sender.close()


def test_the_transformers_engine_follows_a_lora_trainer(job_files: JobFiles) -> None:
    trainer = _trainer(job_files)
    engine = build_engine(
        "transformers", str(job_files.student), dtype=torch.float32, max_model_len=64, lora=LORA
    )
    measured: dict[str, float] = {}
    _check_follows(trainer, engine, measured)
    print(f"transformers engine, LoRA: {measured}")


@pytest.fixture(scope="module")
def vllm_lora_engine(job_files: JobFiles) -> Iterator[Any]:
    """The module's one vLLM engine with LoRA (each start is seconds of CI)."""
    # top-k log-probs of the base as a teacher (`base_rows`): the plan's max_logprobs where a teacher has
    # placement student.
    engine = build_engine(
        "vllm", str(job_files.student), dtype=torch.float32, max_model_len=64, lora=LORA, max_logprobs=TOP_K
    )
    yield engine
    root = engine.adapter_root
    engine.close()
    assert not root.exists()  # the adapters it wrote go with it
    del engine  # the in-process vLLM engine holds ~2 GB: free it for the tests that follow
    gc.collect()


@pytest.mark.slow
def test_the_vllm_engine_follows_a_lora_trainer(job_files: JobFiles, vllm_lora_engine: Any) -> None:
    engine = vllm_lora_engine
    trainer = _trainer(job_files)
    measured: dict[str, float] = {}
    _check_follows(trainer, engine, measured)
    print(f"vLLM engine, LoRA: {measured}")
    # The engine keeps the adapter it serves and the one before, in a folder of its own.
    root = engine.adapter_root
    assert sorted(p.name for p in root.iterdir()) == ["v1", "v2"]
    engine.update_weights(trainer.weights(torch.float32), 3)
    assert sorted(p.name for p in root.iterdir()) == ["v2", "v3"]
    assert (
        _gap(engine.sequence_logprobs(PROMPT, RESPONSE), trainer.sequence_logprobs(PROMPT, RESPONSE))
        < TOLERANCE
    )


def _check_base_teacher(trainer: Trainer, engine: Any, job_files: JobFiles) -> None:
    """The teacher of the student's base on `engine` (whose adapter a train step has moved) scores as a
    teacher of the base model loaded on its own: the same top-k ids and log-probs, which the adapted
    student's differ from."""
    settings = resolve(_spec(job_files, {"rank": 8})).engines["teacher"]
    base = student_base_teacher(engine, settings)
    alone = TransformersTeacher(
        str(job_files.student), settings, dtype=torch.float32, device=torch.device("cpu")
    )
    got = asyncio.run(base.score(SCORED, TOP_K))
    want = asyncio.run(alone.score(SCORED, TOP_K))
    np.testing.assert_array_equal(got.mask, want.mask)
    np.testing.assert_array_equal(got.topk_ids[got.mask], want.topk_ids[want.mask])
    np.testing.assert_allclose(got.topk_logprobs[got.mask], want.topk_logprobs[want.mask], atol=TOLERANCE)
    np.testing.assert_allclose(got.token_logprobs[got.mask], want.token_logprobs[want.mask], atol=TOLERANCE)
    adapted = trainer.sequence_logprobs(PROMPT, RESPONSE)
    assert _gap(adapted, got.token_logprobs[0, : len(RESPONSE)].tolist()) > 0.05  # not the student's


def test_a_teacher_of_the_students_base_is_the_trainers_model_with_the_adapter_off(
    job_files: JobFiles,
) -> None:
    """Where the rollout samples with the trainer's own model (`rollout_in_trainer`), the base teacher is that
    model with the adapter disabled: no copy, its training mode kept."""
    trainer = _trainer(job_files)
    _train(trainer)
    engine = build_engine("transformers", str(job_files.student), dtype=torch.float32, max_model_len=64)
    engine.model = trainer.model  # as `TrainerWithRollout` builds it
    trainer.model.train()
    _check_base_teacher(trainer, engine, job_files)
    assert trainer.model.training  # the forward's eval mode undone
    before = trainer.sequence_logprobs(PROMPT, RESPONSE)
    _train(trainer)  # the adapter still trains after the base scored
    assert _gap(trainer.sequence_logprobs(PROMPT, RESPONSE), before) > 0.01


@pytest.mark.slow
def test_a_teacher_of_the_students_base_on_vllm_scores_requests_without_the_adapter(
    job_files: JobFiles, vllm_lora_engine: Any
) -> None:
    trainer = _trainer(job_files)
    _train(trainer)
    vllm_lora_engine.update_weights(trainer.weights(torch.float32), 7)
    assert (
        _gap(
            vllm_lora_engine.sequence_logprobs(PROMPT, RESPONSE), trainer.sequence_logprobs(PROMPT, RESPONSE)
        )
        < TOLERANCE
    )  # the engine samples the adapted student
    _check_base_teacher(trainer, vllm_lora_engine, job_files)


def test_the_plan_scores_a_teacher_of_the_students_base_where_the_rollout_runs(job_files: JobFiles) -> None:
    def plan(gpus: int, **rollout: Any) -> Any:
        doc = manifest(job_files)
        doc["spec"]["student"].update(
            lora={"rank": 8},
            rollout={"maxNewTokens": 6, **rollout},
            pool={"workers": 1, "gpusPerWorker": gpus},
        )
        doc["spec"]["teachers"] = [
            {"name": "base", "model": doc["spec"]["student"]["model"], "placement": "student"},
        ]
        return resolve(parse_job(doc).spec)

    on_gpu = plan(1, engine="vllm")
    assert on_gpu.teachers_in_rollout == {"base"} and not on_gpu.teachers_in_trainer
    assert on_gpu.rollout.max_logprobs == on_gpu.top_k  # vLLM returns the teacher's top-k
    assert on_gpu.engines["base"].memory_fraction == 0.0  # nothing of its own on the GPU
    assert on_gpu.gpu_budget.student_gpu_taken == on_gpu.rollout.memory_fraction
    assert on_gpu.gpu_placement is not None
    assert [a.name for a in on_gpu.gpu_placement.actors if "teacher" in a.name] == []
    cpu = plan(0, engine="transformers")
    assert cpu.rollout.in_trainer and cpu.teachers_in_trainer == {"base"} and not cpu.teachers_in_rollout
    assert cpu.engines["base"].coalesced_in_flight == 1
    full = manifest(job_files)
    full["spec"]["teachers"] = [
        {"name": "base", "model": full["spec"]["student"]["model"], "placement": "student"}
    ]
    with pytest.raises(ValueError, match=r"needs student\.lora"):
        parse_job(full)


def _spec(job_files: JobFiles, lora: dict[str, Any] | None, gpus: int = 0, **rollout: Any) -> Any:
    doc = manifest(job_files)
    doc["spec"]["student"].update(
        rollout={"maxNewTokens": 6, **rollout}, pool={"workers": 1, "gpusPerWorker": gpus}
    )
    if lora is not None:
        doc["spec"]["student"]["lora"] = lora
    return parse_job(doc).spec


def test_a_vllm_engine_takes_the_adapter_in_one_sync_rank_whatever_its_tensor_parallelism(
    job_files: JobFiles,
) -> None:
    rollout = {"engine": "vllm", "tensorParallel": 2, "replicas": 2}
    lora = resolve(_spec(job_files, {"rank": 8}, **rollout)).rollout
    assert lora.lora == LoraSettings(rank=8, alpha=16.0)
    assert (lora.replica_sync_ranks, lora.sync_ranks) == (1, 2)
    full = resolve(_spec(job_files, None, **rollout)).rollout
    assert full.lora is None
    assert (full.replica_sync_ranks, full.sync_ranks) == (2, 4)  # full weights: every worker loads its shard
    # The transformers engine is one rank a replica in any case.
    assert replace(lora, engine=RolloutEngine.TRANSFORMERS, tensor_parallel=1).sync_ranks == 2


def test_modules_trained_whole_send_auto_to_the_transformers_engine(job_files: JobFiles) -> None:
    # On a GPU auto samples with vLLM, whose LoRA cannot load an lm_head trained whole.
    with_head = _spec(job_files, {"rank": 8, "modulesToSave": ["lm_head"]}, gpus=1)
    assert rollout_engine(with_head, None) == RolloutEngine.TRANSFORMERS
    assert resolve(with_head).rollout.engine == RolloutEngine.TRANSFORMERS
    assert "auto: lora.modulesToSave" in rollout_line(with_head, None)
    assert rollout_engine(_spec(job_files, {"rank": 8}, gpus=1), None) == RolloutEngine.VLLM
    assert rollout_engine(_spec(job_files, None, gpus=1), None) == RolloutEngine.VLLM


def test_a_lora_engine_on_a_gpu_keeps_its_base_weights_while_it_sleeps(job_files: JobFiles) -> None:
    """The sync after a wake-up loads the adapter alone: the base must survive the sleep (level 1)."""
    full = resolve(_spec(job_files, None, gpus=1)).rollout
    assert full.sleep_level == SleepLevel.DISCARD_WEIGHTS
    lora = resolve(_spec(job_files, {"rank": 8}, gpus=1)).rollout
    assert lora.sleep_level == SleepLevel.OFFLOAD_WEIGHTS
