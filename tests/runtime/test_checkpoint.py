"""Checkpoints on disk: atomic, loadable by transformers, pruned to the last N, torn ones never loaded."""

from __future__ import annotations

import os
import random
import subprocess

import numpy as np
import pytest
import torch
from distillery_runtime.checkpoints import checkpoint
from support.requirements import require_root
from transformers import AutoModelForCausalLM, AutoTokenizer


def _save(root, step, model, tok, keep=2, run=None):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"optimizer": optimizer.state_dict(), "rng": checkpoint.rng_state()}
    return checkpoint.save(
        root,
        step,
        model=model,
        tokenizer=tok,
        trainer_state=state,
        state={"position": step * 4, "version": step, "run": run},
        keep=keep,
    )


def test_roundtrip_prune_and_torn_checkpoints(tmp_path, job_files):
    model = AutoModelForCausalLM.from_pretrained(job_files.student, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(job_files.student)
    root = tmp_path / "ckpt"
    for step in (1, 2, 3):
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        path = _save(root, step, model, tok, keep=2)
    assert [ref.step for ref in checkpoint.list_complete(root)] == [2, 3]
    assert not (root / "step-00000001").exists()
    latest = checkpoint.latest(root)
    assert latest is not None and latest.path == path
    assert checkpoint.read_state(latest)["position"] == 12

    # model/ is the kept model: bfloat16 weights that transformers loads as is, in the dtype its config
    # names; master/ keeps the exact float32 weights, which a resume loads.
    assert (path / "model" / "model.safetensors").is_file()
    assert (path / "model" / "generation_config.json").is_file()
    kept = AutoModelForCausalLM.from_pretrained(path / "model")
    assert {t.dtype for t in kept.state_dict().values()} == {torch.bfloat16}
    for a, b in zip(model.state_dict().values(), kept.state_dict().values(), strict=True):
        assert torch.equal(a.to(torch.bfloat16), b)
    assert checkpoint.weights_dir(latest) == path / "master"
    reloaded = AutoModelForCausalLM.from_pretrained(path / "master", dtype=torch.float32)
    for a, b in zip(model.state_dict().values(), reloaded.state_dict().values(), strict=True):
        assert torch.equal(a, b)

    # A torn save (killed before the COMPLETE marker) and a leftover temporary directory are never loaded.
    torn = root / "step-00000009"
    torn.mkdir()
    (torn / "state.json").write_text('{"step": 9, "position": 36, "version": 9}')
    (root / ".tmp-step-00000010-123").mkdir()
    assert checkpoint.latest(root).step == 3
    assert checkpoint.sweep_temporary(root) == 2
    assert sorted(os.listdir(root)) == ["step-00000002", "step-00000003"]


def test_rng_state_roundtrip(tmp_path):
    state = checkpoint.rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(2), random.random()
    checkpoint.set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert (
        torch.equal(expected[0], again[0])
        and np.array_equal(expected[1], again[1])
        and expected[2] == again[2]
    )


def test_rng_state_of_a_gpu_run_restores_on_any_machine():
    # A GPU run's state also holds the CUDA generators; a machine without a GPU skips them and still
    # restores the CPU ones. (On an H100, 2026-11-26, a CUDA checkpoint restored the CUDA generators and a
    # resumed run matched an uninterrupted one bit for bit; CI has no GPU.)
    fake_cuda = [torch.zeros(16, dtype=torch.uint8)]
    state = {**checkpoint.rng_state(), "cuda": checkpoint.rng_state().get("cuda", fake_cuda)}
    expected = torch.rand(3)
    torch.rand(5)
    checkpoint.set_rng_state(state)
    assert torch.equal(torch.rand(3), expected)


def test_parameter_count_reads_the_safetensors_headers(job_files):
    model = AutoModelForCausalLM.from_pretrained(job_files.student)
    assert checkpoint.parameter_count(job_files.student) == sum(p.numel() for p in model.parameters())
    assert checkpoint.parameter_count(job_files.student / "missing") is None


def test_preflight_refuses_a_folder_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(checkpoint.PreflightError) as error:
        checkpoint.preflight(blocker / "checkpoints", 1000, field="spec.checkpoint.path")
    message = str(error.value)
    assert message.startswith(f"spec.checkpoint.path: {blocker / 'checkpoints'} is not writable (")
    assert "\n" not in message


def test_preflight_refuses_a_folder_without_room_for_two_checkpoints(tmp_path):
    parameters = 1_000_000  # 14 MB a checkpoint: 12 of trainer state, 2 of the bfloat16 model
    checkpoint.preflight(tmp_path / "a", parameters, field="f", free_bytes=28_000_000)
    with pytest.raises(
        checkpoint.PreflightError,
        match=r"f: .* has 26.7 MiB free; a checkpoint of this student .* x 14 bytes",
    ):
        checkpoint.preflight(tmp_path / "b", parameters, field="f", free_bytes=27_999_999)
    checkpoint.preflight(tmp_path / "c", parameters, field="f", model_bytes=0, free_bytes=24_000_000)


def test_preflight_measures_a_real_full_disk(tmp_path, job_files):
    require_root("mounting a size-limited tmpfs")  # a skip without root; under CI=true, a failure
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], check=True)
    try:
        parameters = checkpoint.parameter_count(job_files.student)
        with pytest.raises(checkpoint.PreflightError, match="free; a checkpoint of this student takes about"):
            checkpoint.preflight(mount / "checkpoints", parameters, field="--output")
        checkpoint.preflight(mount / "checkpoints", 1000, field="--output")  # a tiny one fits
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_run_never_prunes_or_replaces_another_runs_checkpoints(tmp_path, job_files):
    """A job deleted and made again with the same name writes beside the old run's checkpoints (same
    checkpoint.path): pruning counts only its own, and a step folder of the other run is never replaced."""
    model = AutoModelForCausalLM.from_pretrained(job_files.student)
    tok = AutoTokenizer.from_pretrained(job_files.student)
    root = tmp_path / "ckpt"
    for step in (2, 4):
        _save(root, step, model, tok, keep=1, run="uid-old")
    assert [r.step for r in checkpoint.list_complete(root)] == [4]  # its own pruning, as before
    for step in (6, 8, 10):
        _save(root, step, model, tok, keep=2, run="uid-new")
    assert [r.step for r in checkpoint.list_complete(root)] == [4, 8, 10]  # step 4 is the old run's
    assert [r.step for r in checkpoint.other_runs(root, "uid-new")] == [4]
    with pytest.raises(checkpoint.CheckpointWriteError, match="step-00000004 is a checkpoint of another run"):
        _save(root, 4, model, tok, keep=2, run="uid-new")
    assert checkpoint.read_state(checkpoint.list_complete(root)[0])["run"] == "uid-old"
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    # Local runs (no run id) and checkpoints from before run ids count as one's own.
    assert checkpoint.other_runs(root, None) == []


