"""What the loop needs from a task: how a response is graded against its row's reference answer.

The grader is a field of the task, so the loop grades (task reward, eval accuracy) with whatever its job's
task carries and never imports a particular task. A job on its own data has the API's rule: exact match
on `data.answerField` (`ANSWER_MATCH`).
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
