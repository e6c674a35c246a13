"""How an environment's observation becomes the tokens appended to an episode, as the tool-call format
says: the text as it is (stop_sequence), or the chat template's own tool message followed by the next
assistant turn's header (chat_template). The template's pieces are found by rendering it around markers,
so any template that renders a `tool` message works, with no copy of Qwen's."""

from __future__ import annotations

from typing import Any

from distillery.api.environment import ToolCallFormat

_TURN = "\u2063DISTILLERY-TURN\u2063"
_OBSERVATION = "\u2063DISTILLERY-OBSERVATION\u2063"


class ObservationError(ValueError):
    """The student's chat template cannot append an observation (one line naming the field)."""


def template_frame(tokenizer: Any) -> tuple[str, str]:
    """(text before, text after) an observation in the chat template: what closes the student's turn, opens
    the tool message, then closes it and opens the next assistant turn."""
    turn = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _TURN}]
    try:
        text = tokenizer.apply_chat_template(
            [*turn, {"role": "tool", "content": _OBSERVATION}], tokenize=False, add_generation_prompt=True
        )
    except Exception as error:  # no template, or one that refuses a tool message
        raise ObservationError(
            f"spec.environment.toolCallFormat: chat_template needs the student's chat template to render a "
            f"tool message ({type(error).__name__}: {error}); use stop_sequence"
        ) from error
    if _TURN not in text or _OBSERVATION not in text:
        raise ObservationError(
            "spec.environment.toolCallFormat: chat_template needs the student's chat template to render a "
            "tool message (it dropped it); use stop_sequence"
        )
    after_turn = text[text.index(_TURN) + len(_TURN) :]
    before, _, after = after_turn.partition(_OBSERVATION)
    return before, after


class ObservationEncoder:
    """Tokens of an observation, appended after the student's turn."""

    def __init__(self, tokenizer: Any, tool_call_format: ToolCallFormat) -> None:
        self._tokenizer = tokenizer
        self._frame = (
            template_frame(tokenizer) if tool_call_format == ToolCallFormat.CHAT_TEMPLATE else ("", "")
        )

    def text(self, observation: str) -> str:
        before, after = self._frame
        return before + observation + after

    def encode(self, observation: str) -> list[int]:
        ids = self._tokenizer(self.text(observation), add_special_tokens=False)["input_ids"]
        return [int(i) for i in ids]
