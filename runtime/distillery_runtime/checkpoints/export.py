"""The model you keep: a checkpoint's `model/` folder, which `vllm serve` and `from_pretrained` load as is.

The trainer holds float32 master weights; the kept model is cast to `checkpoint.modelDtype` (bfloat16 by
default: what is served, half the size). It carries the tokenizer the job tokenized with (`student.tokenizer`
when set, its chat template included), not the student model's own, and a `generation_config.json` that
stops where that tokenizer ends a response. A resume never reads this folder: the exact float32 weights are
kept beside it (`checkpoint.MASTER_DIR`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import torch

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class ModelExport:
    """What a checkpoint's `model/` is written with."""

    dtype: str
    """"bfloat16", "float16" or "float32" (`checkpoint.modelDtype`)."""
    tokenizer: Any
    """The tokenizer the job used (a transformers tokenizer, saved with its chat template)."""


def cast_state_dict(state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors cast to `dtype`, the others as they are. Tensors that share storage (tied input and
    output embeddings) are cast once and stay shared, so save_pretrained still writes them once."""
    cast: dict[tuple[int, torch.dtype, tuple[int, ...]], torch.Tensor] = {}
    out = {}
    for name, tensor in state_dict.items():
        if not tensor.is_floating_point() or tensor.dtype == dtype:
            out[name] = tensor
            continue
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if key not in cast:
            cast[key] = tensor.detach().to(dtype)
        out[name] = cast[key]
    return out


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def generation_config(
    student: Mapping[str, Any], *, own: bool, eos: int | None, bos: int | None, pad: int | None
) -> dict[str, Any]:
    """The kept model's generation config (pure).

    `student`: the student's generation config as the trainer loaded it; `own`: whether the student had a
    generation_config.json (else transformers derived `student` from config.json, which knows nothing of a
    tokenizer override, and the tokenizer's bos and pad fill what it lacks). Either way the tokenizer's eos
    is among the stop tokens, beside the student's: an instruct tokenizer over a base model ends a turn
    with a token the base model's config does not name (a served model would never stop there), while the
    rollout engine stopped at the model's own eos, which the student learnt to write."""
    config = {k: v for k, v in student.items() if k not in ("_from_model_config", "transformers_version")}
    if not own:
        config.setdefault("bos_token_id", bos)
        config.setdefault("pad_token_id", pad)
    stops = _ids(config.get("eos_token_id"))
    if eos is not None and eos not in stops:
        stops.append(eos)
    config["eos_token_id"] = stops[0] if len(stops) == 1 else stops or None
    return {k: v for k, v in config.items() if v is not None}


def student_generation_config(model: Any) -> tuple[dict[str, Any], bool]:
    """The student's generation config as the trainer loaded it, and whether it was the student's own
    (False: transformers derived it from config.json, the folder had no generation_config.json)."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return {}, False
    return dict(config.to_diff_dict()), not getattr(config, "_from_model_config", False)


def edit_config(path: Path, *, dtype: str | None = None) -> None:
    """Make config.json name what loads the folder: FSDP2 makes the model's class `FSDP<Class>`, which
    save_pretrained records as its architecture (vLLM and transformers look the class up by name), and the
    dtype recorded is the trainer's float32, not the cast weights' (`from_pretrained` and `vllm serve
    --dtype auto` load in the dtype it names)."""
    data = orjson.loads(path.read_bytes())
    data["architectures"] = [a.removeprefix("FSDP") for a in data.get("architectures") or []]
    if dtype is not None:
        data["dtype"] = dtype
        data.pop("torch_dtype", None)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))


def write_config(directory: Path, model: Any, *, dtype: str) -> None:
    """What save_pretrained writes beside the weights, for a folder whose weights were streamed
    (`streamed_export.py`): a remote-code model's own code, config.json (its architecture and `dtype`
    named: `edit_config`) and, for a model that generates, its generation config."""
    directory.mkdir(parents=True, exist_ok=True)
    if model.is_remote_code():
        from transformers.dynamic_module_utils import custom_object_save

        custom_object_save(model, directory, config=model.config)
    model.config.save_pretrained(directory)
    if model.can_generate():
        model.generation_config.save_pretrained(directory)
    data = orjson.loads((directory / "config.json").read_bytes())
    # save_pretrained names the class that saved (FSDP2's subclass: `edit_config` strips its prefix).
    data["architectures"] = [type(model).__name__]
    (directory / "config.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    edit_config(directory / "config.json", dtype=dtype)


def write_model(
    directory: Path,
    *,
    model: Any,
    state_dict: Mapping[str, torch.Tensor] | None,
    export: ModelExport,
    streamed: bool = False,
) -> None:
    """Write the kept model: weights cast to `export.dtype`, config, tokenizer, generation config.
    `streamed`: the weights are already in `directory` (`streamed_export.WeightStream`), the rest is
    written here."""
    if streamed:
        write_config(directory, model, dtype=export.dtype)
    else:
        weights = cast_state_dict(
            state_dict if state_dict is not None else model.state_dict(), TORCH_DTYPES[export.dtype]
        )
        model.save_pretrained(directory, safe_serialization=True, state_dict=weights)
        edit_config(directory / "config.json", dtype=export.dtype)
    tokenizer = export.tokenizer
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    student, own = student_generation_config(model)
    generation = generation_config(
        student,
        own=own,
        eos=getattr(tokenizer, "eos_token_id", None),
        bos=getattr(tokenizer, "bos_token_id", None),
        pad=getattr(tokenizer, "pad_token_id", None),
    )
    (directory / GENERATION_CONFIG).write_bytes(orjson.dumps(generation, option=orjson.OPT_INDENT_2))
