"""Reads the rows of a data source, the I/O edge of data preparation: every row a dict, whatever held it.

A source is a file (`.jsonl`, a JSON array `.json`, `.parquet`), a folder `datasets.save_to_disk` wrote, or a
Hugging Face Hub dataset `hf://datasets/ORG/NAME` (read with `datasets.load_dataset`, its `subset` and
`split`). Files and folders may be local or behind any URI `uris.resolve_location` opens (pvc://, s3://,
...). Every failure is a `DataError` of one line naming the source (and the line, for JSON Lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from distillery.api.spec import HF_DATASETS_SCHEME, DataFormat, DataSource
from distillery_runtime.data.uris import resolve_location

SAVE_TO_DISK_MARKERS = ("dataset_dict.json", "state.json")
"""What `save_to_disk` writes at a folder's top: a DatasetDict's split list, or one Dataset's state."""


class DataError(ValueError):
    """A dataset the runtime cannot use; the message names the file and the rows."""


@dataclass(frozen=True)
class HubDataset:
    """`load_dataset`'s arguments for an hf://datasets/ORG/NAME source."""

    repo: str
    subset: str | None
    split: str


def hub_dataset(source: DataSource) -> HubDataset | None:
    """The Hub dataset an hf://datasets/ORG/NAME source names (None for any other source)."""
    if not source.path.startswith(HF_DATASETS_SCHEME):
        return None
    repo = source.path[len(HF_DATASETS_SCHEME) :].strip("/")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise DataError(f"{source.path}: a Hub dataset is {HF_DATASETS_SCHEME}ORG/NAME")
    return HubDataset(repo=repo, subset=source.subset, split=source.split)


def detect_format(path: str, declared: DataFormat) -> DataFormat:
    if declared != DataFormat.AUTO:
        return declared
    suffix = Path(path).suffix.lower()
    if suffix in {".jsonl", ".json", ".ndjson"}:
        return DataFormat.JSONL
    if suffix in {".parquet", ".pq"}:
        return DataFormat.PARQUET
    raise DataError(
        f"{path}: cannot tell the format from the extension {suffix!r}; set format: jsonl|parquet"
    )


def load_rows(source: DataSource) -> tuple[str, list[dict[str, Any]]]:
    """The rows of a data source as dicts, and where they were read from (a local path, or the Hub id)."""
    hub = hub_dataset(source)
    if hub is not None:
        return source.path, _hub_rows(source, hub)
    path = resolve_location(source.path)
    if Path(path).is_dir():
        if not any((Path(path) / marker).exists() for marker in SAVE_TO_DISK_MARKERS):
            raise DataError(
                f"{source.path}: is a directory but not one datasets' save_to_disk wrote; "
                "point data paths at a .jsonl, .json or .parquet file, or such a folder"
            )
        return path, _saved_rows(source, path)
    fmt = detect_format(path, source.format)
    if not Path(path).exists():
        raise DataError(f"{source.path}: no such file")
    if fmt == DataFormat.PARQUET:
        return path, _parquet_rows(source, path)
    return path, _json_rows(source, path)


def _hub_rows(source: DataSource, hub: HubDataset) -> list[dict[str, Any]]:
    import datasets

    try:
        dataset = datasets.load_dataset(hub.repo, hub.subset, split=hub.split)
    except Exception as error:  # the Hub, the network and the dataset's own loader each raise their own
        raise DataError(f"{source.path}: cannot load split {hub.split!r} ({_first_line(error)})") from error
    return _dataset_rows(source, dataset)


def _saved_rows(source: DataSource, path: str) -> list[dict[str, Any]]:
    import datasets

    try:
        saved = datasets.load_from_disk(path)
    except Exception as error:  # a folder save_to_disk half wrote, or an incompatible datasets version
        raise DataError(
            f"{source.path}: not a readable save_to_disk folder ({_first_line(error)})"
        ) from error
    if isinstance(saved, datasets.DatasetDict):
        if source.split not in saved:
            raise DataError(f"{source.path}: no split {source.split!r} (it has {sorted(saved)}); set split")
        saved = saved[source.split]
    return _dataset_rows(source, saved)


def _dataset_rows(source: DataSource, dataset: Any) -> list[dict[str, Any]]:
    if not hasattr(dataset, "to_list"):  # a DatasetDict or a streaming dataset: not one split's table
        raise DataError(f"{source.path}: loaded a {type(dataset).__name__}, not one split's rows")
    rows: list[dict[str, Any]] = dataset.to_list()
    return rows


def _parquet_rows(source: DataSource, path: str) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{source.path}: not a readable parquet file ({_first_line(error)})") from error
    return rows


def _json_rows(source: DataSource, path: str) -> list[dict[str, Any]]:
    """JSON Lines, or one JSON array of objects (what `json.dump(rows)` and many exports write)."""
    content = Path(path).read_bytes()
    if content.lstrip()[:1] == b"[":
        try:
            array = orjson.loads(content)
        except orjson.JSONDecodeError as error:
            raise DataError(f"{source.path}: not a valid JSON array ({error})") from error
        for number, row in enumerate(array):
            if not isinstance(row, dict):
                raise DataError(
                    f"{source.path} row {number}: each element must be a JSON object with the data fields, "
                    f"not a {_json_kind(row)}"
                )
        return list(array)
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise DataError(f"{source.path}:{number}: not valid JSON ({error})") from error
        if not isinstance(row, dict):
            raise DataError(
                f"{source.path}:{number}: each line must be a JSON object with the data fields, "
                f"not a {_json_kind(row)}"
            )
        rows.append(row)
    return rows


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null" if value is None else type(value).__name__
    )
