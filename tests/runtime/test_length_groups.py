"""Padded forwards grouped by length (`packing.length_groups`), as the trainer's micro-batches and the
transformers teacher's forwards use it: checked against every grouping of small cases."""

from __future__ import annotations

import itertools
import random

import pytest
from distillery_runtime.data.packing import length_groups
from distillery_runtime.training.trainer import micro_batches, sample_tokens

from tests.runtime.helpers import make_samples


def padded(lengths: list[int], groups: list[list[int]]) -> int:
    return sum(len(g) * max(lengths[i] for i in g) for g in groups)


def every_grouping(items: list[int]):
    """Every partition of `items` into groups (Bell-number many: small cases only)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in every_grouping(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]


def brute_force(lengths: list[int], cost: int | None, rows: int) -> tuple[int, int]:
    """The least (groups, padded) for cost None, else the least padded + cost x groups, over every grouping."""
    best = None
    for grouping in every_grouping(list(range(len(lengths)))):
        if any(len(g) > rows for g in grouping):
            continue
        key = (
            (len(grouping), padded(lengths, grouping))
            if cost is None
            else (padded(lengths, grouping) + cost * len(grouping), 0)
        )
        best = key if best is None or key < best else best
    assert best is not None
    return best


@pytest.mark.parametrize("cost", [None, 0, 3, 10, 40])
def test_the_grouping_is_the_cheapest_of_every_grouping(cost: int | None) -> None:
    rng = random.Random(7)
    for _ in range(40):
        lengths = [rng.randint(1, 30) for _ in range(rng.randint(1, 7))]
        rows = rng.randint(1, 4)
        groups = length_groups(lengths, cost, lambda r, width, start, most=rows: r <= most)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        assert all(len(g) <= rows for g in groups)
        # Shortest first: every group's lengths at most the next one's.
        for a, b in itertools.pairwise(groups):
            assert max(lengths[i] for i in a) <= min(lengths[i] for i in b)
        got = (
            (len(groups), padded(lengths, groups))
            if cost is None
            else (padded(lengths, groups) + cost * len(groups), 0)
        )
        assert got == brute_force(lengths, cost, rows), (lengths, rows, groups)


def test_a_cut_is_made_only_where_it_saves_more_than_a_forward() -> None:
    lengths = [100, 100, 100, 140]
    # One forward: 4 x 140 = 560 padded; cut: 300 + 140 = 440, saving 120 tokens.
    assert length_groups(lengths, 119, lambda r, w, s: True) == [[0, 1, 2], [3]]
    assert length_groups(lengths, 121, lambda r, w, s: True) == [[0, 1, 2, 3]]
    assert length_groups(lengths, None, lambda r, w, s: True) == [[0, 1, 2, 3]]


def test_the_fit_sees_the_least_start_of_the_group() -> None:
    # Starts (a teacher's first kept position) decide the fit, not only rows and width.
    lengths, starts = [10, 10, 10], [5, 1, 5]
    seen = []

    def fits(rows: int, width: int, start: int) -> bool:
        seen.append((rows, width, start))
        return width - start <= 6  # rows of one start 1 never share

    groups = length_groups(lengths, None, fits, starts)
    assert (2, 10, 1) in seen  # the pair holding sample 1 was asked with its start
    assert all(not (1 in g and len(g) > 1) for g in groups)


def test_padded_micro_batches_are_the_plans_grouping_of_the_samples() -> None:
    samples = make_samples(7, 64, 4)  # 5..10 tokens each
    lengths = [sample_tokens(s) for s in samples]
    fewest = micro_batches(samples, 3, None)
    assert len(fewest) == 3 and all(len(b) <= 3 for b in fewest)
    assert sorted(id(s) for b in fewest for s in b) == sorted(id(s) for s in samples)
    for a, b in itertools.pairwise(fewest):
        assert max(map(sample_tokens, a)) <= min(map(sample_tokens, b))
    # A forward that costs nothing: every distinct length its own micro-batch (up to 3 samples).
    free = micro_batches(samples, 3, None, 0)
    assert padded(lengths, [[samples.index(s) for s in b] for b in free]) == sum(lengths)
