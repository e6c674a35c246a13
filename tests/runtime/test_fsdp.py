"""FSDP2 training (trainer.py + sharding.py) on CPU with gloo: sharded over 2 ranks it takes the same steps
as 1 rank, as the replicated layout, and packed micro-batches take the same steps as padded ones.

The ranks are real processes (torch.multiprocessing) joined by a gloo group, as Ray's trainer actors are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from distillery_runtime.run.loop import plan
from distillery_runtime.run.workers import TrainerWorker
from distillery_runtime.training.trainer import micro_batches, step_normalizer

from distillery.api.spec import LossMode, ModelDtype, Precision, Sharding
from distillery.plan.checkpoints.export import ExportSettings
from distillery.plan.lora import LoraSettings
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings
from tests.runtime.helpers import make_samples

VOCAB = 64
STEPS = 3
BASE = TrainerSettings(
    lr=1e-3, grad_clip=0.5, micro_batch_size=2, precision=Precision.FLOAT32, total_steps=STEPS,
    loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK), sharding=Sharding.FSDP,
)  # fmt: skip
CONFIGS: dict[str, TrainerSettings] = {
    "replicate": dataclasses.replace(BASE, sharding=Sharding.REPLICATE),
    "fsdp": BASE,
    "fsdp_ckpt": dataclasses.replace(BASE, activation_checkpointing=True),
    "fsdp_packed": dataclasses.replace(BASE, micro_batch_tokens=24),
    # A LoRA student (peft): replicated on one rank, and FSDP2 over the frozen weights and the adapter.
    "lora": dataclasses.replace(BASE, sharding=Sharding.REPLICATE, lora=LoraSettings(rank=4, alpha=8)),
    "lora_fsdp": dataclasses.replace(BASE, lora=LoraSettings(rank=4, alpha=8)),
}


def _steps() -> list[list[Any]]:
    return [make_samples(7, VOCAB, 4, seed=step) for step in range(STEPS)]


def _worker(rank: int, world: int, init: str, model_dir: str, names: list[str], out: str) -> None:
    import torch.distributed as dist

    # A short timeout: a collective one rank skips fails the test instead of hanging it.
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    torch.use_deterministic_algorithms(True)
    for name in names:
        worker = TrainerWorker(model_dir, CONFIGS[name], rank, world)  # what the loop's Ray actors run
        trainer = worker.trainer
        losses = []
        for samples in _steps():
            metrics = trainer.train_step(
                plan.shard(samples, world)[rank], step_normalizer(samples, BASE.loss)
            )
            losses.append(metrics["distill/loss"])
        weights = trainer.full_state_dict()
        # What one rank holds of the float32 weights (the sharded layouts hold 1/world of each layer).
        held = sum(
            p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in trainer.model.parameters()
        )
        # A LoRA student's adapter, whole, under the names a sync sends and adapter/ keeps.
        adapter = {n: trainer._full(t.detach()).cpu() for n, t in trainer.synced_items()}
        trainable = sum(
            p.to_local().numel() if hasattr(p, "to_local") else p.numel()
            for g in trainer.optimizer.param_groups
            for p in g["params"]
        )
        result = {
            "losses": losses,
            "weights": weights,
            "held": held,
            "adapter": adapter,
            "trainable": trainable,
        }
        torch.save(result, f"{out}/{name}-{world}-{rank}.pt")
        if name == "fsdp":
            export = ExportSettings(dtype=ModelDtype.BFLOAT16, tokenizer=model_dir)
            worker.save_checkpoint(f"{out}/ckpt-{world}", STEPS, {"version": STEPS}, 1, export, True)
    dist.destroy_process_group()


def _run(world: int, tmp: Path, model_dir: Path, names: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # The spawned ranks import this module by its name (tests.runtime.test_fsdp), with the parent's sys.path.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    init = f"file://{tmp}/init-{world}"
    mp.start_processes(
        _worker, args=(world, init, str(model_dir), names, str(tmp)), nprocs=world, start_method="spawn"
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, int], dict[str, Any]]]:
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    tmp = tmp_path_factory.mktemp("fsdp")
    texts = [f"{a}+{b}={a + b}" for a in range(50) for b in range(0, 50, 7)]
    tok = build_tokenizer(texts, VOCAB, full_byte_alphabet=False)
    model_dir = save_tiny_model(
        tmp / "student", tokenizer=tok, hidden=64, layers=2, heads=2, seed=3, dtype=torch.float32
    )
    with pytest.MonkeyPatch.context() as monkeypatch:
        _run(1, tmp, model_dir, list(CONFIGS), monkeypatch)
        _run(2, tmp, model_dir, ["fsdp", "fsdp_packed", "lora_fsdp"], monkeypatch)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for name in CONFIGS:
        for world in (1, 2):
            ranks = [
                torch.load(tmp / f"{name}-{world}-{r}.pt")
                for r in range(world)
                if (tmp / f"{name}-{world}-{r}.pt").exists()
            ]
            if ranks:
                out[(name, world)] = {
                    "losses": [sum(r["losses"][i] for r in ranks) for i in range(STEPS)],
                    "weights": ranks[0]["weights"],
                    "held": [r["held"] for r in ranks],
                    "adapter": ranks[0]["adapter"],
                    "trainable": [r["trainable"] for r in ranks],
                }
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out[("initial", 0)] = {"weights": {k: v.detach() for k, v in initial.state_dict().items()}}
    out[("checkpoint", 2)] = {"path": tmp / "ckpt-2"}
    yield out


def _assert_same(a: dict[str, Any], b: dict[str, Any], initial: dict[str, Any]) -> None:
    """Float32 round-off only. Gradients summed in another order differ in their last bits, and AdamW,
    which divides by |g|, can turn that into a whole step (lr) for an element whose g is ~0; so each
    tensor's change is compared as a whole: it differs by < 0.5% of its norm."""
    assert a["losses"] == pytest.approx(b["losses"], rel=2e-5)
    assert a["weights"].keys() == b["weights"].keys()
    for name, start in initial["weights"].items():
        change = float((b["weights"][name] - start).norm())
        assert float((a["weights"][name] - b["weights"][name]).norm()) <= 5e-3 * change + 1e-7, name


