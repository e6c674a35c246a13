"""The graders of `data.grader` (distillery_runtime.tasks.graders): each built-in on the strings it will
meet, and `load_grader` turning the plan's choice into the function the loop calls, or into a one-line
error naming the spec field."""

from __future__ import annotations

import threading
from decimal import Decimal
from pathlib import Path

import pytest
from distillery_runtime.tasks.graders import (
    Grader,
    GraderError,
    final_number,
    gsm8k,
    load_grader,
    math_equivalent,
    regex_grader,
)
from distillery_runtime.tasks.problems import addition, fibonacci

from distillery.plan import GraderKind, GraderPlan

GSM8K_REFERENCE = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        (GSM8K_REFERENCE, Decimal(72)),
        ("72", Decimal(72)),
        ("72.0", Decimal(72)),
        ("She has 3 apples and 5 pears, so 8 fruits.", Decimal(8)),
        ("#### 1,234", Decimal(1234)),
        ("It costs $1,000,000.50 in all.", Decimal("1000000.50")),
        ("The temperature fell to -5 degrees.", Decimal(-5)),
        ("The answer is 0.25.", Decimal("0.25")),
        ("#### 72 clips, since 24 + 48", Decimal(72)),  # the number after ####, not the last one
        ("first #### 3, then #### 4", Decimal(4)),  # the last mark
        ("12,34", Decimal(34)),  # not a thousands group: two numbers
        ("no number here", None),
        ("the answer: ####", None),  # a marked answer that is no number
    ],
)
def test_final_number(text: str, number: Decimal | None) -> None:
    assert final_number(text) == number


@pytest.mark.parametrize(
    ("response", "reference", "right"),
    [
        ("48/2 = 24 in May, 24 + 48 = 72 in all.\n#### 72", GSM8K_REFERENCE, True),
        ("24 + 48 = 72 clips in all.", GSM8K_REFERENCE, True),  # no ####: the last number
        ("24 + 48 = 72 clips in all.", "72", True),
        ("24 + 48 = 72 clips in all.", "72.0", True),  # a float reference from parquet
        ("So the total is 1,234.", "#### 1234", True),
        ("#### 1,234", "1234.00", True),
        ("The loss was -3.5 dollars.", "-3.5", True),
        ("The loss was 3.5 dollars.", "-3.5", False),
        ("#### 72 and then 73", "73", False),
        ("24 + 48 = 71 clips in all.", GSM8K_REFERENCE, False),
        ("I do not know.", "72", False),
        ("72", "not a number", False),
    ],
)
def test_gsm8k(response: str, reference: str, right: bool) -> None:
    assert gsm8k(response, reference) is right


@pytest.mark.parametrize(
    ("response", "reference", "right"),
    [
        ("So the answer is $\\boxed{\\frac{1}{2}}$.", "0.5", True),
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("We get \\boxed{(x+1)^2}", "x^2+2x+1", True),
        ("First 3, then \\boxed{72}", "72", True),  # the boxed answer, not the last number
        ("\\boxed{0.6}", "\\frac{1}{2}", False),
        ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", False),
        ("", "3", False),
    ],
)
def test_math(response: str, reference: str, right: bool) -> None:
    assert math_equivalent(response, reference) is right


def test_math_away_from_the_main_thread() -> None:
    # math-verify's timeouts are signals, which only the main thread may set: a thread grades without them.
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(math_equivalent("\\boxed{\\frac{1}{2}}", "0.5")))
    worker.start()
    worker.join()
    assert results == [True]


def test_regex_compares_the_first_group_or_the_whole_match() -> None:
    grouped = regex_grader(r"[Aa]nswer: *(-?[0-9]+)")
    assert grouped("Working... Answer: 42 (final)", " 42\n")
    assert not grouped("Answer: 41", "42")
    assert not grouped("no answer given", "42")
    whole = regex_grader(r"[0-9]+ apples")
    assert whole("I have 3 apples", "3 apples")
    assert not whole("I have 3 apples", "3")
    optional = regex_grader(r"answer(?:: (\d+))?")
    assert not optional("the answer is unknown", "")  # a group that took no part matches nothing


