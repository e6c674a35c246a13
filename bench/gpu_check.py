"""Every torch-only CUDA path of the runtime in one go, on one GPU: what a lent GPU machine (torch and
transformers; no vLLM, no Ray) can check, in a few minutes on an H100 (its budget: 8; `--budget-s`, 450 by
default, ends a run that hangs with the line printed).

    python bench/gpu_check.py                    # a CUDA machine: NCCL, bfloat16, CUDA IPC
    python bench/gpu_check.py --device cpu       # the same code on CPU with gloo (tests/runtime/test_gpu_check.py)

One process is trainer rank 0 of a world of one, in a process group of its own (NCCL on a GPU, gloo on
CPU, initialised through a file store), over a Llama built here (no hub, no download). The checks, each
the runtime's own code (docs/gpu.md lists every CUDA-only branch and which of them this covers):

- fsdp_step: `Trainer` with FSDP2 (sharded float32 masters, bfloat16 compute and fused AdamW on a GPU),
  two optimizer steps of the distillation loss: finite loss and gradient norm, the weights moved.
- object_store_sync: `Trainer.weights` (the object-store sync): on a GPU the cast runs there and the
  copies go asynchronously into pinned memory; every tensor equals the gathered weights, cast.
- streamed_export: `Trainer.weight_stream` (streamed_export.py) writes master/ and model/ (bfloat16) a
  tensor at a time; the files hold exactly the gathered weights.
- sharded_checkpoint: the AdamW state written and read back in shards (torch.distributed.checkpoint over
  the group), exactly; the CUDA RNG state saved and restored (checkpoint.rng_state).
- sharded_load: the student built on the meta device, sharded, and filled by `load_from_rank0`'s chunked
  broadcasts over the group (sharded_load.py); every parameter equals the safetensors files' tensor.
- ipc_sync: bench/gpu_sync.py's two processes, trainer rank 0 and an engine worker on one GPU
  (weight_sync.SyncGroup): the transport `auto` chose (CUDA IPC on a GPU, shared memory on CPU), GB/s,
  every tensor exact on arrival.
- losses: every loss mode (losses/, chunked vocabulary pass) forward and backward on the device against
  the same function in float64 on CPU: loss and gradient errors.
- lora_step: a LoRA student (peft) under FSDP2: its frozen weights in the compute dtype (bfloat16 on a
  GPU) beside the float32 adapter, two steps: the frozen weights unchanged, the adapter moved; the merged
  model the checkpoint streams equals W + scale x B @ A of the trained tensors.

A check that fails records `"error"` and the others still run; the last line printed is always one JSON
object (`"checks"`: per check `ok`, `seconds` and its figures); the exit status is 0 only if all passed.
Ray and vLLM are blocked on import, as absent there: a runtime module that starts importing them at module
level fails here, in CI, first. The lent machines have had no pydantic (distillery.api needs it):
`--wheels DIR` installs it from wheels carried with the tree (bench/README.md, gpu_scale.py's H100 run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import json_main  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT / "bench", ROOT, ROOT / "runtime"):
    sys.path.insert(0, str(path))
ABSENT = ("ray", "vllm")
"""Not installed on the lent GPU machines: blocked on import here too (`main`)."""

GPU_SIZE = {"vocab": 1024, "model_vocab": 32768, "hidden": 1024, "layers": 8, "heads": 16}
"""~0.15B parameters on a GPU: big enough for real kernels and several load chunks, small for the budget."""
CPU_SIZE = {"vocab": 256, "model_vocab": 256, "hidden": 64, "layers": 2, "heads": 4}
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")
PEFT_WHEELS = ("peft", "accelerate")
"""LoRA students' library, pure Python; its other needs (safetensors, huggingface_hub, psutil, pyyaml,
tqdm) come with transformers. Installed without dependencies, so that torch is never replaced."""


@dataclass
class Context:
    """What the checks share: the device, the student's folder, the trainer once built."""

    device: Any
    work: Path
    model_dir: Path
    vocab: int
    trainer: Any = None


def describe(error: BaseException) -> str:
    """One line: the exception's type and the first line of its message."""
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}"[:500] if message else type(error).__name__


RUNNING = "still running"


