"""Checkpoints: written atomically, found reliably, pruned to the last N; the final model published as `final/`.

Layout of one checkpoint, `<root>/step-00000012/`:
  model/            the model you keep (`export.py`): weights in checkpoint.modelDtype (bfloat16 by default),
                    config, the tokenizer the job used and generation_config.json; `vllm serve` and
                    `from_pretrained` load it as is
  master/           the trainer's exact float32 weights (safetensors + config + the tokenizer the engines
                    loaded): what a resume loads, so it continues bit for bit whatever model/'s dtype.
                    Both folders' weights are streamed from the ranks' shards a tensor at a time
                    (`streamed_export.py`), in files of at most 4 GiB of float32 with transformers' index
  trainer.pt        optimizer, LR scheduler and RNG states (torch, numpy, python): tensors and plain types only,
                    loaded with `weights_only=True` (the claim may be written by other jobs of the namespace, so
                    nothing in it is unpickled as code); a file that holds anything else is refused, named
  optimizer/        FSDP2 over several ranks: the optimizer state instead, each rank's shards written by
                    that rank with torch.distributed.checkpoint (nothing gathered; a resume onto another
                    number of ranks reshards them); trainer.pt then holds no optimizer
  state.json        step, data position, policy version, the run's identity
  COMPLETE          written last; a directory without it is never loaded

A LoRA student's checkpoint (`spec.student.lora`, `training/lora_export.py`) holds instead of master/:
  adapter/          the adapter exactly as trained: float32, adapter_config.json + adapter_model.safetensors
                    under peft's names, naming the student model as the job does; `PeftModel.from_pretrained`
                    and `vllm serve --enable-lora --lora-modules` load it, and a resume loads it onto the
                    job's own student model (`weights_dir`), which is the frozen base unchanged: no float32
                    copy of the base is kept
  model/            the merged model (W + scale x B @ A for each adapted layer, a module trained whole in
                    place of the base's) in checkpoint.modelDtype under the base's names, config, tokenizer
                    and generation config as above: a plain model, merged a tensor at a time as it streams
  trainer.pt        as above; its optimizer state is the adapter's alone (the optimizer holds nothing else)

A checkpoint is assembled in `<root>/.tmp-step-00000012-<pid>/` (`staging_dir`: rank 0's pid; the other
ranks write their optimizer shards there first, so the root is one filesystem all trainer ranks see), every
file fsync'ed, then renamed into place (rename is atomic on one filesystem) and the parent directory fsync'ed. A crash at any moment leaves
either no checkpoint for that step or a complete one; temporary directories are swept on the next start.

When a run has taken its last step, that checkpoint's `model/` is also published as `<root>/final/` (hard
links, so no second copy on disk; assembled and renamed in the same way, never pruned), with `final.json`
naming the step and run it came from: a stable name to serve from. A LoRA student's `adapter/` is published
with it, as `final/adapter/` (the merged model stays at final/'s top, where `vllm serve` reads it).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson
import torch

from distillery.plan.checkpoints.storage import STATE_BYTES_PER_PARAMETER, checkpoint_bytes
from distillery_runtime.checkpoints.export import (
    TORCH_DTYPES,
    ModelExport,
    edit_config,
    write_config,
    write_model,
)
from distillery_runtime.checkpoints.streamed_export import Target, WeightStream

STEP_DIR_RE = re.compile(r"^step-(\d{8})$")
MARKER = "COMPLETE"
MODEL_DIR = "model"
MASTER_DIR = "master"
ADAPTER_DIR = "adapter"
ADAPTER_FILE = "adapter_model.safetensors"
"""The adapter's tensors in adapter/, as peft names the file (`training.lora.ADAPTER_WEIGHTS`)."""
FINAL_DIR = "final"
FINAL_STATE = "final.json"
TRAINER_FILE = "trainer.pt"
STATE_FILE = "state.json"
OPTIMIZER_DIR = "optimizer"


class AdapterFolder(Protocol):
    """A LoRA student's adapter as a checkpoint keeps it (`training.lora_export.AdapterExport`)."""

    def write(self, folder: Path) -> object:
        """Write the adapter's folder (adapter_config.json + adapter_model.safetensors) at `folder`."""
        ...


