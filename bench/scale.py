"""Issue 16 on CPU: FSDP2 vs the replicated trainer, streamed weight sync vs Ray's object store, the plan.

    python bench/scale.py            # ~3 min on 2 cores; writes bench/results/scale/summary.json
    python bench/scale.py --quick    # smaller sizes (a smoke run)

1. Per-rank memory at world size 1 and 2 (gloo, one process per rank) of a ~110M-parameter Llama, one
   optimizer step of Distillery's trainer, `student.training.sharding` fsdp vs replicate: the bytes of
   this rank's weights + gradients + AdamW state (local shards, counted tensor by tensor) and the process's
   peak RSS. `fsdp_rank_memory_ratio` = 2-rank / 1-rank of the former under FSDP2.
2. Weight sync of 0.1-1 GB of bf16 tensors from one process to another: streamed in 256 MB buckets
   (weight_sync.py) through shared memory (what the loop does for an engine on the trainer's host) and
   over gloo (loopback TCP; what it does across hosts), vs the old path through Ray's object store (the
   sender's copy returned as an ObjectRef, the receiver's ray.get). Seconds from the sender's first byte
   to the receiver holding every tensor (the receiver copies each out, as the rollout worker does),
   GB/s, and `sync_speedup_vs_object_store` (shared memory) at the largest size.
3. The memory plan (distillery/plan/memory/gpu.py) of 1.5B, 7B and 32B Qwen2.5 students on 8 x 80 GB
   (FSDP2, checkpointing, 4 x 1,024-token micro-batches, rollout memoryFraction 0.5), with and without
   cpuOffload, beside the peaks bench/gpu_scale.py measured on one GPU.

The last line printed is the JSON summary; a table goes before it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

from _common import json_main  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "runtime"):
    sys.path.insert(0, str(path))

GB = 1e9


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------ 1: memory


def _model(quick: bool):  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hidden, layers = (256, 4) if quick else (768, 12)
    config = LlamaConfig(
        vocab_size=16000, hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _memory_rank(rank: int, world: int, init: str, sharding: str, quick: bool, out: str) -> None:
    import torch
    import torch.distributed as dist
    from distillery_runtime.training.trainer import Trainer, step_normalizer

    from distillery.api.spec import LossMode, Precision, Sharding
    from distillery.plan.loss import LossConfig
    from distillery.plan.training import TrainerSettings

    sys.path.insert(0, str(ROOT))
    from tests.runtime.helpers import make_samples

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    settings = TrainerSettings(
        lr=1e-4, micro_batch_size=2, precision=Precision.FLOAT32, loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK),
        sharding=Sharding(sharding),
    )  # fmt: skip
    trainer = Trainer(None, settings, rank=rank, world_size=world, device="cpu", model=_model(quick))
    samples = make_samples(4, 16000, 4)
    mine = samples[rank::world]
    trainer.train_step(mine, step_normalizer(samples, settings.loss))

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    params = list(trainer.model.parameters())
    weights = sum(local(p).numel() * local(p).element_size() for p in params)
    grads = sum(local(p.grad).numel() * local(p.grad).element_size() for p in params if p.grad is not None)
    adam = sum(
        local(v).numel() * local(v).element_size()
        for state in trainer.optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    record = {
        "sharding": sharding, "world": world, "rank": rank,
        "params": sum(p.numel() for p in params) if sharding == "replicate" else None,
        "weights_bytes": weights, "grads_bytes": grads, "adam_bytes": adam,
        "state_bytes": weights + grads + adam,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }  # fmt: skip
    Path(out, f"mem-{sharding}-{world}-{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def memory_part(out: Path, quick: bool) -> dict:
    import torch.multiprocessing as mp

    results = {}
    for sharding in ("fsdp", "replicate"):
        for world in (1, 2):
            init = f"file://{out}/init-{sharding}-{world}-{time.time_ns()}"
            mp.start_processes(
                _memory_rank,
                args=(world, init, sharding, quick, str(out)),
                nprocs=world,
                start_method="spawn",
            )
            ranks = [json.loads((out / f"mem-{sharding}-{world}-{r}.json").read_text()) for r in range(world)]
            results[f"{sharding}-{world}"] = {
                "state_bytes_per_rank": max(r["state_bytes"] for r in ranks),
                "peak_rss_bytes_per_rank": max(r["peak_rss_bytes"] for r in ranks),
                "ranks": ranks,
            }
    return results


# ------------------------------------------------------------------------------------------ 2: sync


def _tensors(total_bytes: int):  # type: ignore[no-untyped-def]
    import torch

    chunk = 32 * 1024**2  # 32 MB tensors, bf16 (a 7B student's layers are 28-200 MB)
    n = max(1, total_bytes // chunk)
    g = torch.Generator().manual_seed(0)
    return [(f"w{i}", torch.randn(chunk // 2, generator=g).to(torch.bfloat16)) for i in range(n)]


def _streamed(rank: int, port: int, total: int, out: str, transport: str) -> None:
    import torch
    from distillery_runtime.sync.weight_sync import SyncGroup, plan_buckets, tensor_metas

    timeout = datetime.timedelta(seconds=120)
    group = SyncGroup("127.0.0.1", port, rank, ["sender", "receiver"], timeout=timeout, transport=transport)
    named = _tensors(total)
    metas = tensor_metas(named, torch.bfloat16)
    bucket = 256 * 1024**2
    for attempt in range(2):  # the first warms gloo's connections up; the second is timed
        group.store.set(f"go{attempt}", "1") if rank == 0 else group.store.wait([f"go{attempt}"])
        started = time.perf_counter()
        if rank == 0:
            group.wait_ready()
            buckets = ([named[i][1] for i in b] for b in plan_buckets(metas, bucket))
            group.send(metas, bucket, buckets)
        else:
            got = sum(t.clone().numel() for _, t in group.receive(metas, bucket))  # as RolloutWorker does
            assert got == sum(m.numel for m in metas)
            seconds = time.perf_counter() - started
            if attempt == 1:
                record = {"seconds": seconds, "transport": group.last_transport}
                Path(out, f"sync-{transport}-{total}.json").write_text(json.dumps(record))
    if rank == 0:
        group.close()


def streamed_seconds(total: int, out: Path, transport: str) -> float:
    """auto: what the loop does with a colocated engine (shared memory); collective: gloo over loopback."""
    import torch.multiprocessing as mp

    mp.start_processes(_streamed, args=(_port(), total, str(out), transport), nprocs=2, start_method="spawn")
    record = json.loads((out / f"sync-{transport}-{total}.json").read_text())
    assert record["transport"] == ("shm" if transport == "auto" else "collective"), record
    return float(record["seconds"])


def object_store_seconds(totals: list[int]) -> dict[int, float]:
    """Today's path: the sender actor's copy of the weights as an ObjectRef, the receiver's ray.get."""
    import ray

    @ray.remote(num_cpus=0)
    class Sender:
        def __init__(self, total: int) -> None:
            self.named = _tensors(total)

        def weights(self) -> list:
            return [(n, t.clone()) for n, t in self.named]  # Trainer.weights() on CPU: a copy

    @ray.remote(num_cpus=0)
    class Receiver:
        def take(self, weights: list) -> int:
            return sum(t.numel() for _, t in weights)

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    out = {}
    try:
        receiver = Receiver.remote()
        for total in totals:
            sender = Sender.remote(total)
            for _ in range(2):  # warm-up, then timed
                started = time.perf_counter()
                ray.get(receiver.take.remote(sender.weights.remote()))
                out[total] = time.perf_counter() - started
            ray.kill(sender)
    finally:
        ray.shutdown()
    return out


