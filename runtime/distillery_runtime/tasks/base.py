"""What the loop needs from a task: how a response is graded against its row's reference answer.

The grader is a field of the task, so a job on a bundled task's data grades (task reward, eval accuracy)
with whatever its task carries (`data.grader: auto`) and the loop never imports a particular task. A job
on its own data grades with the grader `data.grader` names (graders.py); `ANSWER_MATCH` is what `auto`
means there: exact match on `data.answerField`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def exact_match(response_text: str, answer: str) -> bool:
    """Exact match after stripping surrounding whitespace."""
    return response_text.strip() == answer.strip()


@dataclass(frozen=True)
class Task:
    name: str
    grade: Callable[[str, str], bool]
    """(response text, reference answer) -> whether the response is correct."""


ANSWER_MATCH = Task(name="answer-match", grade=exact_match)
"""The task of a job on its own data: `data.answerField`, matched exactly."""
