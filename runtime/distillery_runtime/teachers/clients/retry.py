"""Retry decisions, kept pure: which failures are worth another try and how long to wait."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by a total time per call.

    `total_timeout` bounds everything (attempts and waits) for one request; `request_timeout`
    bounds a single attempt. Defaults suit a teacher that scores a few thousand tokens per call.
    """

    base_delay: float = 0.05
    max_delay: float = 2.0
    total_timeout: float = 120.0
    request_timeout: float = 60.0
    connect_timeout: float = 5.0
    # after a connection failure an endpoint is avoided for this long (other replicas first)
    endpoint_cooldown: float = 1.0


def backoff_delay(attempt: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait before retry number `attempt` (0-based): uniform in [0, min(cap, base * 2^n)]."""
    ceiling = min(policy.max_delay, policy.base_delay * (2 ** min(attempt, 30)))
    return rng.uniform(0.0, ceiling)


def is_retryable_status(status: int) -> bool:
    """Overload (429), request timeout (408) and server-side failures (5xx) may pass on retry;
    other 4xx answers mean the request itself is wrong."""
    return status in (408, 429) or 500 <= status <= 599
