"""`distillery run` with a tensor-parallel rollout engine (`student.rollout.tensorParallel: 2`): two vLLM
worker processes inside the rollout actor, each its own rank of the weight sync, and the run stays on
policy: at every step the trainer's log-probs of the sampled tokens, before its update, equal the ones the
engine sampled them with (PPO's `distill/ppo_kl`, the mean of old - new, is 0). A sync that missed a
worker or a step would leave that worker's half of each matrix one update old, and the two would differ
by far more than float32 noise at this learning rate."""

from __future__ import annotations

import subprocess

import pytest

from tests.runtime.conftest import distillery_command, manifest, run_env
from tests.runtime.test_run import read_records


@pytest.mark.slow
@pytest.mark.local_run
def test_a_tensor_parallel_rollout_engine_stays_on_policy(job_files, write_manifest, tmp_path):
    doc = manifest(
        job_files,
        name="tensor-parallel",
        loss={"mode": "k3", "objective": "policy_gradient"},  # PPO: the old log-probs are the engine's
        schedule={"steps": 3, "promptsPerStep": 4, "microBatchSize": 8, "checkpointEvery": 0, "evalEvery": 3},
    )
    doc["spec"]["student"]["rollout"]["tensorParallel"] = 2
    # The colocated teacher in vLLM (on CPU a run picks the transformers forward): the one run of the suite
    # whose in-process teacher actor holds a vLLM engine.
    doc["spec"]["teachers"][0]["inference"] = {"engine": "vllm"}
    doc["spec"]["student"]["optimizer"]["lr"] = 5e-2  # every step moves the log-probs well past the tolerance
    out = tmp_path / "out"
    result = subprocess.run(
        distillery_command(str(write_manifest(doc)), "-o", str(out), "--no-progress"),
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    records = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["staleness"] == 0 and r["samples"] == 8 for r in records)
    assert all(abs(r["metrics"]["distill/ppo_kl"]) < 1e-4 for r in records), [
        r["metrics"]["distill/ppo_kl"] for r in records
    ]
    # The weights moved between steps: the same check against stale weights would have failed.
    assert len({round(r["loss"], 6) for r in records}) == 3
