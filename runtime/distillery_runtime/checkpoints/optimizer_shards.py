"""Reading a sharded checkpoint's optimizer shards (`trainer.load_optimizer_shards`) as data, never as code.

torch.distributed.checkpoint's own reader unpickles the folder's `.metadata` as it comes, and loads every
entry that is not a tensor (an optimizer's param_groups: floats, bools, tuples, lists of names) with
`weights_only=False`: whoever wrote the files would run code in the trainer. The checkpoint claim may be
written by other jobs of the namespace, so `SafeReader` unpickles the metadata with only the classes DCP's
metadata is made of allowed (`allowed_global`), and `SafePlanner` loads those entries with
`weights_only=True` (DCP already loads the tensors so). Either refuses a file in one line naming it
(CheckpointReadError; `shards_refusal` finds it under DCP's wrapping).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import IO, Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from distillery_runtime.checkpoints.checkpoint import CheckpointReadError, load_refusal

METADATA_GLOBALS = frozenset(
    {
        *(
            ("torch.distributed.checkpoint.metadata", name)
            for name in (
                "Metadata",
                "MetadataIndex",
                "StorageMeta",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "TensorProperties",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),  # a lookup among torch's layouts by name
        ("torch", "Size"),
        ("pathlib", "PosixPath"),  # the checkpoint's id, as DCP recorded it
    }
)
"""What DCP's `.metadata` names (torch 2.13; the dtypes aside): dataclasses of plain fields, an enum, sizes and
a path. Constructing any of them runs nothing else."""


def allowed_global(module: str, name: str) -> bool:
    """Whether the metadata's unpickler may resolve `module.name`: one of METADATA_GLOBALS, or a dtype."""
    if (module, name) in METADATA_GLOBALS:
        return True
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only `allowed_global` names: a file naming anything else (a function to
    call, a class to build) is refused before it is resolved (Python's "restricting globals")."""

    def find_class(self, module: str, name: str) -> Any:
        if not allowed_global(module, name):
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no DCP metadata holds")
        return super().find_class(module, name)


def load_metadata(stream: IO[bytes]) -> Metadata:
    """DCP's `.metadata` from `stream`, built from allowed classes only, and a Metadata whose shard files
    are all in its own folder."""
    metadata = _MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise ValueError(f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not shard_file_name(name):
            raise ValueError(f"it names {name!r} as a shard file, not a file of its folder")
    return metadata


def shard_file_name(name: object) -> bool:
    """A shard file DCP writes (`__0_0.distcp`): a plain name in the metadata's folder, so a tampered
    metadata cannot point the reader at any other file of the pod."""
    return (
        isinstance(name, str)
        and bool(name)
        and "/" not in name
        and "\\" not in name
        and name not in (".", "..")
    )


class SafeReader(FileSystemReader):
    """DCP's file reader, its metadata read by `load_metadata` (the shards' tensors it already loads with
    `weights_only=True`). `refusals`: what it refused, in order (DCP falls back from `.metadata` to a rank's
    own, then reports both in one message; the first is the one to report)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.refusals: list[str] = []

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            with self.fs.create_stream(path, "rb") as stream:  # typed as IOBase: a binary file read here
                metadata = load_metadata(cast(IO[bytes], stream))
        except Exception as error:  # refused above, torn (EOFError), or any error of a damaged pickle
            self.refusals.append(f"{path}: refused: {load_refusal(error)}")
            raise CheckpointReadError(self.refusals[-1]) from None
        # The rest is what FileSystemReader.read_metadata does after its own unpickling.
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, its entries that are not tensors loaded with `weights_only=True` (those
    of `folder`, named when one is refused)."""

    def __init__(self, folder: str | Path) -> None:
        super().__init__()
        self.folder = Path(folder)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as error:
            entry = read_item.dest_index.fqn
            raise CheckpointReadError(
                f"{self.folder}: refused: entry {entry}: {load_refusal(error)}"
            ) from None
        # As DefaultLoadPlanner.load_bytes places them.
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def shards_refusal(folder: str | Path, error: BaseException, reader: SafeReader) -> str:
    """One line for a failed `dcp.load` of `folder` through `reader`: the metadata `reader` refused first,
    else the first rank's own error (DCP wraps each rank's in a CheckpointException whose text is every
    rank's traceback), already a refusal naming its file when SafePlanner's."""
    if reader.refusals:
        return reader.refusals[0]
    failures: dict[int, tuple[BaseException, Any]] | None = getattr(error, "failures", None)
    cause = next(iter(failures.values()))[0] if failures else error
    if isinstance(cause, CheckpointReadError):
        return str(cause)
    return f"{folder}: refused: {load_refusal(cause)}"


def load_shards(state: dict[str, Any], folder: str | Path) -> None:
    """`dcp.load` of `folder` into `state` (a collective of the trainers' group where one is up), as data
    only; a refusal is one line naming the file (CheckpointReadError), on every rank alike."""
    reader = SafeReader(folder)
    try:
        dcp.load(state, storage_reader=reader, planner=SafePlanner(folder))
    except (Exception, CheckpointException) as error:  # the latter is a BaseException
        raise CheckpointReadError(shards_refusal(folder, error, reader)) from None
