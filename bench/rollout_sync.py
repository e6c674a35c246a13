"""Weight sync into a real vLLM rollout engine, with one and two tensor-parallel workers: streamed through
vLLM's weight-transfer API (our sync-group backend, rollout/vllm_transfer.py) vs the path a sync through
Ray's object store takes (the whole state dict put in the object store, fetched by the engine's process
and handed to vLLM's `reload_weights`, which a tensor-parallel engine pickles to every worker).

    python bench/rollout_sync.py            # ~3 min on 2 cores; writes bench/results/rollout_sync/
    python bench/rollout_sync.py --quick    # a smaller student (a smoke run)

The student is a random-init Llama of ~110M parameters (hidden 768, 12 layers; --quick: 256, 4),
synced in float32 as a CPU job syncs it. The sender plays trainer rank 0 (whole tensors, 256 MB
buckets) in a thread of this process; the engine runs in this process (tensorParallel 1) or in two
worker processes of vLLM's own (tensorParallel 2). Each sync is timed from the sender's first byte to
the engine's return (its workers have loaded every tensor and the prefix cache is reset); the median of
three syncs after a warm-up. Before timing, each path is checked: after a sync of perturbed weights the
engine's log-probs of a fixed sequence equal the sender's model's (float32, 1e-3).

The last line printed is the JSON summary; a table goes before it.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import json_main  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "runtime"):
    sys.path.insert(0, str(path))

GB = 1e9
BUCKET_BYTES = 256 * 1024**2
PROMPT, RESPONSE = [5, 9, 13, 7], [11, 30, 8, 21, 17, 6]


def _student(directory: Path, quick: bool) -> Path:
    import torch
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    texts = [f"{a}+{b}={a + b}" for a in range(60) for b in range(60)]
    hidden, layers = (256, 4) if quick else (768, 12)
    return save_tiny_model(
        directory, tokenizer=build_tokenizer(texts, 512, full_byte_alphabet=False), hidden=hidden,
        layers=layers, heads=hidden // 64, seed=0, dtype=torch.float32, model_vocab_size=16000, init_std=0.02,
    )  # fmt: skip


def _logprobs(model: Any, prompt: list[int], response: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[*prompt, *response]])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()


def _perturb(model: Any, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)


def measure(model_dir: Path, tensor_parallel: int, rounds: int) -> dict[str, Any]:
    """Both paths into one engine: checked, then timed."""
    import ray
    import torch
    from distillery_runtime.rollout import build_engine
    from distillery_runtime.run.workers import free_port
    from distillery_runtime.sync.weight_sync import SyncGroup, sender_buckets, tensor_metas
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    state = model.state_dict()
    names, tensors = list(state), list(state.values())
    metas = tensor_metas(state.items(), torch.float32)
    total = sum(m.nbytes for m in metas)
    started = time.perf_counter()
    engine = build_engine(
        "vllm", str(model_dir), dtype=torch.float32, max_model_len=64, tensor_parallel=tensor_parallel
    )
    engine_start_s = time.perf_counter() - started
    port = free_port()
    group_names = ["sender", *(f"engine worker {w}" for w in range(tensor_parallel))]
    pool = ThreadPoolExecutor(1)
    sender_future = pool.submit(SyncGroup, "127.0.0.1", port, 0, group_names)
    engine.join_weight_sync("127.0.0.1", port, 1, group_names, timeout_s=120)
    group = sender_future.result()

    def send() -> int:
        group.wait_ready()
        return group.send(metas, BUCKET_BYTES, sender_buckets(metas, BUCKET_BYTES, lambda i: tensors[i]))

    def streamed(version: int) -> float:
        t0 = time.perf_counter()
        sent = pool.submit(send)
        engine.receive_weights(metas, BUCKET_BYTES, version)
        assert sent.result() == total
        return time.perf_counter() - t0

    def object_store(version: int) -> float:
        t0 = time.perf_counter()
        ref = ray.put(
            list(zip(names, [t.clone() for t in tensors], strict=True))
        )  # Trainer.weights(): a copy
        engine.update_weights(ray.get(ref), version)
        return time.perf_counter() - t0

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    out: dict[str, Any] = {
        "tensor_parallel": tensor_parallel,
        "bytes": total,
        "engine_start_s": round(engine_start_s, 1),
    }
    try:
        for name, path in (("streamed", streamed), ("object_store", object_store)):
            _perturb(model, seed=len(out))  # new weights each time: a sync that loaded nothing would show
            path(1)
            got = engine.sequence_logprobs(PROMPT, RESPONSE)
            want = _logprobs(model, PROMPT, RESPONSE)
            error = max(abs(a - b) for a, b in zip(got, want, strict=True))
            assert error < 1e-3, f"{name} with tensorParallel {tensor_parallel}: log-probs off by {error}"
            seconds = [path(2 + i) for i in range(rounds)]
            median = statistics.median(seconds)
            out[name] = {
                "seconds": round(median, 3),
                "all_seconds": [round(s, 3) for s in seconds],
                "gb_s": round(total / GB / median, 2),
                "logprob_error": error,
            }
        out["speedup"] = round(out["object_store"]["seconds"] / out["streamed"]["seconds"], 2)
    finally:
        ray.shutdown()
        group.close()
        pool.shutdown(wait=False)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default="bench/results/rollout_sync")
    args = parser.parse_args()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _student(Path(tmp) / "student", args.quick)
        for tensor_parallel in (1, 2):
            import vllm.envs

            vllm.envs.disable_envs_cache()
            results.append(measure(model_dir, tensor_parallel, args.rounds))
            gc.collect()  # the engine of this case goes before the next one starts
            (out / "results.json").write_text(json.dumps(results, indent=1))
    rows = [
        "| tensorParallel | GB a sync | streamed s (GB/s) | object store s (GB/s) | speedup |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r['tensor_parallel']} | {r['bytes'] / GB:.2f} | {r['streamed']['seconds']} ({r['streamed']['gb_s']}) | "
            f"{r['object_store']['seconds']} ({r['object_store']['gb_s']}) | {r['speedup']}x |"
        )
    print("\n".join(rows))
    summary = {
        "bench": "rollout_sync",
        "quick": args.quick,
        "bytes_per_sync": results[0]["bytes"],
        "results": results,
        "speedup_by_tensor_parallel": {str(r["tensor_parallel"]): r["speedup"] for r in results},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(json_main("rollout_sync", main))