MODULE = '''
NOT_A_FUNCTION = "grade"


def half_credit(response, reference):
    """1 for the answer, 0.5 for an answer that only contains it."""
    if response.strip() == reference:
        return 1
    return 0.5 if reference in response else False


class Scorer:
    @staticmethod
    def loud(response, reference):
        return 2.0
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's graders, importable the way one in the runtime image is."""
    (tmp_path / "my_graders_for_test.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_graders_for_test"


def test_module_grader_is_imported_and_its_scores_kept(user_module: str) -> None:
    grader = load_grader(GraderPlan(GraderKind.MODULE, function=f"{user_module}:half_credit"))
    assert grader.name == "module"
    assert grader.score("42", "42") == 1.0
    assert grader.score("it is 42", "42") == 0.5
    assert grader.score("41", "42") == 0.0


def test_module_grader_out_of_range_is_an_error_naming_the_field(user_module: str) -> None:
    grader = load_grader(GraderPlan(GraderKind.MODULE, function=f"{user_module}:Scorer.loud"))
    with pytest.raises(GraderError, match=r"^spec\.data\.grader: the module grader returned 2\.0;"):
        grader.score("a", "b")


@pytest.mark.parametrize(
    ("function", "error"),
    [
        (
            "no_such_module_xyz:grade",
            "spec.data.grader.function: cannot import 'no_such_module_xyz:grade' in the runtime: "
            "ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
        (
            "{module}:missing",
            "spec.data.grader.function: cannot import '{module}:missing' in the runtime: "
            "AttributeError: module '{module}' has no attribute 'missing'",
        ),
        (
            "{module}:NOT_A_FUNCTION",
            "spec.data.grader.function: '{module}:NOT_A_FUNCTION' is a str, not a function",
        ),
    ],
)
def test_a_bad_import_path_is_one_line_naming_the_field(user_module: str, function: str, error: str) -> None:
    with pytest.raises(GraderError) as raised:
        load_grader(GraderPlan(GraderKind.MODULE, function=function.format(module=user_module)))
    assert str(raised.value) == error.format(module=user_module)
    assert "\n" not in str(raised.value)


def test_a_module_that_fails_as_it_loads_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_graders_for_test.py").write_text("def grade(r, a):\n  return (\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(GraderError, match=r"^spec\.data\.grader\.function: .*SyntaxError: [^\n]*$"):
        load_grader(GraderPlan(GraderKind.MODULE, function="broken_graders_for_test:grade"))


def test_load_grader_gives_each_plan_its_function() -> None:
    assert load_grader(GraderPlan(GraderKind.TASK, task="addition")) == Grader(
        "addition", addition.TASK.grade
    )
    assert load_grader(GraderPlan(GraderKind.TASK, task="fibonacci")).grade is fibonacci.grade
    assert load_grader(GraderPlan(GraderKind.EXACT)).score(" 72\n", "72") == 1.0
    assert load_grader(GraderPlan(GraderKind.GSM8K)).score("so 72", "#### 72") == 1.0
    assert load_grader(GraderPlan(GraderKind.MATH)).score("\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    regex = load_grader(GraderPlan(GraderKind.REGEX, pattern="= ([0-9]+)"))
    assert (regex.name, regex.score("x = 7", "7"), regex.score("x = 8", "7")) == ("regex", 1.0, 0.0)


def test_a_pattern_python_cannot_compile_is_refused_at_load() -> None:
    with pytest.raises(GraderError, match=r"^spec\.data\.grader\.pattern: not a Python regular expression"):
        load_grader(GraderPlan(GraderKind.REGEX, pattern="(unclosed"))
