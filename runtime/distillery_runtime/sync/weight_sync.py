"""Weight sync streamed in buckets from the trainer to every rollout engine, without Ray's object store.

A sync group is a torch.distributed process group of its own (not the trainers' group): rank 0 is trainer
rank 0, ranks 1..n the rollout engines' workers (one per tensor-parallel rank; in vLLM's workers through
its weight-transfer API, rollout/vllm_transfer.py), joined through a TCPStore that rank 0 hosts. Each
member names its device; the group is NCCL where every member has a GPU of its own (NCCL refuses two
ranks on one GPU), gloo on host tensors otherwise, so the CPU tests run what a GPU job runs.

A sync walks the student's tensors in a fixed order (`plan_buckets`: consecutive tensors of one dtype up
to `bucket_bytes`). For each bucket every trainer rank gathers the bucket's tensors from the FSDP2 shards
(a collective of the trainers' group), rank 0 packs them into one flat buffer in the engine's dtype and
broadcasts it to the engines, which unpack it and hand the tensors on as they arrive. So no rank holds
more than a bucket (or two) of gathered weights beyond its shards, and nothing is serialised or copied
through the object store.

Three transports carry the buckets, chosen alike by every member from what each reported:
- CUDA IPC ("ipc"), when every member is on one GPU (a colocated engine beside trainer rank 0, the
  common case on a GPU): the two slots are device memory of rank 0's, which the others map through CUDA
  IPC handles (torch.multiprocessing's reductions, with the device index made the receiver's own), so a
  bucket never leaves the GPU. A handle travels through the store as plain data (`IpcSlotHandle`, JSON),
  never pickled: the store's port takes no credentials, so a receiver checks what it reads
  (`decode_ipc_handle`) before it maps anything;
- shared memory ("shm"), when every member is on one host otherwise: rank 0 copies each bucket into one of
  two /dev/shm slots and says so through the store, the engines read it from there and acknowledge, so
  copying the next bucket overlaps reading this one (from and to a GPU: one copy each way);
- a broadcast on the group ("collective"), across hosts or without room in /dev/shm.
The IPC path ran on an H100 on 2026-11-28 (bench/gpu_sync.py: two processes on one GPU, torch alone; `auto`
chose IPC, 1 GB in 6 ms, every tensor exact), with the handle then pickled: with the plain-data handle it has
not run on a GPU yet (its encoding is tested on CPU against torch's rebuild arguments); inside a vLLM worker
it has not, as no GPU machine lent so far had vLLM (docs/gpu.md lists what ran where).

Every wait has a timeout. Before each sync the engines check in through the store; a peer that does not
within the timeout is named (`WeightSyncError: rollout engine 1 (sync rank 2) did not join ...`); a bucket
that does not arrive in time fails the same way on both sides.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
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


def gpu_id(device: torch.device) -> str | None:
    """What tells GPUs apart across processes (indices differ with CUDA_VISIBLE_DEVICES); None on CPU."""
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


@dataclass(frozen=True)
class Member:
    """What each member reports when it joins: every member derives the same transports from these."""

    host: str
    gpu: str | None


def collective_on_gpus(members: Sequence[Member]) -> bool:
    """NCCL where every member has a GPU of its own; gloo on host tensors otherwise."""
    gpus = [m.gpu for m in members]
    return None not in gpus and len(set(gpus)) == len(gpus)


def one_gpu(members: Sequence[Member]) -> bool:
    """Every member on the same GPU: CUDA IPC."""
    return members[0].gpu is not None and len({(m.host, m.gpu) for m in members}) == 1


# ----------------------------------------------------------------------------- what travels through the store
# The store's port takes no credentials: whatever reaches it can set a key. So every value is plain data a
# reader checks before it acts on it, and nothing read from it is ever unpickled.

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
HANDLE_MAX_BYTES = 64 * 1024
"""Bound on a handle's bytes: a cudaIpcMemHandle is 64, an expandable segment's handle some per segment, the
ref counter's a shared-memory file name; anything near this bound is not one."""
Handle = Annotated[bytes, msgspec.Meta(max_length=HANDLE_MAX_BYTES)]
IPC_DTYPES = {"uint8": torch.uint8}
"""The dtypes a mapped slot may have: the slots are raw bytes, each bucket viewed in its own dtype after."""
HOST_MAX_CHARS = 253
"""A host name, or a GPU's UUID, is never longer (a DNS name's limit)."""
Name = Annotated[str, msgspec.Meta(max_length=HOST_MAX_CHARS)]


