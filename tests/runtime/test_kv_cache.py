"""The transformers rollout engine's preallocated KV cache decodes as transformers' DynamicCache does."""

from __future__ import annotations

import pytest
import torch
from distillery_runtime.rollout.kv_cache import PreallocatedCache
from distillery_runtime.testing.tiny import build_model, build_tokenizer
from transformers import DynamicCache


def test_preallocated_cache_decodes_as_the_dynamic_cache_through_a_row_selection() -> None:
    """A prefill, decode steps, rows leaving the batch, more steps: every step's logits equal the
    DynamicCache's, and the cache writes in place (its buffer is the one allocated at the prefill)."""
    torch.manual_seed(0)
    model = build_model(build_tokenizer(), hidden=64, layers=2, heads=4, dtype=torch.float32)
    rows, prompt, steps = 5, 7, 6
    ids = torch.randint(5, 200, (rows, prompt))
    caches = {"dynamic": DynamicCache(), "preallocated": PreallocatedCache(prompt + 2 * steps)}
    inputs = {name: ids for name in caches}
    kept = torch.arange(rows)
    positions = torch.arange(prompt)[None, :].expand(rows, -1)
    buffer = None
    for step in range(2 * steps):
        if step == steps:  # two rows end: both caches keep the other three
            kept = torch.tensor([0, 2, 4])
            for name, cache in caches.items():
                cache.batch_select_indices(kept)
                inputs[name] = inputs[name][kept]
            positions = positions[kept]
        logits = {
            name: model(
                input_ids=inputs[name], position_ids=positions, past_key_values=cache, use_cache=True
            ).logits[:, -1]
            for name, cache in caches.items()
        }
        torch.testing.assert_close(logits["preallocated"], logits["dynamic"], rtol=0, atol=1e-5)
        layer = caches["preallocated"].layers[0]
        if buffer is None or step == steps:
            buffer = layer.key_buffer.data_ptr()
        assert layer.key_buffer.data_ptr() == buffer  # written in place between selections
        assert layer.get_seq_length() == caches["dynamic"].get_seq_length()
        token = logits["dynamic"].argmax(-1, keepdim=True)
        inputs = {name: token for name in caches}
        positions = positions[:, -1:] + 1


def test_preallocated_cache_refuses_positions_past_its_budget() -> None:
    cache = PreallocatedCache(4)
    keys = torch.zeros(2, 1, 3, 8)
    cache.update(keys, keys, 0)
    with pytest.raises(ValueError, match="past the batch's budget of 4"):
        cache.update(keys[:, :, :2], keys[:, :, :2], 0)
