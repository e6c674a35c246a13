"""The loss and trainer half of the resolved plan (`distillery.plan.loss`, `distillery.plan.training`): the
spec's values, typed by the API's enums, each derived in one function and carried on the JobPlan."""

from __future__ import annotations

import copy
from typing import Any

from distillery.api.spec import LossMode, Objective, Precision, Reduction, Sharding, TeacherEngine
from distillery.plan import resolve
from distillery.plan.loss import LossConfig, resolve_loss
from distillery.plan.training import TrainerSettings, resolve_training
from distillery.validation import parse_job


def test_the_trainer_settings_are_the_spec_s(base_manifest: dict[str, Any]) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"].update(
        precision="float32",
        optimizer={"lr": 2e-5, "weightDecay": 0.1, "gradClip": 0.5, "warmupSteps": 3, "minLrRatio": 0.1},
        training={"sharding": "replicate", "activationCheckpointing": False},
    )
    doc["spec"]["schedule"] = {"steps": 40, "microBatchSize": 4, "microBatchTokens": 2048, "seed": 7}
    doc["spec"]["loss"] = {"mode": "jsd", "topK": 8, "beta": 0.3, "reduction": "sequence_mean"}
    spec = parse_job(doc).spec
    settings = resolve_training(spec, total_steps=12)
    assert settings == TrainerSettings(
        lr=2e-5,
        weight_decay=0.1,
        grad_clip=0.5,
        warmup_steps=3,
        total_steps=12,
        min_lr_ratio=0.1,
        micro_batch_size=4,
        precision=Precision.FLOAT32,
        seed=7,
        loss=LossConfig(mode=LossMode.JSD, beta=0.3, reduction=Reduction.SEQUENCE_MEAN),
        sharding=Sharding.REPLICATE,
        activation_checkpointing=False,
        micro_batch_tokens=2048,
        streamed_export=True,  # every layout: a replicated rank 0 writes without a whole cast copy either
    )
    plan = resolve(spec)
    assert plan.trainer == resolve_training(spec, total_steps=40)  # the schedule's steps
    assert plan.loss == plan.trainer.loss == resolve_loss(spec.loss)


def test_a_cpu_job_left_to_the_plan_trains_one_replica_without_checkpointing(
    base_manifest: dict[str, Any],
) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"]["pool"] = {"workers": 1, "gpusPerWorker": 0}
    settings = resolve(parse_job(doc).spec).trainer
    assert (settings.sharding, settings.activation_checkpointing, settings.cpu_offload) == (
        Sharding.REPLICATE,
        False,
        False,
    )
    assert settings.precision == Precision.AUTO and settings.micro_batch_tokens is None
    assert settings.loss.mode == LossMode.FORWARD_KL_TOPK and settings.loss.objective == Objective.DIRECT


def test_fsdp_over_several_ranks_loads_and_checkpoints_in_shards(base_manifest: dict[str, Any]) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"]["pool"] = {"workers": 2, "gpusPerWorker": 0}
    doc["spec"]["student"]["training"] = {"sharding": "fsdp"}
    settings = resolve(parse_job(doc).spec).trainer
    assert (settings.sharding, settings.sharded_load, settings.sharded_checkpoint) == (
        Sharding.FSDP,
        True,
        True,
    )
    doc["spec"]["student"]["pool"] = {"workers": 1, "gpusPerWorker": 0}
    one = resolve(parse_job(doc).spec).trainer
    assert (one.sharding, one.sharded_load, one.sharded_checkpoint) == (Sharding.FSDP, False, False)


def test_ephemeral_checkpoints_over_several_pods_keep_the_optimizer_whole(
    base_manifest: dict[str, Any],
) -> None:
    """Each rank's optimizer shards must land where rank 0 assembles the checkpoint: one emptyDir a worker
    pod is not that place, so the optimizer is gathered on rank 0 as before (the load stays sharded)."""
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"]["pool"] = {"workers": 2, "gpusPerWorker": 0}
    doc["spec"]["student"]["training"] = {"sharding": "fsdp"}
    doc["spec"]["checkpoint"] = {"ephemeral": True}
    settings = resolve(parse_job(doc).spec).trainer
    assert (settings.sharded_load, settings.sharded_checkpoint) == (True, False)
    # The weights are streamed all the same: gathered a tensor at a time, written by rank 0 alone.
    assert settings.streamed_export


