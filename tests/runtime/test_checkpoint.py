"""Checkpoints on disk: atomic, loadable by transformers, pruned to the last N, torn ones never loaded."""

from __future__ import annotations

import os
import random
import subprocess

import numpy as np
import pytest
import torch
from distillery_runtime import checkpoint
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


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a size-limited tmpfs needs root (CI runs as root)")
def test_preflight_measures_a_real_full_disk(tmp_path, job_files):
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
