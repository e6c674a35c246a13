"""A LoRA student's plan (distillery/plan/lora.py, the memory plan's LoRA phase, `distillery plan`): the
adapter's settings resolved once, its size from the model's shape, its memory against full fine-tuning."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from distillery_cli.main import main as cli_main

from distillery.api.spec import Sharding
from distillery.model_shapes import known_shape
from distillery.plan import resolve
from distillery.plan.lora import (
    ALL_LINEAR,
    DECODER_LINEAR_MODULES,
    LoraSettings,
    adapter_params,
    resolve_lora,
    vllm_max_lora_rank,
)
from distillery.plan.memory.features import job_memory_plan, resolve_memory_features
from distillery.plan.memory.gpu import GIB, plan_memory
from distillery.validation import parse_job


def _job(base: dict[str, Any], lora: dict[str, Any] | None, **student: Any) -> Any:
    doc = copy.deepcopy(base)
    doc["spec"]["student"].update(student)
    if lora is not None:
        doc["spec"]["student"]["lora"] = lora
    return parse_job(doc).spec


def test_defaults_rank_16_scale_2_and_the_decoders_linear_layers(
    base_manifest: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    lora = resolve_lora(_job(base_manifest, {}, model=str(tmp_path)))
    assert lora == LoraSettings(rank=16, alpha=32, target_modules=DECODER_LINEAR_MODULES)
    # A model whose layers we do not know by name: peft's all-linear (every linear layer but the head).
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "someday"}))
    assert resolve_lora(_job(base_manifest, {}, model=str(tmp_path))).target_modules == ALL_LINEAR  # type: ignore[union-attr]
    named = resolve_lora(_job(base_manifest, {"rank": 8, "alpha": 8, "targetModules": ["q_proj"]}))
    assert named == LoraSettings(rank=8, alpha=8, target_modules=("q_proj",))
    assert resolve_lora(_job(base_manifest, None)) is None
    assert resolve(_job(base_manifest, {"rank": 4})).trainer.lora == LoraSettings(
        rank=4, alpha=8, target_modules=ALL_LINEAR
    )


def test_adapter_size_of_a_real_shape() -> None:
    shape = known_shape("Qwen/Qwen2.5-7B-Instruct")
    assert shape is not None
    # Qwen2.5-7B: hidden 3584, 28 heads of 128, 4 KV heads (kv 512), MLP 18944, 28 layers. Per layer and
    # rank: q 3584+3584, k and v 3584+512 each, o 3584+3584, gate and up 3584+18944 each, down 18944+3584.
    per_rank = 28 * (2 * 7168 + 2 * 4096 + 3 * 22528)
    assert adapter_params(shape, LoraSettings(rank=32, alpha=64)) == 32 * per_rank == 80_740_352
    only_q = LoraSettings(rank=8, alpha=16, target_modules=("q_proj",))
    assert adapter_params(shape, only_q) == 28 * 8 * 7168
    whole_head = dataclasses.replace(only_q, modules_to_save=("lm_head",))
    assert adapter_params(shape, whole_head) == 28 * 8 * 7168 + shape.vocab * shape.hidden


def test_vllm_ranks() -> None:
    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 33, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]


def test_the_memory_plan_keeps_frozen_weights_in_the_compute_dtype(base_manifest: dict[str, Any]) -> None:
    pool = {"workers": 1, "gpusPerWorker": 1, "gpuMemoryGiB": 80}
    spec = _job(base_manifest, {"rank": 32}, model="Qwen/Qwen2.5-7B-Instruct", pool=pool)
    plan = job_memory_plan(spec)
    assert plan is not None and plan.layout.adapter_params == 80_740_352
    shape = plan.layout.shape
    lines = {line.name: line.bytes for line in plan.phases["optimizer step"]}
    assert lines["frozen weights (compute dtype)"] == 2 * shape.params
    assert lines["adapter weights (float32)"] == 4 * 80_740_352
    assert lines["adapter AdamW state"] == 8 * 80_740_352
    full = plan_memory(dataclasses.replace(plan.layout, adapter_params=0))
    # Full training of the same layout: 16 bytes a parameter of state; LoRA: 2 (+ the adapter's 16).
    assert full.phase_bytes("optimizer step") > 5 * plan.phase_bytes("optimizer step")
    # A 7B student on one 80 GiB GPU: full training does not fit, its LoRA does, replicated.
    assert plan.fits and not full.fits
    assert resolve_memory_features(spec).sharding == Sharding.REPLICATE


def test_lora_replicates_over_several_ranks_where_a_replica_fits(base_manifest: dict[str, Any]) -> None:
    pool = {"workers": 1, "gpusPerWorker": 2, "gpuMemoryGiB": 80}
    full = _job(base_manifest, None, model="Qwen/Qwen2.5-1.5B-Instruct", pool=pool)
    lora = _job(base_manifest, {"rank": 16}, model="Qwen/Qwen2.5-1.5B-Instruct", pool=pool)
    assert resolve_memory_features(full).sharding == Sharding.FSDP  # several ranks share the state
    features = resolve_memory_features(lora)
    assert features.sharding == Sharding.REPLICATE  # no all-gathers: the frozen bf16 copy fits
    assert "LoRA" in features.reasons[0]
    # A 32B student's frozen copy does not fit an 80 GiB GPU: FSDP2 shards it.
    big = _job(base_manifest, {"rank": 16}, model="Qwen/Qwen2.5-32B-Instruct", pool=pool)
    assert resolve_memory_features(big).sharding == Sharding.FSDP
    # LoRA turns the meta-device load and the sharded optimizer checkpoint off (peft's names).
    trainer = resolve(big).trainer
    assert not trainer.sharded_load and not trainer.sharded_checkpoint


def test_distillery_plan_prints_the_adapter_and_its_savings(
    base_manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"].update(
        model="Qwen/Qwen2.5-7B-Instruct",
        lora={"rank": 32},
        pool={"workers": 1, "gpusPerWorker": 1, "gpuMemoryGiB": 80},
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    cli_main(["plan", str(path)])
    out = capsys.readouterr().out
    assert "LoRA: rank 32, alpha 64 (scale 2), dropout 0, targets all-linear" in out
    assert "adapter 80.74M parameters" in out
    # The sync per step: the adapter in bf16 against the whole model's 15 GB.
    assert "weight sync per step: 161.5 MB (the adapter) against 15231.2 MB for full fine-tuning" in out
    peak = next(line for line in out.splitlines() if "trainer peak per GPU" in line)
    plan = job_memory_plan(parse_job(doc).spec)
    assert plan is not None and f"{plan.trainer_peak_bytes / GIB:.2f} GiB with the adapter" in peak


def test_host_memory_of_a_lora_student(base_manifest: dict[str, Any]) -> None:
    """Each rank loads the student in its compute dtype (not float32), and a checkpoint gathers the
    adapter's optimizer state, not the model's."""
    from distillery.plan.pods.host_memory import plan_host_memory

    pool = {"workers": 1, "gpusPerWorker": 2, "gpuMemoryGiB": 80}
    lora = plan_host_memory(_job(base_manifest, {"rank": 32}, model="Qwen/Qwen2.5-7B-Instruct", pool=pool))
    assert lora is not None
    shape = known_shape("Qwen/Qwen2.5-7B-Instruct")
    assert shape is not None
    load = dict(lora.parts["load"])
    assert load["the whole student in its compute dtype a rank (LoRA)"] == 2 * 2 * shape.params
    from distillery.plan.pods.host_memory import OPTIMIZER_GATHER_BYTES

    gathered = dict(lora.parts["checkpoint"])["the whole optimizer state (rank 0)"]
    assert gathered == OPTIMIZER_GATHER_BYTES * 80_740_352  # the adapter's, not the 7.6B model's
