"""The trainer's step with eager attention against the model's own (sdpa), over micro-batch widths.

The student is the e2e bench's small one (`bench/e2e_vs_trl.py`, a random Llama of 11.5M parameters, hidden
512, 4 layers, 8 heads, a 1,031-token vocabulary), the loss its reverse KL over a teacher top-16. Each width
W gets one micro-batch of about `TOKENS` tokens: max(1, TOKENS // W) rows, half of them W tokens long and the
others shorter (right-padded to W, as the trainer collates them), responses filling all but a 24-token prompt.
Both kernels run the same `Trainer.train_step` on the same samples, switched by the plan's setting
(`TrainerSettings.eager_attention_width`: 0 is the model's own kernel everywhere, a huge width eager
everywhere), in float32 and in bfloat16 autocast. Seconds per step: median of `--repeats` after two warm-up
steps. Prints a table and writes JSON (bench/results/trainer_attention/DATE.json). `plan/attention.py`'s
crossover is read from it.

    python bench/trainer_attention.py [--widths 64 96 128 ... 1024] [--repeats 4]
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
from distillery_runtime.data.samples import TrainSample
from distillery_runtime.training.trainer import Trainer, step_normalizer

from distillery.api.spec import LossMode, Precision
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import json_main  # bench/, the script's own folder
from e2e_vs_trl import speed_setting

TOKENS, PROMPT, TOP_K, VOCAB = 5000, 24, 16, 1031
ALWAYS_EAGER = 1 << 30


def samples(width: int, seed: int = 0) -> list[TrainSample]:
    rng = np.random.default_rng(seed)
    rows = max(1, TOKENS // width)
    out = []
    for row in range(rows):
        length = width if row % 2 == 0 else int(rng.integers(width // 2, width + 1))
        prompt = min(PROMPT, length // 2)
        out.append(random_sample(rng, prompt, length - prompt))
    return out


def random_sample(rng: np.random.Generator, prompt: int, response: int) -> TrainSample:
    """A sample of random tokens, `prompt` + `response` long, with a teacher top-K of sorted random log-probs."""
    logprobs = np.sort(rng.standard_normal((response, TOP_K)).astype(np.float32) - 3.0, axis=-1)[:, ::-1]
    return TrainSample(
        prompt_ids=rng.integers(0, VOCAB, size=prompt).tolist(),
        response_ids=rng.integers(0, VOCAB, size=response).tolist(),
        old_logprobs=None,
        topk_ids=rng.integers(0, VOCAB, size=(response, TOP_K)).astype(np.int32),
        topk_logprobs=np.ascontiguousarray(logprobs),
        token_logprobs=logprobs[:, 0].copy(),
        teacher_mask=np.ones(response, bool),
    )


def time_steps(
    student: str, precision: Precision, eager_width: int, batch: list[TrainSample], repeats: int
) -> float:
    settings = TrainerSettings(
        lr=1e-4,
        micro_batch_size=len(batch),
        precision=precision,
        total_steps=repeats + 2,
        loss=LossConfig(mode=LossMode.REVERSE_KL_TOPK),
        eager_attention_width=eager_width,
    )
    trainer = Trainer(student, settings, device="cpu")
    normalizer = step_normalizer(batch, settings.loss)
    for _ in range(2):  # warm-up: allocator, threads, oneDNN's kernels for these shapes
        trainer.train_step(batch, normalizer)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        trainer.train_step(batch, normalizer)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="*", default=[64, 96, 128, 160, 192, 224, 256, 512, 1024])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument(
        "--models", type=Path, default=Path("runs/bench-e2e"), help="where the e2e bench's models are"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trainer_attention")
    args = parser.parse_args()
    student = speed_setting(args.models, 1, "small").student
    rows = []
    print(f"{'precision':<10} {'width':>6} {'rows':>5} {'sdpa s':>8} {'eager s':>8} {'eager/sdpa':>10}")
    for precision in (Precision.BFLOAT16, Precision.FLOAT32):
        for width in args.widths:
            batch = samples(width)
            own = time_steps(student, precision, 0, batch, args.repeats)
            eager = time_steps(student, precision, ALWAYS_EAGER, batch, args.repeats)
            rows.append(
                {
                    "precision": str(precision),
                    "width": width,
                    "rows": len(batch),
                    "sdpa_s": own,
                    "eager_s": eager,
                }
            )
            print(
                f"{precision!s:<10} {width:>6} {len(batch):>5} {own:>8.3f} {eager:>8.3f} {eager / own:>10.2f}"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "date": datetime.date.today().isoformat(),
        "torch_threads": torch.get_num_threads(),
        "shape": {"tokens_per_micro_batch": TOKENS, "prompt": PROMPT, "top_k": TOP_K, "vocab": VOCAB},
        "results": rows,
    }
    path = args.out / f"{record['date']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    print(json.dumps({"bench": "trainer_attention", "path": str(path), **record}))


if __name__ == "__main__":
    raise SystemExit(json_main("trainer_attention", main))