def test_only_a_bfloat16_student_on_cpu_trains_narrow_micro_batches_with_eager_attention(
    base_manifest: dict[str, Any],
) -> None:
    from distillery.plan.attention import CPU_BF16_EAGER_MAX_WIDTH, attention_kernel, attention_line

    def plan_of(precision: str, gpus: int) -> tuple[int, str]:
        doc = copy.deepcopy(base_manifest)
        doc["spec"]["student"]["precision"] = precision
        doc["spec"]["student"]["pool"] = {"workers": 1, "gpusPerWorker": gpus}
        doc["spec"]["teachers"] = [t for t in doc["spec"]["teachers"] if t.get("placement") != "colocated"]
        spec = parse_job(doc).spec
        return resolve(spec).trainer.eager_attention_width, attention_line(spec)

    width, line = plan_of("bfloat16", 0)
    assert width == CPU_BF16_EAGER_MAX_WIDTH
    assert line.startswith(f"attention: eager for micro-batches up to {width} tokens a row")
    # float32 (and auto, float32 on CPU) keeps sdpa on CPU; on GPUs every precision keeps the model's own.
    for precision, gpus in (("float32", 0), ("auto", 0), ("bfloat16", 1), ("auto", 1)):
        width, line = plan_of(precision, gpus)
        assert width == 0, (precision, gpus)
        assert line.startswith("attention: the model's own (sdpa)")
    # A micro-batch as wide as the bound is eager, one token wider is the model's own; 0 never is eager.
    assert attention_kernel(CPU_BF16_EAGER_MAX_WIDTH, CPU_BF16_EAGER_MAX_WIDTH, "sdpa") == "eager"
    assert attention_kernel(CPU_BF16_EAGER_MAX_WIDTH + 1, CPU_BF16_EAGER_MAX_WIDTH, "sdpa") == "sdpa"
    assert attention_kernel(1, 0, "flash_attention_2") == "flash_attention_2"


def test_padded_forwards_are_cut_by_length_on_cpu_and_fewest_on_gpus_or_over_fsdp_ranks(
    base_manifest: dict[str, Any],
) -> None:
    from distillery.plan.data.padding import CPU_FORWARD_COST_TOKENS, padding_line

    def plan_of(gpus: int, workers: int = 1, sharding: str = "auto", local_gpus: int | None = None) -> Any:
        doc = copy.deepcopy(base_manifest)
        doc["spec"]["student"]["pool"] = {"workers": workers, "gpusPerWorker": gpus}
        doc["spec"]["student"]["training"] = {"sharding": sharding}
        spec = parse_job(doc).spec
        return resolve(spec, local_gpus=local_gpus), padding_line(spec)

    plan, line = plan_of(0)
    assert plan.trainer.forward_cost_tokens == CPU_FORWARD_COST_TOKENS
    assert line.startswith(
        f"micro-batches: sorted by length, cut where a cut saves over {CPU_FORWARD_COST_TOKENS}"
    )
    plan, line = plan_of(1)
    assert plan.trainer.forward_cost_tokens is None and line.endswith("sorted by length (on GPUs)")
    # FSDP over two CPU ranks: every micro-batch all-gathers the weights again.
    plan, line = plan_of(0, workers=2, sharding="fsdp")
    assert plan.trainer.forward_cost_tokens is None and "FSDP over several ranks" in line
    assert (
        plan_of(0, workers=2, sharding="replicate")[0].trainer.forward_cost_tokens == CPU_FORWARD_COST_TOKENS
    )
    # The teachers': a transformers forward on this machine's CPU (a local run without GPUs) is cut; in a
    # cluster the standalone teacher is a vLLM server, which schedules its own, as is an external one.
    local, _ = plan_of(0, local_gpus=0)
    assert local.engines["math"].engine == TeacherEngine.TRANSFORMERS
    assert local.engines["math"].forward_cost_tokens == CPU_FORWARD_COST_TOKENS
    cluster, _ = plan_of(0)
    assert cluster.engines["math"].engine == TeacherEngine.VLLM
    assert cluster.engines["math"].forward_cost_tokens is None
    assert local.engines["ext"].forward_cost_tokens is None
