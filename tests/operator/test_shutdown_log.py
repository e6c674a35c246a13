"""The operator's event-loop exception handler while it stops (`main.quiet_watch_finalizer`): a kopf
watch-stream that asyncio's last clean-up cannot close is a debug line, any other failure stays an error.

Through asyncio's own shutdown (`asyncio.run` closing the async generators left open), with generators
that refuse to close, as kopf's `infinite_watch` once did in CI ("generator didn't stop after athrow()")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from distillery_operator.main import quiet_watch_finalizer

LEFT_OPEN: list[AsyncIterator[int]] = []
"""Held here so that the generators stay open until asyncio.run closes them."""


async def infinite_watch() -> AsyncIterator[int]:  # kopf's name
    try:
        yield 1
    finally:
        yield 2  # ignores GeneratorExit: closing it raises RuntimeError


async def a_stream_of_ours() -> AsyncIterator[int]:
    try:
        yield 1
    finally:
        yield 2


def test_only_a_kopf_watch_stream_closed_at_shutdown_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(quiet_watch_finalizer)
        for generator in (infinite_watch(), a_stream_of_ours()):
            await generator.__anext__()
            LEFT_OPEN.append(generator)

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    LEFT_OPEN.clear()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "a_stream_of_ours" in str(errors[0].__dict__) and "infinite_watch" not in str(errors[0].__dict__)
    assert any(
        r.name == "distillery.operator" and "watch-stream closed at shutdown" in r.getMessage()
        for r in caplog.records
    )
