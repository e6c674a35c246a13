"""Fair admission of scoring requests from many jobs into one teacher engine (a shared teacher).

Each job (`X-Distillery-Job`) has a FIFO queue of requests; a request is admitted into the engine while
at most `capacity` sequences (the engine's slots: a sequence is one vLLM request) are in flight over all
jobs. Whenever slots free up and several jobs wait, the head of the job with the fewest sequences in flight
goes next (ties: the job admitted least recently). So jobs active at the same time converge to equal shares
of the slots, whatever their backlog: a job that queues 100 requests delays a newcomer's request by at
most the completion of one of its in-flight requests, not by its backlog; a job alone uses every slot.

Why here and not vLLM's `--scheduling-policy priority`: that orders vLLM's waiting queue by a number fixed
when a request is submitted (and preempts running requests for it), which cannot express "the job with the
least in flight right now"; and everything queued inside vLLM is past any later decision. Admitting in our
server keeps vLLM's own queue short and already in fair order, and is testable without an engine.

The chosen job's head request waits until it fits, even when a smaller request of another job would: a
large request is never passed over indefinitely.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


def next_job(
    waiting: Iterable[str], in_flight: Mapping[str, int], last_admitted: Mapping[str, int]
) -> str | None:
    """The job whose head request is admitted next: the fewest sequences in flight, then the one admitted
    least recently (never: first), then the order of `waiting`; None when nothing waits. Pure."""
    return min(waiting, key=lambda job: (in_flight.get(job, 0), last_admitted.get(job, -1)), default=None)


@dataclass(slots=True, eq=False)
class _Waiter:
    cost: int
    admitted: asyncio.Future[None]


@dataclass
class FairShare:
    """The admission queues of one engine: `async with share.slot(job, cost)` runs a request's scoring."""

    capacity: int
    """Sequences in flight at most, over all jobs."""
    in_flight: dict[str, int] = field(default_factory=dict)
    """Sequences in flight per job (jobs with none are dropped)."""
    queues: dict[str, deque[_Waiter]] = field(default_factory=dict)
    """Waiting requests per job, oldest first (jobs with none are dropped)."""
    _last_admitted: dict[str, int] = field(default_factory=dict)
    _admissions: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"a teacher admits at least one sequence at a time, not {self.capacity}")

    @property
    def used(self) -> int:
        return sum(self.in_flight.values())

    def waiting(self, job: str) -> int:
        return len(self.queues.get(job, ()))

    @property
    def waiting_sequences(self) -> int:
        """Sequences queued for admission over all jobs: the replica's queue, before vLLM's own."""
        return sum(w.cost for queue in self.queues.values() for w in queue)

    @asynccontextmanager
    async def slot(self, job: str, cost: int = 1) -> AsyncIterator[None]:
        """Wait for the job's turn and room for `cost` sequences (a request larger than the whole capacity
        runs alone), hold them while the body runs."""
        cost = min(max(1, cost), self.capacity)
        waiter = _Waiter(cost, asyncio.get_running_loop().create_future())
        self.queues.setdefault(job, deque()).append(waiter)
        self._dispatch()
        try:
            await waiter.admitted
        except asyncio.CancelledError:
            # The client went away: leave the queue, or give back the slots if admission raced the cancel.
            if waiter.admitted.done() and not waiter.admitted.cancelled():
                self._release(job, cost)
            else:
                self._forget(job, waiter)
            raise
        try:
            yield
        finally:
            self._release(job, cost)

    def _dispatch(self) -> None:
        """Admit heads of queues, fairest job first, while they fit."""
        while True:
            job = next_job(self.queues, self.in_flight, self._last_admitted)
            if job is None:
                return
            head = self.queues[job][0]
            if self.used + head.cost > self.capacity:
                return
            self.queues[job].popleft()
            if not self.queues[job]:
                del self.queues[job]
            self.in_flight[job] = self.in_flight.get(job, 0) + head.cost
            self._admissions += 1
            self._last_admitted[job] = self._admissions
            head.admitted.set_result(None)

    def _release(self, job: str, cost: int) -> None:
        left = self.in_flight.get(job, 0) - cost
        if left > 0:
            self.in_flight[job] = left
        else:
            self.in_flight.pop(job, None)
            if job not in self.queues:
                # Forget an idle job's turn, so that the bookkeeping stays bounded by the active jobs.
                self._last_admitted.pop(job, None)
        self._dispatch()

    def _forget(self, job: str, waiter: _Waiter) -> None:
        queue = self.queues.get(job)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self.queues[job]
        self._dispatch()