@dataclass(frozen=True)
class CheckpointRef:
    step: int
    path: Path


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def list_complete(root: str | Path) -> list[CheckpointRef]:
    """Complete checkpoints under root, oldest first (torn and temporary ones are skipped)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR_RE.match(child.name)
        if match and (child / MARKER).is_file() and (child / STATE_FILE).is_file():
            found.append(CheckpointRef(int(match.group(1)), child))
    return sorted(found, key=lambda ref: ref.step)


BYTES_PER_PARAMETER = STATE_BYTES_PER_PARAMETER
"""A checkpoint holds the float32 master weights (4 bytes a parameter) and AdamW's two float32 moments (8),
and the kept model (`model/`) in its own dtype on top (`export.DTYPE_BYTES`); a LoRA student's, those 12
bytes for each adapter parameter only. The plan sizes the operator's checkpoint claim with the same figure
(`distillery.plan.checkpoints.storage.checkpoint_bytes`)."""
CHECKPOINTS_OF_ROOM = 2
"""A save writes the new checkpoint before pruning the oldest: the folder needs room for two at once."""


class PreflightError(RuntimeError):
    """The checkpoint folder cannot take this run's checkpoints; found before the first step."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, folder gone); the complete ones are untouched."""


class CheckpointReadError(RuntimeError):
    """A checkpoint's trainer state that is not loaded: unreadable, altered, or holding objects other than
    tensors and plain types (`load_trainer_state`, and the optimizer shards: `optimizer_shards.py`); the
    message is one line naming the file."""


def parameter_count(model_dir: str | Path) -> int | None:
    """Parameters of a safetensors model, read from the files' headers (no tensor is loaded); None when
    the folder holds no safetensors (a hub id resolved elsewhere, or pickled weights)."""
    total, found = 0, False
    for path in sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []:
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = orjson.loads(handle.read(size))
        found = True
        for name, entry in header.items():
            if name != "__metadata__":
                total += int(np.prod(entry["shape"], dtype=np.int64))
    return total if found else None


def preflight(
    root: str | Path,
    parameters: int | None,
    *,
    field: str,
    model_bytes: int = 2,
    free_bytes: int | None = None,
    adapter: int | None = None,
) -> None:
    """Refuse a checkpoint folder that cannot be written, or lacks room for CHECKPOINTS_OF_ROOM checkpoints
    of a student with `parameters` parameters, kept in `model_bytes` a parameter (`checkpoint_bytes`;
    `adapter`: a LoRA student's adapter parameters, the only ones with float32 and AdamW state). `field`
    names the setting in the message; `free_bytes` overrides the free space the disk reports (tests)."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".preflight-{os.getpid()}"
        with open(probe, "wb") as handle:
            handle.write(b"distillery")
            handle.flush()
            os.fsync(handle.fileno())
        probe.unlink()
    except OSError as error:
        raise PreflightError(
            f"{field}: {root} is not writable ({type(error).__name__}: {error.strerror or error})"
        ) from error
    if parameters is None:
        return
    per_parameter = BYTES_PER_PARAMETER + model_bytes
    needed = checkpoint_bytes(parameters, model_bytes, adapter)
    free = shutil.disk_usage(root).free if free_bytes is None else free_bytes
    if free < CHECKPOINTS_OF_ROOM * needed:
        millions = parameters / 1e6
        held = (
            f"{millions:.2f}M parameters x {per_parameter} bytes: float32 weights, AdamW state and the kept model"
            if adapter is None
            else f"the merged model, {millions:.2f}M parameters x {model_bytes} bytes, and the adapter, "
            f"{adapter / 1e6:.2f}M parameters x {BYTES_PER_PARAMETER} bytes with its AdamW state"
        )
        raise PreflightError(
            f"{field}: {root} has {_size(free)} free; a checkpoint of this student takes about {_size(needed)} "
            f"({held}) and a save needs room for {CHECKPOINTS_OF_ROOM}: free space or point it elsewhere"
        )


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def latest(root: str | Path) -> CheckpointRef | None:
    complete = list_complete(root)
    return complete[-1] if complete else None


def rng_state() -> dict[str, Any]:
    """Every RNG a step draws from, as tensors and plain types (what `weights_only=True` loads back)."""
    state = {"torch": torch.get_rng_state(), "numpy": numpy_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(numpy_rng_from(state["numpy"]))
    random.setstate(state["python"])
    # A GPU checkpoint resumed on a CPU machine (or the reverse) restores what both sides have.
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def numpy_rng_state() -> tuple[str, list[int], int, int, float]:
    """numpy's global RNG state with its key as a list of ints: numpy's own holds an ndarray, which a
    `weights_only` load refuses."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return str(name), [int(k) for k in keys], int(position), int(has_gauss), float(cached_gaussian)


