"""Grouping items for batched work: greedy packing in order under a size budget (the trainer's token-packed
micro-batches, the sharded load's broadcast chunks), and padded forwards grouped by length (the trainer's
padded micro-batches, the transformers teacher's forwards), and contiguous near-equal shares (a step's samples
over the trainer ranks, its requests over the rollout replicas)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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


def length_groups(
    lengths: Sequence[int],
    forward_cost: int | None,
    fits: Callable[[int, int, int], bool],
    starts: Sequence[int] | None = None,
) -> list[list[int]]:
    """The indices of items `lengths` tokens long, grouped for right-padded forwards (one row an item, as
    wide as the group's longest), shortest first: the groups whose padded tokens plus `forward_cost` tokens
    a group add up to the least. None: the fewest groups, and of those the least padding.

    `fits(rows, width, start)` says whether a group may be one forward: `rows` items, the longest `width`
    tokens, `start` the least of its items' `starts` (default: their lengths). One item always may, and a
    group that does not fit must not fit with another, shorter item either.

    The groups are runs of the items sorted by length, the best such runs by a dynamic program: a group grows
    from its longest item down and stops at the first that does not fit, O(n x the most rows a group takes).
    Where `fits` reads only rows and width, that is the best grouping of all (swapping items between two
    groups until each is a run of lengths widens neither); a fit that reads `start` may leave a grouping
    of fewer forwards unfound, one that mixes items out of their length order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    lows = lengths if starts is None else starts
    # None: a group costs more than any padding could save (at most every item's full width), so the fewest
    # groups win first, then the least padding among them: exact in integers.
    cost = forward_cost if forward_cost is not None else 1 + len(lengths) * max(lengths, default=0)
    best = [0] + [0] * len(order)  # best[j]: the least cost of grouping the j shortest items
    cut = [0] * (len(order) + 1)  # cut[j]: where the last group of that grouping starts
    for j in range(1, len(order) + 1):
        width = lengths[order[j - 1]]
        start = lows[order[j - 1]]
        best[j], cut[j] = best[j - 1] + width + cost, j - 1
        for i in range(j - 2, -1, -1):
            start = min(start, lows[order[i]])
            if not fits(j - i, width, start):
                break
            total = best[i] + (j - i) * width + cost
            if total <= best[j]:  # a tie: the fewer, larger groups
                best[j], cut[j] = total, i
    groups: list[list[int]] = []
    j = len(order)
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def shard(samples: Sequence[T], world_size: int) -> list[list[T]]:
    """Contiguous, near-equal shards, one per rank or rollout replica (the order is preserved)."""
    n = len(samples)
    bounds = [n * r // world_size for r in range(world_size + 1)]
    return [list(samples[bounds[r] : bounds[r + 1]]) for r in range(world_size)]
