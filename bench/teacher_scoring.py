"""Teacher scoring throughput: our clients and compact endpoint versus the peer way, one run.

One real vLLM teacher server (Distillery's `teachers.server`: OpenAI API + compact endpoint,
one engine) with a tiny local model; 32 sequences x 256 tokens; K = 1, 8, 32, 64. Methods:

  a  ours, OpenAI path: `OpenAITeacher` (aiohttp pool, msgspec, vectorised alignment)
  b  ours, compact endpoint: `CompactTeacher` (binary arrays, engine tensors, no decoding)
  c  peer way: one `requests` call per sequence from a thread pool of 8, JSON parsed into
     Python dicts and top-k picked per position by rank (as ms-swift's client does)
  d  ceiling of the OpenAI path: the same requests as (a), answers read but not parsed

Tokens/s = scored tokens (prompt + response) / wall time; every cell is timed once per round
(`--repeats` rounds, 3 by default, 1 with `--quick`) and the best round is kept. Targets at
K=64: a within 10% of d; b >= 5x c; b(K=64) within 25% of b(K=1).

    python bench/teacher_scoring.py [--quick] [--model-dir DIR]

Prints a table, then one JSON summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "runtime")]

from _common import json_main  # noqa: E402  (bench/, the script's own folder)
from distillery_runtime.teachers import CompactTeacher, OpenAITeacher, ScoreRequest  # noqa: E402
from distillery_runtime.testing.teacher_server import cpu_engine, cpu_env, start_teacher_server  # noqa: E402
from distillery_runtime.testing.tiny import save_tiny_model  # noqa: E402

N_SEQ, SEQ_LEN, PROMPT_LEN = 32, 256, 16
KS = (1, 8, 32, 64)


def make_samples(vocab: int, seed: int = 0) -> list[ScoreRequest]:
    rng = np.random.default_rng(seed)
    return [
        ScoreRequest(
            rng.integers(4, vocab, PROMPT_LEN).tolist(),
            rng.integers(4, vocab, SEQ_LEN - PROMPT_LEN).tolist(),
            f"s{i}",
        )
        for i in range(N_SEQ)
    ]


def peer_score(url: str, model: str, samples: list[ScoreRequest], k: int) -> list[tuple[list, list]]:
    """The peer way: requests + thread pool of 8, dicts, sort by rank per position."""

    def one(s: ScoreRequest) -> tuple[list, list]:
        tokens = [*s.prompt_ids, *s.response_ids]
        r = requests.post(
            f"{url}/v1/completions",
            json={
                "model": model,
                "prompt": tokens,
                "max_tokens": 1,
                "prompt_logprobs": k,
                "temperature": 1.0,
            },
            timeout=300,
        )
        r.raise_for_status()
        plp = r.json()["choices"][0]["prompt_logprobs"]
        ids, lps = [], []
        for pos in plp[len(s.prompt_ids) :]:
            top = sorted(pos.items(), key=lambda kv: kv[1]["rank"])[:k]
            ids.append([int(t) for t, _ in top])
            lps.append([v["logprob"] for _, v in top])
        return ids, lps

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, samples))


async def ceiling(teacher: OpenAITeacher, samples: list[ScoreRequest], k: int) -> int:
    """Same requests and transport as (a), answers read but not parsed."""

    async def one(s: ScoreRequest) -> int:
        body = orjson.dumps(
            {
                "model": teacher.model,
                "prompt": [*s.prompt_ids, *s.response_ids],
                "max_tokens": 1,
                "prompt_logprobs": k,
                "temperature": 1.0,
            }
        )
        return len(
            await teacher.transport.request(
                "POST", "/v1/completions", body, {"Content-Type": "application/json"}
            )
        )

    return sum(await asyncio.gather(*(one(s) for s in samples)))


async def run(url: str, model: str, vocab: int, repeats: int) -> dict[int, dict[str, float]]:
    samples = make_samples(vocab)
    a = OpenAITeacher([url], model, concurrency=8)
    b = CompactTeacher([url], name=model, concurrency=4, batch_size=8)
    methods = {
        "a_ours_openai": lambda k: a.score(samples, k),
        "b_ours_compact": lambda k: b.score(samples, k),
        "c_peer_requests": lambda k: asyncio.to_thread(peer_score, url, model, samples, k),
        "d_openai_ceiling": lambda k: ceiling(a, samples, k),
    }
    best = {k: dict.fromkeys(methods, float("inf")) for k in KS}
    try:
        for k in KS:  # warm-up
            await a.score(samples[:4], k)
            await b.score(samples[:4], k)
        # Every (K, method) cell is timed once per round and the best round is kept: on a shared
        # machine, load changes then hit all cells alike instead of whichever K ran during a spike.
        for round_ in range(repeats):
            for k in KS:
                for name, fn in methods.items():
                    t0 = time.perf_counter()
                    await fn(k)
                    best[k][name] = min(best[k][name], time.perf_counter() - t0)
            print(f"round {round_ + 1}/{repeats} done", flush=True)
        results = {k: {m: N_SEQ * SEQ_LEN / t for m, t in row.items()} for k, row in best.items()}
        # consistency: the compact endpoint and the JSON path give the same numbers
        sa, sb = await a.score(samples[:4], 8), await b.score(samples[:4], 8)
        assert np.array_equal(sa.token_logprobs, sb.token_logprobs) and np.array_equal(
            sa.topk_logprobs, sb.topk_logprobs
        ), "compact endpoint and OpenAI path disagree"
    finally:
        await a.close()
        await b.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one timed repeat per cell instead of three")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument(
        "--model-dir", type=Path, default=None, help="existing model dir (default: build a tiny one)"
    )
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument(
        "--no-fast-topk",
        action="store_true",
        help="serve with vLLM's own torch.topk (DISTILLERY_FAST_TOPK=0)",
    )
    args = ap.parse_args()
    # SIGTERM runs the `finally` below, so the teacher server is not left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    repeats = args.repeats or (1 if args.quick else 3)
    cache = ROOT / ".cache"
    work = Path(tempfile.mkdtemp(prefix="bench-teacher-"))
    # the LM head has `--vocab` rows (top-k runs over all of them); sampled ids stay inside the
    # tokenizer, whose BPE training may stop short of that size on the small default corpus
    model_dir = args.model_dir or save_tiny_model(
        work / "model", vocab_size=args.vocab, model_vocab_size=args.vocab, hidden=128, layers=2, heads=4
    )
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(model_dir))
    env = cpu_env(cache)
    env["DISTILLERY_FAST_TOPK"] = "0" if args.no_fast_topk else "1"
    engine = cpu_engine("bench", max_model_len=SEQ_LEN + 8, max_logprobs=64)
    server = start_teacher_server(model_dir, engine, log_path=work / "server.log", env=env)
    try:
        print(f"teacher server {server.url}, model {model_dir} (vocab {vocab}), {N_SEQ} x {SEQ_LEN} tokens")
        results = asyncio.run(run(server.url, "bench", vocab, repeats))
    finally:
        server.stop()

    print()
    print(
        f"{'K':>3} | {'a ours OpenAI':>14} | {'b ours compact':>14} | {'c peer':>10} | {'d ceiling':>10} | a/d   | b/c"
    )
    print("-" * 86)
    for k, r in results.items():
        print(
            f"{k:>3} | {r['a_ours_openai']:>14,.0f} | {r['b_ours_compact']:>14,.0f} | {r['c_peer_requests']:>10,.0f}"
            f" | {r['d_openai_ceiling']:>10,.0f} | {r['a_ours_openai'] / r['d_openai_ceiling']:.2f}"
            f"  | {r['b_ours_compact'] / r['c_peer_requests']:.1f}x"
        )
    r64, r1 = results[64], results[1]
    summary = {
        "bench": "teacher_scoring",
        "tokens": N_SEQ * SEQ_LEN,
        "repeats": repeats,
        "fast_topk": not args.no_fast_topk,
        "tok_per_s": {str(k): {m: round(v) for m, v in r.items()} for k, r in results.items()},
        "k64_a_over_d": round(r64["a_ours_openai"] / r64["d_openai_ceiling"], 3),
        "k64_b_over_c": round(r64["b_ours_compact"] / r64["c_peer_requests"], 2),
        "b_k64_over_b_k1": round(r64["b_ours_compact"] / r1["b_ours_compact"], 3),
        "targets_met": {
            "a_within_10pct_of_d": r64["a_ours_openai"] >= 0.9 * r64["d_openai_ceiling"],
            "b_at_least_5x_c": r64["b_ours_compact"] >= 5 * r64["c_peer_requests"],
            "b_k64_within_25pct_of_b_k1": r64["b_ours_compact"] >= 0.75 * r1["b_ours_compact"],
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    raise SystemExit(json_main("teacher_scoring", main))
