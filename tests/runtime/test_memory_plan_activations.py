"""The memory plan's activation term (distillery/plan/memory/gpu.py) against what a real decoder layer keeps.

The bytes each Hugging Face Qwen2 decoder layer saves for its backward (bfloat16, sdpa attention) are
counted with autograd's saved-tensor hooks, each storage once, and compared with the plan's formula."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from distillery.model_shapes import ModelShape
from distillery.plan.memory.gpu import layer_activation_bytes_per_token


def saved_bytes_per_token(shape: ModelShape, tokens: int = 64) -> float:
    config = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=1, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    layer = model.model.layers[0]
    hidden = torch.randn(1, tokens, shape.hidden, dtype=torch.bfloat16, requires_grad=True)
    position_ids = torch.arange(tokens)[None]
    embeddings = model.model.rotary_emb(hidden, position_ids)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(hidden, attention_mask=None, position_embeddings=embeddings, position_ids=position_ids)
    # Not activations: the layer's weights, and its input (the plan counts that as the previous layer's).
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()} | {
        hidden.untyped_storage().data_ptr()
    }
    return sum(n for ptr, n in storages.items() if ptr not in excluded) / tokens


@pytest.mark.parametrize(
    "shape",
    [
        ModelShape(hidden=256, layers=1, intermediate=1024, vocab=128, heads=4, kv_heads=2, qkv_bias=True),
        ModelShape(hidden=384, layers=1, intermediate=768, vocab=128, heads=6, kv_heads=6, qkv_bias=True),
    ],
    ids=["gqa", "mha"],
)
def test_the_plans_activation_bytes_match_a_real_layer(shape: ModelShape) -> None:
    measured = saved_bytes_per_token(shape)
    assert layer_activation_bytes_per_token(shape) == pytest.approx(measured, rel=0.1)