# ------------------------------------------------------- trainer state: tensors and plain types, or refused


def _trainer_state() -> dict:
    """What a trainer saves (workers.save_checkpoint): AdamW after a step, the LR schedule, RNG states."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "version": 7,
        "rng": checkpoint.rng_state(),
    }


def test_trainer_state_loads_with_weights_only_and_restores_every_rng(tmp_path):
    ref = checkpoint.CheckpointRef(7, tmp_path)
    saved = _trainer_state()
    torch.save(saved, tmp_path / checkpoint.TRAINER_FILE)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    loaded = checkpoint.load_trainer_state(ref)
    assert loaded["version"] == 7 and loaded["scheduler"] == saved["scheduler"]
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], saved["optimizer"]["state"][0]["exp_avg"])
    checkpoint.set_rng_state(loaded["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1])
    assert expected[2] == again[2]


class _Intruder:
    """A pickled call: what a tampered file would make an unsafe load run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.mark.parametrize(
    ("write", "reason"),
    [
        (lambda p, m: torch.save({**_trainer_state(), "x": _Intruder(m)}, p), "GLOBAL posix.mkdir"),
        # numpy's own RNG state (an ndarray): how trainer.pt held it before.
        (lambda p, m: torch.save({**_trainer_state(), "numpy": np.random.get_state()}, p), "_reconstruct"),
        (lambda p, m: p.write_bytes(b"not a checkpoint"), "not tensors and plain types only"),
        (lambda p, m: (torch.save(_trainer_state(), p), p.write_bytes(p.read_bytes()[:200])), "unreadable"),
        (lambda p, m: torch.save([1, 2], p), "it holds a list, not the trainer state's dict"),
        (lambda p, m: torch.save({"rng": {}, "scheduler": {}}, p), "the trainer state lacks version"),
        (lambda p, m: torch.save({**_trainer_state(), "version": "7"}, p), "version is a str, not an int"),
        (lambda p, m: None, "unreadable (FileNotFoundError"),
    ],
    ids=[
        "pickled-call",
        "numpy-array",
        "garbage",
        "torn",
        "not-a-dict",
        "missing-key",
        "bad-version",
        "gone",
    ],
)
def test_a_tampered_trainer_state_is_refused_in_one_line_naming_it(tmp_path, write, reason):
    path, marker = tmp_path / checkpoint.TRAINER_FILE, tmp_path / "ran"
    write(path, marker)
    with pytest.raises(checkpoint.CheckpointReadError) as refused:
        checkpoint.load_trainer_state(checkpoint.CheckpointRef(1, tmp_path))
    message = str(refused.value)
    assert message.startswith(f"{path}: refused: ") and reason in message and "\n" not in message
    assert "weights_only" not in message  # torch's advice to load it unsafely is not passed on
    assert not marker.exists()


