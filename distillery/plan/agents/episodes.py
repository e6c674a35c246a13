"""A tool-using student's episodes (`spec.environment`), decided once: where a turn ends with a call, how
long an episode may grow, how long one environment call may take, and how long a response can be, which
sizes the engines' context and the trainer's memory plan (`response_tokens`). The runtime's episode runner
(`distillery_runtime.agents`) and the renderers only read these."""

from __future__ import annotations

from dataclasses import dataclass

from distillery.api.environment import ToolCallFormat
from distillery.api.spec import DistillationJobSpec

CHAT_TEMPLATE_CALL_END = "</tool_call>"
"""Where a chat template's tool call ends (Qwen2.5/Qwen3's `<tool_call>{json}</tool_call>`, as Hermes
writes it): a turn that writes it stops there and is answered by the environment."""


@dataclass(frozen=True)
class EpisodeSettings:
    """How a job's rollouts play episodes."""

    module: str | None
    url: str | None
    tool_call_format: ToolCallFormat
    call_ends: tuple[str, ...]
    """Strings that end a turn with a tool call; the turn keeps them (the environment reads the call)."""
    max_turns: int
    max_tokens: int
    """Tokens of the episode after its prompt: the student's turns and the observations."""
    turn_tokens: int
    """The most one turn may write (student.rollout.maxNewTokens; less when the episode's budget is short)."""
    step_timeout_s: float

    @property
    def source(self) -> str:
        """The environment as the job names it, for logs and errors."""
        return f"spec.environment.module {self.module}" if self.module else f"spec.environment.url {self.url}"


def resolve_episodes(spec: DistillationJobSpec) -> EpisodeSettings | None:
    """None when the job has no environment (one response per prompt)."""
    env = spec.environment
    if env is None:
        return None
    turn = spec.student.rollout.max_new_tokens
    budget = env.max_tokens if env.max_tokens is not None else turn * env.max_turns
    if env.tool_call_format == ToolCallFormat.CHAT_TEMPLATE:
        ends: tuple[str, ...] = (CHAT_TEMPLATE_CALL_END,)
    else:
        ends = tuple(dict.fromkeys(env.stop))
    return EpisodeSettings(
        module=env.module,
        url=env.url,
        tool_call_format=env.tool_call_format,
        call_ends=ends,
        max_turns=env.max_turns,
        max_tokens=budget,
        turn_tokens=min(turn, budget),
        step_timeout_s=env.step_timeout_seconds,
    )


def response_tokens(spec: DistillationJobSpec) -> int:
    """The longest response a sample can have: one turn's maxNewTokens, or a whole episode's budget."""
    episodes = resolve_episodes(spec)
    return spec.student.rollout.max_new_tokens if episodes is None else episodes.max_tokens


def episode_lines(spec: DistillationJobSpec) -> list[str]:
    """`distillery plan`'s lines on the episodes (none without an environment)."""
    e = resolve_episodes(spec)
    if e is None:
        return []
    ends = ", ".join(repr(s) for s in e.call_ends)
    return [
        f"episodes: {e.source}, {e.tool_call_format.value} tool calls (a turn ends with a call at {ends})",
        f"  up to {e.max_turns} turns of at most {e.turn_tokens} tokens, {e.max_tokens} tokens an episode "
        f"after its prompt (the engines' context and the trainer's memory are sized by it); "
        f"{e.step_timeout_s:g} s per environment call",
        "  the loss, the eval KL and the metrics count the student's tokens only (observations are context)",
    ]
