"""Prompts for the loop: read rows (jsonl/parquet, local or URI), render and tokenize them, and hand them
out in a deterministic, resumable order.

Each row becomes a `PromptRecord` that carries its route value (which teacher scores it), its reference
answer (eval accuracy) and its reference response (the off-policy share). Prompts longer than
`data.maxPromptTokens` are rejected (the job fails naming the rows) or truncated to their last tokens as
the spec says; either way they are counted, never silently dropped.
"""

from __future__ import annotations

import functools
import math
import numbers
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from distillery.api.spec import Data, DataFormat, DataSource, DistillationJobSpec, OverlongPolicy
from distillery.plan import resolve
from distillery_runtime.uris import resolve_location


class DataError(ValueError):
    """A dataset the runtime cannot use; the message names the file and the rows."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt, tokenized, with what the loop needs to route, score and evaluate it."""

    index: int
    """Row number in the source file (0-based), for messages that name the row."""
    prompt_ids: tuple[int, ...]
    route: str | None = None
    answer: str | None = None
    response_ids: tuple[int, ...] | None = None
    """Reference response (data.responseField) plus EOS, for the off-policy share."""


@dataclass
class PreparedData:
    """The records of one source and what preparing them did."""

    records: list[PromptRecord]
    truncated: int = 0
    """Prompts cut to their last maxPromptTokens tokens (overlongPrompts: truncate)."""
    source: str = ""
    rows: int = 0
    notes: list[str] = field(default_factory=list)


def answer_text(value: object) -> str:
    """A reference answer as the graders read it: a string as it is, a number in its shortest form.

    Parquet and JSON often hold a numeric answer as a float (72.0), which str() writes "72.0": an exact
    match with the "72" a model writes would never succeed. An integral number is written as an int, any
    other number as its shortest round-trip form (0.5, not 0.50)."""
    if isinstance(value, bool):  # a bool is an Integral, but True is not 1 to a reader
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        return str(int(number)) if math.isfinite(number) and number.is_integer() else repr(number)
    if isinstance(value, Decimal) and value.is_finite():  # parquet's decimal columns
        return str(int(value)) if value == value.to_integral_value() else format(value.normalize(), "f")
    return str(value)


def detect_format(path: str, declared: DataFormat) -> DataFormat:
    if declared != DataFormat.AUTO:
        return declared
    suffix = Path(path).suffix.lower()
    if suffix in {".jsonl", ".json", ".ndjson"}:
        return DataFormat.JSONL
    if suffix in {".parquet", ".pq"}:
        return DataFormat.PARQUET
    raise DataError(
        f"{path}: cannot tell the format from the extension {suffix!r}; set format: jsonl|parquet"
    )


