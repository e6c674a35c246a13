"""Which grader a job's responses are graded by: `data.grader` with `auto` decided, once.

The runtime grades with it twice (held-out accuracy and, with loss.taskRewardCoef > 0, the task reward) and
reads the choice from here rather than from the spec, so that both agree and the report can name it.
`auto` is the bundled task's own grader for `synthetic://TASK/...` training data (the task knows how its
answers are written) and an exact match for any other data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from distillery.api.spec import Data, GraderName

SYNTHETIC_SCHEME = "synthetic://"
"""The scheme of the bundled tasks' artefacts (`synthetic://TASK/ARTEFACT`; the runtime resolves them)."""


class GraderKind(StrEnum):
    """A grader after `auto` is decided: the API's names less `auto`, plus a bundled task's own grader."""

    TASK = "task"
    EXACT = "exact"
    GSM8K = "gsm8k"
    MATH = "math"
    REGEX = "regex"
    MODULE = "module"


@dataclass(frozen=True)
class GraderPlan:
    kind: GraderKind
    task: str | None = None
    """TASK: the bundled task whose grader it is (`addition`, `fibonacci`)."""
    pattern: str | None = None
    """REGEX: the Python regular expression searched for in a response."""
    function: str | None = None
    """MODULE: `package.module:function`, imported in the runtime."""

    @property
    def name(self) -> str:
        """What the report, eval.jsonl and the logs call it: the task's name for TASK, else the kind."""
        return self.task if self.kind == GraderKind.TASK and self.task else self.kind.value


def synthetic_task(path: str) -> str | None:
    """The task of a `synthetic://TASK/...` location, None for any other."""
    if not path.startswith(SYNTHETIC_SCHEME):
        return None
    return path[len(SYNTHETIC_SCHEME) :].strip("/").partition("/")[0]


def resolve_grader(data: Data) -> GraderPlan:
    """The grader of a job with this `data` block."""
    grader = data.grader
    if grader.name == GraderName.AUTO:
        task = synthetic_task(data.train.path)
        return GraderPlan(GraderKind.TASK, task=task) if task else GraderPlan(GraderKind.EXACT)
    return GraderPlan(GraderKind(grader.name.value), pattern=grader.pattern, function=grader.function)


def pattern_refusal(grader: GraderPlan) -> str | None:
    """Why a regex grader's pattern cannot be used: Python's `re` cannot compile it. None when it can.

    Not a rule of the API: the API server's regular expressions are RE2 (no look-arounds or
    back-references, which Python's `re` has), so it cannot judge a Python pattern. `distillery validate`
    and the runtime, before its first step, refuse it instead."""
    if grader.kind != GraderKind.REGEX or grader.pattern is None:
        return None
    try:
        re.compile(grader.pattern)
    except re.error as error:
        return f"not a Python regular expression: {error}"
    return None