def numpy_rng_from(state: Any) -> tuple[str, Any, int, int, float]:
    """The state `numpy_rng_state` saved, as `np.random.set_state` takes it."""
    name, keys, position, has_gauss, cached_gaussian = state
    return str(name), np.asarray(keys, dtype=np.uint32), int(position), int(has_gauss), float(cached_gaussian)


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for path in [*sorted(p for p in directory.rglob("*") if p.is_dir()), directory]:
        _fsync_dir(path)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(
    root: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    state: dict[str, Any],
    keep: int,
    state_dict: dict[str, Any] | None = None,
    export: ModelExport | None = None,
    staged: Path | None = None,
    weights: WeightStream | None = None,
    adapter: AdapterFolder | None = None,
) -> Path:
    """Write checkpoint `step` atomically, then delete all but the newest `keep` complete ones.

    `tokenizer` is the one the trainer and engines loaded (kept in master/ for a resume); `export` says how
    model/ is written (default: bfloat16 with that same tokenizer). `staged`: the `staging_dir` the ranks
    already wrote their optimizer shards into (completed here, or removed on failure). The weights: streamed
    tensor by tensor into master/ and model/ by `weights` (the other ranks walk the same stream meanwhile),
    else the whole `state_dict` the ranks gathered (or the model's own) through save_pretrained.

    `adapter`: a LoRA student's, written as adapter/; then there is no master/, `model` is the base
    transformers model (its config) and `weights` or `state_dict` the merged model, written into model/."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = staged or staging_dir(root, step)
    if staged is None and tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(exist_ok=staged is not None)
        export = export or ModelExport(dtype="bfloat16", tokenizer=tokenizer)
        if adapter is not None:
            adapter.write(tmp / ADAPTER_DIR)
            if weights is not None:
                weights.write([Target(tmp / MODEL_DIR, TORCH_DTYPES[export.dtype])])
        elif weights is not None:
            dtype = TORCH_DTYPES[export.dtype]
            weights.write([Target(tmp / MASTER_DIR, None), Target(tmp / MODEL_DIR, dtype)])
            write_config(tmp / MASTER_DIR, model, dtype="float32")
        else:
            # A sharded (FSDP2) model saves the whole weights its ranks gathered (`state_dict`).
            model.save_pretrained(tmp / MASTER_DIR, safe_serialization=True, state_dict=state_dict)
            edit_config(tmp / MASTER_DIR / "config.json")
        if tokenizer is not None and adapter is None:
            tokenizer.save_pretrained(tmp / MASTER_DIR)
        write_model(
            tmp / MODEL_DIR, model=model, state_dict=state_dict, export=export, streamed=weights is not None
        )
        torch.save(trainer_state, tmp / TRAINER_FILE)
        (tmp / STATE_FILE).write_bytes(orjson.dumps({**state, "step": step, "saved_at": time.time()}))
        (tmp / MARKER).write_text(str(step))
        _fsync_tree(tmp)
    except Exception as error:
        # A full or failing disk, however the writer reports it (OSError; RuntimeError from torch.save;
        # SafetensorError from the weights): drop the partial copy so the space is back, and keep every
        # complete checkpoint as it is.
        shutil.rmtree(tmp, ignore_errors=True)
        newest = latest(root)
        kept = (
            f"the newest complete checkpoint is {newest.path}" if newest else "no complete checkpoint exists"
        )
        reason = getattr(error, "strerror", None) or str(error).strip().splitlines()[0]
        raise CheckpointWriteError(
            f"{root}: could not write checkpoint step {step} ({reason}); {kept}"
        ) from error
    run = state.get("run")
    if final.exists():
        if (final / STATE_FILE).is_file() and not belongs_to(read_state_at(final), run):
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointWriteError(f"{final} is a checkpoint of another run; it is never replaced")
        shutil.rmtree(final)  # a checkpoint of this step from this run, which died after writing it
    os.rename(tmp, final)
    _fsync_dir(root)
    prune(root, keep, run)
    return final


def staging_dir(root: str | Path, step: int) -> Path:
    """Where checkpoint `step` is assembled before its rename (this process's pid: a rerun's leftovers are
    another's, swept by `sweep_temporary`)."""
    return Path(root) / f".tmp-{step_dir_name(step)}-{os.getpid()}"


def belongs_to(state: dict[str, Any], run: str | None) -> bool:
    """Whether a checkpoint's state is this run's: same run id, or either side has none (local runs and
    checkpoints written before run ids were recorded)."""
    theirs = state.get("run")
    return run is None or theirs is None or theirs == run


def read_state_at(path: Path) -> dict[str, Any]:
    return orjson.loads((path / STATE_FILE).read_bytes())


def other_runs(root: str | Path, run: str | None) -> list[CheckpointRef]:
    """Complete checkpoints under root written by another run, oldest first."""
    return [ref for ref in list_complete(root) if not belongs_to(read_state(ref), run)]


def prune(root: str | Path, keep: int, run: str | None = None) -> None:
    """Delete this run's complete checkpoints beyond its newest `keep`, oldest first; another run's
    checkpoints are never deleted."""
    mine = [ref for ref in list_complete(root) if belongs_to(read_state(ref), run)]
    for ref in mine[:-keep]:
        # Un-mark first: if deletion is interrupted the remains are no longer "complete".
        (ref.path / MARKER).unlink(missing_ok=True)
        shutil.rmtree(ref.path, ignore_errors=True)


def sweep_temporary(root: str | Path) -> int:
    """Remove leftovers of interrupted saves (and un-marked step directories); returns how many."""
    root = Path(root)
    if not root.is_dir():
        return 0
    removed = 0
    for child in root.iterdir():
        torn = STEP_DIR_RE.match(child.name) and not (child / MARKER).is_file()
        if child.name.startswith((".tmp-step-", ".tmp-final-", ".old-final-")) or torn:
            shutil.rmtree(child, ignore_errors=True)
            removed += 1
    return removed


def read_state(ref: CheckpointRef) -> dict[str, Any]:
    return read_state_at(ref.path)


TRAINER_KEYS = frozenset({"scheduler", "version", "rng"})
"""What every trainer.pt holds (and "optimizer" unless the optimizer was saved in shards)."""


def load_trainer_state(ref: CheckpointRef) -> dict[str, Any]:
    """trainer.pt of `ref`, loaded as tensors and plain types only (`weights_only=True`): the claim may be
    written by other jobs, so a file is data, never code. Refuses (CheckpointReadError, one line naming the
    file) one that is unreadable, holds anything else (altered, or written before the RNG state was saved as
    plain data), or lacks what a resume needs."""
    path = ref.path / TRAINER_FILE
    try:
        # map_location cpu: a checkpoint written on a GPU loads on any machine; the optimizer's
        # load_state_dict moves its state to the parameters' device.
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:  # UnpicklingError, a torn zip (RuntimeError), EOFError, OSError
        raise CheckpointReadError(f"{path}: refused: {load_refusal(error)}") from None
    missing = trainer_state_problem(state)
    if missing:
        raise CheckpointReadError(f"{path}: refused: {missing}")
    return state  # type: ignore[no-any-return]


def load_refusal(error: BaseException) -> str:
    """Why torch did not load a checkpoint's file (trainer.pt, an optimizer shard's), in one line. Its
    weights-only refusal spans several lines around its reason and advises `weights_only=False` or
    allowlisting, exactly what is not done here: only the reason is kept."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if type(error).__name__ != "UnpicklingError":  # a torn zip (RuntimeError), EOFError, OSError
        return (
            f"unreadable ({type(error).__name__}: {lines[0] if lines else 'no detail'}): damaged or altered"
        )
    # Its reason follows "WeightsUnpickler error:" (on that line or the next), or stands alone among lines
    # of advice; which, varies with the failure.
    marker = "WeightsUnpickler error:"
    after = [line.split(marker)[-1].strip() for line in lines if marker in line]
    advice = ("Weights only load failed", "Check the documentation", "(1)", "(2)", "Please file", marker)
    others = [line for line in lines if not line.startswith(advice)]
    reason = next((line for line in [*after, *others] if line), "no detail").split(" Please use ")[0]
    return (
        f"not tensors and plain types only ({reason}): altered, or written by a Distillery that saved "
        "objects there; resume from another checkpoint or start afresh"
    )


def trainer_state_problem(state: Any) -> str | None:
    """What a loaded trainer.pt lacks for a resume, or None: a dict with TRAINER_KEYS and an integer
    version."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not the trainer state's dict"
    missing = sorted(TRAINER_KEYS - state.keys())
    if missing:
        return f"the trainer state lacks {', '.join(missing)}"
    if not isinstance(state["version"], int) or isinstance(state["version"], bool):
        return f"the trainer state's version is a {type(state['version']).__name__}, not an int"
    return None


def weights_dir(ref: CheckpointRef, base: str | Path | None = None) -> Path:
    """The folder a resume loads: the exact float32 master weights (a checkpoint written before master/
    existed kept them in model/); a LoRA student's checkpoint, the job's own student model `base`, which
    its adapter/ is loaded onto (`read_adapter`)."""
    master = ref.path / MASTER_DIR
    if master.is_dir():
        return master
    if is_lora(ref):
        if base is None:
            raise ValueError(f"{ref.path} is a LoRA student's checkpoint: it resumes onto the student model")
        return Path(base)
    return ref.path / MODEL_DIR


def is_lora(ref: CheckpointRef) -> bool:
    """A LoRA student's checkpoint: it holds adapter/ and no master/."""
    return (ref.path / ADAPTER_DIR).is_dir() and not (ref.path / MASTER_DIR).is_dir()


def read_adapter(ref: CheckpointRef) -> dict[str, torch.Tensor]:
    """A LoRA checkpoint's adapter tensors by peft's saved names (safetensors: data, never code); refuses
    (CheckpointReadError, one line naming the file) a checkpoint without one (full fine-tuning's) or an
    unreadable one."""
    from safetensors.torch import load_file

    path = ref.path / ADAPTER_DIR / ADAPTER_FILE
    if not path.is_file():
        raise CheckpointReadError(
            f"{path}: refused: no adapter: {ref.path} is a checkpoint of full fine-tuning, which a LoRA "
            "student does not resume; resume from a LoRA checkpoint or start afresh"
        )
    try:
        return load_file(str(path))
    except Exception as error:  # SafetensorError, OSError
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "no detail"
        raise CheckpointReadError(f"{path}: refused: unreadable ({type(error).__name__}: {reason})") from None


def read_final(root: str | Path) -> dict[str, Any] | None:
    """What `<root>/final/` was published from (step, run, checkpoint), or None when there is none."""
    path = Path(root) / FINAL_DIR / FINAL_STATE
    return orjson.loads(path.read_bytes()) if path.is_file() else None


def publish_final(ref: CheckpointRef) -> Path:
    """Publish checkpoint `ref`'s model/ (and a LoRA student's adapter/, as final/adapter/) as
    `<root>/final/`: the model a finished run keeps under a stable name. Assembled from hard links (no
    second copy; a copy where the filesystem has none), fsync'ed, renamed into place; a final/ already there (a resumed run finishing again) is moved aside first and
    then deleted, so final/ is always one whole model. Another run's final/ is never replaced."""
    root = ref.path.parent
    state = read_state(ref)
    final = root / FINAL_DIR
    published = read_final(root)
    if published is not None and not belongs_to(published, state.get("run")):
        raise CheckpointWriteError(f"{final} is the model of another run; it is never replaced")
    tmp = root / f".tmp-final-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(ref.path / MODEL_DIR, tmp, copy_function=_link_or_copy)
        if (ref.path / ADAPTER_DIR).is_dir():
            shutil.copytree(ref.path / ADAPTER_DIR, tmp / ADAPTER_DIR, copy_function=_link_or_copy)
        record = {
            "step": ref.step,
            "run": state.get("run"),
            "job": state.get("job"),
            "checkpoint": ref.path.name,
        }
        (tmp / FINAL_STATE).write_bytes(orjson.dumps(record))
        _fsync_tree(tmp)
    except Exception as error:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = getattr(error, "strerror", None) or str(error).strip().splitlines()[0]
        raise CheckpointWriteError(f"{final}: could not publish step {ref.step} ({reason})") from error
    old = root / f".old-final-{os.getpid()}"
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(root)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
