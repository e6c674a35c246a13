"""Loading the student onto FSDP2 ranks without a whole float32 copy on any rank.

Today's path (a world of one, or the replicated layout) runs `from_pretrained(dtype=float32)` on every
rank and then shards: each rank's host briefly holds the whole model in float32 (4 bytes a parameter,
~30 GB for a 7.6B student, times the ranks of a node). Here instead:

  1. every rank builds the model on the meta device (`meta_model`: shapes only, no memory);
  2. `sharding.shard_student` applies the same `fully_shard` as today and `to_empty` allocates each rank's
     shards only (then rebuilds the rotary buffers, which are not in the checkpoint);
  3. `load_from_rank0` fills the shards through torch's own
     `set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`: rank 0 reads the
     safetensors files tensor by tensor (`safe_open`, converted to float32 one tensor at a time) and
     broadcasts; each rank keeps its slice.

torch's broadcast keeps every tensor of the state dict it is given alive until it returns (rank 0's
`ret`, the other ranks' received copies), so the weights go over in chunks of a bounded size
(`CHUNK_FRACTION` of the model, or one tensor if larger), one `set_model_state_dict` call each with
strict=False: a rank's peak is its own shards plus one chunk, not the model. Every rank plans the same
chunks from the files' headers (a few KB read, no data), so no plan has to be sent.

The plan decides whether a job loads this way (`TrainerSettings.sharded_load`: FSDP2 over several ranks);
`compatible_keys` is the one runtime check: a checkpoint whose tensor names are not the model's own (a
transformers key conversion, a quantised export) keeps today's `from_pretrained` path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from distillery.plan.pods.host_memory import LOAD_CHUNK_FRACTION
from distillery_runtime.data.packing import pack_in_order

log = logging.getLogger(__name__)

CHUNK_FRACTION = LOAD_CHUNK_FRACTION
"""A broadcast chunk's share of the model's float32 size (the host-memory plan counts one a rank): small
against one rank's shard even at 8 ranks (1/8), few enough calls (each re-copies the rank's own shards once
in torch's load) to cost little."""
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The model's safetensors files, in the index's order (a sharded save) or the one file; [] if none."""
    directory = Path(model_dir)
    index = directory / INDEX_FILE
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [directory / name for name in dict.fromkeys(weight_map.values())]
    single = directory / SINGLE_FILE
    return [single] if single.exists() else []


def checkpoint_shapes(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Each tensor's file and shape, from the headers only (safe_open reads no tensor data for this)."""
    from safetensors import safe_open

    out: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safe_open handle is not a mapping
                out[key] = (path, tuple(f.get_slice(key).get_shape()))
    return out


def tied_keys(model: nn.Module) -> set[str]:
    """State-dict names that share a parameter with an earlier name (an LM head tied to the embedding):
    checkpoints store one of them, and loading the first fills both."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            tied.add(name)
        seen.setdefault(id(tensor), name)
    return tied


def compatible_keys(model: nn.Module, shapes: dict[str, tuple[Path, tuple[int, ...]]]) -> str:
    """'' when the checkpoint holds exactly the model's tensors (tied ones once) with the model's shapes;
    else why not (then the caller keeps from_pretrained, which knows transformers' key conversions)."""
    expected = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    tied = tied_keys(model)
    missing = set(expected) - set(shapes) - tied
    unexpected = set(shapes) - set(expected)
    if missing or unexpected:
        return f"checkpoint names differ from the model's: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
    wrong = [n for n, (_, shape) in shapes.items() if shape != expected[n]]
    return f"shapes differ: {wrong[:3]}" if wrong else ""


def unrebuilt_buffers(model: nn.Module) -> list[str]:
    """Non-persistent buffers (in no checkpoint) that `sharding.materialize_empty` does not rebuild after
    `to_empty`: it rebuilds rotary embeddings (`rotary_emb`: Llama, Qwen2, Mistral); any other would be
    left uninitialised, so such a model keeps from_pretrained."""
    persistent = set(model.state_dict())
    return [
        name
        for name, _ in model.named_buffers()
        if name not in persistent and ".rotary_emb." not in f".{name}"
    ]


def meta_model(model_dir: str | Path) -> nn.Module | None:
    """The student built on the meta device from its config, as from_pretrained(dtype=float32) would build
    it (same class, attention implementation and generation config), or None where this path does not
    apply (no safetensors files, or names that do not match: see `compatible_keys`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    files = safetensors_files(model_dir)
    if not files:
        log.info("sharded load: no safetensors files in %s, loading on every rank", model_dir)
        return None
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model: nn.Module = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    why = compatible_keys(model, checkpoint_shapes(files))
    if not why and unrebuilt_buffers(model):
        why = f"buffers no checkpoint holds and no rebuild covers: {unrebuilt_buffers(model)[:3]}"
    if why:
        log.warning("sharded load: %s; loading on every rank", why)
        return None
    # from_pretrained reads generation_config.json when the folder has one; the export reports whether
    # the student had its own (export.student_generation_config), so keep the same object here.
    if (Path(model_dir) / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(model_dir)  # type: ignore[assignment]
    return model


def float32_bytes(shape: tuple[int, ...]) -> int:
    return 4 * int(torch.Size(shape).numel())


def chunks(shapes: dict[str, tuple[Path, tuple[int, ...]]], budget: int) -> list[list[str]]:
    """The tensor names in file order, grouped into chunks of at most `budget` float32 bytes (a tensor
    larger than that alone). Every rank computes the same chunks from the same headers."""
    return pack_in_order(shapes, lambda name: float32_bytes(shapes[name][1]), budget)


def read_chunk(
    names: list[str], shapes: dict[str, tuple[Path, tuple[int, ...]]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Rank 0: the chunk's tensors as float32, read one at a time. Each file is opened for this chunk only:
    safe_open maps the file, and the pages read stay resident (and counted) while it is open."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(shapes[name][0], []).append(name)
    for path, keys in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for key in keys:
                # to(float32): from_pretrained(dtype=float32)'s own cast (a bf16 file widens exactly).
                yield key, f.get_tensor(key).to(torch.float32)


def load_from_rank0(model: nn.Module, model_dir: str | Path) -> None:
    """Fill a sharded model's (materialised, uninitialised) shards with the checkpoint's weights, read by
    rank 0 and broadcast chunk by chunk. Every rank calls it (collectives)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    shapes = checkpoint_shapes(safetensors_files(model_dir))
    total = sum(float32_bytes(shape) for _, shape in shapes.values())
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    for names in chunks(shapes, max(1, int(total * CHUNK_FRACTION))):
        state: dict[str, Any] = dict(read_chunk(names, shapes)) if dist.get_rank() == 0 else {}
        set_model_state_dict(model, state, options=options)
        del state
