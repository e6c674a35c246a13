"""Host memory of loading the student onto FSDP2 ranks: today's path (every rank from_pretrained in float32,
then shard) against the sharded load (meta device everywhere, rank 0 reads the safetensors files and
broadcasts chunk by chunk; `distillery_runtime/training/sharded_load.py`), in the same run.

A real torch.distributed run: gloo, one process per rank (torch.multiprocessing spawn), 2 and 4 ranks, each
path in its own fresh process group (a process that loaded once keeps freed memory in its heap, which would
hide the second load's peak). The student is a Qwen2 of ~203M parameters with a 1,024-token vocabulary
(the parameters are in the layers, as in a real student), random weights saved in bfloat16 with
save_pretrained, as real checkpoints ship. Each rank constructs the real `Trainer` (FSDP2, float32 master
weights) and measures the load as (peak resident memory during it) - (resident memory just before it):
VmHWM after resetting it (writing 5 to /proc/self/clear_refs), the file-backed pages of the mapped
safetensors included. `load_peak_ratio` is the largest over ranks of that, divided by the full float32 model
size. Each rank also checksums its local shards, so the two paths are checked to load the same weights.

Then each rank takes one step (AdamW's state exists from there) and all save a checkpoint (`TrainerWorker.
save_checkpoint`, the loop's call): `checkpoint_peak_ratio` the same way. Today's path gathers the whole
optimizer state on rank 0 into trainer.pt and the whole float32 weights on every rank for master/ and
model/; the new one writes each rank's optimizer shards with torch.distributed.checkpoint and streams the
weights a tensor at a time into rank 0's safetensors files (`distillery_runtime/checkpoints/streamed_export.py`).

Last, `resume_reshard_exact`, a real resume on a tiny Llama (the check is of values, not memory): 2 ranks
take 2 steps, save (optimizer shards, streamed weights) and take 2 more; the same 2 steps are then taken
after a resume onto 2 ranks (they must equal the uninterrupted run's losses and weights bit for bit) and
onto 1 and 4 ranks (DCP reshards the optimizer; each must take bit for bit the steps of a resume at that
rank count from the same state gathered whole, as today's trainer.pt holds it; a rank count's own sums differ
from 2 ranks' in round-off, so that is the exact comparison across counts).

    python bench/host_memory.py --quick     # 2 and 4 ranks
    python bench/host_memory.py --ranks 2 4 8

Prints a table, writes bench/results/host_memory/DATE.json, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from _common import json_main  # bench/, the script's own folder

LAYERS, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 18, 1024, 2816, 16, 4, 1024
PATHS = {"before": False, "after": True}
"""The two paths: today's (sharded_load, sharded_checkpoint and streamed_export False) and the new ones."""
RESUME_VOCAB, SAVED_AT, STEPS = 64, 2, 4
RESUMED_ONTO = (2, 1, 4)
BASELINE_MODULES = (
    "distillery_runtime.training.sharded_load",
    "distillery_runtime.training.sharding",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.fsdp",
    "transformers.models.qwen2.modeling_qwen2",
)


