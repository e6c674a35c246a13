"""The shape of a decoder-only student (sizes only, no weights), for the memory plan.

A shape comes from the model's own `config.json` when `student.model` is a local folder that holds one,
or from a table of well-known Hugging Face models (their published configs), so that `distillery
validate` answers without a download, a network or torch. Unknown models get no plan (None).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a Llama/Qwen/Mistral-style decoder depends on."""

    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    head_dim: int | None = None

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.dim_per_head

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention, gated MLP, two RMSNorms."""
        q_dim = self.heads * self.dim_per_head
        attention = self.hidden * (q_dim + 2 * self.kv_dim) + q_dim * self.hidden
        if self.qkv_bias:
            attention += q_dim + 2 * self.kv_dim
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        """Input embedding, output head (unless tied) and the final norm."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params

    @property
    def token_params(self) -> int:
        """Parameters a token's forward multiplies by: the layers and the output head (the input embedding
        is a lookup)."""
        return self.layers * self.layer_params + self.vocab * self.hidden


def _qwen2(
    hidden: int, layers: int, intermediate: int, heads: int, kv: int, vocab: int, tied: bool
) -> ModelShape:
    return ModelShape(hidden, layers, intermediate, vocab, heads, kv, tied_embeddings=tied, qkv_bias=True)


def _llama(hidden: int, layers: int, intermediate: int, heads: int, kv: int, vocab: int) -> ModelShape:
    return ModelShape(hidden, layers, intermediate, vocab, heads, kv)


KNOWN_SHAPES: dict[str, ModelShape] = {
    # Qwen2.5 (the -Instruct, -Math and -Coder variants share the base shapes).
    "qwen2.5-0.5b": _qwen2(896, 24, 4864, 14, 2, 151936, tied=True),
    "qwen2.5-1.5b": _qwen2(1536, 28, 8960, 12, 2, 151936, tied=True),
    "qwen2.5-3b": _qwen2(2048, 36, 11008, 16, 2, 151936, tied=True),
    "qwen2.5-7b": _qwen2(3584, 28, 18944, 28, 4, 152064, tied=False),
    "qwen2.5-14b": _qwen2(5120, 48, 13824, 40, 8, 152064, tied=False),
    "qwen2.5-32b": _qwen2(5120, 64, 27648, 40, 8, 152064, tied=False),
    "qwen2.5-72b": _qwen2(8192, 80, 29568, 64, 8, 152064, tied=False),
    # Llama 3 / 3.1 (same shapes).
    "llama-3-8b": _llama(4096, 32, 14336, 32, 8, 128256),
    "llama-3.1-8b": _llama(4096, 32, 14336, 32, 8, 128256),
    "llama-3-70b": _llama(8192, 80, 28672, 64, 8, 128256),
    "llama-3.1-70b": _llama(8192, 80, 28672, 64, 8, 128256),
}
"""Lower-case model names without the organisation, e.g. `Qwen/Qwen2.5-7B-Instruct` -> `qwen2.5-7b`."""

_SUFFIXES = ("-instruct", "-math", "-coder", "-base", "-chat")


def known_shape(model: str) -> ModelShape | None:
    """The shape of a well-known Hugging Face id (`Qwen/Qwen2.5-7B-Instruct`, `meta-llama/Meta-Llama-3-8B`)."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower().removeprefix("meta-")
    for suffix in _SUFFIXES:
        name = name.replace(suffix, "")
    name = name.replace("qwen2.5-math", "qwen2.5").replace("qwen2.5-coder", "qwen2.5")
    return KNOWN_SHAPES.get(name)


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """A shape from a Hugging Face `config.json` (Llama, Qwen2, Mistral naming)."""
    heads = int(config["num_attention_heads"])
    return ModelShape(
        hidden=int(config["hidden_size"]),
        layers=int(config["num_hidden_layers"]),
        intermediate=int(config["intermediate_size"]),
        vocab=int(config["vocab_size"]),
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)),
        head_dim=config.get("head_dim"),
    )


def resolve_shape(model: str) -> ModelShape | None:
    """`config.json` of a local folder, else the table; None when neither knows the model."""
    config = Path(model) / "config.json"
    if "://" not in model and config.is_file():
        try:
            return shape_from_config(json.loads(config.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return known_shape(model)
