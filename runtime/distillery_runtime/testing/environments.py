"""Environments for tests and the node scenario (`spec.environment.module`), shipped in the runtime image so a
job on the cluster can name them. Each answers in digits and `=` only, which every test tokenizer spells."""

from __future__ import annotations

import time


class Counter:
    """Answers each call with `=N`, N the calls so far; `error` on every even call (a misuse the tool
    reports); done at the `DONE_AFTER`th call; grades nothing."""

    DONE_AFTER = 1_000

    def reset(self, prompt: str, answer: str | None) -> None:
        self.calls = 0
        self.prompt = prompt

    def step(self, output: str) -> tuple[str, bool, bool]:
        self.calls += 1
        return f"={self.calls}", self.calls >= self.DONE_AFTER, self.calls % 2 == 0


class Graded(Counter):
    """A Counter whose reward is 1 once it was called at least twice, else 0."""

    def reward(self) -> float:
        return 1.0 if self.calls >= 2 else 0.0


class Raising(Counter):
    def step(self, output: str) -> tuple[str, bool, bool]:
        raise RuntimeError("the tool broke")


class Hanging(Counter):
    SECONDS = 2.0

    def step(self, output: str) -> tuple[str, bool, bool]:
        time.sleep(self.SECONDS)
        return super().step(output)


class Wrong(Counter):
    def step(self, output: str) -> tuple[str, bool, bool]:
        return 42  # type: ignore[return-value]  # what the protocol refuses, on purpose


class ResetFails(Counter):
    def reset(self, prompt: str, answer: str | None) -> None:
        raise ValueError("no such task")


class NotAnEnvironment:
    """Has no step: refused when the job starts."""

    def reset(self, prompt: str, answer: str | None) -> None: ...