class Report:
    """The one JSON line, printed once: by `main` at the end, or by the watchdog at the budget's end (a
    collective that hangs, e.g. NCCL's, never returns to Python, and its own timeout aborts the process)."""

    def __init__(
        self, summary: dict[str, Any], results: dict[str, dict[str, Any]], output: Path | None
    ) -> None:
        self.summary, self.results, self.output = summary, results, output
        self.started = time.perf_counter()
        self.lock = threading.Lock()
        self.printed = False

    def emit(self, error: str | None = None) -> bool:
        """Print the line (once; False if it was printed already) and return whether every check passed."""
        with self.lock:
            if self.printed:
                return False
            self.printed = True
            summary = dict(self.summary)
            if error is not None:
                summary["error"] = error
            checks = {name: dict(record) for name, record in self.results.items()}
            summary["checks"] = checks
            summary["ok"] = "error" not in summary and bool(checks) and all(r["ok"] for r in checks.values())
            summary["wall_s"] = round(time.perf_counter() - self.started, 1)
            line = json.dumps(summary)
            if self.output is not None:
                self.output.parent.mkdir(parents=True, exist_ok=True)
                self.output.write_text(line + "\n")
            print(line, flush=True)
            return bool(summary["ok"])

    def watchdog(self, budget_s: float) -> threading.Timer:
        """A timer that, at the budget's end, reports the check still running as timed out and exits."""

        def expire() -> None:
            for record in self.results.values():
                if record.get("error") == RUNNING:
                    record["error"] = f"timed out: still running at the {budget_s:g} s budget"
            self.emit(error=f"the run passed its {budget_s:g} s budget")
            os._exit(1)

        timer = threading.Timer(budget_s, expire)
        timer.daemon = True
        return timer


def guarded(results: dict[str, dict[str, Any]], name: str, check: Callable[[], dict[str, Any]]) -> None:
    """Run one check into `results[name]`: its figures, `ok`, `seconds`; an exception is its `error` (the
    last line of it, the traceback on stderr), and the next check runs."""
    started = time.perf_counter()
    results[name] = {"ok": False, "error": RUNNING}  # what the watchdog reports if it never returns
    try:
        record = {"ok": True, **check()}
    except Exception as error:  # any failure is this check's result, not the script's end
        traceback.print_exc(file=sys.stderr)
        record = {"ok": False, "error": describe(error)}
    record["seconds"] = round(time.perf_counter() - started, 3)
    results[name] = record
    print(f"{name}: {'ok' if record['ok'] else record['error']} ({record['seconds']} s)", file=sys.stderr)


def ensure_pydantic(wheels: Path | None) -> str:
    """pydantic importable, from `wheels` (installed into a temporary folder) where it is not."""
    try:
        import pydantic
    except ImportError:
        if wheels is None or not wheels.is_dir():
            raise SystemExit(
                "gpu_check: pydantic is missing; pass --wheels DIR (see the docstring)"
            ) from None
        target = Path(tempfile.mkdtemp(prefix="gpu-check-deps-"))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
        subprocess.run([*pip, "--target", str(target), *WHEELS], check=True)
        sys.path.insert(0, str(target))
        import pydantic
    return str(pydantic.VERSION)


def ensure_peft(wheels: Path | None) -> str:
    """peft importable, from `wheels` where it is not (as `ensure_pydantic`)."""
    try:
        import peft
    except ImportError:
        if wheels is None or not wheels.is_dir():
            raise RuntimeError("peft is missing; carry its wheels in --wheels DIR (docs/gpu.md)") from None
        target = Path(tempfile.mkdtemp(prefix="gpu-check-peft-"))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
        subprocess.run([*pip, "--no-deps", "--target", str(target), *PEFT_WHEELS], check=True)
        sys.path.insert(0, str(target))
        import peft
    return str(peft.__version__)


def build_student(directory: Path, size: dict[str, int]) -> Path:
    """A random Llama and its tokenizer saved as a model ships (bfloat16 safetensors)."""
    import torch
    from distillery_runtime.testing.tiny import save_tiny_model

    return save_tiny_model(
        directory, vocab_size=size["vocab"], model_vocab_size=size["model_vocab"], hidden=size["hidden"],
        layers=size["layers"], heads=size["heads"], dtype=torch.bfloat16, init_std=0.02,
    )  # fmt: skip


