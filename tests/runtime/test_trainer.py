"""The trainer: gradient accumulation and data parallelism give the update of one big batch.

The data-parallel test runs real Ray actors joined by torch.distributed (gloo on CPU), as the loop does.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from distillery_runtime.losses import reduction_units
from distillery_runtime.training.trainer import Trainer, collate, micro_batches, step_normalizer

from distillery.api.spec import LossMode, Precision, Reduction
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings
from tests.runtime.helpers import make_samples


def settings(
    micro_batch: int, mode: LossMode = LossMode.FORWARD_KL_TOPK, reduction: Reduction = Reduction.TOKEN_MEAN
) -> TrainerSettings:
    return TrainerSettings(
        lr=1e-2, grad_clip=0.5, micro_batch_size=micro_batch, precision=Precision.FLOAT32, total_steps=4, warmup_steps=1,
        loss=LossConfig(mode=mode, reduction=reduction),
    )  # fmt: skip


@pytest.mark.parametrize("reduction", list(Reduction))
def test_micro_batch_weights_and_the_step_normaliser_come_from_one_count(reduction: Reduction) -> None:
    # A mean's micro-batch weights (share / normaliser) add up to 1; sum weighs every micro-batch 1.
    samples = make_samples(7, 64, 4, seed=2)
    loss = LossConfig(mode=LossMode.FORWARD_KL_TOPK, reduction=reduction)
    normaliser = step_normalizer(samples, loss)
    parts = micro_batches(samples, 3, None)
    shares = [
        int(reduction_units(collate(part, loss, pad_id=0)["mask"].sum(-1), reduction)) for part in parts
    ]
    weights = [share / normaliser for share in shares]
    assert sum(weights) == pytest.approx(len(parts) if reduction == Reduction.SUM else 1.0, rel=1e-12)


def params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize(
    ("mode", "reduction"),
    [
        (LossMode.FORWARD_KL_TOPK, Reduction.TOKEN_MEAN),
        (LossMode.K3, Reduction.SEQUENCE_MEAN),
        (LossMode.JSD, Reduction.SUM),
    ],
)
def test_gradient_accumulation_matches_one_big_micro_batch(job_files, mode, reduction):
    vocab = 64
    samples = make_samples(6, vocab, 4)
    results = []
    for mb in (6, 2, 1):
        trainer = Trainer(str(job_files.student), settings(mb, mode, reduction), device="cpu")
        s = settings(mb, mode, reduction)
        metrics = trainer.train_step(samples, step_normalizer(samples, s.loss))
        results.append((params(trainer), trainer.gradients(), metrics))
    (ref, ref_grads, ref_metrics), *others = results
    for got, grads, metrics in others:
        # The applied gradient and the loss agree to float32 round-off. Weights after the first AdamW
        # step are compared loosely: Adam divides by |g|, magnifying round-off in near-zero gradients.
        assert metrics["distill/loss"] == pytest.approx(ref_metrics["distill/loss"], rel=1e-5)
        assert metrics["train/grad_norm"] == pytest.approx(ref_metrics["train/grad_norm"], rel=1e-5)
        for name in ref_grads:
            torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-7)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-3)
    moved = max(
        float((ref[n] - Trainer(str(job_files.student), settings(1)).model.state_dict()[n]).abs().max())
        for n in ref
    )
    assert moved > 1e-4  # the step really changed the weights


@pytest.mark.parametrize("packed", [False, True])
def test_logits_only_at_response_positions_give_the_step_of_every_positions_logits(job_files, packed):
    """The model projects to the vocabulary only the positions that predict a response token (most of a
    step's work at a real vocabulary lies in the prompt's): the loss and gradients are those of the logits
    of every position, with prompts of several lengths, padded or packed."""
    samples = make_samples(5, 64, 4, seed=3)
    assert len({len(s.prompt_ids) for s in samples}) > 1
    results = []
    for keep in (True, False):
        s = dataclasses.replace(settings(5), micro_batch_tokens=256 if packed else None)
        trainer = Trainer(str(job_files.student), s, device="cpu")
        assert trainer.logits_to_keep
        trainer.logits_to_keep = keep
        metrics = trainer.train_step(samples, step_normalizer(samples, s.loss))
        results.append((trainer.gradients(), metrics))
    (grads, metrics), (all_grads, all_metrics) = results
    assert metrics["distill/loss"] == pytest.approx(all_metrics["distill/loss"], rel=1e-5)
    for name in all_grads:
        torch.testing.assert_close(grads[name], all_grads[name], rtol=1e-4, atol=1e-7)
    batch = collate(samples, settings(5).loss, pad_id=0, packed=packed)
    responses = sum(len(x.response_ids) for x in samples)
    # Packed, exactly the response positions; padded, their union over the rows, fewer than the row.
    assert len(batch["keep"]) == responses if packed else len(batch["keep"]) < batch["input_ids"].shape[1]


def test_rollout_logprob_gap_is_zero_in_sync_and_its_max_survives_micro_batches(job_files):
    """The rollout engine's log-probs, when they are the trainer's own, give a gap of ~0; one token off by
    0.25 in the last micro-batch is the step's max (a max of micro-batches, not their average)."""
    import dataclasses

    import numpy as np

    trainer = Trainer(str(job_files.student), settings(2, LossMode.K3), device="cpu")
    samples = make_samples(6, 64, 4)
    for s in samples:
        s.old_logprobs = np.asarray(trainer.sequence_logprobs(s.prompt_ids, s.response_ids), np.float32)
    off = samples[-1].old_logprobs.copy()
    off[0] += 0.25
    samples[-1] = dataclasses.replace(samples[-1], old_logprobs=off)
    metrics = trainer.train_step(samples, step_normalizer(samples, trainer.settings.loss))
    assert metrics["distill/logprob_gap_max"] == pytest.approx(0.25, abs=1e-4)
    assert 0 < metrics["distill/logprob_gap_mean"] < 0.25 / 4
    assert metrics["distill/entropy"] > 0


