"""Which job a teacher replica's busy time belongs to: the rule behind `distillery_teacher_busy_seconds_total`.

The replica is busy while at least one scoring request is in its engine. Time passes in intervals between
two events (a request admitted or finished); each interval is split among the requests in flight during
it in proportion to their tokens (prompt + response of their sequences), and each request's part goes
to its job. The engine batches the requests in flight together and a scoring request is a prefill only,
whose cost grows with its tokens, so a job's part is its share of the work done in that interval. The
parts of all jobs add up to the replica's busy wall time; times the replica's GPUs they are the
accelerator-seconds each job used (the dashboard multiplies by `distillery_teacher_gpus`).

Requests of vLLM's OpenAI endpoints are not counted: a shared teacher's jobs score through the compact
endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field


def split_interval(seconds: float, tokens: Mapping[str, int]) -> dict[str, float]:
    """`seconds` of engine time split among jobs in proportion to their tokens in flight (equally when
    none has tokens); nothing when no job is in flight. Pure."""
    if seconds <= 0 or not tokens:
        return {}
    total = sum(tokens.values())
    if total <= 0:
        return {job: seconds / len(tokens) for job in tokens}
    return {job: seconds * n / total for job, n in tokens.items() if n > 0}


@dataclass
class BusyTime:
    """Requests in flight on one replica; `start` and `finish` return the busy time attributed since the
    previous event, per job."""

    clock: Callable[[], float] = time.perf_counter
    _requests: dict[Hashable, tuple[str, int]] = field(default_factory=dict)
    _since: float = 0.0

    def tokens_by_job(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for job, tokens in self._requests.values():
            out[job] = out.get(job, 0) + tokens
        return out

    def _advance(self) -> dict[str, float]:
        now = self.clock()
        parts = split_interval(now - self._since, self.tokens_by_job())
        self._since = now
        return parts

    def start(self, key: Hashable, job: str, tokens: int) -> dict[str, float]:
        parts = self._advance()
        self._requests[key] = (job, max(0, tokens))
        return parts

    def finish(self, key: Hashable) -> dict[str, float]:
        parts = self._advance()
        self._requests.pop(key, None)
        return parts