class IpcSlotHandle(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One device slot of rank 0's, as the receivers need it to map it: the arguments torch's `reduce_tensor`
    gives `rebuild_cuda_tensor`, less the tensor and storage classes and the device index (the receiver's
    own, `rebuild_args`). JSON, the handles' bytes in base64."""

    shape: tuple[NonNegative, ...]
    stride: tuple[NonNegative, ...]
    offset: NonNegative
    """The tensor's offset in its storage, in elements."""
    dtype: str
    storage_handle: Annotated[bytes, msgspec.Meta(min_length=1, max_length=HANDLE_MAX_BYTES)]
    """Which CUDA allocation holds the storage (a cudaIpcMemHandle, or an expandable segment's handle)."""
    storage_size_bytes: NonNegative
    storage_offset_bytes: NonNegative
    """Where the storage starts in that allocation."""
    ref_counter_handle: Handle
    ref_counter_offset: NonNegative
    event_handle: Handle
    event_sync_required: bool


REBUILD_ARGS = 15
"""How many arguments torch's `rebuild_cuda_tensor` takes (torch.multiprocessing.reductions)."""


def ipc_handle(args: Sequence[Any]) -> IpcSlotHandle:
    """Sender: the plain-data form of `reduce_tensor(slot)`'s rebuild arguments. Refuses (rather than
    sending something a receiver would rebuild differently) if torch's arguments are not what they were
    when this was written: a plain tensor without grad, in a TypedStorage."""
    if len(args) != REBUILD_ARGS:
        raise WeightSyncError(
            f"weight sync: torch's CUDA IPC arguments changed ({len(args)}, not {REBUILD_ARGS})"
        )
    (tensor_cls, size, stride, offset, storage_cls, dtype, _device, storage_handle, storage_size_bytes,
     storage_offset_bytes, requires_grad, ref_counter_handle, ref_counter_offset, event_handle,
     event_sync_required) = args  # fmt: skip
    if tensor_cls is not torch.Tensor or storage_cls is not torch.storage.TypedStorage or requires_grad:
        raise WeightSyncError(
            f"weight sync: a slot to share is a plain tensor without grad, not {tensor_cls.__name__} in "
            f"{storage_cls.__name__} (requires_grad={requires_grad})"
        )
    return IpcSlotHandle(
        shape=tuple(int(d) for d in size),
        stride=tuple(int(d) for d in stride),
        offset=int(offset),
        dtype=str(dtype).removeprefix("torch."),
        storage_handle=bytes(storage_handle),
        storage_size_bytes=int(storage_size_bytes),
        storage_offset_bytes=int(storage_offset_bytes),
        ref_counter_handle=bytes(ref_counter_handle),
        ref_counter_offset=int(ref_counter_offset),
        event_handle=bytes(event_handle),
        event_sync_required=bool(event_sync_required),
    )


def encode_ipc_handle(handle: IpcSlotHandle) -> str:
    """What rank 0 sets in the store for a slot: JSON (ASCII: the handles' bytes are base64)."""
    return msgspec.json.encode(handle).decode()


def decode_ipc_handle(raw: bytes | str, *, sender: str, nbytes: int) -> IpcSlotHandle:
    """Receiver: the handle `sender` set for a slot of `nbytes` bytes, checked before anything is mapped:
    JSON of exactly `IpcSlotHandle`'s fields and types (no other field), a dtype of IPC_DTYPES, and the
    slot asked for (1-D, `nbytes` long, contiguous, inside its storage). Refused in one line naming the
    sender (WeightSyncError)."""
    try:
        handle = msgspec.json.decode(raw, type=IpcSlotHandle)
    except msgspec.DecodeError as error:  # not JSON, a field missing, unknown or of another type
        raise WeightSyncError(_refused(sender, str(error))) from None
    if handle.dtype not in IPC_DTYPES:
        raise WeightSyncError(_refused(sender, f"dtype {handle.dtype!r} is not one of {sorted(IPC_DTYPES)}"))
    if handle.shape != (nbytes,) or handle.stride != (1,) or handle.offset != 0:
        raise WeightSyncError(
            _refused(
                sender,
                f"shape {list(handle.shape)}, stride {list(handle.stride)}, offset {handle.offset} is not "
                f"the slot asked for ([{nbytes}], [1], 0)",
            )
        )
    if handle.storage_size_bytes < nbytes:
        raise WeightSyncError(
            _refused(
                sender, f"its storage ({handle.storage_size_bytes} bytes) is smaller than the slot ({nbytes})"
            )
        )
    return handle


def rebuild_args(handle: IpcSlotHandle, device_index: int) -> tuple[Any, ...]:
    """Receiver: the arguments of torch's `rebuild_cuda_tensor` for a checked handle, opened on this
    process's `device_index` (the same GPU may have another index here than in rank 0's process)."""
    return (
        torch.Tensor,
        torch.Size(handle.shape),
        handle.stride,
        handle.offset,
        torch.storage.TypedStorage,
        IPC_DTYPES[handle.dtype],
        device_index,
        handle.storage_handle,
        handle.storage_size_bytes,
        handle.storage_offset_bytes,
        False,  # requires_grad
        handle.ref_counter_handle,
        handle.ref_counter_offset,
        handle.event_handle,
        handle.event_sync_required,
    )


def decode_member(raw: bytes, *, sender: str) -> Member:
    """What `sender` reported when it joined (JSON `[host, GPU id or null]`), checked like any store value."""
    try:
        host, gpu = msgspec.json.decode(raw, type=tuple[Name, Name | None])
    except msgspec.DecodeError as error:
        raise WeightSyncError(
            f"weight sync: refused what {sender} reported when it joined: {_first_line(str(error))}"
        ) from None
    return Member(host, gpu)


def _refused(sender: str, reason: str) -> str:
    return f"weight sync: refused the CUDA IPC handle from {sender}: {_first_line(reason)}"


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else "(no detail)"


class SyncGroup:
    """One member of a sync group: rank 0 sends, the others receive. `names[r]` names rank r in errors.

    `transport`: "auto" (CUDA IPC when every member is on one GPU, else shared memory when every member is
    on this host and /dev/shm has room, else the collective), "ipc", "shm" or "collective"; every member
    must use the same. `device`: where this member's tensors are (a bucket is sent from and received onto
    it)."""

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
        if self.device.type == "cuda" and self.device.index is None:  # an IPC handle is opened on an index
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.store = dist.TCPStore(host, port, self.world, is_master=rank == 0, timeout=timeout)
        self._syncs = 0
        self._slots: dict[int, torch.Tensor] = {}
        self._prefix = f"distillery-sync-{port}"
        me = Member(socket.gethostname(), gpu_id(self.device))
        self.store.set(f"member/{rank}", json.dumps([me.host, me.gpu]))
        self.members = [
            decode_member(self.store.get(f"member/{r}"), sender=self._peer_names([r])[0])
            for r in range(self.world)
        ]
        one_host = len({m.host for m in self.members}) == 1
        self.transport = "collective" if transport == "auto" and not one_host else transport
        if self.transport == "ipc" and not one_gpu(self.members):
            raise WeightSyncError("weight sync: transport ipc needs every member on one GPU")
        self.last_transport = ""
        """What the last sync went through: ipc, shm or collective."""
        # A backend object of its own: the engines' processes have no default group to derive one from.
        self.group: Any
        if collective_on_gpus(self.members):
            self.collective_device = self.device
            self.group = dist.ProcessGroupNCCL(self.store, rank, self.world, dist.ProcessGroupNCCL.Options())
        else:
            self.collective_device = torch.device("cpu")
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
        if self._use_slots(metas, bucket_bytes):
            return self._send_slots(metas, bucket_bytes, buckets)
        sent = 0
        for index, tensors in enumerate(buckets):
            flat = torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) > 1 else tensors[0].reshape(-1)
            flat = flat.to(self.collective_device).contiguous()
            self._broadcast(flat, f"bucket {index + 1}")
            sent += flat.numel() * flat.element_size()
        return sent

    # ------------------------------------------------------------------------------------- receivers

    def receive(self, metas: Sequence[TensorMeta], bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks 1..n: the tensors of this sync, bucket by bucket as they arrive (each a view of its
        bucket's buffer: valid until the next bucket is asked for; copy what must last longer)."""
        self._syncs += 1
        self.store.set(f"sync{self._syncs}/ready/{self.rank}", "1")
        if self._use_slots(metas, bucket_bytes):
            yield from self._receive_slots(metas, bucket_bytes)
            return
        for index, bucket in enumerate(plan_buckets(metas, bucket_bytes)):
            dtype = DTYPES[metas[bucket[0]].dtype]
            total = sum(metas[i].numel for i in bucket)
            buffer = torch.empty(total, dtype=dtype, device=self.collective_device)
            self._broadcast(buffer, f"bucket {index + 1}")
            offset = 0
            for i in bucket:
                meta = metas[i]
                yield meta.name, buffer[offset : offset + meta.numel].view(meta.shape)
                offset += meta.numel

    # ------------------------------------------------------------------------------- slots: IPC, shared memory

    def _use_slots(self, metas: Sequence[TensorMeta], bucket_bytes: int) -> bool:
        """Whether this sync goes through two slots (CUDA IPC or shared memory; `last_transport` says
        which) rather than the collective."""
        self.last_transport = "collective"
        if self.transport == "collective":
            return False
        if self.transport in ("auto", "ipc") and one_gpu(self.members):
            self.last_transport = "ipc"
            return True
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
            # The sync's own timeout, not the store's: a trainer that gave this sync up (another engine did
            # not check in) never decides, and this engine must not wait longer than the trainer did.
            self.store.wait([decision], self.timeout)
            chosen = self.store.get(decision)
        except RuntimeError:  # the trainer gave this sync up, or is gone
            raise WeightSyncError(self._stuck("the start of the sync", None)) from None
        if chosen == b"1":
            return True
        self.last_transport = "collective"
        return False

    def _slot(self, index: int, nbytes: int) -> torch.Tensor:
        """Slot `index`, at least `nbytes` long: device memory of rank 0's that every member maps (ipc),
        or a file in /dev/shm that every member maps."""
        current = self._slots.get(index)
        ipc = self.last_transport == "ipc"
        if current is not None and current.numel() >= nbytes and current.is_cuda == ipc:
            return current
        if ipc:
            slot = self._ipc_slot(f"ipc-slot/{index}/{nbytes}", nbytes)
            self._slots[index] = slot
            return slot
        path = SHM_DIR / f"{self._prefix}-{index}-{nbytes}"
        if self.rank == 0 and current is not None:
            with contextlib.suppress(OSError):
                (SHM_DIR / f"{self._prefix}-{index}-{current.numel()}").unlink()
        slot = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
        self._slots[index] = slot
        return slot

    def _ipc_slot(self, key: str, nbytes: int) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

        if self.rank == 0:
            slot = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            _, args = reduce_tensor(slot)
            self.store.set(key, encode_ipc_handle(ipc_handle(args)))
            return slot
        handle = decode_ipc_handle(self.store.get(key), sender=self._peer_names([0])[0], nbytes=nbytes)
        assert self.device.index is not None  # set in __init__: a handle is opened on an index
        return rebuild_cuda_tensor(*rebuild_args(handle, self.device.index))

    def _settle(self, slot: torch.Tensor) -> None:
        """Copies into or out of a device slot are asynchronous: done before the store says so."""
        if slot.is_cuda:
            torch.cuda.current_stream(slot.device).synchronize()

    def _wait(self, keys: list[str], ranks: list[int], what: str) -> None:
        try:
            self.store.wait(keys, self.timeout)
        except RuntimeError:
            missing = [r for r, key in zip(ranks, keys, strict=True) if not self._has(key)]
            raise WeightSyncError(
                f"weight sync: {', '.join(self._peer_names(missing))} did not {what} within "
                f"{self.timeout.total_seconds():.0f} s"
            ) from None

    def _send_slots(
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
            self._settle(slot)
            self.store.set(f"{tag}/b{index}/written", "1")
            sent += offset
        # Done when every engine has read every bucket: the slots are free for the next sync.
        for done in range(max(0, index + 1 - SHM_SLOTS), index + 1):
            self._wait([f"{tag}/b{done}/read/{r}" for r in receivers], receivers, f"read bucket {done + 1}")
        # Every member has mapped the slots by now: their names can go, the memory stays while mapped, and
        # nothing is left in /dev/shm when a process dies (or a job never closes its group).
        self._unlink_slots()
        return sent

    def _receive_slots(
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
            self._settle(slot)  # the consumer's copies out of this bucket are done
            self.store.set(f"{tag}/b{index}/read/{self.rank}", "1")

    def _unlink_slots(self) -> None:
        for index, slot in self._slots.items():
            if slot.is_cuda:  # device memory: freed with the tensor
                continue
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
