"""The synthetic Fibonacci task: a long, stepwise generation graded on its final answer. Pure, no I/O.

A problem is two W-digit seeds a, b and a line count m. The response writes out the recurrence
(x, y) -> (y, x + y mod 10^W) for m lines, each addition column by column with its carry, and only the
sum on the last line is graded. With W=3, a=123, b=459, m=2:

    prompt    "2:639_325_314_;"                   the seed line: 336 + 123 = 459
    response  "1:392^258_145_;0:921^584^450^"     123 + 459 = 582; 459 + 582 = 041 (mod 1000)
    answer    "140"                               the last sum, little-endian

A line is `k:` (k counting down in hex to 0, so the model knows when to stop without counting), then
one group per digit, least significant first: x's digit, y's digit, their sum's digit and the carry out
(`^` carried, `_` not), then `;`. The prompt is a line like any other, whose x is b - a, so that its y
and sum are the seeds. Every token is a fixed function of tokens at fixed distances behind it, the same
in every line: x and y copy the line above's y and sum; a sum digit adds the two digits just written and
the carry that ends the group before; a carry is the same three; a label is the one above minus one.

Why this layout: a chain of the addition task's lines (`addition.py`, the carry implicit, the operands
not written next to each other) was tried first and never learned its carried digits (a tiny model sat
at chance on them for 1,200 steps). Written out this way a 0.13M-parameter model learns the task in a
few hundred SFT steps. One wrong digit or carry changes every later line, so one wrong step spoils the
graded answer: the regime where a student's own early mistakes put it in states the teacher's answers
never show.

A line is 4W + 3 tokens (15 for W=3), so 5-9 lines give 74-134 response tokens plus EOS. The held-out
split is a deterministic function of (m, a, b), as in the addition task.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from distillery_runtime.tasks.base import Task
from distillery_runtime.tasks.problems.addition import little_endian

LABELS = "0123456789abcdef"
"""Line labels, one token each: the countdown reaches 15 at most (m + 1 for the first seed line)."""
CARRY, NO_CARRY = "^", "_"
LINE_END = ";"
ALPHABET = LABELS + ":" + CARRY + NO_CARRY + LINE_END
DATA_SOURCE = "fibonacci"


def response_tokens(lines: int, digits: int) -> int:
    """Characters (= tokens) of a response of `lines` lines: `k:`, four per digit, `;` but the last."""
    return lines * (4 * digits + 3) - 1


def add_with_carries(x: int, y: int, digits: int) -> tuple[int, list[bool]]:
    """(x + y) mod 10^digits and the carry out of each digit, least significant first."""
    carries, carry = [], 0
    for i in range(digits):
        column = (x // 10**i) % 10 + (y // 10**i) % 10 + carry
        carry = column // 10
        carries.append(bool(carry))
    return (x + y) % 10**digits, carries


def line(label: int, x: int, y: int, digits: int) -> str:
    """One line: `k:`, then per digit (little-endian) x's, y's, (x + y)'s and the carry-out mark, then `;`."""
    z, carries = add_with_carries(x, y, digits)
    columns = zip(
        little_endian(x, digits),
        little_endian(y, digits),
        little_endian(z, digits),
        (CARRY if c else NO_CARRY for c in carries),
        strict=True,
    )
    return f"{LABELS[label]}:{''.join(''.join(column) for column in columns)}{LINE_END}"


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    m: int
    """Lines the response writes; they are labelled m-1 down to 0."""

    digits: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.m <= len(LABELS) - 1:
            raise ValueError(f"m={self.m}: a problem writes 1..{len(LABELS) - 1} lines")

    def lines(self) -> list[str]:
        """The m + 1 lines: the seed line (b - a, a -> b), then each computed line."""
        mod = 10**self.digits
        out = [line(self.m, (self.b - self.a) % mod, self.a, self.digits)]
        x, y = self.a, self.b
        for label in range(self.m - 1, -1, -1):
            out.append(line(label, x, y, self.digits))
            x, y = y, (x + y) % mod
        return out

    def final(self) -> int:
        """The last line's sum."""
        x, y = self.a, self.b
        for _ in range(self.m):
            x, y = y, (x + y) % 10**self.digits
        return y

    @property
    def prompt(self) -> str:
        return self.lines()[0]

    @property
    def response(self) -> str:
        """The computed lines; the last one has no `;`, EOS ends it."""
        return "".join(self.lines()[1:]).removesuffix(LINE_END)

    @property
    def answer(self) -> str:
        """The graded final answer: the last line's sum, little-endian."""
        return little_endian(self.final(), self.digits)

    def row(self) -> dict[str, str]:
        """A dataset row: `answer` is the graded final number, `response` the full trace SFT learns."""
        return {
            "prompt": self.prompt,
            "answer": self.answer,
            "response": self.response,
            "data_source": DATA_SOURCE,
        }


def is_held_out(problem: Problem, eval_fraction: float = 0.05) -> bool:
    """Whether a problem belongs to the held-out split (a stable hash of m and the seeds)."""
    digest = hashlib.blake2b(f"{problem.m},{problem.a},{problem.b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < eval_fraction


def random_problem(rng: random.Random, *, digits: int, min_lines: int, max_lines: int) -> Problem:
    hi = 10**digits
    return Problem(rng.randrange(hi), rng.randrange(hi), rng.randint(min_lines, max_lines), digits)


def sample_problems(
    n: int, *, digits: int, min_lines: int, max_lines: int, seed: int, held_out: bool
) -> list[Problem]:
    """`n` distinct problems from one split, reproducible from `seed`."""
    rng = random.Random(seed)
    space = 10 ** (2 * digits) * (max_lines - min_lines + 1)
    if held_out and n > space * 0.05 * 0.5:
        raise ValueError(f"asked for {n} held-out problems; the held-out split is too small")
    seen: set[Problem] = set()
    out: list[Problem] = []
    while len(out) < n:
        p = random_problem(rng, digits=digits, min_lines=min_lines, max_lines=max_lines)
        if p in seen or is_held_out(p) != held_out:
            continue
        seen.add(p)
        out.append(p)
    return out


def final_answer(response_text: str) -> str | None:
    """The number on a trace's last line when that line is labelled 0 (the digits, carry marks dropped);
    None when the trace stops early or runs on, whatever number it ends with."""
    last = response_text.strip().removesuffix(LINE_END).rpartition(LINE_END)[2]
    label, colon, body = last.partition(":")
    if label != LABELS[0] or not colon:
        return None
    return body[2::4]


def grade(response_text: str, answer: str) -> bool:
    """Exact match of the trace's final number with the reference answer."""
    return final_answer(response_text) == answer.strip()


TASK = Task(name=DATA_SOURCE, grade=grade)
"""Graded on the final number of the trace (`grade`)."""