# ------------------------------------------------------------------------------------------ 3: the plan


def plan_part() -> dict:
    from distillery.model_shapes import KNOWN_SHAPES
    from distillery.plan.memory.gpu import GIB, TrainingLayout, plan_memory

    out = {}
    # A 32B student's bf16 weights (61 GiB) fill a 0.5 share of one 80 GB GPU: its rollout engine needs
    # tensor parallelism, which the plan checks too.
    cases = (
        ("1.5B", "qwen2.5-1.5b", 1),
        ("7B", "qwen2.5-7b", 1),
        ("32B", "qwen2.5-32b", 1),
        ("32B", "qwen2.5-32b", 2),
    )
    for label, name, tensor_parallel in cases:
        for offload in (False, True):
            plan = plan_memory(
                TrainingLayout(
                    shape=KNOWN_SHAPES[name], ranks=8, gpu_bytes=80 * GIB, cpu_offload=offload,
                    micro_batch_tokens=4096, response_tokens=3072, rollout_fraction=0.5,
                    rollout_tensor_parallel=tensor_parallel,
                )
            )  # fmt: skip
            key = f"{label} on 8x80GB" + (" with cpuOffload" if offload else "")
            key += f", rollout tensorParallel {tensor_parallel}" if tensor_parallel > 1 else ""
            out[key] = {
                "fits": plan.fits,
                "peak_gib": round(plan.peak_bytes / GIB, 2),
                "peak_phase": plan.peak_phase,
                "trainer_peak_gib": round(plan.trainer_peak_bytes / GIB, 2),
                "host_gib_per_rank": round(plan.host_bytes / GIB, 2),
                "rollout_weights_gib_per_gpu": round(plan.rollout_weight_bytes / GIB, 2),
            }
    return out


