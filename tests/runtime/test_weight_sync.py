"""Streamed weight sync (weight_sync.py): FSDP2-sharded trainer ranks to several engine processes over a
gloo group of their own, bucket by bucket, and a peer that never checks in is named in the error.

Real processes (torch.multiprocessing): two trainer ranks (their own gloo group, FSDP2) and two receivers
playing the rollout engines' workers, as Ray's actors would be.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from distillery_runtime.sync.weight_sync import SyncGroup, TensorMeta, WeightSyncError, plan_buckets

from tests.runtime.test_fsdp import BASE, VOCAB

NAMES = ["trainer rank 0", "rollout engine 1", "rollout engine 2"]
BUCKET = 8 * 1024  # bytes: many buckets even for the tiny model


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SYNCS = ("auto", "collective", "stall")
"""Three syncs in a row: as a job runs it (one host: shared memory), over gloo, and one that engine 2
never checks in for (the sync's timeout is then short; the trainers' group outlasts it, as in a job)."""
STALL = datetime.timedelta(seconds=3)


def _member(index: int, model_dir: str, port: int, init: str, out: str) -> None:
    """Processes 0, 1: trainer ranks; 2, 3: engines (sync ranks 1, 2)."""
    import time

    import torch.distributed as dist
    from distillery_runtime.training.trainer import Trainer

    timeout = datetime.timedelta(seconds=60)
    if index < 2:
        group = SyncGroup("127.0.0.1", port, 0, NAMES, timeout=timeout) if index == 0 else None
        dist.init_process_group("gloo", init_method=init, rank=index, world_size=2, timeout=timeout)
        trainer = Trainer(model_dir, BASE, rank=index, world_size=2, device="cpu")
        metas = trainer.weight_metas(torch.bfloat16)
        if index == 0:
            Path(f"{out}/metas.json.tmp").write_text(json.dumps([dataclasses.asdict(m) for m in metas]))
            Path(f"{out}/metas.json.tmp").rename(f"{out}/metas.json")
        for sync in SYNCS:
            if group is not None:
                group.transport = "auto" if sync == "stall" else sync
                group.timeout = STALL if sync == "stall" else timeout
            try:
                trainer.stream_weights(group, torch.bfloat16, BUCKET)
            except WeightSyncError as error:
                Path(f"{out}/error-{index}-{sync}.txt").write_text(str(error))
        if index == 0:
            torch.save(trainer.full_state_dict(), f"{out}/trainer.pt")
        else:
            trainer.full_state_dict()  # a collective: rank 0 gathers
        _leave_together(out, index, group)
        dist.destroy_process_group()
        return
    group = SyncGroup("127.0.0.1", port, index - 1, NAMES, timeout=timeout)
    metas = _wait_for(f"{out}/metas.json")
    for sync in SYNCS:
        group.transport = "auto" if sync == "stall" else sync
        if sync == "stall":
            group.timeout = STALL
            if index == 3:
                time.sleep(STALL.total_seconds() + 2)  # in the group, but never checks in for this sync
                break
        try:
            received = {name: t.clone() for name, t in group.receive(metas, BUCKET)}
        except WeightSyncError as error:
            Path(f"{out}/error-{index}-{sync}.txt").write_text(str(error))
            break
        torch.save(received, f"{out}/engine-{index - 1}-{sync}.pt")
        Path(f"{out}/transport-{index - 1}-{sync}.txt").write_text(group.last_transport)
    _leave_together(out, index, group)


def _leave_together(out: str, index: int, group: SyncGroup | None) -> None:
    """No process exits while another still holds a gloo group with it: a gloo peer that sees its pair's
    socket close during its own interpreter's teardown aborts (SIGABRT), which would fail the run for a
    reason that is not the sync's. Every member waits for all four (a file each, as the metadata travels),
    then drops its sync group; the trainers' group goes after."""
    import time

    Path(f"{out}/done-{index}").touch()
    for _ in range(1200):
        if all(Path(f"{out}/done-{i}").exists() for i in range(4)):
            break
        time.sleep(0.05)
    else:
        raise TimeoutError(f"member {index}: the others did not finish")
    if group is not None:
        group.close()  # rank 0 removes its /dev/shm slots


