"""A LoRA student's adapter in the vLLM rollout engine: each sync's version written as a peft folder of the
engine's own and loaded under a new id in place of the last.

The engine serves the base model with vLLM's LoRA enabled, and a sync carries the adapter alone (peft's
saved names): the engine's own process is the one rank of the sync group (whatever its tensor
parallelism), writes the adapter (`training.lora.save_adapter`) and has vLLM load it, every worker taking
its shard; each request names the current adapter. Until the first sync it samples the base, which is the
adapted model (B starts at zero).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from distillery.plan.lora import LoraSettings


class AdapterVersions:
    """The folder of the adapter versions one engine wrote: the one it serves and the one before (vLLM may
    reload an adapter from its folder). Removed with its owner, or when the process exits."""

    def __init__(self, owner: object) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="distillery-lora-"))
        self._remove = weakref.finalize(owner, shutil.rmtree, self.root, True)

    def load(
        self,
        engine: Any,
        tensors: Sequence[tuple[str, torch.Tensor]],
        lora: LoraSettings,
        *,
        base_model: str,
        version: int,
        previous: Any,
    ) -> Any:
        """`tensors` (saved names) written as the folder of `version` and loaded into `engine` (vLLM's
        `LLMEngine`) in place of `previous` (a `LoRARequest`, or None: the base); the folder before the
        last is removed. Returns the new `LoRARequest`."""
        from vllm.lora.request import LoRARequest

        from distillery_runtime.training.lora import save_adapter

        folder = save_adapter(self.root / f"v{version}", tensors, lora, base_model=base_model)
        if previous is not None:  # before the add: a second sync of one version takes the same id
            engine.remove_lora(previous.lora_int_id)
        adapter = LoRARequest(f"v{version}", version + 1, str(folder))
        engine.add_lora(adapter)
        kept = {folder, Path(previous.lora_path)} if previous is not None else {folder}
        for old in self.root.iterdir():
            if old not in kept:
                shutil.rmtree(old, ignore_errors=True)
        return adapter

    def close(self) -> None:
        self._remove()
