"""Prompts for the loop: render and tokenize the rows `data_sources` reads, and hand them out in a
deterministic, resumable order.

Each row becomes a `PromptRecord` that carries its route value (which teacher scores it), its reference
answer (eval accuracy) and its reference response (the off-policy share). How a row becomes a prompt
(messages or text, chat template or not) is the plan's (`distillery.plan.data.prompts`); the rendering is
`chat`'s. Prompts longer than `data.maxPromptTokens` are rejected (the job fails naming the rows), dropped
or truncated as the spec says; dropped and truncated ones are counted and named, never silently lost.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from distillery.api.spec import Data, DataSource, DistillationJobSpec, OverlongPolicy
from distillery.plan import resolve
from distillery.plan.data.prompts import (
    PromptPlan,
    PromptSource,
    TemplateRequired,
    resolve_prompts,
    uses_template,
    with_context,
)
from distillery.plan.teachers.routes import RouteTable
from distillery_runtime.data.chat import ChatRowError, Turn, fit, render, split_conversation, with_system
from distillery_runtime.data.data_sources import DataError, detect_format, load_rows

__all__ = ["DataError", "PreparedData", "PromptRecord", "detect_format", "load_rows", "prepare", "take"]


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
    teacher_prompt_ids: tuple[int, ...] | None = None
    """The prompt as its teacher sees it, where that teacher has a context of its own (`systemPrompt`: context
    distillation); None: the student's prompt."""


TeacherViews = dict[tuple[str | None, tuple[int, ...]], tuple[int, ...]]
"""(route, the student's prompt ids) -> the prompt ids its teacher scores the response after."""


def teacher_views(*prepared: PreparedData | None) -> TeacherViews:
    """The teachers' own prompts of the records that have one, by what a sample carries (`scored_prompt`)."""
    return {
        (r.route, r.prompt_ids): r.teacher_prompt_ids
        for data in prepared
        if data is not None
        for r in data.records
        if r.teacher_prompt_ids is not None
    }


def scored_prompt(views: TeacherViews, route: str | None, prompt_ids: Sequence[int]) -> Sequence[int]:
    """The prompt a sample's teacher scores its response after: its own view of the record, else the
    student's prompt."""
    return views.get((route, tuple(prompt_ids)), prompt_ids) if views else prompt_ids


@dataclass
class PreparedData:
    """The records of one source and what preparing them did."""

    records: list[PromptRecord]
    truncated: int = 0
    """Prompts cut to maxPromptTokens tokens (overlongPrompts: truncate)."""
    dropped: int = 0
    """Prompts longer than maxPromptTokens left out (overlongPrompts: drop)."""
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


@dataclass(frozen=True)
class Rendered:
    """A row's prompt ids and the reference response its conversation carried (messages rows)."""

    ids: list[int]
    response: str | None = None
    turns: list[Turn] | None = None
    """The rendered turns (template only), what `fit` cuts when the prompt is overlong."""


def render_prompt(
    row: dict[str, Any], plan: PromptPlan, templated: bool, tokenizer: Any, where: str
) -> Rendered:
    """Token ids of a row's prompt: a conversation or a user turn through the chat template, or raw text."""
    if plan.source == PromptSource.MESSAGES:
        try:
            conversation = split_conversation(row.get(plan.row_field))
        except ChatRowError as error:
            raise DataError(f"{where}: field {plan.row_field!r} {error}") from error
        turns = with_system(conversation.turns, plan.system_prompt)
        return Rendered(render(tokenizer, turns, plan.template_kwargs), conversation.response, turns)
    text = row.get(plan.row_field)
    if not isinstance(text, str) or not text:
        raise DataError(f"{where}: field {plan.row_field!r} is missing or not a non-empty string")
    if templated:
        turns = with_system([{"role": "user", "content": text}], plan.system_prompt)
        return Rendered(render(tokenizer, turns, plan.template_kwargs), turns=turns)
    return Rendered(list(tokenizer(text, add_special_tokens=True)["input_ids"]))


def shorten(rendered: Rendered, limit: int, tokenizer: Any, plan: PromptPlan) -> list[int] | None:
    """An overlong prompt cut to `limit` tokens: templated ones by `chat.fit` (the template's tokens kept),
    raw text to its last tokens. None when the template alone is longer than the limit."""
    if rendered.turns is None:
        return rendered.ids[-limit:]
    return fit(
        rendered.turns,
        limit,
        lambda turns: render(tokenizer, turns, plan.template_kwargs),
        lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]),
        lambda ids: str(tokenizer.decode(ids)),
    )


def with_teacher_context(rendered: Rendered, context: str) -> list[Turn]:
    """A templated prompt's turns as a teacher with `context` sees them (`prompts.with_context`)."""
    assert rendered.turns is not None  # a context needs the template (`uses_template`)
    turns = rendered.turns
    own = turns[0]["content"] if turns and turns[0]["role"] == "system" else None
    rest = turns[1:] if own is not None else turns
    return [{"role": "system", "content": with_context(own, context)}, *rest]