def _wait_for(path: str) -> list[TensorMeta]:
    """The metadata the driver would pass along (through Ray, in the loop)."""
    import time

    for _ in range(600):
        if Path(path).exists():
            return [
                TensorMeta(m["name"], tuple(m["shape"]), m["dtype"])
                for m in json.loads(Path(path).read_text())
            ]
        time.sleep(0.1)
    raise TimeoutError(path)


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the four processes (their start is most of the cost)."""
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    tmp = tmp_path_factory.mktemp("sync")
    texts = [f"{a}+{b}={a + b}" for a in range(50) for b in range(50)]
    tok = build_tokenizer(texts, VOCAB, full_byte_alphabet=False)
    model_dir = save_tiny_model(
        tmp / "student", tokenizer=tok, hidden=64, layers=2, heads=2, seed=3, dtype=torch.float32
    )
    port = _port()
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
        args = (str(model_dir), port, f"file://{tmp}/init", str(tmp))
        mp.start_processes(_member, args=args, nprocs=4, start_method="spawn")
    return {"out": tmp, "port": port}


def test_every_engine_gets_the_whole_student_in_buckets(synced: dict[str, Any]) -> None:
    """auto: one host, so shared memory (two slots, reused: more buckets than slots); collective: gloo."""
    out = synced["out"]
    for sync, used in zip(SYNCS[:2], ("shm", "collective"), strict=True):
        assert {(out / f"transport-{e}-{sync}.txt").read_text() for e in (1, 2)} == {used}
    whole = torch.load(out / "trainer.pt")
    metas = _wait_for(str(out / "metas.json"))
    assert len(plan_buckets(metas, BUCKET)) > 3  # really streamed, not one message
    assert not list(Path("/dev/shm").glob(f"distillery-sync-{synced['port']}-*"))  # the sender removed them
    for engine in (1, 2):
        for sync in SYNCS[:2]:
            received = torch.load(out / f"engine-{engine}-{sync}.pt")
            assert received.keys() == whole.keys()
            for name, value in whole.items():
                assert received[name].dtype == torch.bfloat16
                torch.testing.assert_close(received[name], value.to(torch.bfloat16), rtol=0, atol=0)


def test_a_peer_that_never_checks_in_is_named(synced: dict[str, Any]) -> None:
    out = synced["out"]
    error = (out / "error-0-stall.txt").read_text()
    assert "rollout engine 2 (sync rank 2) did not join within 3 s" in error
    assert "rollout engine 1" not in error
    assert "failed on trainer rank 0" in (out / "error-1-stall.txt").read_text()  # stopped with it, no hang
    assert "the trainer (sync rank 0)" in (out / "error-2-stall.txt").read_text()  # the engine that did join
    assert not (out / "error-0-auto.txt").exists() and not (out / "error-0-collective.txt").exists()


def test_buckets_keep_order_dtype_and_size() -> None:
    metas = [
        TensorMeta("a", (10,), "bfloat16"), TensorMeta("b", (100,), "bfloat16"), TensorMeta("c", (3,), "bfloat16"),
        TensorMeta("d", (2,), "int64"), TensorMeta("e", (4,), "bfloat16"),
    ]  # fmt: skip
    buckets = plan_buckets(metas, 64)
    assert [i for b in buckets for i in b] == list(range(5))
    assert buckets == [[0], [1], [2], [3], [4]]
    assert plan_buckets(metas, 1024) == [[0, 1, 2], [3], [4]]


def test_members_decide_the_transport_and_the_collective_alike() -> None:
    from distillery_runtime.sync.weight_sync import Member, collective_on_gpus, one_gpu

    colocated = [Member("node-a", "GPU-1"), Member("node-a", "GPU-1")]
    assert one_gpu(colocated) and not collective_on_gpus(colocated)  # NCCL refuses two ranks on one GPU
    spread = [Member("node-a", "GPU-1"), Member("node-a", "GPU-2"), Member("node-b", "GPU-3")]
    assert not one_gpu(spread) and collective_on_gpus(spread)
    # The same GPU id on two hosts is two GPUs; a tensor-parallel worker on a second GPU rules IPC out.
    assert not one_gpu([Member("node-a", "GPU-1"), Member("node-b", "GPU-1")])
    assert not one_gpu([*colocated, Member("node-a", "GPU-2")])
    cpu = [Member("node-a", None), Member("node-a", None)]
    assert not one_gpu(cpu) and not collective_on_gpus(cpu)
    assert not collective_on_gpus([Member("node-a", "GPU-1"), Member("node-a", None)])


def _gpu_sync_bench(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    # On the path for the whole test: the spawned processes import the bench's module too.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import gpu_sync

    return gpu_sync


def test_the_gpu_sync_check_runs_its_shared_memory_part_on_cpu(tmp_path: Path, monkeypatch) -> None:
    """bench/gpu_sync.py cannot rot between the sessions that have a GPU: its CPU part runs here."""
    result = _gpu_sync_bench(monkeypatch).run("auto", 16 * 1024**2, "cpu", 1, tmp_path)
    assert result["chosen"] == "shm" and result["exact"] and result["seconds"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a CUDA GPU (bench/gpu_sync.py)")
def test_two_processes_on_one_gpu_sync_through_cuda_ipc(tmp_path: Path, monkeypatch) -> None:
    result = _gpu_sync_bench(monkeypatch).run("auto", 64 * 1024**2, "cuda", 1, tmp_path)
    assert result["chosen"] == "ipc" and result["exact"]


# ------------------------------------------------------------------- the IPC handle travels as plain data

SENDER = "trainer rank 0 (sync rank 0)"
SLOT = 4096


def _reduced_slot(device: int = 0) -> tuple[Any, ...]:
    """What torch's `reduce_tensor` gives for a 4 KiB uint8 device slot (its 15 rebuild arguments; the
    handles' bytes made up: no GPU here)."""
    return (
        torch.Tensor, torch.Size([SLOT]), (1,), 0, torch.storage.TypedStorage, torch.uint8, device,
        bytes(range(64)), SLOT, 512, False, b"/torch_1234_5678_0", 3, b"\x07" * 64, True,
    )  # fmt: skip


