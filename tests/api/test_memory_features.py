"""The memory features the plan decides (distillery/plan/memory/features.py): each is on only where the job
does not fit its GPUs without it, a value the spec sets is kept, and `distillery plan` says why."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from distillery_cli.main import main as cli_main

from distillery.api.spec import Sharding
from distillery.plan import resolve
from distillery.plan.memory.features import job_memory_plan, resolve_memory_features
from distillery.plan.memory.gpu import GIB
from distillery.validation import parse_job


def _job(base: dict[str, Any], *, model: str, workers: int, gpus: int, gib: float, **training: Any) -> Any:
    doc = copy.deepcopy(base)
    doc["spec"]["student"].update(
        model=model,
        pool={"workers": workers, "gpusPerWorker": gpus, "gpuMemoryGiB": gib},
        training=training,
    )
    return parse_job(doc).spec


def _chosen(spec: Any) -> tuple[Sharding, bool, bool]:
    features = resolve_memory_features(spec)
    return features.sharding, features.activation_checkpointing, features.cpu_offload


def test_a_small_student_on_one_gpu_runs_replicated_without_checkpointing(
    base_manifest: dict[str, Any],
) -> None:
    spec = _job(base_manifest, model="Qwen/Qwen2.5-0.5B", workers=1, gpus=1, gib=80)
    assert _chosen(spec) == (Sharding.REPLICATE, False, False)
    assert resolve(spec).trainer.sharding == Sharding.REPLICATE  # the trainer reads the plan's choice


def test_several_ranks_shard_whatever_their_memory(base_manifest: dict[str, Any]) -> None:
    spec = _job(base_manifest, model="Qwen/Qwen2.5-0.5B", workers=1, gpus=8, gib=80)
    assert _chosen(spec) == (Sharding.FSDP, False, False)


def test_checkpointing_comes_on_only_where_the_backward_does_not_fit_without_it(
    base_manifest: dict[str, Any],
) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["schedule"] = {"promptsPerStep": 64, "microBatchSize": 32}
    # 32 x 1,280 tokens a micro-batch: every layer's activations together do not fit.
    spec = _job(doc, model="Qwen/Qwen2.5-1.5B", workers=1, gpus=8, gib=80)
    sharding, checkpointing, offload = _chosen(spec)
    assert (sharding, checkpointing, offload) == (Sharding.FSDP, True, False)
    plan = job_memory_plan(spec)
    assert plan is not None and plan.fits and plan.layout.activation_checkpointing
    why = resolve_memory_features(spec).lines()[1]
    assert why.startswith("activationCheckpointing: on (auto: without it the backward phase would need")
    doc["spec"]["schedule"]["microBatchSize"] = 8
    assert _chosen(_job(doc, model="Qwen/Qwen2.5-1.5B", workers=1, gpus=8, gib=80))[1] is False


def test_offload_comes_on_where_nothing_else_fits_and_a_set_value_is_kept(
    base_manifest: dict[str, Any],
) -> None:
    # Qwen2.5-7B on one 80 GB GPU: 16 bytes a parameter (122 GB) fit only in host memory.
    spec = _job(base_manifest, model="Qwen/Qwen2.5-7B", workers=1, gpus=1, gib=80)
    assert _chosen(spec)[2] is True
    assert job_memory_plan(spec).fits  # type: ignore[union-attr]
    refused = _job(base_manifest, model="Qwen/Qwen2.5-7B", workers=1, gpus=1, gib=80, cpuOffload=False)
    assert _chosen(refused)[2] is False
    plan = job_memory_plan(refused)
    assert plan is not None and not plan.fits and plan.peak_bytes > 80 * GIB
    assert resolve_memory_features(refused).lines()[2] == "cpuOffload: off (set in the spec)"


def test_a_set_value_is_kept_even_where_it_costs(base_manifest: dict[str, Any]) -> None:
    spec = _job(
        base_manifest, model="Qwen/Qwen2.5-0.5B", workers=1, gpus=1, gib=80,
        sharding="fsdp", activationCheckpointing=True,
    )  # fmt: skip
    assert _chosen(spec) == (Sharding.FSDP, True, False)


def test_a_gpu_student_of_unknown_shape_gets_the_memory_saving_side(base_manifest: dict[str, Any]) -> None:
    spec = _job(base_manifest, model="some-org/unknown", workers=1, gpus=1, gib=80)
    assert _chosen(spec) == (Sharding.FSDP, True, False)


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        ({}, "sharding: replicate (auto: a CPU job"),
        ({"sharding": "fsdp"}, "sharding: fsdp (set in the spec)"),
    ],
)
def test_distillery_plan_prints_each_choice_and_why(
    tmp_path: Any,
    base_manifest: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    training: dict,
    expected: str,
) -> None:
    import yaml

    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"].update(pool={"workers": 1, "gpusPerWorker": 0}, training=training)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli_main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"  {expected}" in out
    assert "activationCheckpointing: off" in out and "cpuOffload: off" in out
