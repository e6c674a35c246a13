"""The records that flow through one step: what the rollout produced and what the trainer consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class EpisodeStats:
    """What one multi-turn episode did (`agents/episodes.py`)."""

    turns: int = 0
    """Turns the student wrote."""
    tool_calls: int = 0
    """Turns that ended in a tool call."""
    tool_errors: int = 0
    """Calls the tool answered as a misuse (the environment's step said `error`)."""
    environment_failures: int = 0
    """Environment calls that raised, timed out or answered wrongly (each ends its episode)."""
    reward: float | None = None
    """The environment's grade of the episode (its `reward()`), which wins over data.grader; None: none."""
    segments: list[tuple[bool, int]] = field(default_factory=list)
    """(written by the student, tokens) of each run of the response, in order: its turns and observations."""


@dataclass
class RolloutSample:
    """One response of the student (or a dataset response, for the off-policy share)."""

    sample_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    """Rollout policy's log-prob of each response token (None for dataset responses)."""
    route: str | None = None
    answer: str | None = None
    policy_version: int = 0
    """Optimizer steps the rollout weights had taken; training step - this = staleness."""
    finish_reason: str | None = None
    student_mask: list[bool] | None = None
    """An episode's: True where the student wrote the response token, False for an environment's
    observation (never trained on). None: the student wrote every token."""
    episode: EpisodeStats | None = None


@dataclass
class TrainSample:
    """A sample with its teacher targets, per response position (R = len(response_ids))."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: np.ndarray | None
    """float32 [R] rollout log-probs (policy-gradient objectives), None = on-policy ratio 1."""
    topk_ids: np.ndarray
    """int32 [R, K] (K may be 0)."""
    topk_logprobs: np.ndarray
    """float32 [R, K]."""
    token_logprobs: np.ndarray
    """float32 [R]: teacher log-prob of each sampled token."""
    teacher_mask: np.ndarray
    """bool [R]: positions the teacher scored."""
    task_advantage: float = 0.0
    teacher: str = ""