def _fields(**changes: Any) -> bytes:
    """The JSON a sender would set for `_reduced_slot`, with `changes` made (None removes a field)."""
    from distillery_runtime.sync.weight_sync import encode_ipc_handle, ipc_handle

    doc = json.loads(encode_ipc_handle(ipc_handle(_reduced_slot())))
    for key, value in changes.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    return json.dumps(doc).encode()


def test_an_ipc_handle_travels_as_json_and_rebuilds_the_same_arguments() -> None:
    """The receiver's arguments for torch's `rebuild_cuda_tensor` are the sender's, its own device index
    in place of the sender's (the same GPU may have another index in another process)."""
    from distillery_runtime.sync.weight_sync import (
        decode_ipc_handle,
        encode_ipc_handle,
        ipc_handle,
        rebuild_args,
    )

    raw = encode_ipc_handle(ipc_handle(_reduced_slot(device=0)))
    doc = json.loads(raw)  # plain JSON: no pickle on the wire
    assert doc["dtype"] == "uint8" and doc["shape"] == [SLOT] and isinstance(doc["storage_handle"], str)
    rebuilt = rebuild_args(decode_ipc_handle(raw, sender=SENDER, nbytes=SLOT), 3)
    assert rebuilt == _reduced_slot(device=3)
    assert [type(a) for a in rebuilt] == [type(a) for a in _reduced_slot(device=3)]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (_fields(offset="0"), "Expected `int`, got `str` - at `$.offset`"),
        (_fields(event_sync_required=1), "Expected `bool`, got `int`"),
        (_fields(tensor_cls="torch.nn.Parameter"), "unknown field `tensor_cls`"),
        (_fields(ref_counter_handle=None), "missing required field `ref_counter_handle`"),
        (_fields(dtype="float64"), "dtype 'float64' is not one of ['uint8']"),
        (_fields(shape=[SLOT * 2]), f"is not the slot asked for ([{SLOT}], [1], 0)"),
        (_fields(stride=[2]), "is not the slot asked for"),
        (_fields(storage_size_bytes=16), f"its storage (16 bytes) is smaller than the slot ({SLOT})"),
        (_fields(storage_offset_bytes=-1), "Expected `int` >= 0"),
        (_fields(storage_handle=""), "Expected `bytes` of length >= 1"),
        (_fields(event_handle="QUFB" * 30000), "Expected `bytes` of length <= 65536"),
        (b"[1, 2]", "Expected `object`, got `array`"),
    ],
    ids=[
        "wrong-type", "bool-for-int", "extra-field", "missing-field", "unknown-dtype", "other-shape",
        "other-stride", "storage-too-small", "negative", "empty-handle", "huge-handle", "not-an-object",
    ],
)  # fmt: skip
def test_a_receiver_refuses_a_handle_that_is_not_the_slot_in_one_line_naming_the_sender(
    raw: bytes, reason: str
) -> None:
    from distillery_runtime.sync.weight_sync import decode_ipc_handle

    with pytest.raises(WeightSyncError) as refused:
        decode_ipc_handle(raw, sender=SENDER, nbytes=SLOT)
    message = str(refused.value)
    assert message.startswith(f"weight sync: refused the CUDA IPC handle from {SENDER}: ")
    assert reason in message and "\n" not in message


