"""A teacher server's compact scoring for many jobs: fair admission (`fair_share`) and per-job accounting
(`busy_time`, `server_metrics`) around each request's call into the engine.

The teacher server runs every `POST /distillery/v1/score` through `JobServing.run`; what it decides
is in the pure modules, what it records goes to the metrics.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from distillery_runtime.teachers.serving.busy_time import BusyTime
from distillery_runtime.teachers.serving.fair_share import FairShare
from distillery_runtime.teachers.serving.server_metrics import TeacherServerMetrics
from distillery_runtime.teachers.wire import WireSequence

T = TypeVar("T")


class JobServing:
    """One replica's scoring requests, admitted fairly across jobs and accounted per job."""

    def __init__(
        self, capacity: int, metrics: TeacherServerMetrics, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        """`capacity`: sequences in the engine at most (the server's `--distillery-max-in-flight`)."""
        self.share = FairShare(capacity)
        metrics.waiting.set_function(lambda: self.share.waiting_sequences)
        self.busy = BusyTime(clock)
        self.metrics = metrics
        self.clock = clock

    async def run(self, job: str, sequences: Sequence[WireSequence], score: Callable[[], Awaitable[T]]) -> T:
        """`score()` once the job's turn comes, with room for its sequences; its answer."""
        arrived = self.clock()
        tokens = sum(len(s.token_ids) for s in sequences)
        async with self.share.slot(job, len(sequences)):
            self.metrics.waited(job, self.clock() - arrived)
            key = object()
            self.metrics.attribute(self.busy.start(key, job, tokens))
            try:
                answer = await score()
            finally:
                self.metrics.attribute(self.busy.finish(key))
        self.metrics.answered(job, tokens, self.clock() - arrived, sequences=len(sequences))
        return answer
