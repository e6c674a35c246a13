"""What a step's responses look like: their lengths and the share cut at `rollout.maxNewTokens`.

A response that hits the length limit ends mid-thought and the student is still trained on it; a rising
truncated fraction says maxNewTokens is too short for the task, or that the student has stopped ending
its turns (a wrong end token, a collapsing policy)."""

from __future__ import annotations

from collections.abc import Sequence

from distillery_runtime.data.samples import RolloutSample

TRUNCATED = "length"
"""The finish reason of a response cut at maxNewTokens (vLLM's; the transformers engine reports the same)."""


def response_stats(samples: Sequence[RolloutSample]) -> dict[str, float]:
    """Mean and max response length in tokens, and the fraction of sampled responses cut by the length
    limit. Dataset responses (the off-policy share) have no finish reason and are not in the fraction."""
    lengths = [len(s.response_ids) for s in samples]
    sampled = [s for s in samples if s.finish_reason is not None]
    cut = sum(s.finish_reason == TRUNCATED for s in sampled)
    return {
        "rollout/response_length_mean": sum(lengths) / len(lengths) if lengths else 0.0,
        "rollout/response_length_max": float(max(lengths, default=0)),
        "rollout/truncated_fraction": cut / len(sampled) if sampled else 0.0,
    }


def episode_stats(samples: Sequence[RolloutSample]) -> dict[str, float]:
    """A tool-using student's episodes (`spec.environment`): turns and tool calls per episode, the calls the
    tool answered as misuses, the environment calls that failed, and the share of response tokens that are
    observations (context, never trained on). Nothing for single-turn responses."""
    episodes = [s.episode for s in samples if s.episode is not None]
    if not episodes:
        return {}
    tokens = sum(n for e in episodes for _by, n in e.segments)
    observed = sum(n for e in episodes for by_student, n in e.segments if not by_student)
    return {
        "episode/turns_mean": sum(e.turns for e in episodes) / len(episodes),
        "episode/tool_calls_mean": sum(e.tool_calls for e in episodes) / len(episodes),
        "episode/tool_errors": float(sum(e.tool_errors for e in episodes)),
        "episode/environment_failures": float(sum(e.environment_failures for e in episodes)),
        "episode/observation_token_fraction": observed / tokens if tokens else 0.0,
    }
