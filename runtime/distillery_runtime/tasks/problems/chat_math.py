"""The synthetic chat-math task: GSM8K-style word problems as chat rows, graded like GSM8K. Pure, no I/O.

A problem is a short word problem with one or two small-number operations, drawn from a few templates:

    user       "Mia has 7 shells and buys 5 more. Then Mia gives away 4. How many shells are left?"
    assistant  "7 + 5 = 12\\n12 - 4 = 8\\n#### 8"

A row is a `messages` list, the user's question then the assistant's answer, whose last line is GSM8K's
`#### N`; a job reads it with `data.messagesField: messages` and grades with `data.grader: {name: gsm8k}`
(the row has no `answer` field: the last assistant turn is the reference, its number after `####` the
answer). The models are Qwen-like (`qwen.py`: Qwen's real BPE, Qwen2.5's ChatML template), so the prompt
is the conversation before the answer rendered with that template and its assistant header.

The operands are single digits, so the arithmetic is a small table a tiny model memorises; what it must
learn is to read the numbers out of the sentence, pick the operation from the verb and write the answer
in the format. The held-out split is a deterministic function of the whole problem (template, name, item,
numbers), so evaluation asks questions never trained on, built from the same facts and words.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from distillery_runtime.tasks.base import Task, gsm8k

DATA_SOURCE = "chat-math"
NAMES = ("Ann", "Ben", "Mia", "Sam", "Lea", "Tom")
ITEMS = ("apples", "pens", "cards", "books", "shells", "stamps")
KINDS = ("add", "sub", "add_sub")
QUESTIONS = {
    "add": "{name} has {a} {item} and buys {b} more. How many {item} does {name} have?",
    "sub": "{name} has {a} {item} and gives away {b}. How many {item} are left?",
    "add_sub": "{name} has {a} {item} and buys {b} more. Then {name} gives away {c}. How many {item} are left?",
}


@dataclass(frozen=True)
class Problem:
    kind: str
    name: str
    item: str
    a: int
    b: int
    c: int = 0
    """add_sub only: what is given away after the purchase."""

    @property
    def question(self) -> str:
        return QUESTIONS[self.kind].format(name=self.name, item=self.item, a=self.a, b=self.b, c=self.c)

    @property
    def answer(self) -> int:
        if self.kind == "add":
            return self.a + self.b
        if self.kind == "sub":
            return self.a - self.b
        return self.a + self.b - self.c

    @property
    def response(self) -> str:
        """One line per operation, then GSM8K's final line."""
        if self.kind == "add":
            lines = [f"{self.a} + {self.b} = {self.answer}"]
        elif self.kind == "sub":
            lines = [f"{self.a} - {self.b} = {self.answer}"]
        else:
            total = self.a + self.b
            lines = [f"{self.a} + {self.b} = {total}", f"{total} - {self.c} = {self.answer}"]
        return "\n".join([*lines, f"#### {self.answer}"])

    def row(self) -> dict[str, object]:
        """A dataset row: the conversation `data.messagesField` names, and the route."""
        return {
            "messages": [
                {"role": "user", "content": self.question},
                {"role": "assistant", "content": self.response},
            ],
            "data_source": DATA_SOURCE,
        }


def random_problem(rng: random.Random) -> Problem:
    """A problem of a random kind; nothing is given away that is not there, so answers are >= 0."""
    kind, name, item = rng.choice(KINDS), rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if kind == "sub":
        a, b = max(a, b), min(a, b)
    c = rng.randint(1, min(9, a + b)) if kind == "add_sub" else 0
    return Problem(kind, name, item, a, b, c)


def is_held_out(problem: Problem, eval_fraction: float = 0.1) -> bool:
    """Whether a problem belongs to the held-out split (a stable hash of all its parts)."""
    key = f"{problem.kind},{problem.name},{problem.item},{problem.a},{problem.b},{problem.c}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < eval_fraction


def sample_problems(n: int, *, seed: int, held_out: bool) -> list[Problem]:
    """`n` distinct problems from one split, reproducible from `seed`."""
    rng = random.Random(seed)
    seen: set[Problem] = set()
    out: list[Problem] = []
    for _ in range(200 * n):
        p = random_problem(rng)
        if p in seen or is_held_out(p) != held_out:
            continue
        seen.add(p)
        out.append(p)
        if len(out) == n:
            return out
    raise ValueError(
        f"asked for {n} {'held-out' if held_out else 'training'} problems; the split is too small"
    )


TASK = Task(name=DATA_SOURCE, grade=gsm8k)
"""Graded as GSM8K is: the number after `####` (else the last number) equals the reference's."""
