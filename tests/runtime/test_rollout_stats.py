"""A step's response statistics: lengths and the share of sampled responses cut at maxNewTokens."""

from __future__ import annotations

import pytest
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.observe.rollout_stats import response_stats


def _sample(n: int, finish: str | None) -> RolloutSample:
    return RolloutSample(f"s{n}", [1, 2], list(range(n)), None, finish_reason=finish)


def test_lengths_and_truncated_fraction() -> None:
    stats = response_stats(
        [_sample(4, "stop"), _sample(8, "length"), _sample(3, "stop"), _sample(8, "length")]
    )
    assert stats["rollout/response_length_mean"] == pytest.approx(23 / 4)
    assert stats["rollout/response_length_max"] == 8
    assert stats["rollout/truncated_fraction"] == pytest.approx(0.5)


def test_dataset_responses_have_lengths_but_no_truncation() -> None:
    stats = response_stats([_sample(5, None), _sample(2, None)])
    assert stats["rollout/truncated_fraction"] == 0.0 and stats["rollout/response_length_max"] == 5
    assert response_stats([])["rollout/response_length_mean"] == 0.0
