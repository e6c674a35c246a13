"""Weight sync: after an optimizer step and an update, the rollout engine's log-probs of a fixed sequence
equal the trainer's. Real engines: vLLM (CPU build, in-process; eager and torch.compiled, whose graphs must
see weights reloaded in place), vLLM with two tensor-parallel worker processes, and the transformers
fallback; updated through the object store's path (`update_weights`) and streamed over a sync group
(`receive_weights`, through vLLM's weight-transfer API into each worker). The streamed sync reaches a vLLM
engine whose weights were all made NaN first, as sleep level 2 leaves them undefined: it loads every one."""

from __future__ import annotations

import gc
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from distillery_runtime.rollout import GenerationRequest, SamplingSettings, build_engine
from distillery_runtime.sync.weight_sync import SyncGroup
from distillery_runtime.training.trainer import Trainer, step_normalizer

from distillery.api.spec import LossMode, Precision
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings
from tests.runtime.helpers import make_samples

PROMPT = [5, 9, 13, 7]
RESPONSE = [11, 30, 8, 21, 17, 6]


def _settings() -> TrainerSettings:
    """A learning rate that moves the log-probs well past the tolerance in three steps."""
    return TrainerSettings(
        lr=5e-2,
        precision=Precision.FLOAT32,
        micro_batch_size=4,
        loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "enforce_eager"),
    [("vllm", True), ("vllm", False), ("transformers", None)],
    ids=["vllm", "vllm-compiled", "transformers"],
)
def test_rollout_engine_follows_the_trainer(job_files, kind, enforce_eager):
    settings = _settings()
    trainer = Trainer(str(job_files.student), settings, device="cpu")
    engine = build_engine(
        kind, str(job_files.student), dtype=torch.float32, max_model_len=64, enforce_eager=enforce_eager
    )
    if kind == "vllm":
        assert engine.enforce_eager is enforce_eager
    try:
        _check_sync(trainer, engine, settings, lambda e: e.update_weights(trainer.weights(torch.float32), 3))
    finally:
        del engine  # the in-process vLLM engine holds ~2 GB: free it for the tests that follow
        gc.collect()


BUCKET = 4 * 1024
"""Bytes: many buckets for the tiny model, so that a layer's tensors span several."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "tensor_parallel"),
    # Two vLLM worker processes (tensorParallel 2), each its own rank of the sync group loading its half of
    # every weight, are tests/runtime/test_tensor_parallel_run.py's: its run's log-probs after each sync
    # show a worker that missed one. Its engine here cost another 3-6 minutes of the suite.
    [("vllm", 1), ("transformers", 1)],
    ids=["vllm", "transformers"],
)
def test_streamed_sync_reaches_every_engine_worker(job_files, kind, tensor_parallel):
    """Trainer rank 0 here (a thread) streams to the engine's workers, each its own rank of the sync
    group."""
    settings = _settings()
    trainer = Trainer(str(job_files.student), settings, device="cpu")
    engine = build_engine(
        kind, str(job_files.student), dtype=torch.float32, max_model_len=64, tensor_parallel=tensor_parallel
    )
    assert engine.sync_ranks == tensor_parallel
    names = ["trainer rank 0", *(f"engine worker {w}" for w in range(tensor_parallel))]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool = ThreadPoolExecutor(1)
    try:
        sender = pool.submit(SyncGroup, "127.0.0.1", port, 0, names)
        engine.join_weight_sync("127.0.0.1", port, 1, names, timeout_s=60)
        group = sender.result(timeout=60)
        metas = trainer.weight_metas(torch.float32)

        def streamed(e: Any) -> None:
            if kind == "vllm":
                # What sleep level 2 leaves (plan/rollout/sleep.py): weights undefined until the sync loads them. A
                # parameter the sync missed would stay NaN, and the log-probs below with it.
                e.llm.collective_rpc(_discard_weights)
                assert all(x != x for x in e.sequence_logprobs(PROMPT, RESPONSE))  # NaN: the discard took
            sent = pool.submit(trainer.stream_weights, group, torch.float32, BUCKET)
            e.receive_weights(metas, BUCKET, version=3)
            assert sent.result(timeout=60) == sum(m.nbytes for m in metas)

        _check_sync(trainer, engine, settings, streamed)
        group.close()
    finally:
        pool.shutdown(wait=False)
        del engine
        gc.collect()


def _discard_weights(worker: Any) -> None:
    """In a vLLM worker (a collective RPC): every parameter of its model overwritten with NaN."""
    with torch.no_grad():
        for parameter in worker.get_model().parameters():
            parameter.fill_(float("nan"))


def _check_sync(trainer, engine, settings, update: Callable[[Any], None]) -> None:

    before = trainer.sequence_logprobs(PROMPT, RESPONSE)
    assert engine.sequence_logprobs(PROMPT, RESPONSE) == pytest.approx(before, abs=1e-4)

    samples = make_samples(8, 64, 4)
    for _ in range(3):
        trainer.train_step(samples, step_normalizer(samples, settings.loss))
    after = trainer.sequence_logprobs(PROMPT, RESPONSE)
    assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 0.05  # training moved them
    stale = engine.sequence_logprobs(PROMPT, RESPONSE)
    assert stale == pytest.approx(before, abs=1e-4)  # the engine has not seen the update yet

    assert trainer.version == 3
    update(engine)
    assert engine.policy_version == 3
    assert engine.sequence_logprobs(PROMPT, RESPONSE) == pytest.approx(after, abs=1e-4)

    # Sampled responses carry the rollout policy's log-probs: the trainer's own, token by token.
    requests = [GenerationRequest(f"r{i}", tuple(PROMPT), seed=i) for i in range(3)]
    out = [
        s
        for done in engine.generate(requests, SamplingSettings(max_new_tokens=5, temperature=1.0))
        for s in done
    ]
    assert sorted(s.sample_id for s in out) == ["r0", "r1", "r2"]
    for sample in out:
        assert sample.policy_version == 3 and 1 <= len(sample.response_ids) <= 5
        expected = trainer.sequence_logprobs(sample.prompt_ids, sample.response_ids)
        assert sample.logprobs == pytest.approx(expected, abs=1e-3)
    # The same seeds give the same samples (deterministic CPU mode).
    again = {
        s.sample_id: s.response_ids
        for done in engine.generate(requests, SamplingSettings(max_new_tokens=5))
        for s in done
    }
    assert again == {s.sample_id: s.response_ids for s in out}
