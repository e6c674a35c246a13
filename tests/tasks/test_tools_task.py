"""The tools task: the calculator's answers, the grader (the text after the last `;`), the SFT mask that keeps
the calculator's observations out of the loss (and leaves every other task's batches as they were), the
split, the teacher's repair rows, episodes played with the calculator's answers spliced in, and (slow) the
prepared task: a teacher that calls, copies and repairs, a student stopped while it writes malformed calls."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
import torch
from distillery_runtime.tasks.build.prepare import RECIPES, AdditionRecipe, ToolsRecipe, main
from distillery_runtime.tasks.build.sft import IGNORE, encode_batch
from distillery_runtime.tasks.measure.episodes import play, play_many, played_accuracy
from distillery_runtime.tasks.problems import tools
from distillery_runtime.tasks.problems.tools import (
    ERROR_OBSERVATION,
    TASK,
    TOOL_CALL_END,
    Calculator,
    Problem,
    observation,
)
from distillery_runtime.tasks.uri import TASKS, task_for

from tests.tasks.prepared_checks import task_cache


def test_the_docstring_example():
    p = Problem(1234, 5678)
    assert p.prompt == "1234*5678=" and p.answer == "7006652"
    assert p.response == "[1234*5678]>7006652;7006652"
    assert TASK.grade(p.response, p.answer)
    assert Problem.of_prompt(p.prompt) == p


def test_the_calculator_answers_a_well_formed_call_with_the_product():
    calculator = Calculator()
    calculator.reset("1234*5678=", None)
    assert calculator.step("[1234*5678]") == (">7006652;", False, False)
    assert calculator.step("[9999*9999]") == (">99980001;", False, False)
    assert calculator.step("[0012*5678]") == (">68136;", False, False)  # 4 digits each, zeros or not


@pytest.mark.parametrize(
    "call",
    ["[12345*]", "[*5678]", "[1234x5678]", "[12345678]", "[1234**5678]", "[1234*5678=]", "[1234*5678*2]",
     "[]", "[E;>]", "1234*5678]", "[12=34*5678]", "[1234*56;78]", "[12*5678]", "[12345*678]", "[93184*110]",
     "[1234*56789]", " [1234*5678]x]"],
)  # fmt: skip
def test_the_calculator_answers_anything_else_that_ends_in_a_call_with_an_error(call):
    calculator = Calculator()
    calculator.reset("1234*5678=", "7006652")
    assert calculator.step(call) == (ERROR_OBSERVATION, False, True)
    assert observation(call) == ">E;"


@pytest.mark.parametrize("turn", ["7006652", "", "[1234*5678", "junk"])
def test_a_turn_without_a_call_is_the_answer_and_ends_the_episode(turn):
    calculator = Calculator()
    calculator.reset("1234*5678=", None)
    assert calculator.step(turn) == ("", True, False)


@pytest.mark.parametrize(
    ("response", "graded"),
    [
        ("[1234*5678]>7006652;7006652", True),
        ("[1234*5678]>7006652;7006652 ", True),  # whitespace stripped
        ("[1234*5678]>7006652;700665", False),  # a wrong copy
        ("[1234*5678]>7006652;", False),  # no answer after the observation
        ("[1234*5678]>7006652;70066522", False),
        ("[1234]>E;[1234*5678]>7006652;7006652", True),  # repaired
        ("[1234]>E;7006652", True),  # the text after the LAST `;` is graded
        ("[1234*5678]>7006652;[1234]>E;", False),  # the observation before is not the answer
        ("7006652", True),  # no call at all: the whole response
        ("7006653", False),
    ],
)
def test_the_answer_is_the_text_after_the_last_semicolon(response, graded):
    assert TASK.grade(response, "7006652") is graded


def test_a_malformed_call_never_parses_and_the_teachers_rows_repair_it():
    rng = random.Random(0)
    recipe = ToolsRecipe()
    pairs = [recipe.teacher_pair(rng, None) for _ in range(2000)]  # type: ignore[arg-type]
    repairs = 0
    for prompt, segments in pairs:
        p = Problem.of_prompt(prompt)
        assert "".join(text for text, _ in segments).endswith(p.response)
        # what the model writes is trained, what the calculator answers is not
        assert [(text, trained) for text, trained in segments][-3:] == p.segments()
        if len(segments) == 5:
            repairs += 1
            (opening, opening_trained), (seen, seen_trained) = segments[:2]
            assert opening.startswith("[") and opening.endswith(TOOL_CALL_END)
            assert seen == observation(opening) == ERROR_OBSERVATION
            assert not opening_trained and not seen_trained  # the malformed call is context
    assert 0.35 < repairs / len(pairs) < 0.45  # repair_fraction 0.4
    # the student sees clean episodes only
    for prompt, segments in (recipe.training_pair(rng, None) for _ in range(200)):  # type: ignore[arg-type]
        assert segments == Problem.of_prompt(prompt).segments()


def test_the_splits_are_disjoint_and_deterministic():
    train = tools.sample_problems(4000, seed=2, held_out=False)
    held_out = tools.sample_problems(400, seed=1, held_out=True)
    assert not set(train) & set(held_out)
    assert held_out == tools.sample_problems(400, seed=1, held_out=True)
    assert all(1000 <= n <= 9999 for p in train + held_out for n in (p.a, p.b))
    assert len(set(held_out)) == 400


def test_the_task_is_registered():
    assert TASKS["tools"] is TASK and task_for("synthetic://tools/train") is TASK
    assert RECIPES["tools"] is ToolsRecipe


def test_prepare_lists_the_task(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "tools" in capsys.readouterr().out


def test_the_observation_is_context_and_the_students_turns_and_eos_are_trained():
    tokenizer = ToolsRecipe().build_tokenizer()
    p = Problem(1234, 5678)
    ids, mask, labels = encode_batch(tokenizer, [(p.prompt, p.segments("[1234]"))])
    text = p.prompt + "[1234]>E;" + p.response
    n = len(text)
    assert tokenizer.decode(ids[0][:n]) == text and ids[0][n] == tokenizer.eos_token_id
    assert mask[0].tolist() == [1] * (n + 1)
    trained = "".join("." if x == IGNORE else tokenizer.decode([x]) for x in labels[0][:n].tolist())
    assert trained == "." * len(p.prompt + "[1234]>E;") + "[1234*5678]" + "." * len(">7006652;") + "7006652"
    assert labels[0][n] == tokenizer.eos_token_id  # EOS: the model ends the episode


def test_a_text_response_encodes_as_before_alone_or_beside_segments():
    """Every other task's responses are texts: ids and labels as the prompt's, the response's and EOS
    always were, whatever else the batch holds; a text is the same as one trained segment."""
    tokenizer = AdditionRecipe().build_tokenizer()
    pairs = [("321+954=", "2850"), ("1+2=", "30")]
    ids, mask, labels = encode_batch(tokenizer, pairs)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("321+954=", "2850", "1+2=", "30")]
    assert ids.tolist() == [enc[0] + enc[1] + [eos], enc[2] + enc[3] + [eos] + [pad] * 6]
    assert mask.tolist() == [[1] * 13, [1] * 7 + [0] * 6]
    assert labels.tolist() == [
        [IGNORE] * 8 + enc[1] + [eos],
        [IGNORE] * 4 + enc[3] + [eos] + [IGNORE] * 6,
    ]
    mixed = encode_batch(tokenizer, [pairs[0], ("1+2=", [("3", True), ("0", True)])])
    for before, after in zip((ids, mask, labels), mixed, strict=True):
        assert torch.equal(before, after)


class _Oracle:
    """A stand-in model that plays the episode right from its context: the call after the prompt (or
    after `>E;`), the product after an observation. It answers `generate` as transformers does: the left-
    padded inputs, then the new tokens, padded after the stop."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id, **_):
        rows = []
        for ids in input_ids.tolist():
            context = self.tokenizer.decode(ids, skip_special_tokens=True)
            p = Problem.of_prompt(context[: context.index("=") + 1])
            text = p.answer if context.endswith(f"{p.answer};") else p.call
            new = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if not text.endswith(TOOL_CALL_END):
                new.append(self.tokenizer.eos_token_id)
            rows.append(ids + new[:max_new_tokens])
        width = max(len(r) for r in rows)
        return torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows])


