"""Weight sync: after an optimizer step and an update, the rollout engine's log-probs of a fixed sequence
equal the trainer's. Real engines: vLLM (CPU build, in-process; eager and torch.compiled, whose graphs must
see weights reloaded in place) and the transformers fallback."""

from __future__ import annotations

import gc

import pytest
import torch
from distillery_runtime.rollout import GenerationRequest, SamplingSettings, build_engine
from distillery_runtime.trainer import Trainer, step_normalizer

from distillery.api.spec import LossMode, Precision
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings
from tests.runtime.helpers import make_samples

PROMPT = [5, 9, 13, 7]
RESPONSE = [11, 30, 8, 21, 17, 6]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "enforce_eager"),
    [("vllm", True), ("vllm", False), ("transformers", None)],
    ids=["vllm", "vllm-compiled", "transformers"],
)
def test_rollout_engine_follows_the_trainer(job_files, kind, enforce_eager):
    settings = TrainerSettings(
        lr=5e-2,
        precision=Precision.FLOAT32,
        micro_batch_size=4,
        loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK),
    )
    trainer = Trainer(str(job_files.student), settings, device="cpu")
    engine = build_engine(
        kind, str(job_files.student), dtype=torch.float32, max_model_len=64, enforce_eager=enforce_eager
    )
    if kind == "vllm":
        assert engine.enforce_eager is enforce_eager
    try:
        _check_sync(trainer, engine, settings)
    finally:
        del engine  # the in-process vLLM engine holds ~2 GB: free it for the tests that follow
        gc.collect()


def _check_sync(trainer, engine, settings):

    before = trainer.sequence_logprobs(PROMPT, RESPONSE)
    assert engine.sequence_logprobs(PROMPT, RESPONSE) == pytest.approx(before, abs=1e-4)

    samples = make_samples(8, 64, 4)
    for _ in range(3):
        trainer.train_step(samples, step_normalizer(samples, settings.loss))
    after = trainer.sequence_logprobs(PROMPT, RESPONSE)
    assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 0.05  # training moved them
    stale = engine.sequence_logprobs(PROMPT, RESPONSE)
    assert stale == pytest.approx(before, abs=1e-4)  # the engine has not seen the update yet

    engine.update_weights(trainer.weights(torch.float32), version=trainer.version)
    assert engine.policy_version == 3
    assert engine.sequence_logprobs(PROMPT, RESPONSE) == pytest.approx(after, abs=1e-4)

    # Sampled responses carry the rollout policy's log-probs: the trainer's own, token by token.
    requests = [GenerationRequest(f"r{i}", tuple(PROMPT), seed=i) for i in range(3)]
    out = list(engine.generate(requests, SamplingSettings(max_new_tokens=5, temperature=1.0)))
    assert sorted(s.sample_id for s in out) == ["r0", "r1", "r2"]
    for sample in out:
        assert sample.policy_version == 3 and 1 <= len(sample.response_ids) <= 5
        expected = trainer.sequence_logprobs(sample.prompt_ids, sample.response_ids)
        assert sample.logprobs == pytest.approx(expected, abs=1e-3)
    # The same seeds give the same samples (deterministic CPU mode).
    again = {
        s.sample_id: s.response_ids for s in engine.generate(requests, SamplingSettings(max_new_tokens=5))
    }
    assert again == {s.sample_id: s.response_ids for s in out}