def test_a_pickled_handle_is_refused_without_being_unpickled(tmp_path: Path) -> None:
    """What the store carried before (torch's arguments pickled, base64) or anything an intruder sets: never
    unpickled, so the call it names is never made."""
    import base64
    import pickle

    from distillery_runtime.sync.weight_sync import decode_ipc_handle

    marker = tmp_path / "ran"

    class Intruder:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (marker,))

    for raw in (pickle.dumps(Intruder()), base64.b64encode(pickle.dumps(Intruder()))):
        with pytest.raises(WeightSyncError) as refused:
            decode_ipc_handle(raw, sender=SENDER, nbytes=SLOT)
        assert str(refused.value).startswith(f"weight sync: refused the CUDA IPC handle from {SENDER}: JSON")
    assert not marker.exists()


def test_the_sender_refuses_arguments_torch_no_longer_gives() -> None:
    from distillery_runtime.sync.weight_sync import ipc_handle

    with pytest.raises(WeightSyncError, match=r"torch's CUDA IPC arguments changed \(14, not 15\)"):
        ipc_handle(_reduced_slot()[:-1])
    grad = list(_reduced_slot())
    grad[10] = True
    with pytest.raises(WeightSyncError, match="a plain tensor without grad"):
        ipc_handle(grad)


def test_what_a_member_reports_when_it_joins_is_checked() -> None:
    from distillery_runtime.sync.weight_sync import Member, decode_member

    assert decode_member(b'["node-a", "GPU-1"]', sender="x") == Member("node-a", "GPU-1")
    assert decode_member(b'["node-a", null]', sender="x") == Member("node-a", None)
    for raw in (b'["node-a"]', b'["node-a", 3]', b'{"host": "node-a"}', b"\x80\x04K\x01."):
        with pytest.raises(
            WeightSyncError,
            match=r"^weight sync: refused what rollout engine 1 \(sync rank 1\) reported when it joined: ",
        ):
            decode_member(raw, sender="rollout engine 1 (sync rank 1)")
