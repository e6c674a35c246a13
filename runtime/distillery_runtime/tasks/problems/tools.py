"""The synthetic tools task: a product the model cannot work out, asked of a calculator tool. Pure, no I/O.

A problem is two 4-digit numbers. The model cannot multiply; it calls the calculator, whose answer is
spliced into the episode, and copies the product. With a=1234, b=5678:

    prompt       "1234*5678="
    turn 1       "[1234*5678]"          the call: the turn ends at the stop string `]` (`TOOL_CALL_END`)
    observation  ">7006652;"            the calculator's answer (`observation`), context, never trained
    turn 2       "7006652"              the answer, then EOS
    answer       "7006652"              graded on the text after the last `;` (`grade`)

The calculator (`Calculator`, one per episode: the environment a job names by
`distillery_runtime.tasks.problems.tools:Calculator`) answers a well-formed call `[a*b]` (4 digits, `*`,
4 digits, nothing else) with `>{a*b};` and anything else that ends in `]` with `>E;`: a wrong character, a
missing operand, digits dropped or added, the `*` in the wrong place (`[93184*110]`). A turn that does not
end in `]` is the model's answer and ends the episode.

Which property it tests: a multi-turn episode whose observations are not the model's own tokens, and an
error the teacher repairs. The teacher (hidden 128) is trained on clean episodes and on episodes that open
with a malformed call (`malformed_call`), get `>E;` and then make the right call; the student (hidden 64)
only on clean episodes, stopped early, while it still writes malformed calls. After a `>E;`, which its SFT
data never showed it, the student writes junk; on its own episodes the teacher shows the repair.

Measured (`ToolsRecipe` version 1, one thread, 2:59 from empty on 2 idle cores): the teacher after 500 steps
plays 99.2% of the eval episodes right and repairs 94.1% of dev episodes forced to open with a malformed
call; the student stops at step 72 (dev 15.6%, eval 11.3%), 408 of its 454 wrong eval episodes made a
malformed call, and after `>E;` it repairs none. Why 4 digits exactly: with a calculator that took any
digits, most of the student's wrong calls had the `*` one place off (`[93184*110]`), which parsed (a wrong
product, no error): 173 of the same student's 454 wrong eval episodes made a malformed call. At a learning
rate of 3e-4 its errors were mostly wrong digits in well-formed calls.

The held-out split is a deterministic function of (a, b), as in the other tasks.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from distillery_runtime.tasks.base import Task

TOOL_CALL_START, TOOL_CALL_END = "[", "]"
"""A call is `[...]`; a turn ends at `]` (the stop string a rollout engine is given)."""
OBSERVATION_START, OBSERVATION_END = ">", ";"
ERROR = "E"
"""The calculator's answer to a malformed call: `>E;`."""
ALPHABET = "0123456789*=" + TOOL_CALL_START + TOOL_CALL_END + OBSERVATION_START + OBSERVATION_END + ERROR
DATA_SOURCE = "tools"
DIGITS = 4
WELL_FORMED = re.compile(rf"\[(\d{{{DIGITS}}})\*(\d{{{DIGITS}}})\]")
"""A call the calculator answers: `[`, 4 digits, `*`, 4 digits, `]` and nothing else (the calculator of
4-digit numbers: `[93184*110]`, the `*` one place late, is malformed)."""
ERROR_OBSERVATION = f"{OBSERVATION_START}{ERROR}{OBSERVATION_END}"


def observation(call: str) -> str:
    """The calculator's answer to a call (the whole turn, `[` to `]`): `>{a*b};` when it is well-formed, else
    `>E;`."""
    parsed = WELL_FORMED.fullmatch(call.strip())
    if parsed is None:
        return ERROR_OBSERVATION
    a, b = (int(operand) for operand in parsed.groups())
    return f"{OBSERVATION_START}{a * b}{OBSERVATION_END}"


