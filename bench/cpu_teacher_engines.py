"""A step's teacher scoring on CPU: the vLLM teacher server against the transformers forward, one run.

What `distillery.plan.teachers.scoring_engine` decides for a teacher on the student's CPU cores, measured: the e2e
bench's teachers (`e2e_vs_trl.SPEED_MODELS`: tiny 1.6M and small 37M parameter Llamas, vocabulary 1031,
float32), one step's samples as a local run scores them once its rollout is done (32 samples, 8-token
prompts, 128-token responses, top-16):

  vllm     Distillery's teacher server (`teachers.server`, eager, as `distillery run` starts it) and its
           compact client (`CompactTeacher.score`: one request of the 32 samples)
  forward  `TransformersTeacher.score` in this process (the engine a local run's CPU teacher now gets)

Both with the thread settings of a local run (`host_threads.turn_taking_threads_env`). The forward is timed
before the server starts and after it stops (an idle server beside it is not what a run has), the server
between; each cell `--repeats` times after one warm-up, the median kept.

    python bench/cpu_teacher_engines.py [--scales tiny small] [--repeats 5] [--output DIR]

Prints a table, writes `cpu_teacher_engines.json` to --output (default bench/results/cpu_teacher_engines).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "runtime")]

from distillery.plan.env.threads import turn_taking_threads_env  # noqa: E402

# Before torch loads libgomp: the spin a local run's processes get.
os.environ.update(turn_taking_threads_env(os.environ))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from distillery_runtime.teachers import CompactTeacher, ScoreRequest  # noqa: E402
from distillery_runtime.teachers.in_process.transformers_forward import TransformersTeacher  # noqa: E402
from distillery_runtime.testing.teacher_server import cpu_env, start_teacher_server  # noqa: E402
from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model  # noqa: E402

from distillery.api.spec import TeacherEngine  # noqa: E402
from distillery.plan.teachers.engines import EngineSettings  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from _common import json_main  # noqa: E402  (bench/, the script's own folder)
from e2e_vs_trl import SPEED_MODELS  # noqa: E402

SAMPLES, PROMPT, RESPONSE, TOP_K, VOCAB = 32, 8, 128, 16, 1031


def samples(seed: int = 0) -> list[ScoreRequest]:
    rng = np.random.default_rng(seed)
    return [
        ScoreRequest(
            rng.integers(4, VOCAB, PROMPT).tolist(), rng.integers(4, VOCAB, RESPONSE).tolist(), f"s{i}"
        )
        for i in range(SAMPLES)
    ]


def engine(engine_kind: TeacherEngine) -> EngineSettings:
    return EngineSettings(
        "teacher", TOP_K, PROMPT + RESPONSE + 1, memory_fraction=0.9, tensor_parallel=1, dtype="float32",
        extra_args=("--disable-uvicorn-access-log",), enforce_eager=True, on_gpu=False, engine=engine_kind,
    )  # fmt: skip


def timed(score, batch: list[ScoreRequest], repeats: int) -> tuple[list[float], object]:  # type: ignore[no-untyped-def]
    scores = asyncio.run(score(batch, TOP_K))  # warm-up
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        asyncio.run(score(batch, TOP_K))
        seconds.append(time.perf_counter() - started)
    return seconds, scores


def measure(scale: str, root: Path, repeats: int) -> dict:
    model = root / scale
    hidden, layers, heads = SPEED_MODELS[scale][1]
    save_tiny_model(
        model, tokenizer=build_tokenizer(vocab_size=VOCAB), hidden=hidden, layers=layers, heads=heads, seed=2,
        dtype=torch.float32,
    )  # fmt: skip
    batch = samples()
    forward = TransformersTeacher(
        str(model), engine(TeacherEngine.TRANSFORMERS), dtype=torch.float32, device=torch.device("cpu")
    )
    before, forward_scores = timed(forward.score, batch, repeats)
    env = {**cpu_env(root / "cache"), **turn_taking_threads_env(os.environ)}
    server = start_teacher_server(model, engine(TeacherEngine.VLLM), log_path=root / f"{scale}.log", env=env)
    try:

        async def served(b: list[ScoreRequest], k: int):  # type: ignore[no-untyped-def]
            client = CompactTeacher(
                [server.url], name="teacher", max_logprobs=TOP_K, max_model_len=PROMPT + RESPONSE + 1
            )
            try:
                return await client.score(b, k)
            finally:
                await client.close()

        vllm, vllm_scores = timed(served, batch, repeats)
    finally:
        server.stop()
    after, _ = timed(forward.score, batch, repeats)
    # The two engines score the same tokens: the same top-1 nearly everywhere, log-probs to float rounding.
    diff = float(
        np.abs(forward_scores.token_logprobs - vllm_scores.token_logprobs)[forward_scores.mask].max()
    )
    forward_s = statistics.median(before + after)
    return {
        "scale": scale,
        "teacher": {"hidden": hidden, "layers": layers, "heads": heads},
        "vllm_s": statistics.median(vllm),
        "forward_s": forward_s,
        "forward_before_s": statistics.median(before),
        "forward_after_s": statistics.median(after),
        "speedup": statistics.median(vllm) / forward_s,
        "max_token_logprob_diff": diff,
        "runs": {"vllm": vllm, "forward_before": before, "forward_after": after},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", nargs="*", default=["tiny", "small"], choices=["tiny", "small", "medium"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "cpu_teacher_engines")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(scale, Path(tmp), args.repeats) for scale in args.scales]
    print(
        f"{SAMPLES} samples x ({PROMPT} + {RESPONSE}) tokens, top-{TOP_K}, float32, {torch.get_num_threads()} threads"
    )
    print(f"{'teacher':<8} {'vllm server s':>14} {'forward s':>10} {'speedup':>8} {'max |diff|':>11}")
    for r in rows:
        print(
            f"{r['scale']:<8} {r['vllm_s']:>14.3f} {r['forward_s']:>10.3f} {r['speedup']:>7.2f}x {r['max_token_logprob_diff']:>11.2e}"
        )
    args.output.mkdir(parents=True, exist_ok=True)
    result = {"bench": "cpu_teacher_engines", "started": started, "cpu_cores": os.cpu_count(), "rows": rows}
    (args.output / "cpu_teacher_engines.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({r["scale"]: round(r["speedup"], 2) for r in rows}))


if __name__ == "__main__":
    raise SystemExit(json_main("cpu_teacher_engines", main))
