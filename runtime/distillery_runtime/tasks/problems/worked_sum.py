"""The synthetic worked-sum task: an answer guessed in one go, then worked out; graded on the working. Pure.

A problem is two W-digit numbers, written least significant digit first as in the addition task. The
response first guesses the sum in one go (W + 1 digits, every carry implicit), then `|`, then works it
out column by column as the Fibonacci task writes a line: per digit x's digit, y's digit, their sum's
digit and the carry out (`^` carried, `_` not). Only the working is graded: its sum digits and, as the
last digit, its final carry. With W=5, a=12345, b=67890 (sum 80235):

    prompt    "54321+09876="
    response  "532080|505_493^382^270^168_"     the guess 80235, then 5+0=5, 4+9=13, 3+8+1=12, ...
    answer    "532080"                          the working's digits 5,3,2,0,8 and its last carry (none)

Which property it tests: errors that later tokens can repair, where only the student's own mistakes show
the repair. The teacher (hidden 128, two heads) is trained with half of its rows carrying a random wrong
guess in the prompt, so it works the sum out from the operands whatever was guessed; its own guesses are
mostly right (86-100% on its dev split, by kernel path; its working 100%), so few of its traces show a
repair. The student (hidden 64, one head) is trained by SFT on the reference traces (`Problem.response`: a
right guess, the working repeating it) to the end of a 1,000-step schedule. It has not learned the one-go guess of a
5-digit sum by then and its working copies its wrong guess (0% held out). On its own samples the guess is
wrong and the teacher's next tokens are the working done from the operands: on-policy data shows the
repair that the SFT data does not.

Measured (`bench/quality.py --protocol continue`, bench/README.md; the example's lr 3e-4 decayed to 3e-5
over 200 steps): from this student, 200 more steps of SFT on the teacher's traces stay at 0% on seeds 0-2
under the default and the AVX2 kernel paths; on-policy distillation over the teacher's top 16 reaches
99.8-100% with forward KL and 97.9-100% with reverse KL. At a constant 1e-3 the run was bistable: the
arithmetic is learned within 50 steps, but the same updates break the student's copy of y's last two
digits, and the run waits at ~20% for a random step to relearn them (issue 62;
`bench/worked_sum_diagnosis.py`). A teacher trained 1,000 steps instead never learned the
guess (0%), its traces showed the repair in nearly every row, and SFT on them reached 95%: the teacher's
guess is what the task's claim rests on, and the build trains its teacher in rounds of its schedule until
it guesses at least 80% of its dev split right (`grade_guess`), failing after `teacher_max_rounds`. Recipe
version 2 (issue 56) passes in its first round under AVX2 kernels (guess 86%) and in its second under
AVX-512's (100%): a kernel path trains its own teacher, and the figures above hold for both. The student is
not too small for the guess in principle: at 6 digits the same shape learned it from scratch at a constant
learning rate in 800 steps.

The held-out split is a deterministic function of (a, b), as in the addition task.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from distillery_runtime.tasks.base import Task
from distillery_runtime.tasks.problems import addition
from distillery_runtime.tasks.problems.addition import little_endian
from distillery_runtime.tasks.problems.fibonacci import CARRY, NO_CARRY, add_with_carries

GUESS_END = "|"
ALPHABET = "0123456789+=" + GUESS_END + CARRY + NO_CARRY
DATA_SOURCE = "worked-sum"


def working(a: int, b: int, digits: int) -> str:
    """The column-by-column sum: per digit (little-endian) a's, b's, the sum's and the carry mark."""
    z, carries = add_with_carries(a, b, digits)
    return "".join(
        f"{x}{y}{s}{CARRY if c else NO_CARRY}"
        for x, y, s, c in zip(
            little_endian(a, digits), little_endian(b, digits), little_endian(z, digits), carries, strict=True
        )
    )


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    digits: int = 5

    @property
    def _sum(self) -> addition.Problem:
        """The same sum as the addition task writes it: its prompt and answer are this task's."""
        return addition.Problem(self.a, self.b, self.digits)

    @property
    def prompt(self) -> str:
        return self._sum.prompt

    @property
    def answer(self) -> str:
        """The sum, W + 1 digits, little-endian: what a right guess and a right working both say."""
        return self._sum.answer

    def response(self, guess: str | None = None) -> str:
        """The guess (the right one unless given), `|`, the working."""
        return f"{self.answer if guess is None else guess}{GUESS_END}{working(self.a, self.b, self.digits)}"

    def row(self) -> dict[str, str]:
        """A dataset row: `answer` is the graded sum, `response` the full trace SFT learns."""
        return {
            "prompt": self.prompt,
            "answer": self.answer,
            "response": self.response(),
            "data_source": DATA_SOURCE,
        }


def wrong_guess(rng: random.Random, problem: Problem) -> str:
    """A random guess that is not the sum (W + 1 digits, little-endian): the teacher's repair rows."""
    while True:
        guess = little_endian(rng.randrange(2 * 10**problem.digits), problem.digits + 1)
        if guess != problem.answer:
            return guess


def is_held_out(problem: Problem, eval_fraction: float = 0.05) -> bool:
    """Whether a problem belongs to the held-out split (a stable hash of the operands)."""
    digest = hashlib.blake2b(f"ws{problem.a},{problem.b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < eval_fraction


def random_problem(rng: random.Random, digits: int) -> Problem:
    return Problem(rng.randrange(10**digits), rng.randrange(10**digits), digits)


def sample_problems(n: int, *, digits: int, seed: int, held_out: bool) -> list[Problem]:
    """`n` distinct problems from one split, reproducible from `seed`."""
    rng = random.Random(seed)
    seen: set[Problem] = set()
    out: list[Problem] = []
    while len(out) < n:
        p = random_problem(rng, digits)
        if p in seen or is_held_out(p) != held_out:
            continue
        seen.add(p)
        out.append(p)
    return out


def worked_answer(response_text: str) -> str | None:
    """The sum the working after the last `|` says (its sum digits, then its final carry as a digit); None
    when there is no working or it is not whole groups of digit, digit, digit, carry mark."""
    body = response_text.strip().rpartition(GUESS_END)[2] if GUESS_END in response_text else None
    if not body or len(body) % 4:
        return None
    groups = [body[i : i + 4] for i in range(0, len(body), 4)]
    if not all(g[:3].isdigit() and g[3] in (CARRY, NO_CARRY) for g in groups):
        return None
    return "".join(g[2] for g in groups) + ("1" if groups[-1][3] == CARRY else "0")


def grade(response_text: str, answer: str) -> bool:
    """The working's sum equals the reference; the guess is not graded."""
    return worked_answer(response_text) == answer.strip()


TASK = Task(name=DATA_SOURCE, grade=grade)
"""Graded on the working, never the guess (`grade`)."""


def guessed_answer(response_text: str) -> str | None:
    """The guess: what comes before the first `|`; None when there is no `|`."""
    guess, sep, _ = response_text.strip().partition(GUESS_END)
    return guess if sep else None


def grade_guess(response_text: str, answer: str) -> bool:
    """The one-go guess equals the reference: what the build checks of its teacher (`WorkedSumRecipe`)."""
    return guessed_answer(response_text) == answer.strip()


GUESS = Task(name=f"{DATA_SOURCE}-guess", grade=grade_guess)
"""Graded on the guess alone: the teacher's guess accuracy, which the task's claim rests on."""
