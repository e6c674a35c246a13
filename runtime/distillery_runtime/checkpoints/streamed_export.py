"""A checkpoint's weights written tensor by tensor from the trainer's shards: master/ and model/ as Hugging
Face safetensors shards, no process ever holding a whole state dict.

The whole-gather path (`TrainerSettings.streamed_export` False, the one before this module) gathers
every tensor of the float32 state dict whole on every rank; rank 0's save_pretrained then writes master/
from it and a cast copy of it into model/: a whole float32 model (and half of one more) on each rank's host
at every checkpoint. Here instead:

  1. every rank plans the same files from the state dict's names, shapes and dtypes alone (`plan_shards`:
     names in state-dict order, a tied duplicate once, grouped by `packing.pack_in_order` into files of at
     most `shard_bytes` of float32);
  2. every rank walks that plan and gathers one tensor at a time (`DTensor.full_tensor`, a collective each
     rank joins; the trainer's `_full`, which also brings an offloaded shard to the group's device);
  3. rank 0 appends the tensor's bytes to the open shard file of master/ (as trained, float32) and of
     model/ (cast to the kept dtype, that tensor only), then drops it.

A shard file's header lists every tensor's offsets, which the plan knows before any data (shapes and dtypes),
so it is written first and the tensors follow as they arrive: safetensors' own `save_file` wants all of a
file's tensors at once and copies them into one bytes object. Rank 0's extra host memory is one whole tensor
and its cast (the embedding, the largest), whatever `shard_bytes`; the files are the layout transformers and
vLLM load (`model-00001-of-0000N.safetensors` + `model.safetensors.index.json`, or one `model.safetensors`).

Why `full_tensor` per parameter and not `get_model_state_dict(full_state_dict=True, cpu_offload=True)`:
torch's call gathers the whole model's state dict on rank 0 (its unit is the module it is given, and a
decoder layer's FSDP unit does not own the root's embedding and head), so bounding it means calling it per
submodule and re-prefixing names; one parameter at a time bounds memory by the largest tensor, keeps the
state dict's own names (the names the files need), and is the gather the weight sync already runs
(`Trainer.stream_weights`).

Tied parameters (an LM head tied to the embedding) are written once, under the first name, as
save_pretrained writes an unsharded model: `from_pretrained` re-ties, vLLM skips the head of a tied model.
A model whose state-dict names are not its checkpoint names (transformers' weight conversions) is not
streamed (`streamable`): save_pretrained knows how to revert them, this writer does not.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from distillery_runtime.data.packing import pack_in_order

log = logging.getLogger(__name__)

SHARD_BYTES = 4 * 1024**3
"""float32 bytes of one master/ file (model/'s in bfloat16 are half): the file count of a published
model on the Hub. Memory does not follow it: a tensor at a time is held, whatever the file size."""
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class Entry:
    """One tensor of the plan: its state-dict name, whole shape and dtype as trained."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def nbytes(self, dtype: torch.dtype | None = None) -> int:
        """Bytes in `dtype` (a floating tensor's kept dtype; None: as trained)."""
        kept = self.kept(dtype)
        return self.numel * torch.empty((), dtype=kept).element_size()

    def kept(self, dtype: torch.dtype | None) -> torch.dtype:
        """The dtype a folder stores it in: floating tensors in the folder's, the others as they are."""
        return dtype if dtype is not None and self.dtype.is_floating_point else self.dtype


def shard_file(index: int, count: int) -> str:
    """transformers' name of file `index` (0-based) of `count`; one file is `model.safetensors`."""
    return SINGLE_FILE if count == 1 else f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def plan_shards(entries: Iterable[Entry], shard_bytes: int) -> list[list[Entry]]:
    """The files, in order, each a list of tensors of at most `shard_bytes` as trained (a larger tensor has a
    file of its own). Within a file the widest dtypes come first, as safetensors' writer orders them, so
    every tensor's data starts aligned to its element size when mapped. Pure: every rank computes the same."""
    files = pack_in_order(list(entries), lambda e: e.nbytes(), shard_bytes)
    return [sorted(group, key=lambda e: -e.itemsize) for group in files]


def header(entries: Sequence[Entry], dtype: torch.dtype | None) -> tuple[bytes, int]:
    """A safetensors file's leading bytes (8-byte little-endian length, then the JSON header padded with
    spaces to a multiple of 8, as safetensors writes it) and the data's total size, for `entries` stored in
    `dtype` (None: as trained) back to back in their order."""
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for entry in entries:
        size = entry.nbytes(dtype)
        meta[entry.name] = {
            "dtype": SAFETENSORS_DTYPES[entry.kept(dtype)],
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, offset


def write_index(directory: Path, files: Sequence[Sequence[Entry]], dtype: torch.dtype | None) -> None:
    """`model.safetensors.index.json` of a folder of several files (transformers' layout and keys)."""
    if len(files) == 1:
        return
    weight_map = {e.name: shard_file(i, len(files)) for i, group in enumerate(files) for e in group}
    every = [e for group in files for e in group]
    metadata = {
        "total_size": sum(e.nbytes(dtype) for e in every),
        "total_parameters": sum(e.numel for e in every),
    }
    text = json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n"
    (directory / INDEX_FILE).write_text(text)


def _append(handle: IO[bytes], tensor: torch.Tensor) -> None:
    """A CPU tensor's bytes, written from its own memory (a uint8 view, no copy), little-endian as stored."""
    flat = tensor.contiguous().reshape(-1)
    handle.write(flat.view(torch.uint8).numpy().data)


@dataclass(frozen=True)
class Target:
    """A folder the stream writes: `dtype` for its floating tensors (None: as trained, the master weights)."""

    directory: Path
    dtype: torch.dtype | None


class WeightStream:
    """The plan of one checkpoint's weights, and the walk over it every rank takes (`write`)."""

    def __init__(
        self,
        tensors: Mapping[str, Any],
        gather: Callable[[Any], torch.Tensor],
        *,
        tied: Iterable[str] = (),
        shard_bytes: int | None = None,
    ) -> None:
        """`tensors`: the model's state dict (this rank's DTensor shards; nothing is gathered here), or
        sources shaped and typed as the tensors they make (a LoRA student's merged weights:
        `training.lora_export.MergedWeight`); `gather`: a tensor whole (a collective where sharded: every rank calls
        it for the same tensors in the same order); `tied`: names that share a parameter with an earlier
        one, left out; `shard_bytes`: a file's float32 budget (None: `SHARD_BYTES`, read now)."""
        skip = set(tied)
        self.tensors = {name: t for name, t in tensors.items() if name not in skip}
        self.gather = gather
        self.files = plan_shards(
            (Entry(n, tuple(t.shape), t.dtype) for n, t in self.tensors.items()), shard_bytes or SHARD_BYTES
        )
        self.walked = False

    def write(self, targets: Sequence[Target]) -> None:
        """Gather every tensor, in the plan's order, append it to each target folder's shard files, then
        write their index. Rank 0 passes the folders; the other ranks pass none and only take part in the
        gathers. A failed write (a full disk) stops the writing, not the walk: the other ranks are in the
        gathers, so rank 0 joins every one of them before it raises. (A failed gather is raised at once:
        the other ranks' gathers failed too.)"""
        self.walked = True
        failure: OSError | RuntimeError | ValueError | None = None
        for i, group in enumerate(self.files):
            handles: list[IO[bytes]] = []
            try:
                for target in targets if failure is None else ():
                    handles.append(self._open(target, i, group))
            except (OSError, RuntimeError, ValueError) as error:
                failure = error
                _close(handles)
                handles = []
            try:
                for entry in group:
                    whole = self.gather(self.tensors[entry.name].detach())
                    if not handles:
                        continue
                    host = whole.cpu()
                    try:
                        for handle, target in zip(handles, targets, strict=True):
                            _append(handle, host.to(entry.kept(target.dtype)))
                    except (OSError, RuntimeError, ValueError) as error:
                        failure = error
                        _close(handles)
                        handles = []
                    del host, whole
            finally:
                _close(handles)
        if failure is not None:
            raise failure
        for target in targets:
            write_index(target.directory, self.files, target.dtype)

    def finish(self) -> None:
        """Take part in every gather without writing, unless `write` ran: what rank 0 calls when its save
        failed before reaching the weights, so no other rank waits in a gather that never comes."""
        if not self.walked:
            self.write([])

    def _open(self, target: Target, index: int, group: Sequence[Entry]) -> IO[bytes]:
        target.directory.mkdir(parents=True, exist_ok=True)
        handle = open(target.directory / shard_file(index, len(self.files)), "wb")  # noqa: SIM115 - closed by write
        handle.write(header(group, target.dtype)[0])
        return handle


def _close(handles: Sequence[IO[bytes]]) -> None:
    for handle in handles:
        handle.close()


def streamable(model: Any) -> bool:
    """Whether the model's state-dict names are its checkpoint names: transformers reverts no weight
    conversion (fused experts, renamed keys) when saving it, checked on meta tensors (no memory)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without weight conversions: names are saved as they are
        return True
    names = {name: torch.empty(tuple(t.shape), device="meta") for name, t in model.state_dict().items()}
    try:
        reverted = revert_weight_conversion(model, dict(names))
    except Exception as error:  # any doubt keeps save_pretrained, which knows the model
        log.warning("streamed export: cannot check weight conversions (%s); saving whole", error)
        return False
    if set(reverted) != set(names):
        log.warning("streamed export: transformers converts this model's weight names on save; saving whole")
        return False
    return True
