"""The streamed export (streamed_export.py, workers.TrainerWorker.save_checkpoint with streamed_export): two
FSDP2 gloo ranks write a checkpoint's master/ and model/ a tensor at a time; transformers loads both, with
exactly the weights the ranks hold (gathered whole by today's path), tied embeddings included; the files
follow the shard size; config, generation config and tokenizer are those today's path writes.

Real gloo ranks (torch.multiprocessing), as test_fsdp.py runs them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from distillery_runtime.checkpoints import checkpoint
from distillery_runtime.checkpoints.streamed_export import (
    INDEX_FILE,
    Entry,
    Target,
    WeightStream,
    header,
    plan_shards,
    shard_file,
)
from distillery_runtime.run.loop import plan
from distillery_runtime.training.trainer import step_normalizer
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from distillery.api.spec import LossMode, ModelDtype, Precision, Sharding
from distillery.plan.checkpoints.export import ExportSettings
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings
from tests.runtime.helpers import make_samples

VOCAB = 64
SHARD_BYTES = 40_000
"""Small against the tiny model's float32 size (~0.26 MB): many files."""
SETTINGS = TrainerSettings(
    lr=1e-2, micro_batch_size=2, precision=Precision.FLOAT32, loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK),
    sharding=Sharding.FSDP, sharded_load=True, sharded_checkpoint=True, streamed_export=True,
)  # fmt: skip


def _worker(rank: int, world: int, init: str, model_dir: str, out: str) -> None:
    import torch.distributed as dist
    from distillery_runtime.checkpoints import streamed_export
    from distillery_runtime.run.workers import TrainerWorker

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    worker = TrainerWorker(model_dir, SETTINGS, rank, world)
    samples = make_samples(6, VOCAB, 4, seed=1)
    worker.train_step(plan.shard(samples, world)[rank], step_normalizer(samples, SETTINGS.loss))
    export = ExportSettings(dtype=ModelDtype.BFLOAT16, tokenizer=model_dir)
    streamed_export.SHARD_BYTES = SHARD_BYTES  # this process's files: many, to count them
    worker.save_checkpoint(f"{out}/streamed", 1, {"version": 1}, 1, export, False)
    streamed_export.SHARD_BYTES = 4 * 1024**3
    worker.save_checkpoint(f"{out}/one-file", 1, {"version": 1}, 1, export, False)
    # Today's path, from the same weights: every rank gathers the whole state dict.
    worker.trainer.settings = dataclasses.replace(SETTINGS, streamed_export=False)
    worker.save_checkpoint(f"{out}/whole", 1, {"version": 1}, 1, export, False)
    weights = worker.trainer.full_state_dict()
    if rank == 0:
        torch.save(weights, f"{out}/weights.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from distillery_runtime.testing.tiny import build_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = tmp_path_factory.mktemp("streamed-export")
    tok = build_tokenizer(
        [f"{a}+{b}={a + b}" for a in range(40) for b in range(9)], VOCAB, full_byte_alphabet=False
    )
    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp / "student")
    tok.save_pretrained(tmp / "student")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
        mp.start_processes(
            _worker, args=(2, f"file://{tmp}/init", str(tmp / "student"), str(tmp)), nprocs=2, start_method="spawn"
        )  # fmt: skip
    yield tmp


def _ref(root: Path) -> checkpoint.CheckpointRef:
    ref = checkpoint.latest(root)
    assert ref is not None
    return ref


def test_master_and_model_load_with_the_ranks_exact_weights(saved: Path) -> None:
    weights = torch.load(saved / "weights.pt")
    for root in ("streamed", "one-file"):
        ref = _ref(saved / root)
        master = AutoModelForCausalLM.from_pretrained(ref.path / checkpoint.MASTER_DIR, dtype=torch.float32)
        kept = AutoModelForCausalLM.from_pretrained(ref.path / checkpoint.MODEL_DIR)
        assert kept.dtype == torch.bfloat16 and master.config.architectures == ["LlamaForCausalLM"]
        assert master.state_dict().keys() == kept.state_dict().keys() == weights.keys()
        for name, value in weights.items():
            assert torch.equal(master.state_dict()[name], value), name
            assert torch.equal(kept.state_dict()[name], value.to(torch.bfloat16)), name
        # The head is tied: written once, under the embedding's name, as save_pretrained writes it.
        assert master.lm_head.weight is master.model.embed_tokens.weight
        assert not list((saved / root).glob(".tmp-*"))


