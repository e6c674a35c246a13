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

import pytest
import torch
import torch.multiprocessing as mp
from distillery_runtime.weight_sync import SyncGroup, TensorMeta, WeightSyncError, plan_buckets

from tests.runtime.test_fsdp import BASE, VOCAB

NAMES = ["trainer rank 0", "rollout engine 1", "rollout engine 2"]
BUCKET = 8 * 1024  # bytes: many buckets even for the tiny model


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TRANSPORTS = ("auto", "collective")
"""Two syncs in a row: the first as a job runs it (one host: shared memory), the second over gloo."""


def _member(index: int, model_dir: str, port: int, init: str, out: str, stall: bool) -> None:
    """Processes 0, 1: trainer ranks; 2, 3: engines (sync ranks 1, 2)."""
    import torch.distributed as dist
    from distillery_runtime.trainer import Trainer

    # The sync's own timeout is short when a peer stalls; the trainers' group outlasts it, as in a job.
    timeout = datetime.timedelta(seconds=3 if stall else 60)
    if index < 2:
        group = SyncGroup("127.0.0.1", port, 0, NAMES, timeout=timeout) if index == 0 else None
        trainers = datetime.timedelta(seconds=60)
        dist.init_process_group("gloo", init_method=init, rank=index, world_size=2, timeout=trainers)
        trainer = Trainer(model_dir, BASE, rank=index, world_size=2, device="cpu")
        metas = trainer.weight_metas(torch.bfloat16)
        if index == 0:
            Path(f"{out}/metas.json.tmp").write_text(json.dumps([dataclasses.asdict(m) for m in metas]))
            Path(f"{out}/metas.json.tmp").rename(f"{out}/metas.json")
        for transport in TRANSPORTS:
            if group is not None:
                group.transport = transport
            try:
                trainer.stream_weights(group, torch.bfloat16, BUCKET)
            except WeightSyncError as error:
                Path(f"{out}/error-{index}.txt").write_text(str(error))
                break
        whole = trainer.full_state_dict()
        if index == 0:
            torch.save(whole, f"{out}/trainer.pt")
            assert group is not None
            group.close()  # removes its /dev/shm slots
        return
    group = SyncGroup("127.0.0.1", port, index - 1, NAMES, timeout=timeout)
    if stall and index == 3:
        import time

        time.sleep(5)  # joined the group, never checks in for the sync
        return
    metas = _wait_for(f"{out}/metas.json")
    for transport in TRANSPORTS:
        group.transport = transport
        try:
            received = {name: t.clone() for name, t in group.receive(metas, BUCKET)}
        except WeightSyncError as error:
            Path(f"{out}/error-{index}.txt").write_text(str(error))
            return
        torch.save(received, f"{out}/engine-{index - 1}-{transport}.pt")
        Path(f"{out}/transport-{index - 1}-{transport}.txt").write_text(group.last_transport)


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


def _run(tmp: Path, model_dir: Path, stall: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    port = _port()
    args = (str(model_dir), port, f"file://{tmp}/init", str(tmp), stall)
    mp.start_processes(_member, args=args, nprocs=4, start_method="spawn")
    return port


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distillery_runtime.models import build_tokenizer, save_tiny_model

    tmp = tmp_path_factory.mktemp("sync-model")
    tok = build_tokenizer(
        [f"{a}+{b}={a + b}" for a in range(50) for b in range(50)], VOCAB, full_byte_alphabet=False
    )
    return save_tiny_model(
        tmp / "student", tokenizer=tok, hidden=64, layers=2, heads=2, seed=3, dtype=torch.float32
    )


def test_every_engine_gets_the_whole_student_in_buckets(tmp_path: Path, model_dir: Path) -> None:
    """auto: one host, so shared memory (two slots, reused: more buckets than slots); collective: gloo."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        port = _run(tmp_path, model_dir, False, monkeypatch)
    for transport, used in zip(TRANSPORTS, ("shm", "collective"), strict=True):
        assert {(tmp_path / f"transport-{e}-{transport}.txt").read_text() for e in (1, 2)} == {used}
    whole = torch.load(tmp_path / "trainer.pt")
    metas = _wait_for(str(tmp_path / "metas.json"))
    assert len(plan_buckets(metas, BUCKET)) > 3  # really streamed, not one message
    assert not list(Path("/dev/shm").glob(f"distillery-sync-{port}-*"))  # the sender removed its slots
    for engine in (1, 2):
        for transport in TRANSPORTS:
            received = torch.load(tmp_path / f"engine-{engine}-{transport}.pt")
            assert received.keys() == whole.keys()
            for name, value in whole.items():
                assert received[name].dtype == torch.bfloat16
                torch.testing.assert_close(received[name], value.to(torch.bfloat16), rtol=0, atol=0)


def test_a_peer_that_never_checks_in_is_named(tmp_path: Path, model_dir: Path) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        _run(tmp_path, model_dir, True, monkeypatch)
    error = (tmp_path / "error-0.txt").read_text()
    assert "rollout engine 2 (sync rank 2) did not join within 3 s" in error
    assert "rollout engine 1" not in error
    assert "failed on trainer rank 0" in (tmp_path / "error-1.txt").read_text()  # stopped with it, no hang
    assert "the trainer (sync rank 0)" in (tmp_path / "error-2.txt").read_text()  # the engine that did join


def test_buckets_keep_order_dtype_and_size() -> None:
    metas = [
        TensorMeta("a", (10,), "bfloat16"), TensorMeta("b", (100,), "bfloat16"), TensorMeta("c", (3,), "bfloat16"),
        TensorMeta("d", (2,), "int64"), TensorMeta("e", (4,), "bfloat16"),
    ]  # fmt: skip
    buckets = plan_buckets(metas, 64)
    assert [i for b in buckets for i in b] == list(range(5))
    assert buckets == [[0], [1], [2], [3], [4]]
    assert plan_buckets(metas, 1024) == [[0, 1, 2], [3], [4]]