class Calculator:
    """The environment of one episode: answers each turn that ends in a call, ends the episode at a turn
    that does not (the answer)."""

    def reset(self, prompt: str, answer: str | None) -> None:
        """A new episode; the calculator keeps no state, and never sees the reference answer."""

    def step(self, output: str) -> tuple[str, bool, bool]:
        """(observation, done, error) after the student's latest turn `output`: a turn that ends in `]` is a
        call, answered with `>{a*b};` (error False) or, malformed, `>E;` (error True), the episode going on;
        any other turn is the answer: ("", True, False)."""
        if not output.rstrip().endswith(TOOL_CALL_END):
            return "", True, False
        seen = observation(output)
        return seen, False, seen == ERROR_OBSERVATION


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @classmethod
    def of_prompt(cls, prompt: str) -> Problem:
        """The problem a prompt asks (`"1234*5678="`)."""
        a, _, b = prompt.removesuffix("=").partition("*")
        return cls(int(a), int(b))

    @property
    def prompt(self) -> str:
        return f"{self.a}*{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a * self.b)

    @property
    def call(self) -> str:
        """The right call: `[a*b]`."""
        return f"{TOOL_CALL_START}{self.a}*{self.b}{TOOL_CALL_END}"

    def segments(self, opening: str | None = None) -> list[tuple[str, bool]]:
        """The episode after the prompt as (text, written by the model) pieces: the right call, the
        calculator's answer, the product copied. With `opening` (a malformed call) the episode starts with
        it and its `>E;`, both context like every observation: what is learned is the repair after them."""
        clean = [(self.call, True), (observation(self.call), False), (self.answer, True)]
        if opening is None:
            return clean
        return [(opening, False), (observation(opening), False), *clean]

    @property
    def response(self) -> str:
        """The clean episode's text: call, observation, answer."""
        return "".join(text for text, _ in self.segments())

    def row(self) -> dict[str, str]:
        """A dataset row: `answer` is the graded product, `response` the clean episode."""
        return {
            "prompt": self.prompt,
            "answer": self.answer,
            "response": self.response,
            "data_source": DATA_SOURCE,
        }


def malformed_call(rng: random.Random, problem: Problem) -> str:
    """A call to `problem` spoiled so that the calculator cannot parse it (`>E;`): the `*` moved, dropped or
    changed, an operand missing, a character changed, added or dropped, the call cut short, run on or
    garbled. The teacher's repair rows open with one."""
    a, b = str(problem.a), str(problem.b)
    body, digits = f"{a}*{b}", a + b
    junk = "0123456789*=>;E"
    while True:
        i = rng.randrange(len(body) + 1)
        kind = rng.randrange(10)
        if kind == 0:
            spoiled = rng.choice([f"{a}*", f"*{b}", a, b, ""])  # an operand or both missing
        elif kind == 1:
            spoiled = a + rng.choice("=>;E*") + b  # the `*` changed or doubled
        elif kind == 2:
            spoiled = body[:i] + rng.choice(junk) + body[i:]  # a character added
        elif kind == 3:
            spoiled = body[:i] + body[i + 1 :]  # a character dropped
        elif kind == 4:
            spoiled = body[:i] + rng.choice(junk) + body[i + 1 :]  # a character changed
        elif kind == 5:
            spoiled = body[: rng.randrange(len(body))]  # cut short
        elif kind == 6:
            spoiled = body + rng.choice(["=", "*", f"*{b}", a, f"={a}"])  # run on past the operands
        elif kind == 7:
            j = rng.randrange(len(digits) + 1)
            spoiled = digits[:j] + "*" + digits[j:]  # the `*` in the wrong place
        elif kind == 8:
            spoiled = a + rng.choice([a[-1], b[0]]) + b  # the `*` written as a digit beside it
        else:
            spoiled = "".join(rng.choice(junk) for _ in range(rng.randrange(1, 12)))  # garbled
        call = f"{TOOL_CALL_START}{spoiled}{TOOL_CALL_END}"
        if observation(call) == ERROR_OBSERVATION:
            return call


def is_held_out(problem: Problem, eval_fraction: float = 0.05) -> bool:
    """Whether a problem belongs to the held-out split (a stable hash of the operands)."""
    digest = hashlib.blake2b(f"tools{problem.a},{problem.b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < eval_fraction


def random_problem(rng: random.Random) -> Problem:
    lo, hi = 10 ** (DIGITS - 1), 10**DIGITS
    return Problem(rng.randrange(lo, hi), rng.randrange(lo, hi))


def sample_problems(n: int, *, seed: int, held_out: bool) -> list[Problem]:
    """`n` distinct problems from one split, reproducible from `seed`."""
    rng = random.Random(seed)
    seen: set[Problem] = set()
    out: list[Problem] = []
    while len(out) < n:
        p = random_problem(rng)
        if p in seen or is_held_out(p) != held_out:
            continue
        seen.add(p)
        out.append(p)
    return out


def final_answer(response_text: str) -> str:
    """What an episode answers: the text after its last `;` (the end of the last observation), or the whole
    text when it has none (an answer given before any call)."""
    return response_text.rpartition(OBSERVATION_END)[2].strip()


def grade(response_text: str, answer: str) -> bool:
    """The episode's final answer (`final_answer`: student turns and observations together) equals the
    reference product."""
    return final_answer(response_text) == answer.strip()


TASK = Task(name=DATA_SOURCE, grade=grade)
"""Graded on the text after the last observation (`grade`)."""
