"""What a worked-sum run's student gets wrong, step by step: read from the run's own held-out samples.

The worked-sum response is a one-go guess, `|`, then per digit the two operands' digits, the sum's digit and
the carry mark (runtime/distillery_runtime/tasks/problems/worked_sum.py); only the working is graded. A
wrong working can come from four places, and each has its own column here, per evaluated step:

- `guess`: the guess's digits that are right (the student never learns the one-go guess: ~10%, chance);
- `copies guess`: of the working's sum digits under a wrong guess digit, the share that repeat the guess
  (the stalled SFT student's habit: ~100% at step 0);
- `x copied`, `y copied`: per digit position, the working's operand digits equal to the prompt's;
- `sum from own digits`: the working's sum digits equal to (its own x + its own y + its own previous carry
  mark) mod 10, i.e. the column arithmetic done right on whatever it wrote.

Issue 62 read it off: at lr 1e-3 the arithmetic is right within 50 steps (`sum from own digits` 1.0) and
the copying of the guess gone, but `y copied` falls to ~0.5 at the last two positions and the accuracy sits
at ~20% until those copies come back, at a step that differs with the seed and the CPU's kernels.

    python bench/worked_sum_diagnosis.py RUN_DIR [--json]

RUN_DIR is a `distillery run -o` folder (its samples.jsonl); the last line is JSON with every row.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import json_main  # bench/, the script's own folder
from distillery_runtime.tasks.problems.worked_sum import CARRY, GUESS_END

DIGITS = 5


def step_diagnosis(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The columns above for one step's held-out samples (`prompt`, `response`, `reference`, `grade`)."""
    guess_right = copies = wrong_guess = own_right = own_total = 0
    x_copied, y_copied = [0] * DIGITS, [0] * DIGITS
    whole = 0
    for sample in samples:
        x, y = sample["prompt"].rstrip("=").split("+")
        guess, _, working = sample["response"].partition(GUESS_END)
        groups = [working[4 * i : 4 * i + 4] for i in range(DIGITS)]
        if any(len(g) < 4 or not g[:3].isdigit() for g in groups):
            continue  # not a whole working: graded wrong, and no column to read
        whole += 1
        carry = 0
        for i, group in enumerate(groups):
            reference = sample["reference"][i]
            guessed = guess[i] if i < len(guess) else None
            guess_right += guessed == reference
            if guessed != reference:
                wrong_guess += 1
                copies += group[2] == guessed
            x_copied[i] += group[0] == x[i]
            y_copied[i] += group[1] == y[i]
            own_total += 1
            own_right += group[2] == str((int(group[0]) + int(group[1]) + carry) % 10)
            carry = int(group[3] == CARRY)
    n = max(whole, 1)
    return {
        "accuracy": sum(s["grade"] for s in samples) / len(samples),
        "whole_workings": whole / len(samples),
        "guess": guess_right / max(whole * DIGITS, 1),
        "copies_guess": copies / max(wrong_guess, 1),
        "x_copied": [round(v / n, 3) for v in x_copied],
        "y_copied": [round(v / n, 3) for v in y_copied],
        "sum_from_own_digits": own_right / max(own_total, 1),
    }


def diagnose(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Every evaluated step's diagnosis, from the run's samples.jsonl (its `eval-*` rows)."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        if str(sample["id"]).startswith("eval"):
            by_step[sample["step"]].append(sample)
    return {step: step_diagnosis(rows) for step, rows in sorted(by_step.items())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    rows = diagnose(args.run_dir)
    print(
        f"{'step':>4} {'acc':>6} {'guess':>6} {'copies guess':>12} {'sum from own digits':>19}  y copied by position"
    )
    for step, r in rows.items():
        print(f"{step:>4} {r['accuracy']:>6.3f} {r['guess']:>6.3f} {r['copies_guess']:>12.3f} "
              f"{r['sum_from_own_digits']:>19.3f}  {r['y_copied']}")  # fmt: skip
    print(json.dumps({"bench": "worked_sum_diagnosis", "run": str(args.run_dir), "steps": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(json_main("worked_sum_diagnosis", main))