def test_episodes_splice_the_calculators_answers_between_the_turns():
    recipe = ToolsRecipe()
    tokenizer = recipe.build_tokenizer()
    rows = [p.row() for p in tools.sample_problems(6, seed=4, held_out=True)]
    oracle = _Oracle(tokenizer)
    episodes = recipe.play(oracle, tokenizer, rows)  # type: ignore[arg-type]
    for e, r in zip(episodes, rows, strict=True):
        assert e.response == r["response"] and e.done and e.errors == 0
        assert e.turns == [Problem.of_prompt(r["prompt"]).call, r["answer"]]
    assert recipe.accuracy(oracle, tokenizer, rows) == 1.0  # type: ignore[arg-type]
    # forced to open with a malformed call: the error, then the call, then the answer
    forced = recipe.play(oracle, tokenizer, rows, ["[1*]"] * len(rows))  # type: ignore[arg-type]
    assert all(
        e.errors == 1 and e.response == "[1*]>E;" + r["response"] for e, r in zip(forced, rows, strict=True)
    )
    assert recipe.repair_rate(oracle, tokenizer, rows) == 1.0  # type: ignore[arg-type]
    # one turn allowed: the episode stops after the call, unanswered, and is graded wrong
    short = play_many(
        oracle,
        tokenizer,
        [r["prompt"] for r in rows],
        environment=Calculator,
        stop=TOOL_CALL_END,
        max_turns=1,
    )  # type: ignore[arg-type]
    assert not any(e.done for e in short)
    assert played_accuracy(short, [r["answer"] for r in rows], TASK) == 0.0
    single = play(oracle, tokenizer, rows[0]["prompt"], environment=Calculator, stop=TOOL_CALL_END)  # type: ignore[arg-type]
    assert single.response == rows[0]["response"]