def train_samples(
    n: int, vocab: int, top_k: int, seed: int = 0, lengths: tuple[int, int] | None = None
) -> list[Any]:
    """Samples with a random teacher's top-k, as the loop hands the trainer; `lengths`: every sample's
    (prompt, response) tokens, else lengths that vary from sample to sample."""
    import numpy as np
    import torch
    from distillery_runtime.data.samples import TrainSample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt, response = lengths or (8 + i % 5, 16 + (3 * i) % 17)
        logp = torch.log_softmax(torch.randn(response, vocab, generator=g) * 2, -1)
        top = logp.topk(top_k, -1)
        ids = torch.randint(4, vocab, (response,), generator=g)
        out.append(
            TrainSample(
                prompt_ids=torch.randint(4, vocab, (prompt,), generator=g).tolist(),
                response_ids=ids.tolist(),
                old_logprobs=None,
                topk_ids=top.indices.numpy().astype(np.int32),
                topk_logprobs=top.values.numpy().astype(np.float32),
                token_logprobs=logp.gather(-1, ids[:, None])[:, 0].numpy(),
                teacher_mask=np.ones(response, bool),
            )
        )
    return out


def _max_diff(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _peak_gib(ctx: Context) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if ctx.device.type == "cuda" else None


# ---------------------------------------------------------------------------------------------- checks


def fsdp_step(ctx: Context) -> dict[str, Any]:
    import torch
    from distillery_runtime.training.trainer import Trainer, step_normalizer

    from distillery.api.spec import LossMode, Sharding
    from distillery.plan.loss import LossConfig
    from distillery.plan.training import TrainerSettings

    settings = TrainerSettings(
        lr=1e-3, micro_batch_size=4, total_steps=2, sharding=Sharding.FSDP,
        loss=LossConfig(mode=LossMode.REVERSE_KL_TOPK), streamed_export=True, sharded_checkpoint=True,
    )  # fmt: skip
    trainer = Trainer(str(ctx.model_dir), settings, rank=0, world_size=1, device=str(ctx.device))
    before = {n: t.clone() for n, t in trainer.full_state_dict().items()}
    samples = train_samples(8, ctx.vocab, 16)
    normalizer = step_normalizer(samples, settings.loss)
    metrics = trainer.train_step(samples, normalizer)  # the first step warms up (kernels, allocator)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    metrics = trainer.train_step(samples, normalizer)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    step_s = time.perf_counter() - started
    after = trainer.full_state_dict()
    moved = max(_max_diff(after[n], before[n]) for n in before)
    loss, grad_norm = float(metrics["distill/loss"]), float(metrics["train/grad_norm"])
    if not (torch.isfinite(torch.tensor([loss, grad_norm])).all() and moved > 0):
        raise AssertionError(f"loss {loss}, grad norm {grad_norm}, weights moved by {moved}")
    ctx.trainer = trainer
    return {
        "backend": torch.distributed.get_backend(),
        "compute_dtype": str(trainer.compute_dtype).removeprefix("torch."),
        "fused_adamw": bool(trainer.optimizer.defaults.get("fused")),
        "parameters": sum(t.numel() for t in before.values()),
        "loss": round(loss, 5),
        "grad_norm": round(grad_norm, 5),
        "step_s": round(step_s, 4),
        "peak_gib": _peak_gib(ctx),
    }


def lora_step(ctx: Context, wheels: Path | None) -> dict[str, Any]:
    import torch
    from distillery_runtime.checkpoints.streamed_export import Target
    from distillery_runtime.training.trainer import Trainer, step_normalizer
    from safetensors import safe_open

    from distillery.api.spec import LossMode, Sharding
    from distillery.plan.lora import LoraSettings
    from distillery.plan.loss import LossConfig
    from distillery.plan.training import TrainerSettings

    peft_version = ensure_peft(wheels)
    lora = LoraSettings(rank=16, alpha=32)
    settings = TrainerSettings(
        lr=1e-3, micro_batch_size=4, total_steps=2, sharding=Sharding.FSDP,
        loss=LossConfig(mode=LossMode.REVERSE_KL_TOPK), streamed_export=True, lora=lora,
    )  # fmt: skip
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(str(ctx.model_dir), settings, rank=0, world_size=1, device=str(ctx.device))
    before = {n: t.clone() for n, t in trainer.full_state_dict().items()}
    samples = train_samples(8, ctx.vocab, 16)
    normalizer = step_normalizer(samples, settings.loss)
    for _ in range(2):
        metrics = trainer.train_step(samples, normalizer)
    after = trainer.full_state_dict()
    frozen = [n for n in before if ".lora_" not in n]
    if any(not torch.equal(after[n], before[n]) for n in frozen):
        raise AssertionError("a frozen weight changed")
    adapter_moved = max(_max_diff(after[n], before[n]) for n in before if ".lora_B." in n)
    dtypes = {str(after[n].dtype).removeprefix("torch.") for n in frozen if after[n].is_floating_point()}
    if not adapter_moved > 0 or dtypes != {str(trainer.compute_dtype).removeprefix("torch.")}:
        raise AssertionError(f"adapter moved by {adapter_moved}; frozen weights in {dtypes}")
    stream = trainer.weight_stream()
    assert stream is not None
    stream.write([Target(ctx.work / "lora-model", torch.float32)])
    merged: dict[str, Any] = {}
    for path in sorted((ctx.work / "lora-model").glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            merged.update({key: f.get_tensor(key) for key in f.keys()})  # noqa: SIM118 - not a dict
    error = 0.0
    for key in (n for n in after if n.endswith(".base_layer.weight")):
        prefix = key.removesuffix(".base_layer.weight")
        b, a = (
            after[f"{prefix}.lora_B.default.weight"].float(),
            after[f"{prefix}.lora_A.default.weight"].float(),
        )
        want = after[key].float() + lora.scale * (b @ a)
        error = max(
            error, _max_diff(merged[key.removeprefix("base_model.model.").replace(".base_layer", "")], want)
        )
    if error > 1e-4:
        raise AssertionError(f"the merged model differs from W + scale B A by {error}")
    return {
        "peft": peft_version,
        "adapter_parameters": sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"]),
        "loss": round(float(metrics["distill/loss"]), 5),
        "adapter_moved": adapter_moved,
        "merge_error": error,
        "peak_gib": _peak_gib(ctx),
    }


def _trainer(ctx: Context) -> Any:
    if ctx.trainer is None:
        raise RuntimeError("needs fsdp_step's trainer, which failed")
    return ctx.trainer


def object_store_sync(ctx: Context) -> dict[str, Any]:
    import torch

    trainer = _trainer(ctx)
    whole = trainer.full_state_dict()
    started = time.perf_counter()
    weights = dict(trainer.weights(torch.bfloat16))
    seconds = time.perf_counter() - started
    wrong = [n for n, t in whole.items() if not torch.equal(weights[n], t.to(torch.bfloat16))]
    if wrong or set(weights) != set(whole):
        raise AssertionError(f"{len(wrong)} tensors differ from the gathered weights, e.g. {wrong[:3]}")
    pinned = all(t.is_pinned() for t in weights.values()) if ctx.device.type == "cuda" else None
    return {"tensors": len(weights), "sync_s": round(seconds, 4), "pinned": pinned, "exact": True}


def streamed_export(ctx: Context) -> dict[str, Any]:
    import torch
    from distillery_runtime.checkpoints.streamed_export import Target
    from safetensors import safe_open

    trainer = _trainer(ctx)
    stream = trainer.weight_stream()
    if stream is None:
        raise AssertionError("the student's names need save_pretrained: nothing streams")
    out = ctx.work / "export"
    stream.write([Target(out / "master", None), Target(out / "model", torch.bfloat16)])
    whole = trainer.full_state_dict()
    found: dict[str, dict[str, Any]] = {"master": {}, "model": {}}
    for folder, tensors in found.items():
        for path in sorted((out / folder).glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                tensors.update({key: f.get_tensor(key) for key in f.keys()})  # noqa: SIM118 - not a dict
    wrong = [n for n, t in whole.items() if not torch.equal(found["master"][n], t)]
    wrong += [n for n, t in whole.items() if not torch.equal(found["model"][n], t.to(torch.bfloat16))]
    if wrong:
        raise AssertionError(f"{len(wrong)} exported tensors differ, e.g. {wrong[:3]}")
    files = sorted(p.name for p in (out / "master").iterdir())
    size = sum(p.stat().st_size for p in out.rglob("*.safetensors"))
    return {"master_files": files, "bytes": size, "exact": True}


def sharded_checkpoint(ctx: Context) -> dict[str, Any]:
    import torch
    from distillery_runtime.checkpoints import checkpoint
    from torch.distributed.tensor import DTensor

    trainer = _trainer(ctx)
    path = ctx.work / "optimizer"

    def state() -> dict[str, Any]:
        return {
            f"{name}.{key}": (value.full_tensor() if isinstance(value, DTensor) else value)
            .detach()
            .cpu()
            .clone()
            for name, param in trainer.model.named_parameters()
            for key, value in trainer.optimizer.state[param].items()
            if isinstance(value, torch.Tensor)
        }

    saved = state()
    trainer.save_optimizer_shards(path)
    for param_state in trainer.optimizer.state.values():
        for value in param_state.values():
            if isinstance(value, torch.Tensor):
                value.zero_()
    trainer.load_optimizer_shards(path)
    loaded = state()
    wrong = [k for k, v in saved.items() if not torch.equal(loaded[k], v)]
    if wrong:
        raise AssertionError(f"{len(wrong)} optimizer tensors differ after the round trip, e.g. {wrong[:3]}")
    rng = checkpoint.rng_state()
    expected = torch.rand(4, device=ctx.device)
    checkpoint.set_rng_state(rng)
    again = torch.rand(4, device=ctx.device)
    if not torch.equal(expected, again):
        raise AssertionError(f"the RNG state did not come back on {ctx.device}")
    return {"optimizer_tensors": len(saved), "cuda_rng": "cuda" in rng, "exact": True}


def sharded_load(ctx: Context) -> dict[str, Any]:
    import torch
    from distillery_runtime.training.sharded_load import (
        CHUNK_FRACTION,
        checkpoint_shapes,
        chunks,
        load_from_rank0,
        meta_model,
        safetensors_files,
    )
    from distillery_runtime.training.sharding import full_tensor, shard_student
    from safetensors import safe_open

    model = meta_model(ctx.model_dir)
    if model is None:
        raise AssertionError("meta_model refused the student (see its log line)")
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32
    shard_student(model, device=ctx.device, compute_dtype=dtype, random_init=False)
    load_from_rank0(model, ctx.model_dir)
    files = safetensors_files(ctx.model_dir)
    stored: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            stored.update({key: f.get_tensor(key).float() for key in f.keys()})  # noqa: SIM118 - not a dict
    state = model.state_dict()
    wrong = [n for n, t in stored.items() if not torch.equal(full_tensor(state[n], ctx.device).cpu(), t)]
    if wrong or set(stored) != set(state):
        raise AssertionError(f"{len(wrong)} loaded tensors differ from the files, e.g. {wrong[:3]}")
    shapes = checkpoint_shapes(files)
    total = sum(4 * int(torch.Size(s).numel()) for _, s in shapes.values())
    broadcasts = len(chunks(shapes, max(1, int(total * CHUNK_FRACTION))))
    return {"tensors": len(stored), "chunks": broadcasts, "exact": True}


def ipc_sync(ctx: Context, total_bytes: int) -> dict[str, Any]:
    import gpu_sync

    out = ctx.work / "gpu_sync"
    out.mkdir(exist_ok=True)
    result = gpu_sync.run("auto", total_bytes, ctx.device.type, 1, out)
    expected = "ipc" if ctx.device.type == "cuda" else "shm"
    if result["chosen"] != expected:
        raise AssertionError(f"auto chose {result['chosen']}, not {expected}")
    return {"bytes": total_bytes, **result}


def losses(ctx: Context, tokens: int, vocab: int, top_k: int) -> dict[str, Any]:
    import torch
    from distillery_runtime.losses import TeacherTargets, distillation_loss

    from distillery.api.spec import LossMode, Objective
    from distillery.plan.loss import LossConfig

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, tokens, vocab, generator=g, dtype=torch.float64) * 2
    teacher = torch.log_softmax(torch.randn(1, tokens, vocab, generator=g, dtype=torch.float64) * 2, -1)
    top = teacher.topk(top_k, -1)
    response = top.indices[..., 0]
    old = torch.log_softmax(logits, -1).gather(-1, response[..., None])[..., 0] - 0.1

    def run(mode: LossMode, device: Any, dtype: Any) -> tuple[float, Any, float]:
        objective = Objective.POLICY_GRADIENT if mode == LossMode.K1 else Objective.DIRECT
        # Four chunks of the vocabulary pass on either device: the chunked path is the one that runs.
        config = LossConfig(mode=mode, objective=objective, chunk_tokens=max(1, tokens // 4))
        student = logits.to(device, dtype, copy=True).requires_grad_()  # a leaf of its own each run
        targets = TeacherTargets(
            top.indices.to(device), top.values.to(device, dtype), teacher.gather(-1, response[..., None])[..., 0].to(device, dtype)
        )  # fmt: skip
        mask = torch.ones(1, tokens, dtype=torch.bool, device=device)
        old_logprobs = old.to(device, dtype) if objective == Objective.POLICY_GRADIENT else None
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = distillation_loss(
            student, response.to(device), mask, targets, config, old_logprobs=old_logprobs
        )
        out.loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        assert student.grad is not None
        return float(out.loss.detach()), student.grad.detach().cpu().double(), time.perf_counter() - started

    figures: dict[str, Any] = {"tokens": tokens, "vocab": vocab, "top_k": top_k}
    worst = 0.0
    for mode in LossMode:
        loss, grad, seconds = run(mode, ctx.device, torch.float32)
        ref_loss, ref_grad, _ = run(mode, torch.device("cpu"), torch.float64)
        loss_error = abs(loss - ref_loss) / max(1.0, abs(ref_loss))
        grad_error = float((grad - ref_grad).abs().max() / ref_grad.abs().max().clamp_min(1e-30))
        worst = max(worst, loss_error, grad_error)
        figures[str(mode)] = {
            "loss": round(loss, 6), "loss_error": float(f"{loss_error:.2e}"),
            "grad_error": float(f"{grad_error:.2e}"), "ms": round(1000 * seconds, 2),
        }  # fmt: skip
    if worst > 1e-3:  # float32 against float64: a wrong kernel is off by far more
        raise AssertionError(f"a loss differs from its float64 reference by {worst:.2e} (relative)")
    figures["worst_relative_error"] = float(f"{worst:.2e}")
    return figures


# ------------------------------------------------------------------------------------------------ main


def init_group(device: Any, work: Path) -> str:
    """Rank 0 of a world of one, through a file store: what every check's collectives run on."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    extra = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend, init_method=f"file://{work}/group", rank=0, world_size=1,
        timeout=datetime.timedelta(minutes=5), **extra,
    )  # fmt: skip
    return backend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--wheels", type=Path, default=ROOT / ".gpu-wheels", help="where pydantic's wheels are"
    )
    parser.add_argument("--output", type=Path, default=None, help="also write the summary here (JSON)")
    parser.add_argument(
        "--budget-s", type=float, default=450, help="the whole run's limit (the line is printed)"
    )
    args = parser.parse_args(argv)
    for absent in ABSENT:
        sys.modules[absent] = None  # type: ignore[assignment]  # an import of it raises ImportError
    summary: dict[str, Any] = {"bench": "gpu_check", "device": args.device}
    results: dict[str, dict[str, Any]] = {}
    report = Report(summary, results, args.output)
    watchdog = report.watchdog(args.budget_s)
    watchdog.start()
    try:
        summary["pydantic"] = ensure_pydantic(args.wheels)
        import torch
        import transformers

        device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
            summary["device"] = torch.cuda.get_device_name(device)
        summary.update(
            torch=torch.__version__, transformers=transformers.__version__, cuda=torch.version.cuda
        )
        on_gpu = device.type == "cuda"
        size = GPU_SIZE if on_gpu else CPU_SIZE
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            work = Path(tmp)
            summary["backend"] = init_group(device, work)
            ctx = Context(device, work, build_student(work / "student", size), size["vocab"])
            guarded(results, "fsdp_step", lambda: fsdp_step(ctx))
            guarded(results, "object_store_sync", lambda: object_store_sync(ctx))
            guarded(results, "streamed_export", lambda: streamed_export(ctx))
            guarded(results, "sharded_checkpoint", lambda: sharded_checkpoint(ctx))
            guarded(results, "sharded_load", lambda: sharded_load(ctx))
            guarded(results, "ipc_sync", lambda: ipc_sync(ctx, 1024**3 if on_gpu else 16 * 1024**2))
            shape = (4096, 32768, 64) if on_gpu else (64, 512, 8)
            guarded(results, "losses", lambda: losses(ctx, *shape))
            guarded(results, "lora_step", lambda: lora_step(ctx, args.wheels))
            torch.distributed.destroy_process_group()
    except BaseException as error:  # the one line is printed whatever happened before it
        summary["error"] = describe(error)
        traceback.print_exc(file=sys.stderr)
    watchdog.cancel()
    return 0 if report.emit() else 1


if __name__ == "__main__":
    raise SystemExit(json_main("gpu_check", main))