@pytest.mark.slow
def test_two_data_parallel_workers_equal_one_worker_with_twice_the_micro_batches(job_files, ray_local):
    import ray
    from distillery_runtime.run.workers import TrainerWorker

    samples = make_samples(8, 64, 4, seed=3)
    cfg = settings(2)
    normalizer = step_normalizer(samples, cfg.loss)
    Worker = ray.remote(TrainerWorker).options(num_cpus=0)

    single = Worker.remote(str(job_files.student), cfg, 0, 1)  # 8 samples = 4 micro-batches of 2
    pair = [Worker.remote(str(job_files.student), cfg, rank, 2) for rank in range(2)]  # 2 micro-batches each
    address = ray.get(pair[0].rendezvous.remote())
    ray.get([w.init_group.remote(address) for w in pair])

    for _ in range(2):  # two optimizer steps: AdamW state and the schedule must agree as well
        m1 = ray.get(single.train_step.remote(samples, normalizer))
        m2 = ray.get(
            [
                pair[0].train_step.remote(samples[:4], normalizer),
                pair[1].train_step.remote(samples[4:], normalizer),
            ]
        )
    g1 = ray.get(single.gradients.remote())
    g2 = ray.get(pair[0].gradients.remote())
    # The all-reduced gradient of the second step. Each rank groups its own samples by length, so the
    # micro-batches (and the order of the sums) differ from the single worker's: equal up to rounding.
    for name, value in g1.items():
        torch.testing.assert_close(g2[name], value, rtol=1e-4, atol=1e-6)
    w1 = dict(ray.get(single.weights.remote("float32")))
    w2a, w2b = (dict(ray.get(w.weights.remote("float32"))) for w in pair)
    for name, value in w1.items():
        torch.testing.assert_close(w2a[name], value, rtol=0, atol=1e-3)  # loosely, see above
        torch.testing.assert_close(w2b[name], w2a[name], rtol=0, atol=0)  # the ranks stay identical
    assert m2[0]["train/grad_norm"] == pytest.approx(m1["train/grad_norm"], rel=1e-5)
    assert m1["train/samples"] == 8 and m2[0]["train/samples"] == 4


@pytest.mark.slow
def test_a_rank_with_no_samples_joins_the_step_with_zero_gradients(job_files, ray_local):
    """Fewer samples than ranks leaves a rank with an empty shard: it crashed on torch.cat([])."""
    import ray
    from distillery_runtime.run.workers import TrainerWorker

    samples = make_samples(2, 64, 4, seed=5)
    cfg = settings(2)
    normalizer = step_normalizer(samples, cfg.loss)
    Worker = ray.remote(TrainerWorker).options(num_cpus=0)
    single = Worker.remote(str(job_files.student), cfg, 0, 1)
    pair = [Worker.remote(str(job_files.student), cfg, rank, 2) for rank in range(2)]
    address = ray.get(pair[0].rendezvous.remote())
    ray.get([w.init_group.remote(address) for w in pair])
    m1 = ray.get(single.train_step.remote(samples, normalizer))
    m2 = ray.get([pair[0].train_step.remote(samples, normalizer), pair[1].train_step.remote([], normalizer)])
    assert m2[1]["train/samples"] == 0 and m2[1]["distill/loss"] == 0.0
    assert m2[0]["train/grad_norm"] == pytest.approx(m1["train/grad_norm"], rel=1e-5)
    w1 = dict(ray.get(single.weights.remote("float32")))
    w2 = [dict(ray.get(w.weights.remote("float32"))) for w in pair]
    for name, value in w1.items():
        torch.testing.assert_close(w2[0][name], value, rtol=0, atol=1e-3)
        # Not bit-equal: each rank reduces its gradient norm on its own CPU threads, and float32 sums in
        # another order differ in the last bits (2.9e-6 seen in CI).
        torch.testing.assert_close(w2[1][name], w2[0][name], rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float32])