def status_kib(field: str) -> int:
    """A /proc/self/status field in KiB (VmRSS: resident now; VmHWM: the peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> None:
    """VmHWM back to the current resident size (Linux: '5' to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def save_student(directory: Path) -> int:
    """The benchmark's student, random, saved in bfloat16 with its tokenizer; returns its parameter count."""
    from distillery_runtime.testing.tiny import build_tokenizer, default_texts
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer(default_texts(), VOCAB)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=2048,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def samples(seed: int, vocab: int) -> list[Any]:
    """One short synthetic sample (one a rank: a step's worth of optimizer state is what a checkpoint
    holds), drawn from `seed`."""
    import numpy as np
    from distillery_runtime.data.samples import TrainSample

    g = torch.Generator().manual_seed(seed)
    response = torch.randint(4, vocab, (4,), generator=g)
    top = torch.log_softmax(torch.randn(4, vocab, generator=g), -1).topk(4, -1)
    return [
        TrainSample(
            prompt_ids=torch.randint(4, vocab, (4,), generator=g).tolist(),
            response_ids=response.tolist(),
            old_logprobs=None,
            topk_ids=top.indices.numpy().astype(np.int32),
            topk_logprobs=top.values.numpy().astype(np.float32),
            token_logprobs=top.values[:, 0].numpy().copy(),
            teacher_mask=np.ones(4, bool),
        )
    ]


def _rank(rank: int, world: int, init: str, model_dir: str, sharded: bool, out: str) -> None:
    import torch.distributed as dist
    from distillery_runtime.run.workers import TrainerWorker
    from torch.distributed.tensor import DTensor

    from distillery.api.spec import LossMode, ModelDtype, Precision, Sharding
    from distillery.plan.checkpoints.export import ExportSettings
    from distillery.plan.loss import LossConfig
    from distillery.plan.training import TrainerSettings

    torch.set_num_threads(1)  # ranks share the host's cores
    # The code both paths run, imported before the measurement: the modules' own memory (~0.1 GiB of
    # transformers, torch.distributed and tokenizers) is the runtime's baseline, not the load's.
    for module in BASELINE_MODULES:
        importlib.import_module(module)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model_dir)

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(minutes=10)
    )
    settings = TrainerSettings(
        lr=1e-4, precision=Precision.FLOAT32, sharding=Sharding.FSDP, loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK),
        sharded_load=sharded, sharded_checkpoint=sharded, streamed_export=sharded,
    )  # fmt: skip
    record: dict[str, Any] = {}
    dist.barrier()
    reset_peak()
    record["load_before_kib"] = status_kib("VmRSS")
    worker = TrainerWorker(model_dir, settings, rank, world)
    record["load_peak_kib"] = status_kib("VmHWM")
    trainer = worker.trainer
    record["checksum"] = sum(
        float((p.to_local() if isinstance(p, DTensor) else p).detach().double().sum())
        for p in trainer.model.parameters()
    )
    trainer.train_step(samples(rank, VOCAB), float(4 * world))  # AdamW's state exists from here
    export = ExportSettings(dtype=ModelDtype.BFLOAT16, tokenizer=model_dir)
    dist.barrier()
    reset_peak()
    record["checkpoint_before_kib"] = status_kib("VmRSS")
    started = time.perf_counter()
    worker.save_checkpoint(f"{out}/ckpt", 1, {"version": 1}, 1, export, False)
    dist.barrier()  # the save is done when every rank's part is
    record["checkpoint_seconds"] = time.perf_counter() - started
    record["checkpoint_peak_kib"] = status_kib("VmHWM")
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def measure(world: int, sharded: bool, model_dir: Path, scratch: Path) -> list[dict[str, Any]]:
    """One fresh process group of `world` ranks loading the student one way; each rank's record."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    init = f"file://{out}/init"
    mp.start_processes(
        _rank, args=(world, init, str(model_dir), sharded, str(out)), nprocs=world, start_method="spawn"
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def resume_settings(world: int) -> Any:
    from distillery.api.spec import LossMode, Precision, Sharding
    from distillery.plan.loss import LossConfig
    from distillery.plan.training import TrainerSettings

    return TrainerSettings(
        lr=1e-3, weight_decay=0.1, grad_clip=0.5, micro_batch_size=2, precision=Precision.FLOAT32,
        total_steps=STEPS, warmup_steps=1, loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK), sharding=Sharding.FSDP,
        sharded_load=world > 1, sharded_checkpoint=world > 1, streamed_export=True,
    )  # fmt: skip


def take_steps(worker: Any, rank: int, world: int, steps: range) -> list[float]:
    """Steps of 8 samples each (`samples` of 8 seeds), shared out over the ranks as the loop does; each
    rank's part of each step's loss."""
    from distillery_runtime.run.loop import plan
    from distillery_runtime.training.trainer import step_normalizer

    losses = []
    for step in steps:
        batch = [s for seed in range(8) for s in samples(100 * step + seed, RESUME_VOCAB)]
        normalizer = step_normalizer(batch, worker.trainer.settings.loss)
        losses.append(worker.train_step(plan.shard(batch, world)[rank], normalizer)["distill/loss"])
    return losses


def _resume_rank(rank: int, world: int, init: str, phase: str, model_dir: str, out: str) -> None:
    import torch.distributed as dist
    from distillery_runtime.checkpoints import checkpoint
    from distillery_runtime.run.workers import TrainerWorker

    from distillery.api.spec import ModelDtype
    from distillery.plan.checkpoints.export import ExportSettings

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(minutes=5)
    )
    torch.use_deterministic_algorithms(True)
    settings = resume_settings(world)
    result: dict[str, Any] = {}
    if phase == "run":
        worker = TrainerWorker(model_dir, settings, rank, world)
        take_steps(worker, rank, world, range(SAVED_AT))
        export = ExportSettings(dtype=ModelDtype.BFLOAT16, tokenizer=model_dir)
        worker.save_checkpoint(f"{out}/ckpt", SAVED_AT, {"version": SAVED_AT}, 1, export, False)
        # The same AdamW state gathered whole (a collective), as today's trainer.pt holds it: the reference
        # a resume at another rank count starts from.
        whole = worker.trainer.trainer_state(with_optimizer=True)["optimizer"]
        if rank == 0:
            torch.save(whole, f"{out}/optimizer-whole.pt")
    else:
        ref = checkpoint.latest(f"{out}/ckpt")
        assert ref is not None
        weights = str(checkpoint.weights_dir(ref))
        worker = TrainerWorker(weights, settings, rank, world)
        worker.load_state(str(ref.path))  # the optimizer from its shards, resharded onto `world` ranks
        reference = TrainerWorker(weights, settings, rank, world)
        state = {**checkpoint.load_trainer_state(ref), "optimizer": torch.load(f"{out}/optimizer-whole.pt")}
        reference.trainer.load_trainer_state(state)
        result["reference"] = take_steps(reference, rank, world, range(SAVED_AT, STEPS))
        result["reference_weights"] = reference.trainer.full_state_dict()
    result["losses"] = take_steps(worker, rank, world, range(SAVED_AT, STEPS))
    result["weights"] = worker.trainer.full_state_dict()
    if rank == 0:
        torch.save(result, f"{out}/{phase}-{world}.pt")
    dist.destroy_process_group()


def resume_reshard_exact(scratch: Path) -> dict[str, bool]:
    """Per rank count resumed onto: whether the resumed steps were exact (see the module docstring)."""
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    out = Path(tempfile.mkdtemp(dir=scratch))
    texts = [f"{a}+{b}={a + b}" for a in range(50) for b in range(0, 50, 7)]
    tok = build_tokenizer(texts, RESUME_VOCAB, full_byte_alphabet=False)
    model_dir = save_tiny_model(
        out / "student", tokenizer=tok, hidden=64, layers=2, heads=2, seed=3, dtype=torch.float32,
        model_vocab_size=RESUME_VOCAB,
    )  # fmt: skip

    def spawn(phase: str, world: int) -> dict[str, Any]:
        init = f"file://{out}/init-{phase}-{world}"
        args = (world, init, phase, str(model_dir), str(out))
        mp.start_processes(_resume_rank, args=args, nprocs=world, start_method="spawn")
        loaded: dict[str, Any] = torch.load(out / f"{phase}-{world}.pt")
        return loaded

    run = spawn("run", 2)
    exact = {}
    for world in RESUMED_ONTO:
        resumed = spawn("resume", world)
        # At 2 ranks the uninterrupted run's own steps; at another count, the steps of a resume from the
        # state gathered whole at that count (rank 0's part of each step's loss, and the weights after).
        expected = (
            run if world == 2 else {"losses": resumed["reference"], "weights": resumed["reference_weights"]}
        )
        same_weights = all(torch.equal(v, resumed["weights"][k]) for k, v in expected["weights"].items())
        exact[str(world)] = resumed["losses"] == expected["losses"] and same_weights
    return exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 and 4 ranks (the default set, named for CI)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "host_memory")
    args = parser.parse_args()
    ranks = [2, 4] if args.quick else args.ranks
    with tempfile.TemporaryDirectory(prefix="host-memory-") as tmp:
        scratch = Path(tmp)
        params = save_student(scratch / "student")
        full_bytes = 4 * params
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in PATHS}
        for world in ranks:
            for name, sharded in PATHS.items():
                runs[name][str(world)] = measure(world, sharded, scratch / "student", scratch)
        resumes = resume_reshard_exact(scratch)
    phases = ("load", "checkpoint")

    def ratio(r: dict[str, Any], phase: str) -> float:
        return 1024 * (r[f"{phase}_peak_kib"] - r[f"{phase}_before_kib"]) / full_bytes

    ratios = {
        name: {phase: {w: max(ratio(r, phase) for r in recs) for w, recs in by.items()} for phase in phases}
        for name, by in runs.items()
    }
    same = all(
        [r["checksum"] for r in runs["before"][w]] == [r["checksum"] for r in runs["after"][w]]
        for w in runs["after"]
    )
    print(f"student: {params / 1e6:.1f}M parameters, float32 {full_bytes / 2**30:.2f} GiB (bf16 on disk)")
    print(f"{'phase':<10} {'ranks':>5} {'path':<7} {'peak / fp32 model, per rank':<40} {'max':>6}")
    for phase in phases:
        for world in map(str, ranks):
            for name in PATHS:
                shown = " ".join(f"{ratio(r, phase):.3f}" for r in runs[name][world])
                print(f"{phase:<10} {world:>5} {name:<7} {shown:<40} {ratios[name][phase][world]:>6.3f}")
    seconds = {
        name: {w: round(max(r["checkpoint_seconds"] for r in recs), 3) for w, recs in by.items()}
        for name, by in runs.items()
    }
    print(f"checkpoint write seconds (slowest rank), by ranks: {seconds}")
    print(f"same weights on every rank, both paths: {same}")
    print(f"resume of a 2-rank checkpoint, exact, by ranks resumed onto: {resumes}")
    summary = {
        "load_peak_ratio": ratios["after"]["load"],
        "checkpoint_peak_ratio": ratios["after"]["checkpoint"],
        "before": {
            "load_peak_ratio": ratios["before"]["load"],
            "checkpoint_peak_ratio": ratios["before"]["checkpoint"],
            "checkpoint_seconds": seconds["before"],
        },
        "checkpoint_seconds": seconds["after"],
        "weights_equal": same,
        "resume_reshard_exact": all(resumes.values()),
        "resumed_onto": resumes,
        "params": params,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "date": datetime.date.today().isoformat(),
        "host_cpus": os.cpu_count(),
        "shape": {"layers": LAYERS, "hidden": HIDDEN, "intermediate": INTERMEDIATE, "vocab": VOCAB},
        "runs": runs,
        "summary": summary,
    }
    path = args.out / f"{record['date']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    print(json.dumps(summary))


if __name__ == "__main__":
    raise SystemExit(json_main("host_memory", main))
