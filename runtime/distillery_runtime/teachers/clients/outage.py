"""Teacher outages: the loop waits for an unreachable teacher instead of failing, up to a budget.

A client's own retries (`RetryPolicy.total_timeout`) ride out blips. When they run out the teacher is
*down*: `OutageTracker` records since when, tells the caller how long to wait before trying again
(exponential backoff), reports each change (down, back) once for the whole teacher however many samples
are waiting on it, and raises `TeacherOutageError` when the teacher has been down longer than the budget.
Samples already scored are never thrown away: only the waiting ones wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from distillery_runtime.teachers.types import TeacherUnavailableError


class TeacherOutageError(TeacherUnavailableError):
    """A teacher stayed unreachable longer than the job's outage budget."""


@dataclass(frozen=True)
class OutageChange:
    """A teacher went down (`down` True, with the error that showed it) or came back."""

    teacher: str
    down: bool
    seconds: float
    """Down: the outage budget. Back: how long it was down."""
    error: str = ""


@dataclass
class _Down:
    since: float
    attempts: int = 0
    error: str = ""


class OutageTracker:
    """Which teachers are down since when, and how long a waiting sample sleeps before its next try."""

    def __init__(
        self,
        budget_seconds: float,
        *,
        detected_after: float = 0.0,
        base_delay: float = 1.0,
        max_delay: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[OutageChange], None] | None = None,
    ) -> None:
        """`detected_after`: how long the client had already retried when it gave up, counted as down."""
        self.budget = budget_seconds
        self.detected_after = detected_after
        self.base_delay, self.max_delay = base_delay, max_delay
        self.clock = clock
        self.on_change = on_change
        self._down: dict[str, _Down] = {}

    def failed(self, teacher: str, error: str) -> float:
        """A call to `teacher` gave up: seconds to wait before the next try, or TeacherOutageError."""
        now = self.clock()
        down = self._down.get(teacher)
        if down is None:
            down = self._down[teacher] = _Down(since=now - self.detected_after)
            if self.on_change:
                self.on_change(OutageChange(teacher, True, self.budget, error))
        down.attempts += 1
        down.error = error
        elapsed = now - down.since
        if elapsed >= self.budget:
            raise TeacherOutageError(
                f"teacher {teacher} unreachable for {elapsed:.0f} s, past the outage budget of "
                f"{self.budget:.0f} s; last error: {error}"
            )
        delay = min(self.max_delay, self.base_delay * 2 ** min(down.attempts - 1, 30))
        return min(delay, self.budget - elapsed)

    def recovered(self, teacher: str) -> None:
        """A call to `teacher` succeeded."""
        down = self._down.pop(teacher, None)
        if down is not None and self.on_change:
            self.on_change(OutageChange(teacher, False, self.clock() - down.since))

    def down_seconds(self) -> dict[str, float]:
        """Seconds each currently unreachable teacher has been down."""
        now = self.clock()
        return {name: now - down.since for name, down in self._down.items()}
