"""Chat data as the field writes it: conversations split at their last assistant turn, prompt text through the
student's chat template (Qwen's real templates), template variables, every file source, and overlong prompts
rejected, dropped or truncated with the template's header intact. No Ray, no vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distillery_runtime.data.data import DataError, check_training_rows, prepare, scored_prompt, teacher_views
from distillery_runtime.data.data_sources import HubDataset, hub_dataset, load_rows
from transformers import AutoTokenizer

from distillery.api.spec import Data, DataSource, DistillationJobSpec
from distillery.plan.data.prompts import resolve_prompts
from distillery.plan.teachers.routes import route_table

HEADER = "<|im_start|>assistant\n"
ANSWER = "The answer is 42 because six times seven is 42."
CHAT = [
    {"role": "system", "content": "You are a careful tutor."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And six times seven?"},
    {"role": "assistant", "content": ANSWER},
]


@pytest.fixture(scope="module")
def qwen25(qwen_tokenizer):
    return qwen_tokenizer("qwen2.5")  # the session's


@pytest.fixture(scope="module")
def qwen3(qwen_tokenizer):
    return qwen_tokenizer("qwen3")  # the session's


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _data(path: Path | str, **fields: Any) -> Data:
    return Data.model_validate({"train": {"path": str(path)}, **fields})


def _prompt(tokenizer: Any, ids: tuple[int, ...]) -> str:
    return str(tokenizer.decode(list(ids)))


# ------------------------------------------------------------------------------------------ messages


def test_a_conversation_is_split_at_its_last_assistant_turn(tmp_path, qwen25):
    data = _data(_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}]), messagesField="messages")
    record = prepare(data.train, data, qwen25).records[0]
    prompt = _prompt(qwen25, record.prompt_ids)
    assert ANSWER not in prompt and "six times seven is" not in prompt
    # System turn and history kept, the template's generation prompt once, at the end.
    assert prompt == qwen25.apply_chat_template(CHAT[:-1], add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system\nYou are a careful tutor.<|im_end|>")
    assert "What is 2+2?" in prompt and "<|im_start|>assistant\n4.<|im_end|>" in prompt
    assert prompt.endswith("And six times seven?<|im_end|>\n" + HEADER) and prompt.count(HEADER) == 2
    # The answer is the row's reference response (off-policy share) and, with no answer field, its answer.
    assert record.response_ids is not None
    assert _prompt(qwen25, record.response_ids) == ANSWER + "<|im_end|>"
    assert record.answer == ANSWER


def test_the_answer_field_and_response_field_win_over_the_assistant_turn(tmp_path, qwen25):
    rows = [{"messages": CHAT, "answer": 42, "response": "42"}]
    data = _data(_jsonl(tmp_path / "chat.jsonl", rows), messagesField="messages", responseField="response")
    record = prepare(data.train, data, qwen25).records[0]
    assert record.answer == "42"
    assert _prompt(qwen25, record.response_ids or ()) == "42<|im_end|>"


def test_a_conversation_ending_with_a_user_turn_is_a_prompt_as_a_whole(tmp_path, qwen25):
    data = _data(_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT[:-1]}]), messagesField="messages")
    record = prepare(data.train, data, qwen25).records[0]
    assert _prompt(qwen25, record.prompt_ids).endswith("And six times seven?<|im_end|>\n" + HEADER)
    assert record.response_ids is None and record.answer is None


def test_rows_without_the_final_answer_are_found_when_the_off_policy_share_needs_it(tmp_path, qwen25):
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}, {"messages": CHAT[:-1]}])
    spec = DistillationJobSpec.model_validate(
        {
            "student": {"model": "s"},
            "teachers": [{"name": "t", "model": "m", "placement": "external", "endpoint": "http://t"}],
            "data": {"train": {"path": str(path)}, "messagesField": "messages"},
            "loss": {"onPolicyFraction": 0.5},
        }
    )
    with pytest.raises(
        DataError, match=r"1 row\(s\) without a final assistant turn in 'messages'.*\(row 1\)"
    ):
        check_training_rows(prepare(spec.data.train, spec.data, qwen25), spec.data.train, spec)


def test_a_system_prompt_is_added_where_a_conversation_has_none(tmp_path, qwen25):
    own = [{"messages": CHAT}, {"messages": CHAT[1:]}]
    data = _data(_jsonl(tmp_path / "chat.jsonl", own), messagesField="messages", systemPrompt="Be brief.")
    kept, added = (_prompt(qwen25, r.prompt_ids) for r in prepare(data.train, data, qwen25).records)
    assert (
        kept.startswith("<|im_start|>system\nYou are a careful tutor.<|im_end|>") and "Be brief." not in kept
    )
    assert added.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?")


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ("What is 2+2?", "must be a non-empty list of messages"),
        ([], "must be a non-empty list of messages"),
        ([{"role": "user"}], "message 0 needs a string role and a string content"),
        ([{"role": "user", "content": "hi"}, "hello"], "message 1 is not an object"),
        (
            [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}],
            "nothing to prompt with",
        ),
    ],
)
def test_a_bad_conversation_is_one_line_naming_the_row_and_field(tmp_path, qwen25, messages, problem):
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}, {"messages": messages}])
    data = _data(path, messagesField="messages")
    with pytest.raises(DataError) as error:
        prepare(data.train, data, qwen25)
    message = str(error.value)
    assert (
        message.startswith(f"{path} row 1: field 'messages' ") and problem in message and "\n" not in message
    )


def test_messages_need_a_tokenizer_with_a_chat_template(tmp_path, qwen25):
    base = AutoTokenizer.from_pretrained(qwen25.name_or_path)
    base.chat_template = None
    data = _data(_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}]), messagesField="messages")
    with pytest.raises(
        DataError, match=r"data\.messagesField needs a chat template and the student.s tokenizer"
    ):
        prepare(data.train, data, base)


# -------------------------------------------------------------------------------------- prompt text


def test_prompt_text_is_a_user_turn_of_the_template(tmp_path, qwen25):
    data = _data(_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2+2?"}]))
    prompt = _prompt(qwen25, prepare(data.train, data, qwen25).records[0].prompt_ids)
    assert prompt == (  # Qwen2.5's template brings its default system turn
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n" + HEADER
    )


def test_a_system_prompt_is_the_text_prompts_system_turn(tmp_path, qwen25):
    data = _data(
        _jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2+2?"}]), systemPrompt="Answer with a number."
    )
    prompt = _prompt(qwen25, prepare(data.train, data, qwen25).records[0].prompt_ids)
    assert prompt == (
        "<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        + HEADER
    )


def test_chat_template_none_keeps_the_raw_text(tmp_path, qwen25):
    data = _data(_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2+2?"}]), chatTemplate="none")
    record = prepare(data.train, data, qwen25).records[0]
    assert list(record.prompt_ids) == qwen25("What is 2+2?")["input_ids"]
    assert _prompt(qwen25, record.prompt_ids) == "What is 2+2?"


def test_template_kwargs_reach_the_template(tmp_path, qwen3):
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2+2?"}])
    thinking, direct = (
        _prompt(qwen3, prepare(d.train, d, qwen3).records[0].prompt_ids)
        for d in (_data(path), _data(path, chatTemplateKwargs={"enable_thinking": False}))
    )
    assert thinking == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n" + HEADER
    assert direct == thinking + "<think>\n\n</think>\n\n"  # Qwen3's template read enable_thinking=false
    chat = _data(
        _jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}]),
        messagesField="messages",
        chatTemplateKwargs={"enable_thinking": False},
    )
    assert _prompt(qwen3, prepare(chat.train, chat, qwen3).records[0].prompt_ids).endswith(
        HEADER + "<think>\n\n</think>\n\n"
    )


# ------------------------------------------------------------------------------------------ sources

ROWS = [
    {"messages": CHAT, "data_source": "math"},
    {"messages": CHAT[1:3], "data_source": "chat"},
]


def test_every_file_source_gives_the_same_records(tmp_path, qwen25):
    import datasets

    jsonl = _jsonl(tmp_path / "d.jsonl", ROWS)
    array = tmp_path / "d.json"
    array.write_text(json.dumps(ROWS, indent=2))  # one JSON array, as json.dump writes it
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    one = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(one))
    splits = tmp_path / "saved-splits"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:1]), "test": datasets.Dataset.from_list(ROWS)}
    ).save_to_disk(str(splits))
    data = _data(jsonl, messagesField="messages")
    expected = prepare(data.train, data, qwen25).records
    assert [r.route for r in expected] == ["math", "chat"] and expected[1].answer == "4."
    sources = [
        DataSource(path=str(array)),
        DataSource(path=str(parquet)),
        DataSource(path=str(one)),
        DataSource(path=str(splits), split="test"),
    ]
    for source in sources:
        assert prepare(source, data, qwen25).records == expected, source.path
    assert len(prepare(DataSource(path=str(splits)), data, qwen25).records) == 1  # split defaults to train
    with pytest.raises(DataError, match=r"no split 'validation' \(it has \['test', 'train'\]\)"):
        load_rows(DataSource(path=str(splits), split="validation"))


def test_pvc_folders_written_by_save_to_disk_are_read(tmp_path, monkeypatch, qwen25):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "claim" / "chat"))
    monkeypatch.setenv("DISTILLERY_PVC_ROOT", str(tmp_path))
    path, rows = load_rows(DataSource(path="pvc://claim/chat"))
    assert path == str(tmp_path / "claim" / "chat") and [r["data_source"] for r in rows] == ["math", "chat"]


def test_a_folder_not_written_by_save_to_disk_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError, match="is a directory but not one datasets' save_to_disk wrote"):
        load_rows(DataSource(path=str(tmp_path / "data")))


def test_a_json_array_element_that_is_not_an_object_names_its_row(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[{"prompt": "1+1="}, "2+2="]')
    with pytest.raises(DataError) as error:
        load_rows(DataSource(path=str(path)))
    assert (
        str(error.value)
        == f"{path} row 1: each element must be a JSON object with the data fields, not a string"
    )


def test_hub_datasets_are_parsed_and_loaded_through_datasets(monkeypatch, qwen25):
    import datasets

    assert hub_dataset(DataSource(path="/data/train.jsonl")) is None
    assert hub_dataset(
        DataSource(path="hf://datasets/openai/gsm8k", subset="main", split="test")
    ) == HubDataset("openai/gsm8k", "main", "test")
    calls: list[tuple[Any, ...]] = []

    def load_dataset(repo: str, subset: str | None = None, *, split: str) -> datasets.Dataset:
        calls.append((repo, subset, split))
        return datasets.Dataset.from_list([{"question": "What is 2+2?", "answer": "#### 4"}])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    data = _data("hf://datasets/openai/gsm8k", promptField="question")
    records = prepare(DataSource(path="hf://datasets/openai/gsm8k", subset="main"), data, qwen25).records
    assert calls == [("openai/gsm8k", "main", "train")]
    assert records[0].answer == "#### 4" and "What is 2+2?" in _prompt(qwen25, records[0].prompt_ids)

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(DataError) as error:
        load_rows(DataSource(path="hf://datasets/openai/gsm8k"))
    assert str(error.value) == (
        "hf://datasets/openai/gsm8k: cannot load split 'train' "
        "(Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError))"
    )


# ----------------------------------------------------------------------------------------- overlong

LONG = "Here is a long story. " * 40 + "So what is 2+2?"


def _overlong(tmp_path: Path, policy: str, limit: int, **fields: Any) -> Data:
    rows = [{"prompt": "What is 2+2?"}, {"prompt": LONG}, {"prompt": "1+1?"}, {"prompt": LONG + " Twice."}]
    return _data(_jsonl(tmp_path / "p.jsonl", rows), overlongPrompts=policy, maxPromptTokens=limit, **fields)


def test_overlong_prompts_rejected_name_every_row(tmp_path, qwen25):
    data = _overlong(tmp_path, "reject", 64)
    with pytest.raises(DataError) as error:
        prepare(data.train, data, qwen25)
    message = str(error.value)
    assert "2 prompt(s) longer than data.maxPromptTokens=64: row 1 (" in message and "row 3 (" in message
    assert "set data.overlongPrompts: drop or truncate" in message


def test_overlong_prompts_dropped_are_counted_and_named(tmp_path, qwen25):
    data = _overlong(tmp_path, "drop", 64)
    prepared = prepare(data.train, data, qwen25)
    assert [r.index for r in prepared.records] == [0, 2] and prepared.dropped == 2 and prepared.truncated == 0
    assert prepared.notes == ["2 prompt(s) longer than data.maxPromptTokens=64 dropped (row 1, row 3)"]
    everything = _overlong(tmp_path, "drop", 8)
    with pytest.raises(DataError, match="no rows left after dropping 4"):
        prepare(everything.train, everything, qwen25)


def test_overlong_prompts_truncated_keep_the_templates_opening_and_header(tmp_path, qwen25):
    data = _overlong(tmp_path, "truncate", 64, systemPrompt="Be brief.")
    prepared = prepare(data.train, data, qwen25)
    assert prepared.truncated == 2 and len(prepared.records) == 4
    for record in (prepared.records[1], prepared.records[3]):
        prompt = _prompt(qwen25, record.prompt_ids)
        assert 56 <= len(record.prompt_ids) <= 64
        assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
        assert prompt.endswith("<|im_end|>\n" + HEADER)
        user = prompt.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        assert user.endswith("So what is 2+2?" + (" Twice." if record.index == 3 else ""))  # the tail kept
        assert len(user) < len(LONG)
    assert prepared.notes == ["2 prompt(s) truncated to 64 tokens"]


def test_truncating_a_conversation_drops_old_turns_then_cuts_the_last(tmp_path, qwen3):
    history = [
        {"role": "system", "content": "You are a careful tutor."},
        {"role": "user", "content": "Tell me a story. " * 30},
        {"role": "assistant", "content": "Once upon a time. " * 30},
        {"role": "user", "content": LONG},
        {"role": "assistant", "content": "4"},
    ]
    rows = [{"messages": history}]
    # Rendered: 583 tokens whole, 427 without the first user turn, 271 with the last user turn alone.
    for limit, kept_history in ((500, True), (300, False), (60, False)):
        data = _data(
            _jsonl(tmp_path / "c.jsonl", rows),
            messagesField="messages",
            overlongPrompts="truncate",
            maxPromptTokens=limit,
            chatTemplateKwargs={"enable_thinking": False},
        )
        record = prepare(data.train, data, qwen3).records[0]
        prompt = _prompt(qwen3, record.prompt_ids)
        assert len(record.prompt_ids) <= limit
        assert prompt.startswith("<|im_start|>system\nYou are a careful tutor.<|im_end|>\n")
        assert prompt.endswith("So what is 2+2?<|im_end|>\n" + HEADER + "<think>\n\n</think>\n\n")
        assert ("Tell me a story." in prompt) is False and ("Once upon a time." in prompt) is kept_history


def test_a_template_longer_than_the_limit_alone_is_one_line(tmp_path, qwen25):
    data = _overlong(tmp_path, "truncate", 8, systemPrompt="Be brief.")
    with pytest.raises(DataError) as error:
        prepare(data.train, data, qwen25)
    assert str(error.value).startswith(
        f"{data.train.path} row 0: the chat template with the system turn alone"
    )


def test_raw_text_truncation_keeps_the_last_tokens(tmp_path, qwen25):
    data = _overlong(tmp_path, "truncate", 16, chatTemplate="none")
    record = prepare(data.train, data, qwen25).records[1]
    assert list(record.prompt_ids) == qwen25(LONG)["input_ids"][-16:]


# ---------------------------------------------------------------------------------- teachers' contexts

CONTEXT = "Think step by step, then give the number alone."


def _context_plan(data: Data, teachers: list[dict[str, Any]]) -> tuple[Any, Any]:
    """The prompt plan and route table of a job with these teachers (`plan.prompts`, `plan.routes`)."""
    doc = {
        "student": {"model": "s", "pool": {"workers": 1, "gpusPerWorker": 0}},
        "teachers": [{"model": "t", "placement": "colocated", **t} for t in teachers],
        "data": data.model_dump(by_alias=True, exclude_none=True),
    }
    spec = DistillationJobSpec.model_validate(doc)
    return resolve_prompts(spec.data, spec.teachers), route_table(spec)


def test_a_teachers_context_renders_its_own_prompt_and_the_students_stays_as_it_was(tmp_path, qwen25):
    rows = [
        {"prompt": "What is 2+2?", "data_source": "math"},
        {"messages": CHAT, "prompt": "x", "data_source": "chat"},
    ]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    data = _data(path, systemPrompt="You are terse.")
    teachers = [
        {"name": "tutor", "routes": ["math"], "systemPrompt": CONTEXT},
        {"name": "plain", "default": True},
    ]
    prompts, routes = _context_plan(data, teachers)
    plain = prepare(data.train, data, qwen25).records
    records = prepare(data.train, data, qwen25, prompts, routes).records
    assert [r.prompt_ids for r in records] == [r.prompt_ids for r in plain]  # the student's prompt unchanged
    # The teacher of route "math" sees its context first, then the prompt's own system turn.
    turns = [
        {"role": "system", "content": f"{CONTEXT}\n\nYou are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    assert _prompt(qwen25, records[0].teacher_prompt_ids or ()) == qwen25.apply_chat_template(
        turns, add_generation_prompt=True, tokenize=False
    )
    assert records[1].teacher_prompt_ids is None  # routed to a teacher without a context
    views = teacher_views(prepare(data.train, data, qwen25, prompts, routes))
    assert scored_prompt(views, "math", records[0].prompt_ids) == records[0].teacher_prompt_ids
    assert scored_prompt(views, "chat", records[0].prompt_ids) == records[0].prompt_ids  # another route
    assert scored_prompt(views, "chat", records[1].prompt_ids) == records[1].prompt_ids


def test_a_teachers_prompt_must_fit_max_prompt_tokens_too(tmp_path, qwen25):
    short = "What is 2+2?"
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": short}])
    student = len(prepare(_data(path).train, _data(path), qwen25).records[0].prompt_ids)
    limit = student + 4  # the student's prompt fits, the teacher's with its context does not
    # Longer than Qwen2.5's default system turn, which the student's prompt has and the teacher's replaces.
    context = " ".join([CONTEXT] * 4)
    data = _data(path, maxPromptTokens=limit)
    prompts, routes = _context_plan(data, [{"name": "tutor", "systemPrompt": context}])
    with pytest.raises(DataError, match=rf"longer than data.maxPromptTokens={limit} \(a teacher's prompt"):
        prepare(data.train, data, qwen25, prompts, routes)
    turns = [{"role": "system", "content": context}, {"role": "user", "content": short}]
    text = qwen25.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    whole = len(qwen25(text, add_special_tokens=False)["input_ids"])
    limit = whole - 3  # the teacher's prompt loses 3 tokens of the question; the student's fits
    assert student <= limit
    cut = _data(path, maxPromptTokens=limit, overlongPrompts="truncate")
    prompts, routes = _context_plan(cut, [{"name": "tutor", "systemPrompt": context}])
    prepared = prepare(cut.train, cut, qwen25, prompts, routes)
    record = prepared.records[0]
    assert len(record.teacher_prompt_ids or ()) <= limit and prepared.truncated == 1
    assert len(record.prompt_ids) == student  # the student's prompt whole
    teacher = _prompt(qwen25, record.teacher_prompt_ids or ())
    assert teacher.startswith(f"<|im_start|>system\n{context}") and teacher.endswith(f"<|im_end|>\n{HEADER}")


def test_a_teachers_context_needs_a_tokenizer_with_a_chat_template(tmp_path, qwen25):
    data = _data(_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1?"}]))
    prompts, routes = _context_plan(data, [{"name": "tutor", "systemPrompt": CONTEXT}])
    bare = AutoTokenizer.from_pretrained(qwen25.name_or_path)
    bare.chat_template = None
    with pytest.raises(DataError, match="the systemPrompt of teacher tutor needs a chat template"):
        prepare(data.train, data, bare, prompts, routes)