def test_two_fsdp_ranks_take_the_steps_of_one(results: dict) -> None:
    _assert_same(results[("fsdp", 2)], results[("fsdp", 1)], results[("initial", 0)])
    one, two = results[("fsdp", 1)]["held"], results[("fsdp", 2)]["held"]
    assert max(two) < 0.6 * one[0]  # each rank holds about half of the weights


def test_fsdp_takes_the_steps_of_the_replicated_layout(results: dict) -> None:
    _assert_same(results[("fsdp", 1)], results[("replicate", 1)], results[("initial", 0)])
    _assert_same(results[("fsdp_ckpt", 1)], results[("fsdp", 1)], results[("initial", 0)])


def test_packed_micro_batches_take_the_steps_of_padded_ones(results: dict) -> None:
    _assert_same(results[("fsdp_packed", 1)], results[("fsdp", 1)], results[("initial", 0)])
    _assert_same(results[("fsdp_packed", 2)], results[("fsdp", 1)], results[("initial", 0)])


def test_the_steps_really_train(results: dict) -> None:
    trained, initial = results[("fsdp", 1)]["weights"], results[("initial", 0)]["weights"]
    moved = max(float((trained[n] - initial[n]).abs().max()) for n in initial)
    assert moved > 1e-3  # far above the tolerance the layouts are compared with


