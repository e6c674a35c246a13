"""A LoRA student in peft's terms: the adapter put on a model, and its tensors named as peft saves them.

`plan.lora.LoraSettings` decides the adapter; this module translates it. The trainer wraps its student
with `apply_lora` (every base weight frozen, the adapter trainable), the rollout engines wrap theirs alike
(the transformers engine) or load the adapter files (vLLM), and a weight sync, an `adapter/` folder and
vLLM all carry the adapter under the names of peft's `adapter_model.safetensors`
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`): `saved_name` turns a live state key
(`...q_proj.lora_A.default.weight`) into that form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from distillery.plan.lora import LoraSettings

ADAPTER = "default"
"""peft's name for the one adapter a model carries."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def peft_config(lora: LoraSettings, *, inference: bool = False) -> Any:
    """peft's LoraConfig of the settings (`inference`: dropout off, as a rollout engine samples)."""
    from peft import LoraConfig

    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=0.0 if inference else lora.dropout,
        target_modules=targets,
        modules_to_save=list(lora.modules_to_save) or None,
        task_type="CAUSAL_LM",
        inference_mode=inference,
    )


def apply_lora(model: torch.nn.Module, lora: LoraSettings, *, inference: bool = False) -> Any:
    """`model` with the adapter put on (a peft PeftModel): every base weight frozen, the adapter (and any
    module trained whole) trainable, A random and B zero, so the model starts as the base."""
    from peft import get_peft_model

    # peft keeps the adapter in float32 beside a bf16 base (autocast_adapter_dtype): its weights, gradients
    # and AdamW state are the trainer's float32 master, as full training's are.
    return get_peft_model(model, peft_config(lora, inference=inference), autocast_adapter_dtype=True)


def is_adapter_key(key: str) -> bool:
    """A state key of the adapter (LoRA A/B or a module trained whole), not of the frozen base."""
    return (
        f".lora_A.{ADAPTER}." in key or f".lora_B.{ADAPTER}." in key or f".modules_to_save.{ADAPTER}." in key
    )


def saved_name(key: str) -> str:
    """The name peft saves a live adapter key under (and vLLM loads): the adapter's name dropped, a module
    trained whole under its own module's name."""
    return key.replace(f".modules_to_save.{ADAPTER}.", ".").replace(f".{ADAPTER}.", ".")


def adapter_items(state: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """The adapter's tensors of a PeftModel's state dict, under their saved names, in the state's order."""
    return [(saved_name(key), tensor) for key, tensor in state.items() if is_adapter_key(key)]


def live_keys(state_keys: Iterable[str]) -> dict[str, str]:
    """Saved name -> live state key, for the adapter keys among `state_keys` (a receiving engine's)."""
    return {saved_name(key): key for key in state_keys if is_adapter_key(key)}


def adapter_config(lora: LoraSettings, base_model: str) -> dict[str, Any]:
    """`adapter_config.json` as peft writes it (peft's own `to_dict`), naming the base model."""
    config = peft_config(lora, inference=True)
    config.base_model_name_or_path = base_model
    out = config.to_dict()
    for key, value in out.items():  # sets (peft's normalised target_modules) are not JSON
        if isinstance(value, set):
            out[key] = sorted(value)
    return dict(out)


def save_adapter(
    folder: str | Path, tensors: Iterable[tuple[str, torch.Tensor]], lora: LoraSettings, base_model: str
) -> Path:
    """An adapter folder loadable by peft (`PeftModel.from_pretrained`) and vLLM (`--lora-modules`): its
    config and its tensors (saved names, contiguous, on CPU). Written beside and renamed into place, so a
    reader (vLLM loading the previous version) never sees half a file."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors}
    partial = folder / f".{ADAPTER_WEIGHTS}.partial"
    save_file(weights, str(partial), metadata={"format": "pt"})
    partial.replace(folder / ADAPTER_WEIGHTS)
    config = folder / f".{ADAPTER_CONFIG}.partial"
    config.write_text(json.dumps(adapter_config(lora, base_model), indent=2, sort_keys=True))
    config.replace(folder / ADAPTER_CONFIG)
    return folder
