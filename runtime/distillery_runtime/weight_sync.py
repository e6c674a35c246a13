"""Weight sync streamed in buckets from the trainer to every rollout engine, without Ray's object store.

A sync group is a torch.distributed process group of its own (not the trainers' group): rank 0 is trainer
rank 0, ranks 1..n the rollout engines' workers, joined through a TCPStore that rank 0 hosts. Gloo on CPU,
NCCL on GPU: the same code either way, so the CPU tests run what a GPU job runs.

A sync walks the student's tensors in a fixed order (`plan_buckets`: consecutive tensors of one dtype up
to `bucket_bytes`). For each bucket every trainer rank gathers the bucket's tensors from the FSDP2 shards
(a collective of the trainers' group), rank 0 packs them into one flat buffer in the engine's dtype and
broadcasts it to the engines, which unpack it and hand the tensors on as they arrive. So no rank holds
more than a bucket (or two) of gathered weights beyond its shards, and nothing is serialised or copied
through the object store.

Every wait has a timeout. Before each sync the engines check in through the store; a peer that does not
within the timeout is named (`WeightSyncError: rollout engine 1 (sync rank 2) did not join ...`); a bucket
that does not arrive in time fails the same way on both sides.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 256 * 1024**2
DEFAULT_TIMEOUT = datetime.timedelta(seconds=120)
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
}


class WeightSyncError(RuntimeError):
    """A sync that could not finish: a peer that never joined, or a bucket that did not arrive in time."""


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str
    """As it travels (the engine's dtype for floating tensors)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=DTYPES[self.dtype]).element_size()


def plan_buckets(metas: Sequence[TensorMeta], bucket_bytes: int) -> list[list[int]]:
    """Indices of `metas`, in order, cut into buckets of one dtype of at most `bucket_bytes` (a larger
    tensor travels alone). Sender and receivers compute the same plan from the same metadata."""
    buckets: list[list[int]] = []
    size = 0
    for i, meta in enumerate(metas):
        fresh = not buckets or metas[buckets[-1][0]].dtype != meta.dtype or size + meta.nbytes > bucket_bytes
        if fresh:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += meta.nbytes
    return buckets


def tensor_metas(named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None) -> list[TensorMeta]:
    """What the engines need to know before the first byte: names, whole shapes, dtypes as sent."""
    out = []
    for name, tensor in named:
        sent = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        out.append(TensorMeta(name, tuple(tensor.shape), str(sent).removeprefix("torch.")))
    return out


class SyncGroup:
    """One member of a sync group: rank 0 sends, the others receive. `names[r]` names rank r in errors."""

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        names: Sequence[str],
        *,
        device: torch.device | None = None,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        self.rank, self.names, self.timeout = rank, list(names), timeout
        self.world = len(self.names)
        self.device = device or torch.device("cpu")
        self.store = dist.TCPStore(host, port, self.world, is_master=rank == 0, timeout=timeout)
        self._syncs = 0
        # A backend object of its own: the engines' processes have no default group to derive one from.
        self.group: Any
        if self.device.type == "cuda":
            self.group = dist.ProcessGroupNCCL(self.store, rank, self.world, dist.ProcessGroupNCCL.Options())
        else:
            self.group = dist.ProcessGroupGloo(self.store, rank, self.world, timeout)

    # ------------------------------------------------------------------------------------- both sides

    def _broadcast(self, buffer: torch.Tensor, what: str) -> None:
        work = self.group.broadcast([buffer], dist.BroadcastOptions())  # root 0
        try:
            done = work.wait(self.timeout)
        except RuntimeError as error:
            raise WeightSyncError(self._stuck(what, error)) from None
        if done is False:
            raise WeightSyncError(self._stuck(what, None))

    def _stuck(self, what: str, error: Exception | None) -> str:
        peers = (
            "the trainer (sync rank 0)" if self.rank else ", ".join(self._peer_names(range(1, self.world)))
        )
        reason = f": {str(error).splitlines()[0]}" if error else ""
        return (
            f"weight sync: {what} did not complete within {self.timeout.total_seconds():.0f} s between "
            f"{self.names[self.rank]} and {peers}{reason}"
        )

    def _peer_names(self, ranks: Iterable[int]) -> list[str]:
        return [f"{self.names[r]} (sync rank {r})" for r in ranks]

    # ------------------------------------------------------------------------------------- sender

    def wait_ready(self) -> None:
        """Rank 0, before a sync: waits until every engine has checked in for it, naming any that does not."""
        self._syncs += 1
        keys = [f"sync{self._syncs}/ready/{r}" for r in range(1, self.world)]
        try:
            self.store.wait(keys, self.timeout)
        except RuntimeError:
            missing = [
                r for r, key in zip(range(1, self.world), keys, strict=True) if not self.store.check([key])
            ]
            raise WeightSyncError(
                f"weight sync: {', '.join(self._peer_names(missing))} did not join within "
                f"{self.timeout.total_seconds():.0f} s"
            ) from None

    def send(self, buckets: Iterable[list[torch.Tensor]]) -> int:
        """Rank 0, after `wait_ready`: broadcasts each bucket as one flat buffer. Returns the bytes sent."""
        sent = 0
        for index, tensors in enumerate(buckets):
            flat = torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) > 1 else tensors[0].reshape(-1)
            flat = flat.to(self.device).contiguous()
            self._broadcast(flat, f"bucket {index + 1}")
            sent += flat.numel() * flat.element_size()
        return sent

    # ------------------------------------------------------------------------------------- receivers

    def receive(self, metas: Sequence[TensorMeta], bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks 1..n: the tensors of this sync, bucket by bucket as they arrive (each a view of its
        bucket's buffer, valid until the caller drops it)."""
        self._syncs += 1
        self.store.set(f"sync{self._syncs}/ready/{self.rank}", "1")
        for index, bucket in enumerate(plan_buckets(metas, bucket_bytes)):
            dtype = DTYPES[metas[bucket[0]].dtype]
            total = sum(metas[i].numel for i in bucket)
            buffer = torch.empty(total, dtype=dtype, device=self.device)
            self._broadcast(buffer, f"bucket {index + 1}")
            offset = 0
            for i in bucket:
                meta = metas[i]
                yield meta.name, buffer[offset : offset + meta.numel].view(meta.shape)
                offset += meta.numel

    def close(self) -> None:
        del self.group


def sender_buckets(
    metas: Sequence[TensorMeta],
    bucket_bytes: int,
    gather: Callable[[int], torch.Tensor | None],
) -> Iterator[list[torch.Tensor]]:
    """The sender's buckets: `gather(i)` returns tensor i whole, cast to its travelling dtype (on every
    trainer rank it is a collective; it returns None on ranks other than 0, which only take part)."""
    for bucket in plan_buckets(metas, bucket_bytes):
        tensors = [gather(i) for i in bucket]
        if all(t is not None for t in tensors):
            yield [t for t in tensors if t is not None]