def test_files_follow_the_shard_size(saved: Path) -> None:
    ref = _ref(saved / "streamed")
    order = [n for n in torch.load(saved / "weights.pt") if n != "lm_head.weight"]  # state-dict order
    for folder, size in ((checkpoint.MASTER_DIR, 4), (checkpoint.MODEL_DIR, 2)):
        index = json.loads((ref.path / folder / INDEX_FILE).read_text())
        files = sorted(set(index["weight_map"].values()))
        assert len(files) > 5 and files == [shard_file(i, len(files)) for i in range(len(files))]
        numel: dict[str, int] = {}
        for name in files:
            with safe_open(str(ref.path / folder / name), framework="pt") as f:
                numel.update({k: int(torch.Size(f.get_slice(k).get_shape()).numel()) for k in f.keys()})  # noqa: SIM118
        assert sorted(numel) == sorted(order)
        # Greedy in state-dict order: each file within the float32 budget (or one tensor), and too full
        # to take the next file's first tensor.
        groups = [[n for n in order if index["weight_map"][n] == name] for name in files]
        assert [n for g in groups for n in g] == order
        for i, group in enumerate(groups):
            used = 4 * sum(numel[n] for n in group)
            assert used <= SHARD_BYTES or len(group) == 1
            if i + 1 < len(groups):
                assert used + 4 * numel[groups[i + 1][0]] > SHARD_BYTES
        assert index["metadata"]["total_size"] == size * sum(numel.values())
    one = _ref(saved / "one-file").path / checkpoint.MODEL_DIR
    assert (one / "model.safetensors").is_file() and not (one / INDEX_FILE).exists()


def test_the_folders_are_those_todays_path_writes(saved: Path) -> None:
    streamed, whole = _ref(saved / "streamed").path, _ref(saved / "whole").path
    for folder in (checkpoint.MASTER_DIR, checkpoint.MODEL_DIR):
        names = {p.name for p in (streamed / folder).iterdir() if ".safetensors" not in p.name}
        assert names == {p.name for p in (whole / folder).iterdir() if ".safetensors" not in p.name}
        for name in names:
            if name.endswith(".json"):
                assert json.loads((streamed / folder / name).read_text()) == json.loads(
                    (whole / folder / name).read_text()
                ), (folder, name)
    tok = AutoTokenizer.from_pretrained(streamed / checkpoint.MODEL_DIR)
    assert tok.eos_token_id == AutoTokenizer.from_pretrained(saved / "student").eos_token_id


def test_plan_packs_in_order_and_headers_are_what_safetensors_reads(tmp_path: Path) -> None:
    entries = [Entry(f"w{i}", (10, 10), torch.float32) for i in range(5)] + [
        Entry("big", (30, 30), torch.float32)
    ]
    files = plan_shards(entries, 1000)
    assert [[e.name for e in f] for f in files] == [["w0", "w1"], ["w2", "w3"], ["w4"], ["big"]]
    # A file's widest tensors first: int64 steps before float32 weights, keeping the data aligned.
    mixed = plan_shards([Entry("a", (3,), torch.float32), Entry("steps", (1,), torch.int64)], 10**6)
    assert [e.name for e in mixed[0]] == ["steps", "a"]
    head, size = header(mixed[0], torch.bfloat16)
    assert len(head) % 8 == 0 and size == 8 + 6

    # A plain (unsharded) model streams too, with no process group; a step counter kept as int64.
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7), "steps": torch.tensor([4, 2], dtype=torch.int64)}
    WeightStream(tensors, lambda t: t, shard_bytes=64).write(
        [Target(tmp_path / "f32", None), Target(tmp_path / "bf16", torch.bfloat16)]
    )
    for folder, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        index = json.loads((tmp_path / folder / INDEX_FILE).read_text())["weight_map"]
        for name, value in tensors.items():
            with safe_open(str(tmp_path / folder / index[name]), framework="pt") as f:
                got = f.get_tensor(name)
            assert torch.equal(got, value.to(dtype) if value.is_floating_point() else value), (folder, name)


def test_a_failed_write_still_walks_every_gather(tmp_path: Path) -> None:
    gathered: list[int] = []
    tensors = {f"w{i}": torch.randn(4) for i in range(6)}

    def gather(t: torch.Tensor) -> torch.Tensor:
        gathered.append(1)
        return t

    (tmp_path / "blocked").write_text("a file where the folder should be")
    stream = WeightStream(tensors, gather, shard_bytes=32)
    with pytest.raises(OSError):
        stream.write([Target(tmp_path / "blocked", None)])
    assert len(gathered) == len(tensors)  # the other ranks would be waiting in each of them
    stream.finish()  # already walked: no second walk
    assert len(gathered) == len(tensors)
    fresh = WeightStream(tensors, gather, shard_bytes=32)
    fresh.finish()
    assert len(gathered) == 2 * len(tensors)
