"""The DistillationJob's environment (`spec.environment`): what answers the student's tool calls, so that a
rollout is a multi-turn episode (the student writes, stops at a call, the environment's observation is
appended, the student goes on) instead of one response."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import MAX_LOCATION, MAX_NAME, MAX_STOP_STRINGS, WHITESPACE, StopString
from distillery.api.data import FUNCTION_RE


class ToolCallFormat(StrEnum):
    CHAT_TEMPLATE = "chat_template"
    STOP_SEQUENCE = "stop_sequence"


class Environment(ApiModel):
    """A tool-using student's environment: one instance per episode, reset with the row's prompt and answer,
    then stepped with each turn the student writes until it answers `done` or a limit ends the episode.
    The loss, the eval KL and the metrics count only the tokens the student wrote; the environment's
    (its observations) are context the teachers read too."""

    module: str | None = Field(default=None, max_length=MAX_NAME, pattern=FUNCTION_RE)
    """`package.module:Class`, importable in the runtime image: one instance per episode, with
    `reset(prompt, answer)`, `step(output) -> (observation, done)` or `(observation, done, error)` (error:
    the call was a misuse the tool answered, counted in episode/tool_errors) and optionally `reward()`, a
    score in [0, 1] that grades the episode in place of data.grader."""
    url: str | None = Field(
        default=None, pattern=f"^https?://[^{WHITESPACE}/]+(/[^{WHITESPACE}]*)?$", max_length=MAX_LOCATION
    )
    """An HTTP service (a Service in the cluster): POST `{url}/reset`, `{url}/step` and `{url}/reward` with
    JSON bodies naming the episode (`{"episode": ID, ...}`), answering as `module` does (docs/guide/agents.md)."""
    tool_call_format: ToolCallFormat = ToolCallFormat.CHAT_TEMPLATE
    """chat_template: a turn ends at the chat template's tool call (Qwen's `<tool_call>{json}</tool_call>`)
    and each observation is appended as the template's tool message, then the next assistant turn's
    header; stop_sequence: a turn ends at one of `stop` and the observation's text is appended as it is."""
    stop: list[StopString] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    """stop_sequence only: the strings that end a turn with a tool call (kept in the turn, which the
    environment then reads)."""
    max_turns: int = Field(default=8, ge=1, le=256)
    """Student turns an episode may take; the last one is not answered by the environment."""
    max_tokens: int | None = Field(default=None, ge=1, le=131072)
    """Tokens of the whole episode after its prompt (the student's turns and the observations). Unset:
    student.rollout.maxNewTokens times maxTurns. It sizes the engines' context and the trainer's memory
    plan, as maxNewTokens does for one turn; student.rollout.maxNewTokens still bounds each turn."""
    step_timeout_seconds: float = Field(default=30.0, gt=0.0, le=3600.0)
    """How long one call of the environment (reset, step or reward) may take before its episode ends
    (counted in episode/environment_failures, kept as far as it went)."""

    rules = (
        Rule(
            check=lambda e: (e.module is None) != (e.url is None),
            cel="has(self.module) != has(self.url)",
            message="exactly one of module and url is required",
            field="module",
        ),
        Rule(
            check=lambda e: (len(e.stop) > 0) == (e.tool_call_format == ToolCallFormat.STOP_SEQUENCE),
            cel="(has(self.stop) && self.stop.size() > 0) == (self.toolCallFormat == 'stop_sequence')",
            message="is required for toolCallFormat stop_sequence and not allowed for chat_template",
            field="stop",
        ),
    )