def prepare(
    source: DataSource,
    data: Data,
    tokenizer: Any,
    prompts: PromptPlan | None = None,
    routes: RouteTable | None = None,
) -> PreparedData:
    """Tokenize every row of a source; overlong prompts are rejected (all named), dropped or truncated
    (counted). `prompts`: the plan's (default: `data`'s alone, no teacher contexts); `routes`: which teacher
    scores each row, whose context (`PromptPlan.teacher_contexts`) then renders its teacher's own prompt. That
    prompt must fit `data.maxPromptTokens` too: an overlong one is rejected, dropped or cut as the student's."""
    plan = prompts or resolve_prompts(data)
    try:
        templated = uses_template(plan, bool(getattr(tokenizer, "chat_template", None)))
    except TemplateRequired as error:
        raise DataError(f"{source.path}: {error}") from error
    path, rows = load_rows(source)
    records: list[PromptRecord] = []
    overlong: list[tuple[int, int]] = []
    dropped: list[PromptRecord] = []
    truncated = 0
    limit = plan.max_tokens
    for index, row in enumerate(rows):
        where = f"{source.path} row {index}"
        rendered = render_prompt(row, plan, templated, tokenizer, where)
        views = [rendered]
        context = _context(row, data, plan, routes)
        if context is not None:
            turns = with_teacher_context(rendered, context)
            views.append(Rendered(render(tokenizer, turns, plan.template_kwargs), turns=turns))
        fitted: list[list[int]] = []
        for view in views:
            ids = view.ids
            if len(ids) > limit and plan.overlong == OverlongPolicy.TRUNCATE:
                cut = shorten(view, limit, tokenizer, plan)
                if cut is None:
                    raise DataError(
                        f"{where}: the chat template with the system turn alone is longer than "
                        f"data.maxPromptTokens={limit}; raise maxPromptTokens or shorten "
                        + ("data.systemPrompt" if view is rendered else "the teacher's systemPrompt")
                    )
                ids = cut
            fitted.append(ids)
        longest = max(len(view.ids) for view in views)
        if longest > limit:
            if plan.overlong == OverlongPolicy.REJECT:
                overlong.append((index, longest))
                continue
            if plan.overlong == OverlongPolicy.DROP:
                dropped.append(PromptRecord(index=index, prompt_ids=()))
                continue
            truncated += 1
        record = _record(index, row, fitted[0], rendered.response, data, tokenizer)
        if context is not None:
            record = dataclasses.replace(record, teacher_prompt_ids=tuple(fitted[1]))
        records.append(record)
    if overlong:
        shown = ", ".join(f"row {i} ({n} tokens)" for i, n in overlong[:10])
        more = f" and {len(overlong) - 10} more" if len(overlong) > 10 else ""
        counted = " (a teacher's prompt with its systemPrompt counted)" if plan.teacher_contexts else ""
        raise DataError(
            f"{source.path}: {len(overlong)} prompt(s) longer than data.maxPromptTokens={limit}{counted}: "
            f"{shown}{more}; raise maxPromptTokens or set data.overlongPrompts: drop or truncate"
        )
    if not records:
        raise DataError(
            f"{source.path}: no rows" + (f" left after dropping {len(dropped)}" if dropped else "")
        )
    prepared = PreparedData(
        records=records, truncated=truncated, dropped=len(dropped), source=path, rows=len(rows)
    )
    if truncated:
        prepared.notes.append(f"{truncated} prompt(s) truncated to {limit} tokens")
    if dropped:
        prepared.notes.append(
            f"{len(dropped)} prompt(s) longer than data.maxPromptTokens={limit} dropped ({_rows(dropped)})"
        )
    return prepared


def _context(row: dict[str, Any], data: Data, plan: PromptPlan, routes: RouteTable | None) -> str | None:
    """The context of the teacher that scores `row` (None: it sees the student's prompt)."""
    if not plan.teacher_contexts or routes is None:
        return None
    route = row.get(data.route_field)
    teacher = routes.teacher_for(None if route is None else str(route))
    return None if teacher is None else plan.teacher_contexts.get(teacher)


def _record(
    index: int,
    row: dict[str, Any],
    ids: list[int],
    conversation_response: str | None,
    data: Data,
    tokenizer: Any,
) -> PromptRecord:
    """A row's record: route, reference answer and response (a messages row's last assistant turn stands in
    for the fields the row does not have)."""
    response = row.get(data.response_field) if data.response_field else None
    if not isinstance(response, str):
        response = conversation_response
    response_ids = None
    if response is not None:
        encoded = tokenizer(response, add_special_tokens=False)["input_ids"]
        response_ids = (*encoded, tokenizer.eos_token_id)
    route = row.get(data.route_field)
    answer = row.get(data.answer_field) if data.answer_field else None
    if answer is None:
        answer = conversation_response
    return PromptRecord(
        index=index,
        prompt_ids=tuple(ids),
        route=None if route is None else str(route),
        answer=None if answer is None else answer_text(answer),
        response_ids=response_ids,
    )


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
            what = (
                f"a final assistant turn in {spec.data.messages_field!r}"
                if spec.data.messages_field
                else f"a string {spec.data.response_field!r}"
            )
            problems.append(
                f"{len(missing)} row(s) without {what}, which the off-policy share needs "
                f"(loss.onPolicyFraction={spec.loss.on_policy_fraction} < 1) ({_rows(missing)})"
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
