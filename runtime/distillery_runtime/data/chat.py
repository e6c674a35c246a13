"""Chat rows as prompts: split a conversation at its last assistant turn, render the prompt with the student's
chat template, and fit an overlong one without cutting the template's own tokens.

Pure in the tokenizer: nothing here reads files or the spec. The template renders with
`add_generation_prompt=True`, so every prompt ends with the assistant header (and whatever the template's
variables add there, e.g. Qwen3's empty think block under enable_thinking=false) the student answers after.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Turn = dict[str, str]


class ChatRowError(ValueError):
    """A row's conversation is not one the template can render; the message names what is wrong."""


@dataclass(frozen=True)
class Conversation:
    """A row's prompt turns and, when the row ends with one, its assistant answer (the reference response)."""

    turns: list[Turn]
    response: str | None = None


def split_conversation(messages: object) -> Conversation:
    """The prompt (every turn before the last assistant turn) and that turn's content as the response.

    A conversation that does not end with an assistant turn is a prompt as a whole: the turns after the last
    answer are what the student is asked, and nothing is split off. The prompt must keep a non-system turn."""
    if not isinstance(messages, list) or not messages:
        raise ChatRowError("must be a non-empty list of messages")
    turns: list[Turn] = []
    for number, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatRowError(f"message {number} is not an object with role and content")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role or not isinstance(content, str):
            raise ChatRowError(f"message {number} needs a string role and a string content")
        turns.append({"role": role, "content": content})
    response = None
    if turns[-1]["role"] == "assistant":
        response = turns.pop()["content"]
    if all(turn["role"] == "system" for turn in turns):
        raise ChatRowError(
            "has no turn before its last assistant turn but a system one: nothing to prompt with"
        )
    return Conversation(turns=turns, response=response)


def with_system(turns: list[Turn], system_prompt: str | None) -> list[Turn]:
    """`system_prompt` as a first system turn, unless there is none or the conversation has its own."""
    if system_prompt is None or (turns and turns[0]["role"] == "system"):
        return turns
    return [{"role": "system", "content": system_prompt}, *turns]


def render(tokenizer: Any, turns: list[Turn], kwargs: Mapping[str, object]) -> list[int]:
    """Token ids of the prompt: the template's text with the generation prompt, encoded as the template
    means it (no BOS added on top: a template that wants one writes it)."""
    text = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False, **kwargs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def fit(
    turns: list[Turn],
    limit: int,
    render_turns: Callable[[list[Turn]], list[int]],
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
) -> list[int] | None:
    """The rendered ids of `turns` cut to at most `limit` tokens, keeping the conversation's tail; None when
    even the template with only the system turn and an empty last turn is longer.

    Only content is cut, never the template's tokens, so the prompt still opens as the template opens and
    ends with the assistant header: whole history turns go first (oldest first, system turn kept), then the
    last turn's content loses its start (its question usually closes it)."""
    ids = render_turns(turns)
    if len(ids) <= limit:
        return ids
    system = turns[:1] if turns[0]["role"] == "system" else []
    history, last = turns[len(system) : -1], turns[-1]
    while history:
        history = history[1:]
        ids = render_turns([*system, *history, last])
        if len(ids) <= limit:
            return ids
    kept = [*system, *history]
    overhead = len(render_turns([*kept, {**last, "content": ""}]))
    if overhead > limit:
        return None
    content = encode(last["content"])
    keep = limit - overhead
    while keep > 0:
        # Decoding a token run re-encodes to a close but not always equal count (merges across the cut, a
        # character split between tokens): shrink by the excess until the rendering fits.
        text = decode(content[-keep:]).lstrip("\ufffd")
        ids = render_turns([*kept, {**last, "content": text}])
        if len(ids) <= limit:
            return ids
        keep -= max(1, len(ids) - limit)
    return render_turns([*kept, {**last, "content": ""}])
