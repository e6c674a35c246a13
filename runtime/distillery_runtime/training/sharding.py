"""FSDP2 for the student: each decoder layer and the root sharded over the trainer ranks.

`shard_student` applies torch's own `fully_shard` per decoder layer, then to the whole model (the root
holds the embedding, the final norm and the head): float32 master weights, gradients and AdamW state are
sharded over the ranks (1/N of 16 bytes a parameter each), a layer's weights are all-gathered in the
compute dtype just before it runs and freed after (MixedPrecisionPolicy: bf16 compute on GPU, float32
gradient reduction), optionally kept in host memory between uses (CPUOffloadPolicy: the optimizer step
then runs on the CPU), and each layer optionally recomputed in the backward (transformers' gradient
checkpointing, non-reentrant `torch.utils.checkpoint`).

Gradients are SUMMED over ranks, not averaged: every rank weights its loss by its share of the whole
step (trainer.py), as the replicated path's all-reduce does.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
"""A collective that has not finished by then fails (a stuck rank) instead of hanging the job."""


def ensure_process_group(device: torch.device, world_size: int) -> None:
    """FSDP2 needs a process group; a single trainer rank gets one of its own (no port, no peers)."""
    if dist.is_initialized():
        return
    if world_size != 1:
        raise RuntimeError(f"{world_size} trainer ranks but no process group: call init_group first")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=COLLECTIVE_TIMEOUT)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a Hugging Face causal LM (Llama, Qwen2, Mistral: `model.model.layers`), under
    a LoRA student's peft wrapper too."""
    unwrap = getattr(model, "get_base_model", None)
    if callable(unwrap):
        model = unwrap()
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no model.layers to shard")
    return list(layers)


def shard_student(
    model: nn.Module,
    *,
    device: torch.device,
    compute_dtype: torch.dtype,
    cpu_offload: bool = False,
    offload_pinned: bool = True,
    activation_checkpointing: bool = False,
    random_init: bool = True,
) -> nn.Module:
    """Apply FSDP2 in place (per decoder layer, then the root); returns the same model, now an FSDPModule.

    The model's float32 parameters may be on CPU or on the meta device; FSDP2 moves them to `device`, or
    keeps them pinned in host memory with `cpu_offload`. Meta parameters are materialised as this rank's
    shards only, random-initialised (`random_init`: benchmarks of real-size shapes) or left for
    `sharded_load.load_from_rank0` to fill.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if activation_checkpointing:
        # transformers' own per-layer checkpointing (non-reentrant: works with FSDP2's hooks).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]
        model.config.use_cache = False  # type: ignore[union-attr]
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(
        param_dtype=compute_dtype if compute_dtype != torch.float32 else None, reduce_dtype=torch.float32
    )
    offload: OffloadPolicy = CPUOffloadPolicy(pin_memory=offload_pinned) if cpu_offload else OffloadPolicy()
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp, "offload_policy": offload}
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    # Sum, not mean, over ranks (see the module docstring); a plain SUM (gloo has no PREMUL_SUM).
    model.set_gradient_divide_factor(1.0)  # type: ignore[operator]
    if hasattr(model, "set_force_sum_reduction_for_comms"):  # torch >= 2.9
        model.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    if any(param.is_meta for param in model.parameters()):
        target = torch.device("cpu") if cpu_offload else device
        if random_init:
            materialize_random(model, target)
        else:
            materialize_empty(model, target)
    if cpu_offload:
        # Buffers (rotary inverse frequencies) are not offloaded state: they live where compute runs.
        for module in model.modules():
            for name, buffer in list(module.named_buffers(recurse=False)):
                module._buffers[name] = buffer.to(device)
    return model


@torch.no_grad()
def materialize_empty(model: nn.Module, device: torch.device) -> None:
    """A model built on the meta device: allocate each rank's shards only (uninitialised), rebuild the
    rotary embedding's buffers, which `to_empty` leaves uninitialised and no checkpoint holds
    (non-persistent `inv_freq`), and re-tie an LM head tied to the embedding (transformers' tie_weights:
    a no-op where `to_empty` kept the one shared parameter)."""
    model.to_empty(device=device)
    for module in model.modules():
        rotary = getattr(module, "rotary_emb", None)
        if rotary is not None and hasattr(rotary, "inv_freq"):
            module.rotary_emb = type(rotary)(config=model.config).to(device)
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()


@torch.no_grad()
def materialize_random(model: nn.Module, device: torch.device) -> None:
    """A model built on the meta device (benchmarks of real-size shapes): `materialize_empty`, then
    random-initialise the shards (normal(0, initializer_range) weights, zero biases, unit norms)."""
    materialize_empty(model, device)
    std = float(getattr(model.config, "initializer_range", 0.02))  # type: ignore[union-attr]
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        if name.endswith("norm.weight"):
            local.fill_(1.0)
        elif name.endswith(".bias"):
            local.zero_()
        else:
            local.normal_(0.0, std)


def local_grad_norm_squared(params: list[nn.Parameter], device: torch.device) -> torch.Tensor:
    """Sum of squares of this rank's shards of the gradients (float32, on `device`)."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    for p in params:
        if p.grad is None:
            continue
        grad = p.grad
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        total += local.float().pow(2).sum().to(device)
    return total


def clip_sharded_gradients(params: list[nn.Parameter], max_norm: float, device: torch.device) -> float:
    """Global gradient norm over all ranks' shards, and clipping to `max_norm` (0 = none).

    By hand rather than `clip_grad_norm_` on DTensors: with CPU offload the gradients are host tensors
    while the group may be NCCL, so the one collective here runs on `device`."""
    squared = local_grad_norm_squared(params, device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(squared, op=dist.ReduceOp.SUM)
    norm = float(squared.sqrt())
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for p in params:
            if p.grad is not None:
                grad = p.grad
                (grad.to_local() if isinstance(grad, DTensor) else grad).mul_(scale)
    return norm


def full_tensor(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The whole tensor of a (possibly sharded) parameter; a collective: every rank must call it."""
    if isinstance(tensor, DTensor):
        # An offloaded shard lives on the CPU; the all-gather runs where the group does. (A DTensor's `to`
        # returns a DTensor; torch types it as a plain Tensor.)
        whole: torch.Tensor = tensor.to(device).full_tensor()  # type: ignore[attr-defined]
        return whole
    return tensor
