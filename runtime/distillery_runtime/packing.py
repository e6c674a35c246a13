"""Greedy packing of items, in order, into groups under a size budget: the trainer's token-packed
micro-batches and the sharded load's broadcast chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def pack_in_order(items: Iterable[T], size: Callable[[T], int], budget: int) -> list[list[T]]:
    """`items` in their order, grouped so that a group's sizes sum to at most `budget`; an item larger than
    the budget gets a group of its own."""
    out: list[list[T]] = []
    current: list[T] = []
    used = 0
    for item in items:
        n = size(item)
        if current and used + n > budget:
            out.append(current)
            current, used = [], 0
        current.append(item)
        used += n
    if current:
        out.append(current)
    return out
