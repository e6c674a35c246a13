"""A keyed work queue in the style of client-go's: deduplicated, one worker per key, backoff on errors.

Watch events only add keys; workers take a key, reconcile the whole job from the latest state and mark
it done. A key added while it is being processed is processed again afterwards (never concurrently), so
the newest state always wins and a burst of events costs one reconcile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Backoff:
    """Exponential per-key delay: base, 2 x base, ... up to cap; reset by `forget`."""

    base: float = 0.5
    cap: float = 60.0
    failures: dict[Hashable, int] = field(default_factory=dict)

    def next_delay(self, key: Hashable) -> float:
        count = self.failures.get(key, 0)
        self.failures[key] = count + 1
        return min(self.cap, self.base * (2**count))

    def forget(self, key: Hashable) -> None:
        self.failures.pop(key, None)


class WorkQueue(Generic[K]):
    def __init__(self, backoff: Backoff | None = None):
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self.backoff = backoff or Backoff()

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: K) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Adds the key after `delay` seconds; an earlier pending timer for the key is kept if sooner."""
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: K) -> float:
        delay = self.backoff.next_delay(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self.backoff.forget(key)

    def drop(self, key: K) -> None:
        """Forgets everything about a key (its job is gone)."""
        self.forget(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def get(self) -> K:
        while True:
            key = await self._queue.get()
            if key in self._dirty and key not in self._processing:
                self._dirty.discard(key)
                self._processing.add(key)
                return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.put_nowait(key)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
