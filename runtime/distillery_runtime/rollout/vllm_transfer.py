"""Our weight sync as a vLLM weight-transfer backend: every worker of a vLLM engine (each tensor-parallel
rank) joins the sync group itself and loads the buckets as they arrive.

vLLM 0.32 has a weight-transfer API (`vllm.distributed.weight_transfer`): the engine is started with
`weight_transfer_config={"backend": NAME}`, each worker builds the backend's `WeightTransferEngine` around
its model, and the caller drives it with the workers' RPCs `init_weight_transfer_engine`,
`start_weight_update`, `update_weights` and `finish_weight_update`. Its own backends are NCCL and CUDA IPC,
which need a GPU on both ends and vLLM's trainer-side engines; this one carries `weight_sync.SyncGroup`'s
buckets (CUDA IPC on one GPU, shared memory on one host, a collective across hosts), so the trainer's
FSDP2 gather is unchanged and the CPU tests run the path a job runs. Loading goes through vLLM's layerwise reload, as its NCCL backend does:
checkpoint (Hugging Face) names in, each worker keeps its tensor-parallel shard of each tensor.

Registered by `register`, which vLLM calls in every process it starts (the `vllm.general_plugins` entry
point in pyproject.toml): a tensor-parallel engine's workers are processes of their own.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from distillery_runtime.sync.weight_sync import SyncGroup, TensorMeta

NAME = "distillery"
"""The backend's name in vLLM's registry."""
PLUGIN = "distillery_weight_sync"
"""The entry point's name (pyproject.toml), as VLLM_PLUGINS names it."""


@dataclass
class SyncInitInfo(WeightTransferInitInfo):
    """Where the sync group is and which ranks this engine's workers take: worker w of the engine (its
    rank in vLLM's parallel config) is sync rank `first_rank + w`."""

    host: str
    port: int
    first_rank: int
    names: list[str]
    timeout_s: float
    transport: str = "auto"


@dataclass
class SyncUpdateInfo(WeightTransferUpdateInfo):
    """One sync: the tensors' metadata (`TensorMeta` fields: name, shape, dtype) and the bucket size,
    from which sender and receivers derive the same buckets."""

    metas: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)
    bucket_bytes: int = 0


class SyncGroupTransferEngine(WeightTransferEngine[SyncInitInfo, SyncUpdateInfo]):
    """One vLLM worker's end of the weight-sync group."""

    init_info_cls = SyncInitInfo
    update_info_cls = SyncUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: SyncGroup | None = None

    def init_transfer_engine(self, init_info: SyncInitInfo) -> None:
        rank = init_info.first_rank + self.parallel_config.rank
        self.group = SyncGroup(
            init_info.host,
            init_info.port,
            rank,
            init_info.names,
            device=self.device,  # a GPU worker beside trainer rank 0 maps its buckets through CUDA IPC
            timeout=datetime.timedelta(seconds=init_info.timeout_s),
            transport=init_info.transport,
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class synchronises the accelerator after receiving, which raises on a CPU-only build;
        # our buckets are host tensors copied in synchronously.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: SyncUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("weight sync: init_weight_transfer_engine was not called on this worker")
        self.model.load_weights(self._tensors(update_info))  # type: ignore[operator]

    def _tensors(self, update_info: SyncUpdateInfo) -> Iterator[tuple[str, torch.Tensor]]:
        assert self.group is not None
        metas = [TensorMeta(name, tuple(shape), dtype) for name, shape, dtype in update_info.metas]
        for name, tensor in self.group.receive(metas, update_info.bucket_bytes):
            # A copy: the view is of the bucket's buffer, which the next bucket overwrites, and layerwise
            # reload holds a layer's tensors until the layer is complete.
            yield name, tensor.to(self.device, copy=True)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


def register() -> None:
    """The `vllm.general_plugins` entry point: vLLM calls it once in each of its processes."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    with contextlib.suppress(ValueError):  # registered already: the in-process engine registers it first
        WeightTransferEngineFactory.register_engine(NAME, SyncGroupTransferEngine)
