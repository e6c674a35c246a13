"""A LoRA student's checkpoint: its adapter as peft saves it, and the merged model under the base's names.

The trainer of a LoRA student holds a peft PeftModel: the frozen base (`...q_proj.base_layer.weight`) and
the float32 adapter (`...q_proj.lora_A.default.weight`, `lora_B`, and whole copies of `modules_to_save`).
A checkpoint keeps both things a user wants from it:

  adapter/   the adapter exactly as trained (float32, peft's saved names: `training.lora.save_adapter`):
             what a resume loads onto the job's own student model, and what peft and vLLM load;
  model/     the merged model, W + scale x B @ A for each adapted linear layer and a module trained whole in
             place of the base's, under the base's own names (`model.layers.0.self_attn.q_proj.weight`):
             a plain model that `from_pretrained` and `vllm serve` load as they load full training's.

The merge runs a tensor at a time inside the checkpoint's `WeightStream` (`streamed_export.py`): each
`MergedWeight` names a base weight and the A and B that merge into it, and the stream's gather gathers the
three (under FSDP2 each is a collective every rank joins), merges them in float32 and drops them, so no rank
holds a second whole model. `merged_sources` maps the PeftModel's state dict to those sources.
`AdapterExport` is what `checkpoint.save` writes adapter/ from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from distillery.plan.lora import LoraSettings
from distillery_runtime.training.lora import ADAPTER, save_adapter

PEFT_PREFIX = "base_model.model."
"""What a PeftModel's state keys put before the base model's own."""
BASE_LAYER = ".base_layer."
ORIGINAL = ".original_module."
"""A module trained whole: peft keeps the base's copy under this name (not kept), the trained one under
`.modules_to_save.default.`."""
TRAINED_WHOLE = f".modules_to_save.{ADAPTER}."
UNMERGED = ("lora_embedding_", "lora_magnitude_vector", ".lora_A.", ".lora_B.")
"""Adapter keys that are no base weight: LoRA's A and B (merged into their base weight), and the forms this
merge does not know (an embedding's LoRA, DoRA's magnitudes): those are refused, not silently dropped."""


@dataclass(frozen=True)
class MergedWeight:
    """One tensor of the merged model: a base weight and, where the layer is adapted, its A and B (this
    rank's shards; nothing is gathered until `whole`). Shaped and typed as the base, as a stream's plan
    reads a tensor."""

    base: torch.Tensor
    a: torch.Tensor | None = None
    b: torch.Tensor | None = None
    scale: float = 1.0
    transposed: bool = False
    """peft's fan_in_fan_out (a GPT-2 style Conv1D stores the weight as in x out)."""

    @property
    def shape(self) -> torch.Size:
        return self.base.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    def detach(self) -> MergedWeight:
        return self

    def whole(self, gather: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The merged tensor, whole: `gather` each part (a collective where sharded, every rank the same
        calls), W + scale x B @ A in float32 (the stream casts it to the folder's dtype)."""
        weight = gather(self.base.detach())
        if self.a is None or self.b is None:
            return weight
        a, b = gather(self.a.detach()), gather(self.b.detach())
        delta = b.float() @ a.float()
        return weight.float() + self.scale * (delta.T if self.transposed else delta)


def base_name(key: str) -> str:
    """A PeftModel's state key under the base model's own name."""
    return key.removeprefix(PEFT_PREFIX).replace(BASE_LAYER, ".").replace(TRAINED_WHOLE, ".")


def lora_layers(model: torch.nn.Module) -> dict[str, tuple[float, bool]]:
    """Module name -> (scale, fan_in_fan_out) of each layer carrying the adapter, as peft computes them
    (alpha / r, or alpha / sqrt(r) with rsLoRA): the merge uses peft's own numbers."""
    from peft.tuners.lora import LoraLayer

    return {
        name: (float(module.scaling[ADAPTER]), bool(getattr(module, "fan_in_fan_out", False)))
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.scaling
    }


def merged_sources(
    state: Mapping[str, torch.Tensor], layers: Mapping[str, tuple[float, bool]]
) -> dict[str, torch.Tensor | MergedWeight]:
    """The merged model's tensors by the base's names, in the state's order: a plain tensor where nothing
    merges into it (norms, embeddings, a base layer's bias), a `MergedWeight` for an adapted layer's weight,
    the trained copy of a module trained whole. `layers`: `lora_layers` of the model."""
    out: dict[str, torch.Tensor | MergedWeight] = {}
    for key, tensor in state.items():
        if ORIGINAL in key:
            continue
        if any(part in key for part in UNMERGED):
            if ".lora_A." in key or ".lora_B." in key:
                continue
            raise ValueError(
                f"{key}: this adapter's form is not merged into a kept model (LoRA on linear layers is)"
            )
        module, _, leaf = key.rpartition(BASE_LAYER)
        if leaf == "weight" and module in layers:
            scale, transposed = layers[module]
            a = state[f"{module}.lora_A.{ADAPTER}.weight"]
            b = state[f"{module}.lora_B.{ADAPTER}.weight"]
            out[base_name(key)] = MergedWeight(tensor, a, b, scale, transposed)
        else:
            out[base_name(key)] = tensor
    return out


def tied_base_names(model: torch.nn.Module) -> set[str]:
    """Base names (`base_name`) that share a parameter with an earlier one: the tied LM head, written once."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen and ORIGINAL not in name:
            tied.add(base_name(name))
        seen.setdefault(id(tensor), name)
    return tied


def gather_merged(gather: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Any], torch.Tensor]:
    """A stream's gather over `merged_sources`: a plain tensor gathered as it is, a merged one merged."""

    def whole(source: Any) -> torch.Tensor:
        return source.whole(gather) if isinstance(source, MergedWeight) else gather(source)

    return whole


@dataclass(frozen=True)
class AdapterExport:
    """What a LoRA checkpoint's `adapter/` is written from (`checkpoint.save`)."""

    tensors: Iterable[tuple[str, torch.Tensor]]
    """The adapter, whole, float32, under peft's saved names (rank 0's gather)."""
    lora: LoraSettings
    base_model: str
    """The student model as the job names it (adapter_config.json's base_model_name_or_path)."""

    def write(self, folder: Path) -> Path:
        """The adapter's folder, as peft and vLLM load it (`training.lora.save_adapter`)."""
        return save_adapter(folder, self.tensors, self.lora, self.base_model)
