"""Data preparation: formats, chat template, route/answer fields, overlong prompts counted or rejected."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distillery_runtime.data.data import (
    DataError,
    answer_text,
    check_training_rows,
    epoch_order,
    prepare,
    take,
)
from distillery_runtime.data.uris import UnresolvableLocation, resolve_location
from transformers import AutoTokenizer

from distillery.api.spec import Data, DataSource, DistillationJobSpec


@pytest.fixture(scope="module")
def tokenizer(job_files):
    return AutoTokenizer.from_pretrained(job_files.student)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_and_parquet_give_the_same_records(tmp_path, tokenizer):
    rows = [
        {"prompt": "12+3=", "answer": "15", "data_source": "math"},
        {"prompt": "4+4=", "answer": "8", "data_source": "x"},
    ]
    jsonl = _jsonl(tmp_path / "d.jsonl", rows)
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    data = Data(train=DataSource(path=str(jsonl)))
    a = prepare(DataSource(path=str(jsonl)), data, tokenizer).records
    b = prepare(DataSource(path=str(parquet)), data, tokenizer).records
    assert a == b
    assert [r.route for r in a] == ["math", "x"]
    assert [r.answer for r in a] == ["15", "8"]
    assert list(a[0].prompt_ids) == tokenizer("12+3=")["input_ids"]


def test_numeric_answers_from_parquet_and_json_read_as_a_model_writes_them(tmp_path, tokenizer):
    rows = [
        {"prompt": "1+1=", "answer": 72.0},  # parquet's float column: str() would say "72.0"
        {"prompt": "1+1=", "answer": 0.5},
        {"prompt": "1+1=", "answer": -3.0},
    ]
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    jsonl = _jsonl(tmp_path / "d.jsonl", [*rows, {"prompt": "1+1=", "answer": 1234}])
    data = Data(train=DataSource(path=str(parquet)))
    assert [r.answer for r in prepare(DataSource(path=str(parquet)), data, tokenizer).records] == [
        "72",
        "0.5",
        "-3",
    ]
    assert [r.answer for r in prepare(DataSource(path=str(jsonl)), data, tokenizer).records] == [
        "72",
        "0.5",
        "-3",
        "1234",
    ]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (72.0, "72"),
        (72, "72"),
        (1e20, "100000000000000000000"),
        (0.1, "0.1"),
        (float("nan"), "nan"),
        (Decimal("72.00"), "72"),
        (Decimal("1.50"), "1.5"),
        (True, "True"),
        (" 72.0 ", " 72.0 "),  # a string is the data's own spelling: left as it is
    ],
)
def test_answer_text(value, text):
    assert answer_text(value) == text


def test_numpy_scalars_read_like_python_numbers():
    import numpy as np  # a runtime dependency: always there

    assert [answer_text(np.float32(72.0)), answer_text(np.int64(72)), answer_text(np.float64(2.5))] == [
        "72",
        "72",
        "2.5",
    ]


def test_messages_use_the_students_chat_template(tmp_path, job_files):
    from distillery_runtime.testing.tiny import CHAT_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(job_files.student)  # a base model's: no template of its own
    tokenizer.chat_template = CHAT_TEMPLATE
    messages = [{"role": "user", "content": "1+2="}]
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": messages, "answer": "3"}])
    data = Data(train=DataSource(path=str(path)), messages_field="messages")
    record = prepare(data.train, data, tokenizer).records[0]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert expected.startswith("<s>user") and expected.endswith("assistant\n")
    assert list(record.prompt_ids) == tokenizer(expected, add_special_tokens=False)["input_ids"]


def test_overlong_prompts_are_rejected_naming_every_row(tmp_path, tokenizer):
    rows = [
        {"prompt": "1+1="},
        {"prompt": "1" * 40 + "+1="},
        {"prompt": "2+2="},
        {"prompt": "9" * 30 + "+9="},
    ]
    path = _jsonl(tmp_path / "long.jsonl", rows)
    data = Data(train=DataSource(path=str(path)), max_prompt_tokens=8)
    with pytest.raises(DataError) as error:
        prepare(data.train, data, tokenizer)
    message = str(error.value)
    assert "2 prompt(s) longer than data.maxPromptTokens=8" in message
    assert "row 1 (" in message and "row 3 (" in message and "row 0" not in message


def test_overlong_prompts_truncated_keep_their_tail_and_are_counted(tmp_path, tokenizer):
    long_prompt = "1" * 40 + "+1="
    path = _jsonl(tmp_path / "long.jsonl", [{"prompt": long_prompt}, {"prompt": "2+2="}])
    data = Data(train=DataSource(path=str(path)), max_prompt_tokens=8, overlong_prompts="truncate")
    prepared = prepare(data.train, data, tokenizer)
    assert len(prepared.records) == 2 and prepared.truncated == 1
    full = tokenizer(long_prompt)["input_ids"]
    assert list(prepared.records[0].prompt_ids) == full[-8:]


def test_missing_prompt_field_names_the_row(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "1+1="}, {"text": "oops"}])
    data = Data(train=DataSource(path=str(path)))
    with pytest.raises(DataError, match="row 1: field 'prompt'"):
        prepare(data.train, data, tokenizer)


def test_a_jsonl_line_that_is_not_an_object_names_its_line(tmp_path, tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "1+1="}\n[1, 2]\n')
    data = Data(train=DataSource(path=str(path)))
    with pytest.raises(DataError) as error:
        prepare(data.train, data, tokenizer)
    assert str(error.value) == f"{path}:2: each line must be a JSON object with the data fields, not a list"


def test_a_corrupt_parquet_file_is_one_line_naming_the_file(tmp_path, tokenizer):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    data = Data(train=DataSource(path=str(path)))
    with pytest.raises(DataError) as error:
        prepare(data.train, data, tokenizer)
    message = str(error.value)
    assert message.startswith(f"{path}: not a readable parquet file (") and "\n" not in message


def _two_teacher_spec(path: Path, **loss: object) -> DistillationJobSpec:
    return DistillationJobSpec.model_validate(
        {
            "student": {"model": "s"},
            "teachers": [
                {
                    "name": "math",
                    "model": "m",
                    "placement": "external",
                    "endpoint": "http://m",
                    "routes": ["math"],
                },
                {
                    "name": "code",
                    "model": "c",
                    "placement": "external",
                    "endpoint": "http://c",
                    "routes": ["code"],
                },
            ],
            "data": {"train": {"path": str(path)}, "responseField": "response"},
            "loss": loss,
        }
    )


def test_rows_no_teacher_takes_are_found_at_load_naming_them(tmp_path, tokenizer):
    rows = [
        {"prompt": "1+1=", "data_source": r, "response": "2"} for r in ("math", "code", "physics", "math")
    ]
    spec = _two_teacher_spec(_jsonl(tmp_path / "t.jsonl", rows))
    prepared = prepare(spec.data.train, spec.data, tokenizer)
    with pytest.raises(DataError) as error:
        check_training_rows(prepared, spec.data.train, spec)
    message = str(error.value)
    assert "1 row(s) whose 'data_source' no teacher takes (row 2 'physics')" in message
    assert "known routes: ['code', 'math']" in message
    rows[2]["data_source"] = "code"
    spec = _two_teacher_spec(_jsonl(tmp_path / "t.jsonl", rows))
    check_training_rows(prepare(spec.data.train, spec.data, tokenizer), spec.data.train, spec)


def test_rows_without_the_off_policy_response_are_found_at_load(tmp_path, tokenizer):
    rows = [
        {"prompt": "1+1=", "data_source": "math", "response": "2"},
        {"prompt": "2+2=", "data_source": "math"},
    ]
    path = _jsonl(tmp_path / "t.jsonl", rows)
    on_policy = _two_teacher_spec(path)
    check_training_rows(
        prepare(on_policy.data.train, on_policy.data, tokenizer), on_policy.data.train, on_policy
    )
    mixed = _two_teacher_spec(path, onPolicyFraction=0.5)
    with pytest.raises(DataError, match=r"1 row\(s\) without a string 'response'.*\(row 1\)"):
        check_training_rows(prepare(mixed.data.train, mixed.data, tokenizer), mixed.data.train, mixed)


def test_take_is_a_deterministic_permutation_per_epoch(job_files, tokenizer):
    data = Data(train=DataSource(path=str(job_files.train)))
    records = prepare(data.train, data, tokenizer).records
    n = len(records)
    first_epoch = take(records, 0, n, seed=3)
    assert sorted(r.index for r in first_epoch) == list(range(n))
    assert take(records, 5, 7, seed=3) == first_epoch[5:12]
    crossing = take(records, n - 2, 4, seed=3)
    assert crossing[:2] == first_epoch[-2:]
    assert [r.index for r in crossing[2:]] == list(epoch_order(n, 1, 3)[:2])
    assert take(records, 0, n, seed=4) != first_epoch


def test_uri_schemes(tmp_path):
    assert resolve_location("/some/path") == "/some/path"
    assert resolve_location("file:///a/b") == "/a/b"
    with pytest.raises(UnresolvableLocation, match="nosuchscheme"):
        resolve_location("nosuchscheme://bucket/data.jsonl")


def test_pvc_locations_open_where_the_claim_is_mounted(tmp_path, monkeypatch, job_files):
    from distillery_runtime.data.data import load_rows

    from distillery.api.spec import DataSource

    # In a cluster the operator mounts the claim at /mnt/distillery/pvc/CLAIM; elsewhere
    # DISTILLERY_PVC_ROOT says where the claims' files are, so the same manifest runs.
    monkeypatch.delenv("DISTILLERY_PVC_ROOT", raising=False)
    with pytest.raises(UnresolvableLocation, match=r"nothing at /mnt/distillery/pvc/datasets/train\.jsonl"):
        resolve_location("pvc://datasets/train.jsonl")
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "train.jsonl").write_bytes(job_files.train.read_bytes())
    monkeypatch.setenv("DISTILLERY_PVC_ROOT", str(tmp_path))
    path, rows = load_rows(DataSource(path="pvc://datasets/train.jsonl"))
    assert path == str(tmp_path / "datasets" / "train.jsonl")
    assert rows and "prompt" in rows[0]