def test_weights_are_a_detached_host_copy_in_the_asked_dtype(job_files, dtype):
    # CPU only here (CI has no GPU); the GPU path (cast on the device, pinned async copies) was checked
    # bit-exact on an H100 by bench/gpu_breakdown.py (`sync_exact`).
    trainer = Trainer(str(job_files.student), settings(2), device="cpu")
    live = trainer.model.state_dict()
    weights = trainer.weights(dtype)
    assert [name for name, _ in weights] == list(live)
    for name, tensor in weights:
        assert tensor.device.type == "cpu"
        assert tensor.dtype == (dtype or live[name].dtype)
        assert torch.equal(tensor, live[name].to(tensor.dtype))
    # The rollout engine may keep what it got: later training must not change it.
    before = [t.clone() for _, t in weights]
    trainer.train_step(make_samples(2, 64, 4), 8.0)
    assert all(torch.equal(a, b) for (_, a), b in zip(weights, before, strict=True))
    assert any(not torch.equal(t, trainer.model.state_dict()[n].to(t.dtype)) for n, t in weights)


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16-gpu", "older-gpu"])
def test_each_gpu_actor_resolves_the_precision_on_its_own_device(monkeypatch, job_files, bf16):
    from distillery_runtime.run.workers import compute_dtype_here
    from distillery_runtime.training.trainer import resolve_precision

    # In a cluster the driver runs on the Ray head, which has no GPU: the rollout engine and colocated
    # teachers resolve `auto` where they run, as the trainer does, so all three compute in one dtype.
    assert compute_dtype_here("bfloat16") == "bfloat16"
    assert compute_dtype_here("float32") == "float32"
    # Here, on this process's real device: the name an actor resolves is the dtype a real trainer on that
    # device computes in.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    auto = dataclasses.replace(settings(2), precision=Precision.AUTO)
    trainer = Trainer(str(job_files.student), auto, device=device)
    assert compute_dtype_here("auto") == str(trainer.compute_dtype).removeprefix("torch.")
    if device == "cpu":
        assert trainer.compute_dtype == torch.float32
    # A stand-in for a GPU with or without bfloat16 (this machine may have neither): the expected dtype is
    # written out, not read back from the stand-in. The head (a CPU device) stays float32 all the same.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    want = torch.bfloat16 if bf16 else torch.float32
    assert compute_dtype_here("auto") == ("bfloat16" if bf16 else "float32")
    assert resolve_precision(Precision.AUTO, torch.device("cuda")) == want
    assert resolve_precision(Precision.AUTO, torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("packed", [False, True])
def test_narrow_micro_batches_train_with_eager_attention_and_the_same_gradients(job_files, packed):
    """The plan's eager width (`plan.attention`): each micro-batch no wider than it runs its forward and
    backward with eager attention, a wider one with the model's own kernel, and the step's gradients are
    those of the model's own kernel everywhere (the same attention, to float32 round-off)."""
    samples = make_samples(6, 64, 4, seed=3)
    base = dataclasses.replace(settings(2), micro_batch_tokens=12 if packed else None)
    widths = [
        collate(part, base.loss, pad_id=0, packed=packed)["input_ids"].shape[1]
        for part in micro_batches(samples, 2, base.micro_batch_tokens)
    ]
    eager_width = sorted(widths)[len(widths) // 2]
    assert min(widths) <= eager_width < max(widths)  # both kernels in one step
    results = []
    for width in (0, eager_width):
        trainer = Trainer(
            str(job_files.student), dataclasses.replace(base, eager_attention_width=width), device="cpu"
        )
        assert trainer.own_attention == "sdpa"
        kernels: list[str] = []
        trainer.model.register_forward_pre_hook(
            lambda m, _, seen=kernels: seen.append(m.config._attn_implementation)
        )
        metrics = trainer.train_step(samples, step_normalizer(samples, base.loss))
        results.append((trainer.gradients(), metrics, kernels))
    (own_grads, own_metrics, own_kernels), (grads, metrics, kernels) = results
    assert own_kernels == ["sdpa"] * len(widths)
    assert kernels == ["eager" if w <= eager_width else "sdpa" for w in widths]
    assert metrics["distill/loss"] == pytest.approx(own_metrics["distill/loss"], rel=1e-5)
    for name in own_grads:
        torch.testing.assert_close(grads[name], own_grads[name], rtol=1e-4, atol=1e-7)
