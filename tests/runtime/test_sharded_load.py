"""Sharded loading (sharded_load.py): FSDP2 ranks built on the meta device and filled from rank 0's reading of
the safetensors files hold, bit for bit, the weights from_pretrained loads, and take the same first step as
today's path (every rank loads the whole model, then shards).

Two real gloo ranks (torch.multiprocessing), as test_fsdp.py runs them, over two students: a Qwen2 with a
tied LM head saved in bfloat16 across two safetensors files (an index), and the float32 Llama of the other
trainer tests.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from distillery_runtime.run.loop import plan
from distillery_runtime.training.sharded_load import (
    INDEX_FILE,
    checkpoint_shapes,
    chunks,
    compatible_keys,
    meta_model,
    safetensors_files,
    unrebuilt_buffers,
)
from distillery_runtime.training.trainer import step_normalizer

from distillery.api.spec import LossMode, Precision, Sharding
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings, sharded_state
from tests.runtime.helpers import make_samples

VOCAB = 64
SETTINGS = TrainerSettings(
    lr=1e-3, grad_clip=0.5, micro_batch_size=2, precision=Precision.FLOAT32, total_steps=2,
    loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK), sharding=Sharding.FSDP,
)  # fmt: skip


def _save_qwen_tied(directory: Path) -> Path:
    """A tiny Qwen2 with tie_word_embeddings, in bfloat16, split over several safetensors files."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(5)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True, initializer_range=0.1,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="40KB")
    return directory


def _worker(rank: int, world: int, init: str, model_dir: str, out: str) -> None:
    import torch.distributed as dist
    from distillery_runtime.training.trainer import Trainer

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    torch.use_deterministic_algorithms(True)
    samples = make_samples(7, VOCAB, 4, seed=1)
    result: dict[str, Any] = {}
    for name, load in (("sharded", True), ("today", False)):
        trainer = Trainer(
            model_dir, dataclasses.replace(SETTINGS, sharded_load=load), rank=rank, world_size=world
        )
        inner = trainer.model
        result[f"{name}/tied"] = inner.lm_head.weight is inner.model.embed_tokens.weight
        result[f"{name}/params_meta"] = any(p.is_meta for p in inner.parameters())
        result[f"{name}/buffers"] = {n: b.clone() for n, b in inner.named_buffers()}
        result[f"{name}/weights"] = trainer.full_state_dict()
        metrics = trainer.train_step(
            plan.shard(samples, world)[rank], step_normalizer(samples, SETTINGS.loss)
        )
        result[f"{name}/loss"] = metrics["distill/loss"]
        result[f"{name}/stepped"] = trainer.full_state_dict()
    torch.save(result, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def _run_ranks(model_dir: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    mp.start_processes(
        _worker, args=(2, f"file://{tmp}/init", str(model_dir), str(tmp)), nprocs=2, start_method="spawn"
    )
    return [torch.load(tmp / f"rank{r}.pt") for r in range(2)]


@pytest.fixture(scope="module")
def students(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    tmp = tmp_path_factory.mktemp("students")
    tok = build_tokenizer(
        [f"{a}+{b}={a + b}" for a in range(50) for b in range(0, 50, 7)], VOCAB, full_byte_alphabet=False
    )
    assert len(tok) == VOCAB
    llama = save_tiny_model(
        tmp / "llama", tokenizer=tok, hidden=64, layers=2, heads=2, seed=3, dtype=torch.float32
    )
    qwen = _save_qwen_tied(tmp / "qwen")
    tok.save_pretrained(qwen)
    return {"llama": llama, "qwen": qwen}


@pytest.mark.parametrize("student", ["qwen", "llama"])
def test_two_ranks_load_from_rank0_what_from_pretrained_loads(
    student: str, students: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = students[student]
    if student == "qwen":
        assert (model_dir / INDEX_FILE).exists() and len(safetensors_files(model_dir)) > 1
    ranks = _run_ranks(model_dir, tmp_path, monkeypatch)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    expected = {k: v.detach() for k, v in reference.state_dict().items()}
    for result in ranks:
        assert not result["sharded/params_meta"]
        assert result["sharded/tied"] == result["today/tied"] == (student == "qwen")
        loaded = result["sharded/weights"]
        assert loaded.keys() == expected.keys()
        for name, tensor in expected.items():
            assert loaded[name].dtype == torch.float32, name
            assert torch.equal(loaded[name], tensor), name
        # Non-persistent buffers (rotary inv_freq) are no checkpoint's: rebuilt, equal to from_pretrained's.
        for name, buffer in reference.named_buffers():
            assert torch.equal(result["sharded/buffers"][name].cpu(), buffer), name
    # The same first step as today's path, to the bit: the same shards, the same collectives.
    assert [r["sharded/loss"] for r in ranks] == [r["today/loss"] for r in ranks]
    for name, tensor in ranks[0]["today/stepped"].items():
        assert torch.equal(ranks[0]["sharded/stepped"][name], tensor), name
    assert ranks[0]["sharded/loss"] > 0


def test_chunks_are_bounded_and_cover_every_tensor(students: dict[str, Path]) -> None:
    shapes = checkpoint_shapes(safetensors_files(students["llama"]))
    budget = 20_000
    groups = chunks(shapes, budget)
    assert [n for g in groups for n in g] == list(shapes)
    for group in groups:
        size = sum(4 * torch.Size(shapes[n][1]).numel() for n in group)
        assert size <= budget or len(group) == 1
    assert len(groups) > 1


def test_a_checkpoint_with_other_names_keeps_from_pretrained(
    students: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    source = students["llama"]
    assert meta_model(source) is not None
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for f in ("config.json",):
        (renamed / f).write_bytes((source / f).read_bytes())
    tensors = load_file(str(source / "model.safetensors"))
    save_file({f"base.{k}": v for k, v in tensors.items()}, str(renamed / "model.safetensors"))
    assert meta_model(renamed) is None
    model = meta_model(source)
    assert model is not None
    assert "unexpected" in compatible_keys(model, checkpoint_shapes(safetensors_files(renamed)))


@pytest.mark.parametrize(
    ("sharding", "ranks", "expected"),
    [(Sharding.FSDP, 2, True), (Sharding.FSDP, 1, False), (Sharding.REPLICATE, 4, False)],
)
def test_the_plan_loads_from_rank0_only_onto_several_fsdp_ranks(
    sharding: Sharding, ranks: int, expected: bool
) -> None:
    assert sharded_state(sharding, ranks) is expected


def test_a_buffer_no_rebuild_covers_keeps_from_pretrained(students: dict[str, Path]) -> None:
    model = meta_model(students["qwen"])
    assert model is not None and unrebuilt_buffers(model) == []
    assert any("rotary_emb" in name for name, _ in model.named_buffers())  # rebuilt: not listed
    layer = model.model.layers[0]  # type: ignore[union-attr,index]
    layer.register_buffer("scale", torch.ones(2), persistent=False)
    assert unrebuilt_buffers(model) == ["model.layers.0.scale"]
