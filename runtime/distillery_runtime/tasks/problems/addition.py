"""The synthetic addition task: problems, their reference answers, and grading (`TASK`). Pure, no I/O.

Every number is written least-significant digit first and zero-padded to a fixed width: the problem
a=123, b=459 (sum 582) is the prompt `"321+954="` and the answer `"2850"`. This "little-endian" format
is the one of Lee et al. 2023 ("Teaching Arithmetic to Small Transformers"), taken one step further:
with reversed output each answer digit depends only on digits (and a carry) the model has already
seen, and with reversed, fixed-width operands the two digits it needs sit at the same relative
distance for every answer position, which rotary attention learns almost at once. Measured here: a
0.5M-parameter Llama reaches ~99% held-out accuracy in under 1,000 SFT steps; in normal order (or
with only the answer reversed) the same model sat on a loss plateau for 1,000+ steps.

The held-out split is a deterministic function of (a, b), so no training problem ever appears in
evaluation.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from distillery_runtime.tasks.base import Task, exact_match

ALPHABET = "0123456789+="
DATA_SOURCE = "addition"


def little_endian(value: int, width: int) -> str:
    """`value` zero-padded to `width` digits, least-significant digit first (582, 4 -> "2850")."""
    return f"{value:0{width}d}"[::-1]


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    digits: int = 3

    @property
    def prompt(self) -> str:
        return f"{little_endian(self.a, self.digits)}+{little_endian(self.b, self.digits)}="

    @property
    def answer(self) -> str:
        return little_endian(self.a + self.b, self.digits + 1)

    def row(self) -> dict[str, str]:
        """A dataset row: the fields `data.promptField`, `answerField`, `responseField`, `routeField` name."""
        return {
            "prompt": self.prompt,
            "answer": self.answer,
            "response": self.answer,
            "data_source": DATA_SOURCE,
        }


def is_held_out(problem: Problem, eval_fraction: float = 0.05) -> bool:
    """Whether a problem belongs to the held-out split (a stable hash of the operands)."""
    digest = hashlib.blake2b(f"{problem.a},{problem.b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < eval_fraction


def sample_problems(n: int, *, digits: int, seed: int, held_out: bool) -> list[Problem]:
    """`n` distinct problems from one split, reproducible from `seed`."""
    rng = random.Random(seed)
    hi = 10**digits
    if held_out and n > hi * hi * 0.05 * 0.5:
        raise ValueError(f"asked for {n} held-out problems; the {digits}-digit held-out split is too small")
    seen: set[Problem] = set()
    out: list[Problem] = []
    while len(out) < n:
        p = Problem(rng.randrange(hi), rng.randrange(hi), digits)
        if p in seen or is_held_out(p) != held_out:
            continue
        seen.add(p)
        out.append(p)
    return out


TASK = Task(name="addition", grade=exact_match)
"""The answer is a fixed-width number: exact match after stripping surrounding whitespace."""