def test_a_stop_string_must_be_one_token():
    tokenizer = ToolsRecipe().build_tokenizer()
    with pytest.raises(ValueError, match="2 tokens"):
        play_many(None, tokenizer, ["1*2="], environment=Calculator, stop="]]")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tools_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distillery_runtime.tasks.build.prepare import prepare

    return prepare("tools", root=task_cache(tmp_path_factory))


# Preparation trains both models (~3 minutes from empty on 2 idle cores, one thread; many more on a loaded
# machine). Not a local run: it may run beside the node's scenarios (tests/support/work_groups.py).
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_prepared_teacher_calls_and_repairs_and_the_student_still_writes_malformed_calls(tools_task):
    recipe = ToolsRecipe()
    manifest = orjson.loads((tools_task / "manifest.json").read_bytes())
    assert manifest["threads"] == recipe.threads
    rows = [orjson.loads(line) for line in (tools_task / "eval.jsonl").read_bytes().splitlines()]
    train = [orjson.loads(line) for line in (tools_task / "train.jsonl").read_bytes().splitlines()]
    assert len(rows) == recipe.eval_rows and len(train) == recipe.train_rows
    assert set(rows[0]) == set(train[0]) == {"prompt", "answer", "response", "data_source"}
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in rows}
    teacher, tokenizer = _load(tools_task / "teacher")
    student, _ = _load(tools_task / "student")
    # the teacher, played: its calls answered by the calculator, graded on what follows the last `;`
    played = recipe.accuracy(teacher, tokenizer, rows)
    assert played >= recipe.teacher_min_accuracy, manifest
    assert played == pytest.approx(manifest["teacher"]["eval_accuracy"], abs=1e-9)  # saved == trained
    assert manifest["teacher"]["repair_rate"] >= recipe.teacher_min_repair, manifest
    assert recipe.repair_rate(teacher, tokenizer, rows) >= recipe.teacher_min_repair, manifest
    # the student: stopped in its band, most of its wrong episodes a malformed call, and no repair after `>E;`
    assert recipe.student_start <= manifest["student"]["dev_accuracy"] <= recipe.student_ceiling, manifest
    assert 0.05 <= recipe.accuracy(student, tokenizer, rows) <= 0.5, manifest
    record = recipe.student_record(student, tokenizer, rows)
    assert record == {k: manifest["student"][k] for k in record}
    assert record["eval_wrong_malformed"] > 0.5 * record["eval_wrong"], manifest
    assert recipe.repair_rate(student, tokenizer, rows) <= 0.5 * recipe.repair_rate(teacher, tokenizer, rows)


def _load(directory: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval(), tokenizer
