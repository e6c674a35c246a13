"""One step's rollout on CPU: vLLM against the transformers engine, batched and one request at a time.

A step of the e2e bench's speed settings (`bench/e2e_vs_trl.py`): 32 prompts of six words, 128 new tokens at
temperature 1.0, random Llamas that rarely emit EOS (so every response runs to 128 tokens), the tiny (0.4M)
and small (11.5M) students. Engines, each in this process, each timed on the same requests:

- transformers: `TransformersRolloutEngine`, the step's requests decoded in one batch;
- transformers, decode on one thread: the batched engine with torch's intra-op threads at 1 in its decode
  steps (the plan's `decode_threads` for these students on CPU; the prompts' forward on every thread). Its
  figures from before this row was timed ahead of vLLM's (2026-12-04, 10:00 UTC) are the batched engine's
  on every thread: vLLM had turned `torch.set_num_threads` off;
- transformers, one at a time (the old path): the same engine with `batch_rows=1`;
- HF generate (TRL's path, the peer): `model.generate` on the left-padded batch, sampling;
- vllm: `VllmRolloutEngine` as a run builds it (eager at tiny, compiled at small, as the e2e bench), timed
  after the others (its CPU worker binds the process's threads and turns `torch.set_num_threads` off).

`--neighbour BUSY_MS IDLE_MS`: a process beside the engines spins BUSY_MS then sleeps IDLE_MS, over and over,
as another tenant of a shared host (or a run's own helper processes) takes a core in bursts: an OpenMP region
waits for its slowest thread, so a decode step of tiny kernels on every core stalls whenever one is taken.

`--alternate PAIRS`: only the batched engine, its decode steps on every thread and on one in turn, step by step,
PAIRS pairs after a warm-up pair (a drift of the host falls on both).

Seconds per step: median of `--repeats` after one warm-up step. Prints a table and writes JSON
(bench/results/rollout_engines/DATE[-neighbour-B-I].json).

    python bench/rollout_engines.py [--scales tiny small] [--repeats 3] [--neighbour 5 5] [--alternate 10]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "runtime")]

from distillery.plan.env.threads import turn_taking_threads_env  # noqa: E402

# as a local run's rollout actor: OpenMP threads that keep libgomp's spin (set before torch starts them)
os.environ.update(turn_taking_threads_env(os.environ))

import torch  # noqa: E402
from distillery_runtime.rollout import GenerationRequest, SamplingSettings, build_engine  # noqa: E402
from distillery_runtime.rollout.hf_engine import TransformersRolloutEngine  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from _common import json_main  # noqa: E402  (bench/, the script's own folder)
from e2e_vs_trl import speed_setting  # noqa: E402

PROMPTS, NEW_TOKENS, MAX_MODEL_LEN = 32, 128, 256
NEIGHBOUR = """
import sys, time

busy, idle = float(sys.argv[1]) / 1000, float(sys.argv[2]) / 1000
while True:
    began = time.perf_counter()
    while time.perf_counter() - began < busy:
        pass
    time.sleep(idle)
