"""The memory plan (distillery/plan/memory/gpu.py): shapes, the arithmetic, and `distillery validate`/`plan`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from distillery_cli.main import main as cli_main

from distillery.model_shapes import known_shape, resolve_shape
from distillery.plan.memory.gpu import GIB, TrainingLayout, plan_memory, refusal


def test_known_shapes_have_their_published_parameter_counts() -> None:
    # Model cards: Qwen2.5-7B 7.61B, Qwen2.5-1.5B 1.54B, Qwen2.5-32B 32.5B (+ head), Llama-3-8B 8.03B.
    assert known_shape("Qwen/Qwen2.5-7B-Instruct").params == pytest.approx(7.6156e9, rel=1e-3)  # type: ignore[union-attr]
    assert known_shape("Qwen/Qwen2.5-1.5B").params == pytest.approx(1.5437e9, rel=1e-3)  # type: ignore[union-attr]
    assert known_shape("meta-llama/Meta-Llama-3-8B").params == pytest.approx(8.0303e9, rel=1e-3)  # type: ignore[union-attr]
    assert known_shape("Qwen/Qwen2.5-Math-7B-Instruct") == known_shape("Qwen/Qwen2.5-7B")
    assert known_shape("some-org/unknown-model") is None


def test_a_local_config_json_gives_the_shape(tmp_path: Path) -> None:
    config = {
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 3, "intermediate_size": 128,
        "vocab_size": 100, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = resolve_shape(str(tmp_path))
    assert shape is not None
    # q 64x64, k/v 64x32 each, o 64x64, MLP 3 x 64x128, two norms; tied embedding 100x64 + final norm.
    per_layer = 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert shape.params == 3 * per_layer + 100 * 64 + 64


def _layout(name: str, **kw: Any) -> TrainingLayout:
    shape = known_shape(name)
    assert shape is not None
    defaults: dict[str, Any] = dict(
        ranks=8, gpu_bytes=80 * GIB, micro_batch_tokens=4096, response_tokens=2048
    )
    return TrainingLayout(shape=shape, **{**defaults, **kw})


def test_fsdp_divides_the_state_by_the_ranks_and_replication_does_not() -> None:
    one = plan_memory(_layout("qwen2.5-7b", ranks=1))
    eight = plan_memory(_layout("qwen2.5-7b", ranks=8))
    state = {"weights (float32)", "gradients (float32)", "AdamW state"}
    one_state = sum(line.bytes for line in one.phases["optimizer step"] if line.name in state)
    eight_state = sum(line.bytes for line in eight.phases["optimizer step"] if line.name in state)
    assert one_state == 16 * one.layout.shape.params
    assert eight_state == pytest.approx(one_state / 8, rel=1e-6)
    replicated = plan_memory(_layout("qwen2.5-7b", ranks=8, sharding="replicate"))
    assert sum(line.bytes for line in replicated.phases["optimizer step"] if line.name in state) == one_state


def test_offload_moves_the_state_to_the_host_and_checkpointing_shrinks_activations() -> None:
    base = plan_memory(_layout("qwen2.5-7b", ranks=1))
    offloaded = plan_memory(_layout("qwen2.5-7b", ranks=1, cpu_offload=True))
    assert offloaded.host_bytes == 16 * base.layout.shape.params
    assert offloaded.trainer_peak_bytes < base.trainer_peak_bytes - 100 * GIB
    full = plan_memory(_layout("qwen2.5-7b", activation_checkpointing=False))
    key = "activations + logits, or grads"
    act = {line.name: line.bytes for line in full.phases["backward"]}[key]
    ckpt = {line.name: line.bytes for line in plan_memory(_layout("qwen2.5-7b")).phases["backward"]}[key]
    assert act > 5 * ckpt


def test_foreach_adamw_adds_a_whole_size_temporary_to_the_step() -> None:
    fused = plan_memory(_layout("qwen2.5-1.5b", ranks=1))
    foreach = plan_memory(_layout("qwen2.5-1.5b", ranks=1, fused_optimizer=False))
    p = fused.layout.shape.params
    assert foreach.phase_bytes("optimizer step") - fused.phase_bytes("optimizer step") == 4 * p
    # What bench/gpu_scale.py measured on an H200 (1.5B, foreach AdamW, checkpointing): 28.82 GiB.
    assert foreach.trainer_peak_bytes / GIB == pytest.approx(28.82, rel=0.05)


def test_the_issue_cases_7b_fits_8x80_and_alone_it_does_not() -> None:
    assert plan_memory(_layout("qwen2.5-7b", rollout_fraction=0.5)).fits
    alone = plan_memory(_layout("qwen2.5-7b", ranks=1, rollout_fraction=0.5))
    assert not alone.fits
    line = refusal(alone)
    assert line is not None and "\n" not in line
    assert "student.pool.gpuMemoryGiB is 80" in line and "cpuOffload" in line
    assert "memoryFraction" not in line  # the trainer's state alone (114 GiB) does not fit: no use
    tight = refusal(plan_memory(_layout("qwen2.5-7b", ranks=2, rollout_fraction=0.9)))
    assert tight is not None and tight.index("memoryFraction") < tight.index("workers")
    assert refusal(plan_memory(_layout("qwen2.5-7b"))) is None


def test_the_rollout_engine_weights_must_leave_room_in_its_share_tensor_parallel_splits_them() -> None:
    # Qwen2.5-32B in bf16 is 61 GiB: more than half of an 80 GB GPU, the engine's default share.
    alone = plan_memory(_layout("qwen2.5-32b", cpu_offload=True, rollout_fraction=0.5))
    assert alone.peak_bytes <= alone.layout.gpu_bytes and not alone.fits  # the trainer fits, the engine not
    assert alone.refused_field == "spec.student.rollout.tensorParallel"
    line = refusal(alone)
    assert line is not None and "\n" not in line
    assert "61.0 GiB per GPU over 1 GPU(s)" in line and "is 40.0 GiB" in line and "tensorParallel" in line
    split = plan_memory(
        _layout("qwen2.5-32b", cpu_offload=True, rollout_fraction=0.5, rollout_tensor_parallel=2)
    )
    assert split.fits and split.rollout_weight_bytes * 2 == alone.rollout_weight_bytes
    assert "leaves room for its KV cache" in split.table()
    # A trainer that does not fit is reported on the GPUs' memory, whatever the engine.
    assert plan_memory(_layout("qwen2.5-32b", rollout_fraction=0.5)).refused_field.endswith("gpuMemoryGiB")


def _write(tmp_path: Path, manifest: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def test_validate_refuses_a_job_that_cannot_fit_naming_the_field_and_numbers(
    base_manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    student = base_manifest["spec"]["student"]
    student["model"] = "Qwen/Qwen2.5-7B-Instruct"
    student["pool"] = {"workers": 1, "gpusPerWorker": 1}
    student["training"] = {"sharding": "replicate"}
    path = _write(tmp_path, base_manifest)
    assert cli_main(["validate", str(path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert out[0].startswith(f"{path}: spec.student.pool.gpuMemoryGiB: the student needs ")
    assert "GiB per GPU" in out[0] and "sharding: fsdp" in out[0]
    assert cli_main(["plan", str(path)]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    student["pool"] = {"workers": 1, "gpusPerWorker": 8}
    student["training"] = {"sharding": "fsdp"}
    path = _write(tmp_path, base_manifest)
    assert cli_main(["validate", "-q", str(path)]) == 0
    assert cli_main(["plan", str(path)]) == 0
    assert "fits" in capsys.readouterr().out


def test_cpu_offload_needs_fsdp(
    base_manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base_manifest["spec"]["student"]["training"] = {"sharding": "replicate", "cpuOffload": True}
    assert cli_main(["validate", str(_write(tmp_path, base_manifest))]) == 1
    assert "spec.student.training.cpuOffload: cpuOffload needs sharding: fsdp" in capsys.readouterr().out


def test_validate_names_tensor_parallel_when_only_the_rollout_engine_does_not_fit(
    base_manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    student = base_manifest["spec"]["student"]
    student["model"] = "Qwen/Qwen2.5-32B-Instruct"
    student["pool"] = {"workers": 1, "gpusPerWorker": 8}
    student["training"] = {"cpuOffload": True}
    path = _write(tmp_path, base_manifest)
    assert cli_main(["validate", str(path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"{path}: spec.student.rollout.tensorParallel: ")
    student["rollout"] = {**student.get("rollout", {}), "tensorParallel": 2}
    assert cli_main(["validate", "-q", str(_write(tmp_path, base_manifest))]) == 0