def test_a_lora_student_trains_its_adapter_alone_in_every_layout(results: dict) -> None:
    """The frozen weights stay the model's own, bit for bit; the adapter moves, and FSDP2 over two ranks or
    one takes the replicated layout's steps; the optimizer holds the adapter's parameters only."""
    from distillery.model_shapes import resolve_shape
    from distillery.plan.lora import adapter_params

    initial = results[("initial", 0)]["weights"]
    replica = results[("lora", 1)]
    for key, value in replica["weights"].items():
        if ".lora_" in key:
            continue
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(value, initial[name]), name
    assert max(float(t.abs().max()) for n, t in replica["adapter"].items() if ".lora_B." in n) > 1e-3
    for other in (results[("lora_fsdp", 1)], results[("lora_fsdp", 2)]):
        # Looser than full training's 2e-5: B starts at zero, so A's first gradients are round-off, which
        # AdamW (dividing by |g|) turns into whole steps that differ between layouts; measured 3.6e-5.
        assert other["losses"] == pytest.approx(replica["losses"], rel=2e-4)
        assert other["adapter"].keys() == replica["adapter"].keys()
        # Adam's first steps are ~lr x sign(g) per element, whatever |g|: an element whose gradient is
        # round-off takes its sign from the layout's summation order (measured: 6% of B's norm after 3 steps,
        # while the losses agree to 4e-5). A layout that dropped a rank's gradients or froze a shard would
        # be ~100% off.
        for name, value in replica["adapter"].items():
            assert float((other["adapter"][name] - value).norm()) <= 0.15 * float(value.norm()) + 1e-7, name
    # The plan's count of the adapter is what peft put on the model (the tiny Llama's seven projections).
    shape = resolve_shape(str(results[("checkpoint", 2)]["path"].parent / "student"))
    assert shape is not None
    expected = adapter_params(shape, LoraSettings(rank=4, alpha=8))
    assert replica["trainable"] == [expected] == [sum(t.numel() for t in replica["adapter"].values())]
    assert sum(results[("lora_fsdp", 2)]["trainable"]) == expected  # each rank's optimizer: its shards


def test_a_sharded_checkpoint_holds_the_whole_student(results: dict) -> None:
    from distillery_runtime.checkpoints import checkpoint
    from transformers import AutoModelForCausalLM

    ref = checkpoint.latest(results[("checkpoint", 2)]["path"])
    assert ref is not None and ref.step == STEPS
    # master/ (what a resume loads) holds the exact float32 weights; model/ and final/ the bfloat16 cast.
    model = AutoModelForCausalLM.from_pretrained(checkpoint.weights_dir(ref), dtype=torch.float32)
    assert model.config.architectures == ["LlamaForCausalLM"]  # not FSDP2's FSDPLlamaForCausalLM
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, results[("fsdp", 2)]["weights"][name], rtol=0, atol=0)
    for folder in (ref.path / checkpoint.MODEL_DIR, ref.path.parent / checkpoint.FINAL_DIR):
        kept = AutoModelForCausalLM.from_pretrained(folder)
        assert kept.config.architectures == ["LlamaForCausalLM"] and kept.dtype == torch.bfloat16
        for name, value in kept.state_dict().items():
            assert torch.equal(value, results[("fsdp", 2)]["weights"][name].to(torch.bfloat16)), name
    state = checkpoint.load_trainer_state(ref)
    moments = [s["exp_avg"] for s in state["optimizer"]["state"].values()]
    assert sum(m.numel() for m in moments) == sum(v.numel() for v in model.state_dict().values())


def test_token_budget_packs_in_order_and_isolates_long_samples() -> None:
    samples = make_samples(7, VOCAB, 4)  # 5..10 tokens each
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    batches = micro_batches(samples, 2, 16)
    assert [s for b in batches for s in b] == samples
    for b in batches:
        total = sum(len(s.prompt_ids) + len(s.response_ids) for s in b)
        assert total <= 16 or len(b) == 1
    assert len(batches) < len(samples)
    assert max(lengths) > 6 and micro_batches(samples, 2, 6)[0] == [samples[0]]