"""


def requests(prompts: list[str], tokenizer) -> list[GenerationRequest]:
    return [
        GenerationRequest(f"s{i}", tuple(tokenizer(p)["input_ids"]), seed=i)
        for i, p in enumerate(prompts[:PROMPTS])
    ]


def time_steps(step: Callable[[], int], repeats: int) -> tuple[list[float], int]:
    """Seconds of each timed step (after one warm-up) and the tokens a step sampled."""
    tokens = step()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return times, tokens


def engine_step(engine, batch: list[GenerationRequest], sampling: SamplingSettings) -> Callable[[], int]:
    return lambda: sum(len(s.response_ids) for out in engine.generate(batch, sampling) for s in out)


def hf_generate_step(model, tokenizer, batch: list[GenerationRequest]) -> Callable[[], int]:
    width = max(len(r.prompt_ids) for r in batch)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + list(r.prompt_ids) for r in batch])
    mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch])

    @torch.no_grad()
    def step() -> int:
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=NEW_TOKENS, pad_token_id=pad,
        )  # fmt: skip
        return int((out[:, width:] != pad).sum())

    return step


def step_inputs(scale: str, work: Path):
    """The scale's setting (its models built once in `work`), tokenizer, one step's requests and sampling."""
    from transformers import AutoTokenizer

    setting = speed_setting(work, 1, scale)
    tokenizer = AutoTokenizer.from_pretrained(setting.student)
    prompts = [json.loads(line)["prompt"] for line in Path(setting.train).read_text().splitlines()]
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=NEW_TOKENS, logprobs=False)
    return setting, tokenizer, requests(prompts, tokenizer), sampling


def alternate_threads(scale: str, work: Path, pairs: int) -> dict[str, dict]:
    """The batched engine's decode on every thread and on one (`decode_threads`), step by step in turn after a
    warm-up pair, so that a drift of the host falls on both."""
    setting, _, batch, sampling = step_inputs(scale, work)
    engine = TransformersRolloutEngine(setting.student, dtype=torch.float32)
    names = {None: "transformers (batched)", 1: "transformers (batched), decode on one thread"}
    times: dict[int | None, list[float]] = {None: [], 1: []}
    for i in range(2 * (pairs + 1)):
        engine.decode_threads = None if i % 2 == 0 else 1
        started = time.perf_counter()
        engine_step(engine, batch, sampling)()
        if i >= 2:
            times[engine.decode_threads].append(time.perf_counter() - started)
    results = {names[k]: {"median_s": statistics.median(v), "steps_s": v} for k, v in times.items()}
    for name, result in results.items():
        print(f"  {scale:<6} {name:<32} {result['median_s']:8.3f} s  (alternating)", flush=True)
    return results


def bench_scale(scale: str, work: Path, repeats: int, *, vllm: bool) -> dict[str, dict]:
    """The scale's rows: vLLM's alone (`vllm`), else every other engine's."""
    from transformers import AutoModelForCausalLM

    setting, tokenizer, batch, sampling = step_inputs(scale, work)
    results: dict[str, dict] = {}

    def record(name: str, step: Callable[[], int]) -> None:
        times, tokens = time_steps(step, repeats)
        results[name] = {"median_s": statistics.median(times), "steps_s": times, "tokens": tokens}
        print(f"  {scale:<6} {name:<32} {statistics.median(times):8.3f} s  ({tokens} tokens)", flush=True)

    if vllm:
        engine = build_engine(
            "vllm",
            setting.student,
            dtype=torch.float32,
            max_model_len=MAX_MODEL_LEN,
            enforce_eager=setting.enforce_eager,
        )
        record("vllm", engine_step(engine, batch, sampling))
        del engine
        gc.collect()
        return results
    batched = TransformersRolloutEngine(setting.student, dtype=torch.float32)
    record("transformers (batched)", engine_step(batched, batch, sampling))
    batched.decode_threads = 1
    record("transformers (batched), decode on one thread", engine_step(batched, batch, sampling))
    alone = TransformersRolloutEngine(setting.student, dtype=torch.float32, batch_rows=1)
    record("transformers, one at a time (old)", engine_step(alone, batch, sampling))
    model = AutoModelForCausalLM.from_pretrained(setting.student, dtype=torch.float32).eval()
    record("HF generate (TRL's path)", hf_generate_step(model, tokenizer, batch))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", nargs="*", default=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--neighbour", type=float, nargs=2, metavar=("BUSY_MS", "IDLE_MS"))
    parser.add_argument(
        "--alternate", type=int, metavar="PAIRS",
        help="only the batched engine's decode on every thread and on one, step by step in turn, PAIRS pairs",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rollout_engines")
    args = parser.parse_args()
    neighbour = (
        subprocess.Popen([sys.executable, "-c", NEIGHBOUR, *map(str, args.neighbour)])
        if args.neighbour
        else None
    )
    try:
        with tempfile.TemporaryDirectory() as work:
            # vLLM's rows last: its CPU worker binds this process's threads and makes torch.set_num_threads a
            # no-op from then on (before 2026-12-04 it ran first, and the one-thread row ran on every thread)
            if args.alternate:
                results = {
                    scale: alternate_threads(scale, Path(work), args.alternate) for scale in args.scales
                }
            else:
                results = {
                    scale: bench_scale(scale, Path(work), args.repeats, vllm=False) for scale in args.scales
                }
                for scale in args.scales:
                    results[scale].update(bench_scale(scale, Path(work), args.repeats, vllm=True))
    finally:
        if neighbour is not None:
            neighbour.kill()
    names = list(next(iter(results.values())))
    print(f"\n{'engine':<34}" + "".join(f"{scale + ' s/step':>14}" for scale in results))
    for name in names:
        print(f"{name:<34}" + "".join(f"{results[scale][name]['median_s']:>14.3f}" for scale in results))
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "date": datetime.date.today().isoformat(),
        "torch_threads": torch.get_num_threads(),
        "shape": {"prompts": PROMPTS, "new_tokens": NEW_TOKENS, "temperature": 1.0},
        "neighbour_busy_idle_ms": args.neighbour,
        "alternate_pairs": args.alternate,
        "results": results,
    }
    suffix = f"-neighbour-{args.neighbour[0]:g}-{args.neighbour[1]:g}" if args.neighbour else ""
    suffix = (f"-alternate-{'-'.join(args.scales)}" if args.alternate else "") + suffix
    path = args.out / f"{record['date']}{suffix}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    print(json.dumps({"bench": "rollout_engines", "path": str(path), **record}))


if __name__ == "__main__":
    raise SystemExit(json_main("rollout_engines", main))
