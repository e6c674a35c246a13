"""The host-memory plan of a student worker pod (distillery/plan/pods/host_memory.py): its phases, the worker's
default memory, and `distillery validate`/`plan` refusing a pool memory that cannot hold it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from distillery_cli.main import main as cli_main

from distillery.model_shapes import known_shape
from distillery.plan.pods.host_memory import GIB, HEADROOM, RUNTIME_GIB_PER_GPU, plan_host_memory
from distillery.plan.pods.resources import pod_resources
from distillery.validation import parse_job

REPO = Path(__file__).resolve().parents[2]
SEVEN_B = "Qwen/Qwen2.5-7B-Instruct"


def standalone(student: str = SEVEN_B, memory: str | None = "64Gi") -> dict[str, Any]:
    """examples/standalone-teacher.yaml (8 GPUs in one worker pod) with another student and memory."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "standalone-teacher.yaml").read_text())
    doc["spec"]["student"]["model"] = student
    requests = doc["spec"]["student"]["pool"]["resources"]["requests"]
    if memory is None:
        del requests["memory"]
    else:
        requests["memory"] = memory
    return doc


def test_a_7b_student_on_8_gpus_counts_what_each_rank_holds() -> None:
    """The checkpoint streams master/ and model/ a tensor at a time (the largest: the embedding); the 8
    rollout engines (one a GPU) sleep at level 2 and keep no copy of their weights in host memory."""
    plan = plan_host_memory(parse_job(standalone()).spec)
    assert plan is not None and plan.gpus == 8
    shape = known_shape(SEVEN_B)
    assert shape is not None
    p = shape.params
    checkpoint = dict(plan.parts["checkpoint"])
    assert checkpoint["runtime"] == 8 * RUNTIME_GIB_PER_GPU * GIB
    largest = shape.hidden * max(shape.vocab, shape.intermediate)
    assert checkpoint["the largest float32 tensor a rank (master/, model/ streamed)"] == 8 * 4 * largest
    assert not any("asleep" in what for what in checkpoint)
    assert not any("whole float32 weights" in what for what in checkpoint)
    # FSDP2 over 8 ranks: the sharded load (no rank builds the whole float32 model) and optimizer shards.
    load = dict(plan.parts["load"])
    assert "the whole float32 student a rank" not in load
    assert load["a broadcast chunk a rank"] == 8 * -(-4 * p // 16)
    assert not any("optimizer" in what for what in checkpoint)
    # Without the engines' host copies (113 GiB at level 1), the load's mapped files and chunks are the peak.
    assert plan.peak_phase == "load"
    assert plan.phase_bytes("checkpoint") < plan.peak_bytes


def test_validate_refuses_64gi_for_a_7b_student_naming_the_field_and_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(standalone()))
    assert cli_main(["validate", str(path)]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"{path}: spec.student.pool.resources.requests.memory: 64Gi cannot hold ")
    assert "GiB of host memory in the load phase" in line and "ask for at least" in line
    assert cli_main(["plan", str(path)]) == 1
    out = capsys.readouterr().out
    assert "host memory per worker pod, load:" in out and "(peak)" in out


def test_a_limit_is_held_to_the_plan_too_and_enough_memory_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = standalone(memory=None)
    doc["spec"]["student"]["pool"]["resources"]["limits"] = {"memory": "70Gi"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli_main(["validate", str(path)]) == 1
    assert "spec.student.pool.resources.limits.memory: 70Gi cannot hold" in capsys.readouterr().out
    plan = plan_host_memory(parse_job(doc).spec)
    assert plan is not None
    doc["spec"]["student"]["pool"]["resources"]["limits"] = {"memory": f"{plan.default_memory_gib}Gi"}
    path.write_text(yaml.safe_dump(doc))
    assert cli_main(["validate", "-q", str(path)]) == 0


def test_the_worker_pods_default_memory_is_the_plans_peak_with_headroom() -> None:
    spec = parse_job(standalone(memory=None)).spec
    plan = plan_host_memory(spec)
    assert plan is not None
    worker = pod_resources(spec).worker
    assert worker.requests["memory"] == worker.limits["memory"] == f"{plan.default_memory_gib}Gi"
    assert plan.default_memory_gib * GIB >= plan.peak_bytes * HEADROOM
    assert "host-memory plan" in worker.reason


def test_offload_and_replication_change_the_phases() -> None:
    doc = standalone(student="Qwen/Qwen2.5-1.5B-Instruct", memory=None)
    doc["spec"]["student"]["training"] = {"sharding": "replicate"}
    replicated = plan_host_memory(parse_job(doc).spec)
    assert replicated is not None
    # Replicated: every rank loads the whole float32 model, and rank 0 gathers the optimizer state.
    assert any(what == "the whole float32 student a rank" for what, _ in replicated.parts["load"])
    assert any("optimizer" in what for what, _ in replicated.parts["checkpoint"])
    doc["spec"]["student"]["training"] = {"sharding": "fsdp", "cpuOffload": True}
    offloaded = plan_host_memory(parse_job(doc).spec)
    assert offloaded is not None
    state = dict(offloaded.parts["training"])["offloaded state (pinned)"]
    p = known_shape("Qwen/Qwen2.5-1.5B-Instruct").params  # type: ignore[union-attr]
    assert state == pytest.approx(8 * 16 * p / 8 * 1.3, rel=1e-6)


def test_cpu_pools_and_unknown_students_have_no_plan() -> None:
    doc = standalone(memory=None)
    doc["spec"]["student"]["pool"] = {"workers": 1, "gpusPerWorker": 0}
    assert plan_host_memory(parse_job(doc).spec) is None
    doc = standalone(student="s3://bucket/unknown-model", memory=None)
    assert plan_host_memory(parse_job(doc).spec) is None
