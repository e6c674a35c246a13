"""Samples scored one by one as they stream out of the rollout, sent to the teacher in as few requests as the
stream allows.

Each sample is submitted the moment its rollout ends, so scoring overlaps sampling. Sent one per request,
a burst of short samples (a step whose answers all end in the same few decode iterations) costs a request
each: with 64 five-token answers of the bundled task the teacher server spent 0.133 s on 64 requests
against 0.077 s on one request of 64 (`bench/README.md`). So at most `in_flight` requests are out at a
time; the samples submitted in one turn of the event loop (a burst one engine step finished) are spread
over the free slots, a sample that finds a free slot goes on the loop's next turn (no added latency while
samples trickle in), and the samples that arrive while every slot is taken go together in the next
request, up to `max_tokens` tokens (one sample at least). Nagle's algorithm without its timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from distillery_runtime.teachers.types import ScoreRequest, TeacherScores

SendBatch = Callable[[Sequence[ScoreRequest], int], Awaitable[list[TeacherScores]]]
"""(samples, top_k) -> each sample's scores, in order (one request to the teacher)."""


@dataclass
class _Waiting:
    sample: ScoreRequest
    top_k: int
    future: asyncio.Future[TeacherScores]

    @property
    def tokens(self) -> int:
        return len(self.sample.prompt_ids) + len(self.sample.response_ids)


class Coalescer:
    """Queues single samples and sends them through `send` in batches (see the module docstring)."""

    def __init__(self, send: SendBatch, *, in_flight: int, max_tokens: int) -> None:
        self.send = send
        self.in_flight = max(1, in_flight)
        self.max_tokens = max(1, max_tokens)
        self._queue: list[_Waiting] = []
        self._sending: set[asyncio.Task[None]] = set()
        self._scheduled = False
        self.requests = 0
        """Requests sent so far (a test's and a benchmark's count)."""

    async def score_one(self, sample: ScoreRequest, top_k: int) -> TeacherScores:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[TeacherScores] = loop.create_future()
        self._queue.append(_Waiting(sample, top_k, future))
        if not self._scheduled:
            # Sent on the loop's next turn, not now: the samples submitted in this turn (a burst that one
            # engine step finished) go out together instead of the first alone.
            self._scheduled = True
            loop.call_soon(self._dispatch)
        return await future

    def _dispatch(self) -> None:
        self._scheduled = False
        while self._queue and len(self._sending) < self.in_flight:
            # The waiting samples spread over the free slots (replicas score side by side).
            share = -(-len(self._queue) // (self.in_flight - len(self._sending)))
            batch = self._take(share)
            task = asyncio.create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sent)

    def _take(self, most: int) -> list[_Waiting]:
        """The oldest waiting samples of one top-k, at most `most` and up to the token budget (one at
        least)."""
        first = self._queue[0]
        batch: list[_Waiting] = []
        rest: list[_Waiting] = []
        tokens = 0
        for waiting in self._queue:
            fits = not batch or (len(batch) < most and tokens + waiting.tokens <= self.max_tokens)
            if waiting.top_k == first.top_k and fits and not waiting.future.cancelled():
                batch.append(waiting)
                tokens += waiting.tokens
            elif not waiting.future.cancelled():
                rest.append(waiting)
        self._queue = rest
        return batch

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._dispatch()

    async def _send(self, batch: list[_Waiting]) -> None:
        self.requests += 1
        try:
            scores = await self.send([w.sample for w in batch], batch[0].top_k)
        except asyncio.CancelledError:
            for waiting in batch:
                waiting.future.cancel()
            raise
        except Exception as error:  # every sample of the request gets its error (its caller retries it)
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(error)
            return
        for waiting, one in zip(batch, scores, strict=True):
            if not waiting.future.done():
                waiting.future.set_result(one)

    async def close(self) -> None:
        for task in list(self._sending):
            task.cancel()
        for waiting in self._queue:
            waiting.future.cancel()
        self._queue.clear()
