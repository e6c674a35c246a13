"""What the loop needs from a task: how a response is graded against its row's reference answer.

The grader is a field of the task, so a job on a bundled task's data grades (task reward, eval accuracy)
with whatever its task carries (`data.grader: auto`) and the loop never imports a particular task. A job
on its own data grades with the grader `data.grader` names (graders.py); `ANSWER_MATCH` is what `auto`
means there: exact match on `data.answerField`. The two graders a bundled task grades with too (`exact_match`,
`gsm8k`: the chat-math task's) live here, below every task and graders.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal


def exact_match(response_text: str, answer: str) -> bool:
    """Exact match after stripping surrounding whitespace."""
    return response_text.strip() == answer.strip()


NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
"""A number as GSM8K writes one: an optional minus, digits (grouped by commas or not: 1,234 or 1234), an
optional decimal part. A sentence's full stop after it is not a decimal point (`is 72.`)."""
FINAL_MARK = "####"
"""GSM8K's marker of the final answer (`... so she has 72 left.\\n#### 72`)."""


def final_number(text: str) -> Decimal | None:
    """The number after the last `####` of `text`, else its last number; None when there is none (or the
    `####` has no number after it: the text marked an answer, and that answer is not a number)."""
    _before, mark, after = text.rpartition(FINAL_MARK)
    if mark:
        found = NUMBER.search(after)
        return Decimal(found.group().replace(",", "")) if found else None
    numbers = NUMBER.findall(text)
    return Decimal(numbers[-1].replace(",", "")) if numbers else None


def gsm8k(response: str, reference: str) -> bool:
    """The response's final number (`final_number`) equals the reference's, compared as numbers (Decimal,
    so 72, 72.0 and 72.00 are equal and no float rounding makes 0.1 + 0.2 anything but 0.3)."""
    got, want = final_number(response), final_number(reference)
    return got is not None and want is not None and got == want


@dataclass(frozen=True)
class Task:
    name: str
    grade: Callable[[str, str], bool]
    """(response text, reference answer) -> whether the response is correct."""


ANSWER_MATCH = Task(name="answer-match", grade=exact_match)
"""The task of a job on its own data: `data.answerField`, matched exactly."""
