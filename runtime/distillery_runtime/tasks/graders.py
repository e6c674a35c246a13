"""The graders of `data.grader`: (response, reference answer) -> bool or a score in [0, 1].

The built-ins (`exact_match`, `gsm8k`, `math_equivalent`, `regex_grader`) are pure functions of two strings
(the first two, which bundled tasks grade with too, are `base.py`'s). `load_grader`
turns the job's resolved choice (`distillery.plan.grader`) into a `Grader`, the one object the loop grades
with, for held-out accuracy and for the task reward alike. A grader that cannot be used (a module that does
not import, a pattern Python cannot compile) is a `GraderError` naming its spec field, raised while the job
loads, before step 1.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from distillery.plan.grader import GraderKind, GraderPlan, pattern_refusal
from distillery_runtime.tasks.base import exact_match, gsm8k
from distillery_runtime.tasks.base import (
    final_number as final_number,  # the gsm8k grader's reading, re-exported
)
from distillery_runtime.tasks.uri import TASKS

Score = bool | float
GradeFn = Callable[[str, str], Score]
"""(response text, reference answer) -> whether the response is right, or how right in [0, 1]."""


class GraderError(ValueError):
    """A grader that cannot be used, or that returned something other than a score; the message is one
    line that names the spec field."""


# ---------------------------------------------------------------------------------------------- math

PARSE_TIMEOUT_S = 5
"""math-verify's own limit on parsing and on comparing one pair (sympy can take very long on odd input)."""


def math_equivalent(response: str, reference: str) -> bool:
    """The reference and the response's answer are mathematically equal, by Hugging Face's math-verify:
    the response's `\\boxed{}` answer (several: the set of them), else its last LaTeX or plain expression,
    is parsed with sympy and compared symbolically, so `\\boxed{\\frac{1}{2}}` matches 0.5 and `(x+1)^2`
    matches `x^2+2x+1`."""
    from math_verify import parse, verify  # sympy and antlr load only for jobs that grade with math

    # math-verify's timeouts are SIGALRM, which Python allows only in the main thread: elsewhere, none.
    timeout = PARSE_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = []
    if "$" not in reference and "\\boxed" not in reference:
        # A bare reference (`\frac12`, `x^2+1`) parses as LaTeX only between $ signs.
        gold = parse(f"${reference}$", parsing_timeout=timeout)
    if not gold:
        gold = parse(reference, parsing_timeout=timeout)
    answer = parse(response, parsing_timeout=timeout)
    return bool(gold and answer and verify(gold, answer, timeout_seconds=timeout))


# ---------------------------------------------------------------------------------------------- regex


def regex_grader(pattern: str) -> GradeFn:
    """A grader that searches the response for `pattern` (Python's re) and compares the first match's first
    group, or the whole match when the pattern has no group, with the reference, both stripped."""
    compiled = re.compile(pattern)

    def grade(response: str, reference: str) -> bool:
        found = compiled.search(response)
        if found is None:
            return False
        got = found.group(1) if compiled.groups else found.group(0)
        return got is not None and got.strip() == reference.strip()

    return grade


# ---------------------------------------------------------------------------------------------- module


def import_object(path: str, field: str, error: type[ValueError] = ValueError) -> object:
    """The object named by `package.module:attribute` (the attribute may be dotted); what cannot be
    imported is `error`, one line naming the spec `field` (a grader's function, an environment's class)."""
    module_name, _, attribute = path.partition(":")
    try:
        found: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except Exception as caught:  # ImportError, AttributeError, or whatever the module raises as it loads
        reason = (str(caught).strip().splitlines() or [""])[0]
        raise error(
            f"{field}: cannot import {path!r} in the runtime: {type(caught).__name__}: {reason}"
        ) from caught
    return found


def import_function(path: str) -> GradeFn:
    """The function named by `package.module:function` (the part after the colon may be dotted)."""
    found = import_object(path, "spec.data.grader.function", GraderError)
    if not callable(found):
        raise GraderError(f"spec.data.grader.function: {path!r} is a {type(found).__name__}, not a function")
    return found  # type: ignore[return-value]  # a callable of the user's: its signature is checked by use


# ---------------------------------------------------------------------------------------------- the job's


@dataclass(frozen=True)
class Grader:
    """What grades a job's responses: eval accuracy is the mean of `score`, the task reward is `score`."""

    name: str
    """As the report and eval.jsonl name it (`gsm8k`, `addition`, ...)."""
    grade: GradeFn

    def score(self, response: str, reference: str) -> float:
        """The grade as a number in [0, 1]; a grade that is not one is a GraderError naming the grader."""
        value = self.grade(response, reference)
        try:
            number = float(value)  # bool, int, float and numpy's scalars
        except (TypeError, ValueError):
            number = float("nan")
        if isinstance(value, str) or not 0.0 <= number <= 1.0:  # NaN fails the comparison too
            raise GraderError(
                f"spec.data.grader: the {self.name} grader returned {value!r}; a grader returns a bool or a "
                "score in [0, 1]"
            )
        return number


def load_grader(plan: GraderPlan) -> Grader:
    """The grader the plan names, ready to call: the module imported, the pattern compiled."""
    if plan.kind == GraderKind.TASK:
        if plan.task not in TASKS:
            raise GraderError(
                f"spec.data.train.path: unknown synthetic task {plan.task!r}; known: {', '.join(TASKS)}"
            )
        return Grader(plan.name, TASKS[plan.task].grade)
    if plan.kind == GraderKind.REGEX:
        assert plan.pattern is not None  # the API requires one with regex
        why = pattern_refusal(plan)
        if why:
            raise GraderError(f"spec.data.grader.pattern: {why}")
        return Grader(plan.name, regex_grader(plan.pattern))
    if plan.kind == GraderKind.MODULE:
        assert plan.function is not None  # the API requires one with module
        return Grader(plan.name, import_function(plan.function))
    if plan.kind == GraderKind.MATH:
        try:
            importlib.import_module("math_verify")
        except (
            ImportError
        ) as error:  # the runtime extra has it; an image built without it fails here, not at eval
            raise GraderError(
                f"spec.data.grader.name: math needs the math-verify package: {error}"
            ) from error
    return Grader(plan.name, BUILT_IN[plan.kind])


BUILT_IN: dict[GraderKind, GradeFn] = {
    GraderKind.EXACT: exact_match,
    GraderKind.GSM8K: gsm8k,
    GraderKind.MATH: math_equivalent,
}
"""The graders that take no setting, by kind."""