def _optimizer_shards(folder, extra=None):
    """An AdamW state written by torch.distributed.checkpoint (one process), as trainer.save_optimizer_shards
    writes it, and a fresh optimizer's state of the same layout to load it into."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    def stepped(lr):
        torch.manual_seed(int(lr * 1e4))
        model = torch.nn.Linear(4, 3)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        return {"optimizer": get_optimizer_state_dict(model, optimizer)}

    saved = stepped(1e-3)
    dcp.save({**saved, **(extra or {})}, checkpoint_id=str(folder))
    return saved, {**stepped(5e-3), **({key: 0 for key in extra} if extra else {})}


def _load_shards(folder, state):
    from distillery_runtime.checkpoints.optimizer_shards import load_shards

    load_shards(state, folder)


def test_optimizer_shards_load_as_data_only(tmp_path):
    saved, state = _optimizer_shards(tmp_path / "optimizer")
    _load_shards(tmp_path / "optimizer", state)
    assert state["optimizer"]["param_groups"][0]["lr"] == 1e-3
    for name, moments in saved["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(state["optimizer"]["state"][name][key], value)


def test_tampered_optimizer_shards_are_refused_in_one_line_naming_the_file(tmp_path):
    import pickle

    marker = tmp_path / "ran"
    folder = tmp_path / "optimizer"
    # The metadata unpickled by DCP's own reader as it comes: here it may name only DCP's metadata classes.
    _, state = _optimizer_shards(folder)
    (folder / ".metadata").write_bytes(pickle.dumps(_Intruder(marker)))
    with pytest.raises(checkpoint.CheckpointReadError) as refused:
        _load_shards(folder, state)
    message = str(refused.value)
    assert message.startswith(f"{folder / '.metadata'}: refused: not tensors and plain types only (it names ")
    assert "mkdir, which no DCP metadata holds" in message and "\n" not in message
    # Metadata of DCP's own classes that points at a file outside its folder.
    import dataclasses

    from distillery_runtime.checkpoints.optimizer_shards import SafeReader

    _, state = _optimizer_shards(folder)
    metadata = SafeReader(folder).read_metadata()
    assert metadata.storage_data
    index = next(iter(metadata.storage_data))
    metadata.storage_data[index] = dataclasses.replace(
        metadata.storage_data[index], relative_path="../trainer.pt"
    )
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(checkpoint.CheckpointReadError) as refused:
        _load_shards(folder, state)
    assert str(refused.value) == (
        f"{folder / '.metadata'}: refused: unreadable (ValueError: it names '../trainer.pt' as a shard file, "
        "not a file of its folder): damaged or altered"
    )
    # An entry that is not a tensor, loaded by DCP with weights_only=False: here with True.
    folder = tmp_path / "optimizer-with-an-object"
    _, state = _optimizer_shards(folder, extra={"x": _Intruder(marker)})
    with pytest.raises(checkpoint.CheckpointReadError) as refused:
        _load_shards(folder, state)
    message = str(refused.value)
    assert message.startswith(f"{folder}: refused: entry x: not tensors and plain types only (")
    assert "\n" not in message
    assert not marker.exists()


def test_a_refusal_in_a_trainer_actor_reaches_the_cli_as_its_one_line():
    """A resume loads trainer.pt in the trainers' actors: Ray's wrapping is still a CheckpointReadError (the
    CLI's `except` catches it) and `root_cause` gives back the one line, not the remote traceback."""
    from distillery_runtime.run.cli import root_cause
    from ray.exceptions import RayTaskError

    refusal = checkpoint.CheckpointReadError("/ckpt/step-00000004/trainer.pt: refused: unreadable (...)")
    wrapped = RayTaskError("TrainerWorker.load_state", "Traceback ...", refusal).as_instanceof_cause()
    assert isinstance(wrapped, checkpoint.CheckpointReadError)
    assert str(root_cause(wrapped)) == str(refusal)
