"""Padded forwards grouped by length (`plan/data/padding.py`): the trainer's step and the teacher's forward on one
step's samples, in the fewest forwards against the plan's cuts, alternating in one process.

The models are the e2e bench's (`bench/e2e_vs_trl.py`, `--scale small`: an 11.5M student, a 37M teacher, a
1,031-token vocabulary). A step's samples are like its small job's: 32 prompts drawn from its train set
(6-14 tokens), each response 128 tokens, or, for 12% of them (where the student sampled its end of text
early: 3,796 tokens a step of 4,096 in the e2e run), fewer, uniformly. Each batch is trained and scored both
ways (the first of the two alternating), so a slow spell of the host touches both alike; the first two
batches only warm up. Prints a table of medians and writes JSON (bench/results/length_groups/DATE.json).

    python bench/length_groups.py [--scale small] [--costs 64 128] [--batches 10]
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
from distillery_runtime.teachers.in_process.transformers_forward import TransformersTeacher, forward_groups
from distillery_runtime.teachers.types import ScoreRequest
from distillery_runtime.training.trainer import Trainer, micro_batches, sample_tokens, step_normalizer

from distillery.api.spec import LossMode, Precision, TeacherEngine
from distillery.plan.attention import CPU_BF16_EAGER_MAX_WIDTH
from distillery.plan.loss import LossConfig
from distillery.plan.teachers.engines import EngineSettings
from distillery.plan.training import TrainerSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import json_main  # bench/, the script's own folder
from e2e_vs_trl import speed_setting
from trainer_attention import TOP_K, VOCAB, random_sample

ROWS, RESPONSE, EARLY = 32, 128, 0.12
WARM_UP = 2


def step_samples(prompt_lengths: list[int], seed: int) -> list[TrainSample]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(ROWS):
        prompt = int(rng.choice(prompt_lengths))
        response = RESPONSE if rng.random() >= EARLY else int(rng.integers(1, RESPONSE))
        out.append(random_sample(rng, prompt, response))
    return out


def measure(setting, precision: Precision, cost: int, batches: int, prompt_lengths: list[int]) -> dict:
    """Seconds of the trainer's step and the teacher's forward, fewest forwards against the cut, medians."""
    dtype = torch.float32 if precision == Precision.FLOAT32 else torch.bfloat16
    trainers, teachers = {}, {}
    for name, forward_cost in (("fewest", None), ("cut", cost)):
        settings = TrainerSettings(
            lr=1e-4,
            micro_batch_size=ROWS,
            precision=precision,
            total_steps=batches + 1,
            loss=LossConfig(mode=LossMode.REVERSE_KL_TOPK),
            # The plan's kernel for a bfloat16 CPU student (`plan/attention.py`), as the e2e run trains.
            eager_attention_width=CPU_BF16_EAGER_MAX_WIDTH if precision == Precision.BFLOAT16 else 0,
            forward_cost_tokens=forward_cost,
        )
        trainers[name] = Trainer(setting.student, settings, device="cpu")
        engine = EngineSettings(
            "teacher", TOP_K, 4096, memory_fraction=0.5, tensor_parallel=1, dtype=str(precision),
            on_gpu=False, engine=TeacherEngine.TRANSFORMERS, forward_cost_tokens=forward_cost,
        )  # fmt: skip
        teachers[name] = TransformersTeacher(setting.teacher, engine, dtype=dtype, device=torch.device("cpu"))
    times: dict[str, list[float]] = {
        f"{part}_{name}": [] for part in ("train", "teacher") for name in trainers
    }
    forwards_cut: list[int] = []
    padding = {"real": 0, "fewest": 0, "cut": 0}
    for batch in range(batches + WARM_UP):
        samples = step_samples(prompt_lengths, seed=batch)
        normalizer = step_normalizer(samples, trainers["cut"].settings.loss)
        requests = [ScoreRequest(s.prompt_ids, s.response_ids) for s in samples]
        lengths = [sample_tokens(s) for s in samples]
        for name in ("fewest", "cut") if batch % 2 == 0 else ("cut", "fewest"):
            started = time.perf_counter()
            trainers[name].train_step(samples, normalizer)
            trained = time.perf_counter()
            teachers[name].rows(requests, TOP_K)
            if batch >= WARM_UP:
                times[f"train_{name}"].append(trained - started)
                times[f"teacher_{name}"].append(time.perf_counter() - trained)
        if batch >= WARM_UP:
            padding["real"] += sum(lengths)
            for name, forward_cost in (("fewest", None), ("cut", cost)):
                parts = micro_batches(samples, ROWS, None, forward_cost)
                if name == "cut":
                    forwards_cut.append(len(parts))
                padding[name] += sum(len(p) * max(map(sample_tokens, p)) for p in parts)
                # The teacher's forwards group the same samples the same way (its bounds are far away here).
                assert len(forward_groups(requests, VOCAB, forward_cost)) == len(parts)
    medians = {key: statistics.median(values) for key, values in times.items()}
    return {
        "precision": str(precision),
        "cost_tokens": cost,
        **{f"{key}_s": round(value, 4) for key, value in medians.items()},
        "forwards_cut_mean": statistics.mean(forwards_cut),
        "padding_fewest": round(1 - padding["real"] / padding["fewest"], 4),
        "padding_cut": round(1 - padding["real"] / padding["cut"], 4),
        "runs": {key: [round(v, 4) for v in values] for key, values in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="small")
    parser.add_argument("--costs", type=int, nargs="*", default=[64])
    parser.add_argument("--precisions", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument(
        "--models", type=Path, default=Path("runs/bench-e2e"), help="where the e2e bench's models are"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "length_groups")
    args = parser.parse_args()
    setting = speed_setting(args.models, 1, args.scale)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(setting.student)
    prompts = [json.loads(line)["prompt"] for line in Path(setting.train).read_text().splitlines()]
    prompt_lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    rows = []
    header = (
        f"{'precision':<10} {'cost':>5} {'forwards':>8} {'padding':>13} {'train s':>15} {'ratio':>6} "
        f"{'teacher s':>15} {'ratio':>6}"
    )
    print(header)
    for precision in map(Precision, args.precisions):
        for cost in args.costs:
            row = measure(setting, precision, cost, args.batches, prompt_lengths)
            rows.append(row)
            print(
                f"{row['precision']:<10} {cost:>5} {row['forwards_cut_mean']:>8.1f} "
                f"{row['padding_fewest']:>6.1%}->{row['padding_cut']:>5.1%} "
                f"{row['train_fewest_s']:>6.3f}->{row['train_cut_s']:>6.3f} "
                f"{row['train_cut_s'] / row['train_fewest_s']:>6.2f} "
                f"{row['teacher_fewest_s']:>6.3f}->{row['teacher_cut_s']:>6.3f} "
                f"{row['teacher_cut_s'] / row['teacher_fewest_s']:>6.2f}"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "date": datetime.date.today().isoformat(),
        "scale": args.scale,
        "torch_threads": torch.get_num_threads(),
        "shape": {"rows": ROWS, "response": RESPONSE, "early": EARLY, "top_k": TOP_K, "vocab": VOCAB},
        "batches": args.batches,
        "results": rows,
    }
    path = args.out / f"{record['date']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    print(json.dumps({"bench": "length_groups", "path": str(path), **record}))


if __name__ == "__main__":
    raise SystemExit(json_main("length_groups", main))