def load_rows(source: DataSource) -> tuple[str, list[dict[str, Any]]]:
    """The rows of a data source as dicts, and the local path they were read from."""
    path = resolve_location(source.path)
    if Path(path).is_dir():
        raise DataError(f"{source.path}: is a directory; point data paths at a .jsonl or .parquet file")
    fmt = detect_format(path, source.format)
    if not Path(path).exists():
        raise DataError(f"{source.path}: no such file")
    if fmt == DataFormat.PARQUET:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return path, pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise DataError(f"{source.path}: not a readable parquet file ({first})") from error
    rows: list[dict[str, Any]] = []
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as error:
                raise DataError(f"{source.path}:{number}: not valid JSON ({error})") from error
            if not isinstance(row, dict):
                raise DataError(
                    f"{source.path}:{number}: each line must be a JSON object with the data fields, "
                    f"not a {_json_kind(row)}"
                )
            rows.append(row)
    return path, rows


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def render_prompt(row: dict[str, Any], data: Data, tokenizer: Any, where: str) -> list[int]:
    """Token ids of a row's prompt: messages through the chat template, or the prompt text as is."""
    if data.messages_field:
        messages = row.get(data.messages_field)
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: field {data.messages_field!r} must be a non-empty list of messages")
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    text = row.get(data.prompt_field)
    if not isinstance(text, str) or not text:
        raise DataError(f"{where}: field {data.prompt_field!r} is missing or not a non-empty string")
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def prepare(source: DataSource, data: Data, tokenizer: Any) -> PreparedData:
    """Tokenize every row of a source; overlong prompts are rejected (all named) or truncated (counted)."""
    path, rows = load_rows(source)
    records: list[PromptRecord] = []
    overlong: list[tuple[int, int]] = []
    truncated = 0
    limit = data.max_prompt_tokens
    for index, row in enumerate(rows):
        where = f"{source.path} row {index}"
        ids = render_prompt(row, data, tokenizer, where)
        if len(ids) > limit:
            if data.overlong_prompts == OverlongPolicy.REJECT:
                overlong.append((index, len(ids)))
                continue
            ids = ids[-limit:]
            truncated += 1
        response_ids = None
        if data.response_field and isinstance(row.get(data.response_field), str):
            response = tokenizer(row[data.response_field], add_special_tokens=False)["input_ids"]
            response_ids = (*response, tokenizer.eos_token_id)
        route = row.get(data.route_field)
        answer = row.get(data.answer_field) if data.answer_field else None
        records.append(
            PromptRecord(
                index=index,
                prompt_ids=tuple(ids),
                route=None if route is None else str(route),
                answer=None if answer is None else answer_text(answer),
                response_ids=response_ids,
            )
        )
    if overlong:
        shown = ", ".join(f"row {i} ({n} tokens)" for i, n in overlong[:10])
        more = f" and {len(overlong) - 10} more" if len(overlong) > 10 else ""
        raise DataError(
            f"{source.path}: {len(overlong)} prompt(s) longer than data.maxPromptTokens={limit}: {shown}{more}; "
            "raise maxPromptTokens or set data.overlongPrompts: truncate"
        )
    if not records:
        raise DataError(f"{source.path}: no rows")
    prepared = PreparedData(records=records, truncated=truncated, source=path, rows=len(rows))
    if truncated:
        prepared.notes.append(f"{truncated} prompt(s) truncated to their last {limit} tokens")
    return prepared


def check_training_rows(prepared: PreparedData, source: DataSource, spec: DistillationJobSpec) -> None:
    """Finds at load what the loop would otherwise hit mid-run, after steps were spent: rows whose route no
    teacher takes, and rows without the reference response the off-policy share needs."""
    problems: list[str] = []
    routes = resolve(spec).routes
    unrouted = [record for record in prepared.records if routes.teacher_for(record.route) is None]
    if unrouted:
        problems.append(
            f"{len(unrouted)} row(s) whose {spec.data.route_field!r} no teacher takes "
            f"({_rows(unrouted, lambda r: repr(r.route))}); known routes: {routes.known_routes()}; "
            "add the value to a teacher's routes or make one teacher default: true"
        )
    if spec.loss.on_policy_fraction < 1.0:
        missing = [r for r in prepared.records if r.response_ids is None]
        if missing:
            problems.append(
                f"{len(missing)} row(s) without a string {spec.data.response_field!r}, which the off-policy "
                f"share needs (loss.onPolicyFraction={spec.loss.on_policy_fraction} < 1) ({_rows(missing)})"
            )
    if problems:
        raise DataError(f"{source.path}: " + "; ".join(problems))


def _rows(records: Sequence[PromptRecord], detail: Any = None, shown: int = 10) -> str:
    parts = [f"row {r.index}" + (f" {detail(r)}" if detail else "") for r in records[:shown]]
    more = f" and {len(records) - shown} more" if len(records) > shown else ""
    return ", ".join(parts) + more


@functools.lru_cache(maxsize=4)
def epoch_order(n: int, epoch: int, seed: int) -> tuple[int, ...]:
    """The visiting order of n records in one epoch: a permutation fixed by (seed, epoch)."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tuple(order)


def take(records: Sequence[PromptRecord], position: int, count: int, seed: int) -> list[PromptRecord]:
    """`count` records starting at global `position` (prompts consumed so far), crossing epochs.

    Pure in (position, count, seed): a resumed run that restores `position` gets the same prompts.
    """
    n = len(records)
    out: list[PromptRecord] = []
    for p in range(position, position + count):
        epoch, offset = divmod(p, n)
        out.append(records[epoch_order(n, epoch, seed)[offset]])
    return out
