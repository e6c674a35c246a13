"""Weight sync streamed in buckets from the trainer to every rollout engine, without Ray's object store.

A sync group is a torch.distributed process group of its own (not the trainers' group): rank 0 is trainer
rank 0, ranks 1..n the rollout engines' workers (one per tensor-parallel rank; in vLLM's workers through
its weight-transfer API, rollout/vllm_transfer.py), joined through a TCPStore that rank 0 hosts. Gloo, on
tensors in host memory (where the engines' loaders take them today), so the CPU tests run what a GPU job
runs; NCCL when the members pass a CUDA device (written, not yet run: the lent GPU machines have no vLLM).

A sync walks the student's tensors in a fixed order (`plan_buckets`: consecutive tensors of one dtype up
to `bucket_bytes`). For each bucket every trainer rank gathers the bucket's tensors from the FSDP2 shards
(a collective of the trainers' group), rank 0 packs them into one flat buffer in the engine's dtype and
broadcasts it to the engines, which unpack it and hand the tensors on as they arrive. So no rank holds
more than a bucket (or two) of gathered weights beyond its shards, and nothing is serialised or copied
through the object store.

Two transports carry the buckets. When every member of the group is on one host (a colocated engine:
the common case), through shared memory: rank 0 copies each bucket into one of two /dev/shm slots and
says so through the store, the engines read it from there and acknowledge, so copying the next bucket
overlaps reading this one (the CPU counterpart of CUDA IPC, which a GPU would use: not done yet). Across
hosts, or without room in /dev/shm, a broadcast on the group (gloo; NCCL on request).

Every wait has a timeout. Before each sync the engines check in through the store; a peer that does not
within the timeout is named (`WeightSyncError: rollout engine 1 (sync rank 2) did not join ...`); a bucket
that does not arrive in time fails the same way on both sides.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
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


SHM_DIR = Path("/dev/shm")
SHM_SLOTS = 2
"""Two slots: rank 0 fills one while the engines read the other."""


def bucket_sizes(metas: Sequence[TensorMeta], bucket_bytes: int) -> list[int]:
    return [sum(metas[i].nbytes for i in bucket) for bucket in plan_buckets(metas, bucket_bytes)]


class SyncGroup:
    """One member of a sync group: rank 0 sends, the others receive. `names[r]` names rank r in errors.

    `transport`: "auto" (shared memory when every member is on this host and /dev/shm has room, else the
    collective), "shm" or "collective"; every member must use the same."""

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        names: Sequence[str],
        *,
        device: torch.device | None = None,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
        transport: str = "auto",
    ) -> None:
        self.rank, self.names, self.timeout = rank, list(names), timeout
        self.world = len(self.names)
        self.device = device or torch.device("cpu")
        self.store = dist.TCPStore(host, port, self.world, is_master=rank == 0, timeout=timeout)
        self._syncs = 0
        self._slots: dict[int, torch.Tensor] = {}
        self._prefix = f"distillery-sync-{port}"
        self.store.set(f"host/{rank}", socket.gethostname())
        hosts = {self.store.get(f"host/{r}").decode() for r in range(self.world)}
        self.transport = "collective" if transport == "auto" and len(hosts) > 1 else transport
        self.last_transport = ""
        """What the last sync went through: shm or collective."""
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

    def _has(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except RuntimeError:  # the store's host (the trainer) is gone
            return False

    def _peer_names(self, ranks: Iterable[int]) -> list[str]:
        return [f"{self.names[r]} (sync rank {r})" for r in ranks]

    # ------------------------------------------------------------------------------------- sender

    def wait_ready(self) -> None:
        """Rank 0, before a sync: waits until every engine has checked in for it, naming any that does not."""
        self._syncs += 1
        engines = list(range(1, self.world))
        self._wait([f"sync{self._syncs}/ready/{r}" for r in engines], engines, "join")

    def send(
        self, metas: Sequence[TensorMeta], bucket_bytes: int, buckets: Iterable[list[torch.Tensor]]
    ) -> int:
        """Rank 0, after `wait_ready`: each bucket (the tensors of `plan_buckets(metas, bucket_bytes)`) as one
        flat buffer, through shared memory or a broadcast. Returns the bytes sent."""
        if self._use_shm(metas, bucket_bytes):
            return self._send_shm(metas, bucket_bytes, buckets)
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
        bucket's buffer: valid until the next bucket is asked for; copy what must last longer)."""
        self._syncs += 1
        self.store.set(f"sync{self._syncs}/ready/{self.rank}", "1")
        if self._use_shm(metas, bucket_bytes):
            yield from self._receive_shm(metas, bucket_bytes)
            return
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

    # ------------------------------------------------------------------------------------- shared memory

    def _use_shm(self, metas: Sequence[TensorMeta], bucket_bytes: int) -> bool:
        self.last_transport = "collective"
        if self.transport == "collective" or self.device.type != "cpu":
            return False
        self.last_transport = "shm"
        if self.transport == "shm":
            return True
        # auto: every member decides the same from the same numbers (a pod's /dev/shm is often small).
        need = SHM_SLOTS * max(bucket_sizes(metas, bucket_bytes), default=0)
        decision = f"shm-decision/{self._syncs}"
        if self.rank == 0:
            stat = os.statvfs(SHM_DIR) if SHM_DIR.is_dir() else None
            room = stat.f_bavail * stat.f_frsize if stat else 0
            held = sum(t.numel() for t in self._slots.values())
            self.store.set(decision, "1" if room + held >= need else "0")
        try:
            chosen = self.store.get(decision)
        except RuntimeError:  # the trainer gave this sync up (an engine did not check in), or is gone
            raise WeightSyncError(self._stuck("the start of the sync", None)) from None
        if chosen == b"1":
            return True
        self.last_transport = "collective"
        return False

    def _slot(self, index: int, nbytes: int) -> torch.Tensor:
        """Slot `index`, at least `nbytes` long: a file in /dev/shm that every member maps."""
        current = self._slots.get(index)
        if current is not None and current.numel() >= nbytes:
            return current
        path = SHM_DIR / f"{self._prefix}-{index}-{nbytes}"
        if self.rank == 0 and current is not None:
            with contextlib.suppress(OSError):
                (SHM_DIR / f"{self._prefix}-{index}-{current.numel()}").unlink()
        slot = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
        self._slots[index] = slot
        return slot

    def _wait(self, keys: list[str], ranks: list[int], what: str) -> None:
        try:
            self.store.wait(keys, self.timeout)
        except RuntimeError:
            missing = [r for r, key in zip(ranks, keys, strict=True) if not self._has(key)]
            raise WeightSyncError(
                f"weight sync: {', '.join(self._peer_names(missing))} did not {what} within "
                f"{self.timeout.total_seconds():.0f} s"
            ) from None

    def _send_shm(
        self, metas: Sequence[TensorMeta], bucket_bytes: int, buckets: Iterable[list[torch.Tensor]]
    ) -> int:
        size = max(bucket_sizes(metas, bucket_bytes))
        tag = f"sync{self._syncs}"
        receivers = list(range(1, self.world))
        sent = 0
        index = -1
        for index, tensors in enumerate(buckets):
            if index >= SHM_SLOTS:  # the slot's previous bucket must have been read by every engine
                done = index - SHM_SLOTS
                self._wait(
                    [f"{tag}/b{done}/read/{r}" for r in receivers], receivers, f"read bucket {done + 1}"
                )
            slot = self._slot(index % SHM_SLOTS, size)
            offset = 0
            for tensor in tensors:
                flat = tensor.reshape(-1).contiguous().view(torch.uint8)
                slot[offset : offset + flat.numel()].copy_(flat)
                offset += flat.numel()
            self.store.set(f"{tag}/b{index}/written", "1")
            sent += offset
        # Done when every engine has read every bucket: the slots are free for the next sync.
        for done in range(max(0, index + 1 - SHM_SLOTS), index + 1):
            self._wait([f"{tag}/b{done}/read/{r}" for r in receivers], receivers, f"read bucket {done + 1}")
        # Every member has mapped the slots by now: their names can go, the memory stays while mapped, and
        # nothing is left in /dev/shm when a process dies (or a job never closes its group).
        self._unlink_slots()
        return sent

    def _receive_shm(
        self, metas: Sequence[TensorMeta], bucket_bytes: int
    ) -> Iterator[tuple[str, torch.Tensor]]:
        size = max(bucket_sizes(metas, bucket_bytes))
        tag = f"sync{self._syncs}"
        for index, bucket in enumerate(plan_buckets(metas, bucket_bytes)):
            self._wait([f"{tag}/b{index}/written"], [0], f"write bucket {index + 1}")
            slot = self._slot(index % SHM_SLOTS, size)
            offset = 0
            for i in bucket:
                meta = metas[i]
                yield meta.name, slot[offset : offset + meta.nbytes].view(DTYPES[meta.dtype]).view(meta.shape)
                offset += meta.nbytes
            self.store.set(f"{tag}/b{index}/read/{self.rank}", "1")

    def _unlink_slots(self) -> None:
        for index, slot in self._slots.items():
            with contextlib.suppress(OSError):
                (SHM_DIR / f"{self._prefix}-{index}-{slot.numel()}").unlink()

    def close(self) -> None:
        """Rank 0 removes the shared-memory slots' names if a sync failed before it did."""
        if self.rank == 0:
            self._unlink_slots()
        self._slots.clear()
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
