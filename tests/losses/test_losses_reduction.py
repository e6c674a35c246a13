"""One owner of the reduction: a micro-batch's share and the step's normaliser both come from
`reduction_units`, so the shares over micro-batches add up to the whole step's reduction."""

from __future__ import annotations

import pytest
import torch
from distillery_runtime.losses import reduce_tokens, reduction_units

from distillery.api.spec import Reduction

SPLITS = [slice(0, 2), slice(2, 3), slice(3, 7)]
"""Micro-batches of a 7-sequence step, one of a single sequence that has no counted token."""


def _step() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    values = torch.randn(7, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(7, 5, generator=g) < 0.6
    mask[2] = False  # a sequence the teacher scored nothing of
    mask[4, 0] = True
    return values, mask


@pytest.mark.parametrize("reduction", list(Reduction))
def test_micro_batch_shares_add_up_to_the_whole_step(reduction: Reduction) -> None:
    values, mask = _step()
    normaliser = max(int(reduction_units(mask.sum(-1), reduction)), 1)
    shares = [int(reduction_units(mask[part].sum(-1), reduction)) for part in SPLITS]
    accumulated = sum(reduce_tokens(values[part], mask[part], reduction) * share / normaliser
                      for part, share in zip(SPLITS, shares, strict=True))  # fmt: skip
    whole = reduce_tokens(values, mask, reduction)
    if reduction == Reduction.SUM:
        assert normaliser == 1 and shares == [1, 1, 1]
    else:
        assert sum(shares) == normaliser
    torch.testing.assert_close(accumulated, whole, rtol=1e-12, atol=1e-12)


def test_units_count_tokens_sequences_or_one() -> None:
    per_sequence = torch.tensor([3, 0, 2])
    assert int(reduction_units(per_sequence, Reduction.TOKEN_MEAN)) == 5
    assert int(reduction_units(per_sequence, Reduction.SEQUENCE_MEAN)) == 2
    assert int(reduction_units(per_sequence, Reduction.SUM)) == 1
    with pytest.raises(ValueError, match="unknown reduction"):
        reduction_units(per_sequence, "mean")  # type: ignore[arg-type]
