"""A trainer step with logits only at the positions that predict a response token, against every position's.

The student is the chat-math example's shape (a Qwen2 of hidden 64 with Qwen's 151,936-row embedding tied
to the output), the batch its shape too: 32 samples of a 54-token chat prompt (system turn, question,
assistant header) and a 17-token answer. Both paths run the same `Trainer.train_step` on the same samples;
`Trainer.logits_to_keep` switches between them (the old path is every position's logits). Prints a table
and writes JSON (bench/results/trainer_logits/DATE.json).

    python bench/trainer_logits.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _common import json_main  # bench/, the script's own folder
from distillery_runtime.data.samples import TrainSample
from distillery_runtime.tasks.recipes.qwen import build_qwen_model
from distillery_runtime.training.trainer import Trainer, step_normalizer

from distillery.api.spec import LossMode, Precision
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings

VOCAB = 151_936
SAMPLES, PROMPT, RESPONSE, TOP_K = 32, 54, 17, 8


def samples(seed: int = 0) -> list[TrainSample]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(SAMPLES):
        # Prompts of the example's spread of lengths (48-54 tokens): padded rows, as the trainer sees them.
        prompt = rng.integers(0, 5000, size=PROMPT - int(rng.integers(0, 7))).tolist()
        response = rng.integers(0, 5000, size=RESPONSE).tolist()
        logprobs = np.sort(rng.standard_normal((RESPONSE, TOP_K)).astype(np.float32) - 3.0, axis=-1)[:, ::-1]
        out.append(
            TrainSample(
                prompt_ids=prompt,
                response_ids=response,
                old_logprobs=None,
                topk_ids=rng.integers(0, 5000, size=(RESPONSE, TOP_K)).astype(np.int32),
                topk_logprobs=np.ascontiguousarray(logprobs),
                token_logprobs=logprobs[:, 0].copy(),
                teacher_mask=np.ones(RESPONSE, bool),
            )
        )
    return out


def time_steps(keep: bool, batch: list[TrainSample], repeats: int) -> list[float]:
    settings = TrainerSettings(
        lr=1e-3,
        micro_batch_size=SAMPLES,
        precision=Precision.FLOAT32,
        total_steps=repeats + 1,
        loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK),
    )
    model = build_qwen_model(dtype=torch.float32, vocab_size=VOCAB)
    trainer = Trainer(None, settings, device="cpu", model=model)
    trainer.logits_to_keep = keep
    normalizer = step_normalizer(batch, settings.loss)
    trainer.train_step(batch, normalizer)  # warm-up: allocator, threads
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        trainer.train_step(batch, normalizer)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trainer_logits")
    args = parser.parse_args()
    batch = samples()
    results = {}
    for name, keep in (("every position (old)", False), ("response positions", True)):
        times = time_steps(keep, batch, args.repeats)
        results[name] = {"median_s": statistics.median(times), "steps_s": times}
    old, new = (results[k]["median_s"] for k in results)
    print(f"{'path':<24} {'median step (s)':>16}")
    for name, r in results.items():
        print(f"{name:<24} {r['median_s']:>16.3f}")
    print(
        f"speed-up: {old / new:.2f}x  ({SAMPLES} samples, prompt {PROMPT}, response {RESPONSE}, vocab {VOCAB})"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "date": datetime.date.today().isoformat(),
        "torch_threads": torch.get_num_threads(),
        "shape": {"samples": SAMPLES, "prompt": PROMPT, "response": RESPONSE, "vocab": VOCAB, "top_k": TOP_K},
        "results": results,
        "speedup": old / new,
    }
    path = args.out / f"{record['date']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    print(json.dumps({"bench": "trainer_logits", "path": str(path), **record}))


if __name__ == "__main__":
    raise SystemExit(json_main("trainer_logits", main))
