"""The weight sync's transports on one GPU, torch alone: CUDA IPC vs staging through shared memory.

    python bench/gpu_sync.py                       # on a CUDA machine (torch only; ~1 min)
    python bench/gpu_sync.py --device cpu --smoke  # the script's CPU part (shared memory), as the tests run it

Two processes play trainer rank 0 and a rollout engine's worker on the same GPU, as in a colocated job
(weight_sync.SyncGroup, the code the loop runs). The sender holds 1 GB of bfloat16 tensors on the GPU
(32 MB each) and sends them in 256 MB buckets; the receiver copies each tensor out onto its own device, as
the vLLM backend does (rollout/vllm_transfer.py). Transports: "auto", which picks CUDA IPC when both are
on one GPU (the bucket never leaves the device), and "shm" (each bucket copied to /dev/shm and back). Per
transport: the median of three syncs after a warm-up, seconds and GB/s, the transport `auto` chose, and
an exact check of what arrived (a checksum of every tensor).

The last line printed is the JSON summary; a table goes before it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

from _common import json_main  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "runtime"):
    sys.path.insert(0, str(path))

GB = 1e9
BUCKET_BYTES = 256 * 1024**2
TENSOR_BYTES = 32 * 1024**2


def _tensors(total_bytes: int, device: str):  # type: ignore[no-untyped-def]
    import torch

    g = torch.Generator().manual_seed(0)
    n = max(1, total_bytes // TENSOR_BYTES)
    return [
        (f"w{i}", torch.randn(TENSOR_BYTES // 2, generator=g).to(torch.bfloat16).to(device)) for i in range(n)
    ]


def _checksum(tensor) -> float:  # type: ignore[no-untyped-def]
    return float(tensor.float().sum())


def _member(rank: int, port: int, total: int, device: str, transport: str, rounds: int, out: str) -> None:
    import torch
    from distillery_runtime.sync.weight_sync import SyncGroup, plan_buckets, tensor_metas

    if device == "cuda":
        torch.cuda.set_device(0)
    named = _tensors(total, device)
    metas = tensor_metas(named, torch.bfloat16)
    group = SyncGroup(
        "127.0.0.1", port, rank, ["trainer rank 0", "rollout engine 0"], device=torch.device(device),
        timeout=datetime.timedelta(seconds=120), transport=transport,
    )  # fmt: skip
    seconds = []
    for attempt in range(rounds + 1):  # the first warms up (slot allocation, IPC handles)
        group.store.set(f"go{attempt}", "1") if rank == 0 else group.store.wait([f"go{attempt}"])
        started = time.perf_counter()
        if rank == 0:
            group.wait_ready()
            group.send(
                metas, BUCKET_BYTES, ([named[i][1] for i in b] for b in plan_buckets(metas, BUCKET_BYTES))
            )
            continue
        received = {name: tensor.to(device, copy=True) for name, tensor in group.receive(metas, BUCKET_BYTES)}
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
        if attempt == 0:
            wrong = [n for n, t in named if _checksum(received[n]) != _checksum(t)]
            assert not wrong, f"{transport}: {len(wrong)} tensors arrived different"
    if rank == 1:
        record = {"seconds": seconds[1:], "transport": group.last_transport}
        Path(out, f"{transport}.json").write_text(json.dumps(record))
    group.close()


def run(transport: str, total: int, device: str, rounds: int, out: Path) -> dict:
    import torch.multiprocessing as mp
    from distillery_runtime.run.workers import free_port

    args = (free_port(), total, device, transport, rounds, str(out))
    mp.start_processes(_member, args=args, nprocs=2, start_method="spawn")
    record = json.loads((out / f"{transport}.json").read_text())
    median = statistics.median(record["seconds"])
    return {
        "chosen": record["transport"],
        "seconds": round(median, 4),
        "all_seconds": [round(s, 4) for s in record["seconds"]],
        "gb_s": round(total / GB / median, 2),
        "exact": True,  # the receiver asserts every checksum before it writes its record
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--smoke", action="store_true", help="64 MB instead of 1 GB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default="bench/results/gpu_sync")
    args = parser.parse_args()
    import torch

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    total = 64 * 1024**2 if args.smoke else 1024**3
    started = time.perf_counter()
    results = {
        transport: run(transport, total, args.device, args.rounds, out) for transport in ("auto", "shm")
    }
    rows = ["| transport | chosen | seconds | GB/s | exact |", "|---|---|---|---|---|"]
    for name, r in results.items():
        rows.append(f"| {name} | {r['chosen']} | {r['seconds']} | {r['gb_s']} | {r['exact']} |")
    print("\n".join(rows))
    summary = {
        "bench": "gpu_sync",
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "bytes": total,
        "results": results,
        # Only where auto chose IPC (both on one GPU); on CPU both runs are shared memory.
        "ipc_speedup_vs_shm": round(results["shm"]["seconds"] / results["auto"]["seconds"], 2)
        if results["auto"]["chosen"] == "ipc"
        else None,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(json_main("gpu_sync", main))
