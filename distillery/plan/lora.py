"""A LoRA student's adapter, resolved: its peft settings and what it costs (pure).

`resolve_lora` turns `spec.student.lora` into the `LoraSettings` that the trainer ranks, the rollout
engines and the checkpoints all read, its target modules decided once (the architecture's linear layers
unless the spec names them). `adapter_params` counts the adapter of a Llama/Qwen-style decoder from its
shape (`model_shapes.ModelShape`): r x (d_in + d_out) for each adapted linear layer of each decoder layer,
what `distillery plan` prints, the memory plan charges and a weight sync sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from distillery.api.spec import DistillationJobSpec
from distillery.model_shapes import ModelShape

DECODER_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama-style decoder layer: attention's four projections and the gated MLP's
three. Adapting all of them, not attention alone, is what lets LoRA match full fine-tuning at the ranks
on-policy distillation uses (Thinking Machines, "LoRA Without Regret", 2025)."""

ALL_LINEAR = "all-linear"
"""peft's own choice for an architecture we do not know: every linear layer except the output head."""

KNOWN_ARCHITECTURES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "gemma", "gemma2", "phi3"}
)
"""`model_type`s whose decoder layers name their linear layers as DECODER_LINEAR_MODULES (phi3 fuses qkv and
gate/up: peft's names there are the fused ones, so it is matched as all-linear below)."""


@dataclass(frozen=True)
class LoraSettings:
    """The adapter as peft's LoraConfig takes it (`distillery_runtime.training.lora` translates it)."""

    rank: int
    alpha: int
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = DECODER_LINEAR_MODULES
    """Module names, or ALL_LINEAR."""
    modules_to_save: tuple[str, ...] = ()

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def default_target_modules(model_type: str | None) -> tuple[str, ...] | str:
    """The decoder's linear layers for the architectures we know, peft's all-linear otherwise."""
    if model_type in KNOWN_ARCHITECTURES and model_type != "phi3":
        return DECODER_LINEAR_MODULES
    return ALL_LINEAR


def model_type(model: str) -> str | None:
    """`model_type` of a local model folder's config.json; None for a hub id or a remote location (the
    rank resolves it again where the files are)."""
    config = Path(model) / "config.json"
    if "://" in model or not config.is_file():
        return None
    try:
        value = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def resolve_lora(spec: DistillationJobSpec, student_type: str | None = None) -> LoraSettings | None:
    """The spec's adapter (None: full fine-tuning). `student_type`: the student's `model_type` where the
    caller has read it; else read from a local model folder."""
    lora = spec.student.lora
    if lora is None:
        return None
    if lora.target_modules is not None:
        targets: tuple[str, ...] | str = tuple(lora.target_modules)
    else:
        targets = default_target_modules(student_type or model_type(spec.student.model))
    return LoraSettings(
        rank=lora.rank,
        alpha=lora.alpha if lora.alpha is not None else 2 * lora.rank,
        dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=tuple(lora.modules_to_save),
    )


def module_dims(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each linear layer of a decoder layer."""
    q_dim = shape.heads * shape.dim_per_head
    return {
        "q_proj": (shape.hidden, q_dim),
        "k_proj": (shape.hidden, shape.kv_dim),
        "v_proj": (shape.hidden, shape.kv_dim),
        "o_proj": (q_dim, shape.hidden),
        "gate_proj": (shape.hidden, shape.intermediate),
        "up_proj": (shape.hidden, shape.intermediate),
        "down_proj": (shape.intermediate, shape.hidden),
    }


def adapter_params(shape: ModelShape, lora: LoraSettings) -> int:
    """Parameters of the adapter on a decoder of `shape` (all-linear: the seven projections; a module
    name the shape does not know counts nothing: the runtime's count is then the truth), plus any
    modules trained whole (`lm_head` or `embed_tokens`: vocabulary x hidden)."""
    dims = module_dims(shape)
    names = DECODER_LINEAR_MODULES if lora.target_modules == ALL_LINEAR else lora.target_modules
    per_layer = sum(lora.rank * sum(dims[name]) for name in names if name in dims)
    whole = sum(
        shape.vocab * shape.hidden for name in lora.modules_to_save if name in ("lm_head", "embed_tokens")
    )
    return shape.layers * per_layer + whole


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `max_lora_rank` values vLLM takes."""


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM takes that holds `rank` (the API bounds the rank by the largest)."""
    return next(size for size in VLLM_LORA_RANKS if size >= rank)


def describe(lora: LoraSettings, shape: ModelShape | None, compute_bytes: int) -> list[str]:
    """`distillery plan`'s lines on the adapter: its settings, parameters, and the bytes a weight sync
    sends per step against full fine-tuning's."""
    targets = lora.target_modules if isinstance(lora.target_modules, str) else ", ".join(lora.target_modules)
    lines = [
        f"LoRA: rank {lora.rank}, alpha {lora.alpha:g} (scale {lora.scale:g}), dropout {lora.dropout:g}, "
        f"targets {targets}"
        + (f", trained whole {', '.join(lora.modules_to_save)}" if lora.modules_to_save else "")
    ]
    if shape is None:
        lines.append("  adapter size: the student's shape is unknown here (counted by the trainer at start)")
        return lines
    adapter = adapter_params(shape, lora)
    lines.append(
        f"  adapter {adapter / 1e6:.2f}M parameters = {100 * adapter / shape.params:.2f}% of the student's "
        f"{shape.params / 1e6:.1f}M"
    )
    lines.append(
        f"  weight sync per step: {compute_bytes * adapter / 1e6:.1f} MB (the adapter) against "
        f"{compute_bytes * shape.params / 1e6:.1f} MB for full fine-tuning"
    )
    return lines