def measured_points() -> dict:
    """bench/gpu_scale.py's measured peaks beside today's plan of the same case. That run's trainer used
    foreach AdamW (the fused kernel since), so the plan is made for foreach."""
    from distillery.plan.memory.gpu import GIB

    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_scale

    path = ROOT / "bench/results/gpu_scale/results.jsonl"
    if not path.exists():
        return {}
    points = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        fields = {f: r[f] for f in gpu_scale.Case.__dataclass_fields__ if f in r}
        plan = gpu_scale.prediction(gpu_scale.Case(**fields), int(140 * GIB), fused=False)
        point = {"plan_gib": round(plan["planned_trainer_gib"], 2), "optimizer": "foreach AdamW"}
        if "peak_allocated_gib" in r:
            point |= {
                "gpu": r["gpu"],
                "measured_gib": round(r["peak_allocated_gib"], 2),
                "measured_over_plan": round(r["peak_allocated_gib"] / plan["planned_trainer_gib"], 3),
            }
        else:
            point["error"] = r.get("error", r.get("skipped", ""))[:120]
        points[r["case"]] = point
    return points


# ------------------------------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", default="bench/results/scale")
    args = parser.parse_args()
    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "runtime")]))
    started = time.perf_counter()

    work = Path(tempfile.mkdtemp(prefix="distillery-scale-"))  # the ranks' files; the summary goes to `out`
    memory = memory_part(work, args.quick)
    fsdp1, fsdp2 = memory["fsdp-1"], memory["fsdp-2"]
    rep2 = memory["replicate-2"]
    totals = [int(x * GB) for x in ((0.05, 0.1) if args.quick else (0.1, 0.25, 0.5, 1.0))]
    streamed = {t: streamed_seconds(t, work, "auto") for t in totals}
    collective = {t: streamed_seconds(t, work, "collective") for t in totals}
    store = object_store_seconds(totals)
    sync = {
        f"{t / GB:g} GB": {
            "streamed_s": round(streamed[t], 3), "object_store_s": round(store[t], 3),
            "streamed_gb_s": round(t / GB / streamed[t], 2), "object_store_gb_s": round(t / GB / store[t], 2),
            "speedup": round(store[t] / streamed[t], 2),
            "collective_s": round(collective[t], 3), "collective_gb_s": round(t / GB / collective[t], 2),
            "collective_speedup": round(store[t] / collective[t], 2),
        }
        for t in totals
    }  # fmt: skip
    plan = plan_part()
    largest = f"{totals[-1] / GB:g} GB"

    rows = [
        "| layout | ranks | weights+grads+AdamW per rank (MB) | peak RSS per rank (MB) |",
        "|---|---|---|---|",
    ]
    for key, value in memory.items():
        sharding, world = key.split("-")
        rows.append(
            f"| {sharding} | {world} | {value['state_bytes_per_rank'] / 1e6:.0f} | "
            f"{value['peak_rss_bytes_per_rank'] / 1e6:.0f} |"
        )
    rows += [
        "",
        "| weights | streamed, shared memory: s (GB/s) | streamed, gloo: s (GB/s) | object store: s (GB/s) | speedup (shm / gloo) |",
        "|---|---|---|---|---|",
    ]
    for key, value in sync.items():
        rows.append(
            f"| {key} | {value['streamed_s']} ({value['streamed_gb_s']}) | "
            f"{value['collective_s']} ({value['collective_gb_s']}) | "
            f"{value['object_store_s']} ({value['object_store_gb_s']}) | "
            f"{value['speedup']}x / {value['collective_speedup']}x |"
        )
    rows += [
        "",
        "| student (plan) | fits | peak GiB (phase) | trainer GiB | host GiB/rank |",
        "|---|---|---|---|---|",
    ]
    for key, value in plan.items():
        rows.append(
            f"| {key} | {value['fits']} | {value['peak_gib']} ({value['peak_phase']}) | "
            f"{value['trainer_peak_gib']} | {value['host_gib_per_rank']} |"
        )
    print("\n".join(rows))
    summary = {
        "bench": "scale",
        "quick": args.quick,
        "model_params": memory["replicate-1"]["ranks"][0]["params"],
        "fsdp_rank_memory_ratio": round(fsdp2["state_bytes_per_rank"] / fsdp1["state_bytes_per_rank"], 3),
        "fsdp_vs_replica_2rank_ratio": round(fsdp2["state_bytes_per_rank"] / rep2["state_bytes_per_rank"], 3),
        "fsdp_rss_ratio": round(fsdp2["peak_rss_bytes_per_rank"] / fsdp1["peak_rss_bytes_per_rank"], 3),
        "memory": {k: {kk: vv for kk, vv in v.items() if kk != "ranks"} for k, v in memory.items()},
        "sync": sync,
        "sync_speedup_vs_object_store": sync[largest]["speedup"],
        "sync_speedup_vs_object_store_gloo": sync[largest]["collective_speedup"],
        "planner": plan,
        "planner_fits": {k: v["fits"] for k, v in plan.items()},
        "measured_on_gpu": measured_points(),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(json_main("scale", main))
