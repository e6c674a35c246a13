"""Which engine computes each teacher's log-probs (`distillery.plan.teachers.scoring_engine`), what the runtime config
makes of it (in process, no server), and the API's rule on `inference.engine`; which engine samples the
student (`distillery.plan.rollout.settings.rollout_engine`)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from distillery.api import DistillationTeacher, RolloutEngine, TeacherEngine
from distillery.model_shapes import ModelShape
from distillery.plan import resolve
from distillery.plan.placement.rollout import rollout_line
from distillery.plan.rollout.settings import (
    CPU_ONE_THREAD_DECODE_MAX_TOKEN_PARAMS,
    CPU_TRANSFORMERS_MAX_TOKEN_PARAMS,
    rollout_engine,
)
from distillery.plan.teachers.scoring_engine import scoring_engine, scoring_engine_lines
from distillery.runtime_config import TeacherProtocol, resolve_runtime_config
from distillery.validation import InvalidManifest, parse_job

VLLM, FORWARD = TeacherEngine.VLLM, TeacherEngine.TRANSFORMERS
EXTERNAL = {"placement": "external", "endpoint": "http://t:8000", "model": "big"}
SHARED = {"placement": "shared", "teacherRef": {"name": "qwen-7b"}}


def job(base: dict[str, Any], teacher: dict[str, Any], *, student_gpus: int = 0) -> Any:
    doc = copy.deepcopy(base)
    doc["spec"]["teachers"] = [{"name": "t", "model": "Qwen/Qwen2.5-7B", **teacher}]
    doc["spec"]["student"]["pool"] = {"gpusPerWorker": student_gpus}
    return parse_job(doc)


@pytest.mark.parametrize(
    ("teacher", "student_gpus", "local_gpus", "engine"),
    [
        # colocated: the student's devices decide, wherever the job runs
        ({"placement": "colocated"}, 0, None, FORWARD),
        ({"placement": "colocated"}, 0, 0, FORWARD),
        ({"placement": "colocated"}, 1, None, VLLM),
        ({"placement": "colocated"}, 1, 1, VLLM),
        # standalone: a Deployment of vLLM in a cluster, whatever its GPUs
        ({}, 0, None, VLLM),
        ({"pool": {"gpusPerReplica": 0}}, 0, None, VLLM),
        # ... and in `distillery run` a forward where it gets no GPU: none on the machine, or none asked for
        ({}, 0, 0, FORWARD),
        ({}, 1, 0, FORWARD),
        ({}, 0, 2, VLLM),
        ({"pool": {"gpusPerReplica": 0}}, 0, 2, FORWARD),
        # served elsewhere: always a vLLM server, never the job's
        (EXTERNAL, 0, 0, VLLM),
        (SHARED, 0, 0, VLLM),
        (SHARED, 0, None, VLLM),
        # what vLLM alone understands keeps vLLM
        ({"inference": {"dtype": "fp8"}}, 0, 0, VLLM),
        ({"inference": {"extraArgs": ["--enable-prefix-caching"]}}, 0, 0, VLLM),
        ({"placement": "colocated", "inference": {"extraArgs": ["--kv-cache-dtype=fp8"]}}, 0, 0, VLLM),
        # the user's choice wins
        ({"inference": {"engine": "vllm"}}, 0, 0, VLLM),
        ({"placement": "colocated", "inference": {"engine": "vllm"}}, 0, None, VLLM),
        ({"placement": "colocated", "inference": {"engine": "transformers"}}, 1, None, FORWARD),
    ],
)
def test_the_forward_where_the_teacher_computes_on_the_jobs_cpu_cores(
    base_manifest: dict[str, Any],
    teacher: dict[str, Any],
    student_gpus: int,
    local_gpus: int | None,
    engine: TeacherEngine,
) -> None:
    spec = job(base_manifest, teacher, student_gpus=student_gpus).spec
    assert scoring_engine(spec, spec.teachers[0], local_gpus=local_gpus) == engine
    settings = resolve(spec, local_gpus=local_gpus).engines["t"]
    assert settings.engine == engine
    # One forward a call: the samples that arrive meanwhile join the next one instead of queueing beside it.
    assert settings.coalesced_in_flight == (1 if engine == FORWARD else settings.coalesced_in_flight)


def test_a_local_runs_cpu_teacher_is_reached_in_process_and_a_clusters_at_its_service(
    base_manifest: dict[str, Any],
) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["teachers"] = [
        {"name": "t", "model": "Qwen/Qwen2.5-7B", "routes": ["math"]},
        {"name": "u", **EXTERNAL, "default": True},
    ]
    doc["spec"]["student"]["pool"] = {"gpusPerWorker": 0}
    local = resolve_runtime_config(parse_job(doc), None, in_cluster=False)
    assert [(t.name, t.protocol, t.endpoints) for t in local.teachers] == [
        ("t", TeacherProtocol.IN_PROCESS, []),
        ("u", TeacherProtocol.OPENAI, ["http://t:8000"]),
    ]
    on_gpus = resolve_runtime_config(parse_job(doc), None, in_cluster=False, local_gpus=1)
    assert on_gpus.teachers[0].protocol == TeacherProtocol.COMPACT
    cluster = resolve_runtime_config(parse_job(doc), "ns", in_cluster=True)
    assert cluster.teachers[0].protocol == TeacherProtocol.COMPACT
    assert cluster.teachers[0].endpoints == [f"http://{doc['metadata']['name']}-teacher-t.ns.svc:8000"]


def test_plan_prints_each_teachers_engine_and_why(base_manifest: dict[str, Any]) -> None:
    spec = job(base_manifest, {}).spec
    assert scoring_engine_lines(spec) == [
        "teacher t: vllm (auto: on GPUs or a server of its own); distillery run without GPUs: transformers in "
        "the run's processes"
    ]
    colocated = job(base_manifest, {"placement": "colocated"}).spec
    assert scoring_engine_lines(colocated) == [
        "teacher t: transformers (auto: colocated with a CPU student, a forward in its processes)"
    ]
    pinned = job(base_manifest, {"inference": {"engine": "vllm"}}).spec
    assert scoring_engine_lines(pinned) == ["teacher t: vllm (spec: inference.engine vllm)"]


@pytest.mark.parametrize("teacher", [{}, EXTERNAL, SHARED])
def test_transformers_is_refused_for_a_served_teacher_naming_the_field(
    base_manifest: dict[str, Any], teacher: dict[str, Any]
) -> None:
    with pytest.raises(InvalidManifest, match=r"spec\.teachers\[0\]\.inference\.engine: transformers is for"):
        job(base_manifest, {**teacher, "inference": {"engine": "transformers"}})


def test_a_distillation_teacher_is_a_vllm_server() -> None:
    doc = {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationTeacher",
        "metadata": {"name": "qwen-7b"},
        "spec": {"model": "Qwen/Qwen2.5-7B-Instruct", "inference": {"engine": "transformers"}},
    }
    with pytest.raises(ValidationError, match="a DistillationTeacher is a vLLM server"):
        DistillationTeacher.model_validate(doc)
    doc["spec"]["inference"]["engine"] = "vllm"
    assert DistillationTeacher.model_validate(doc).spec.inference.engine == VLLM


# ------------------------------------------------------------------------------------- the rollout engine


def shape(hidden: int, layers: int, vocab: int = 1031) -> ModelShape:
    return ModelShape(hidden, layers, 2 * hidden, vocab, 4, 4)


TINY, MINI = shape(128, 2), shape(256, 3)  # bench/rollout_engines.py's tiny and mini students: 0.46M, 2.23M
BETWEEN = shape(192, 3)  # 1.31M: sampled by the transformers engine on every thread


@pytest.mark.parametrize(
    ("rollout", "gpus", "student", "engine"),
    [
        ({}, 0, TINY, RolloutEngine.TRANSFORMERS),  # below the crossover on CPU
        ({}, 0, BETWEEN, RolloutEngine.TRANSFORMERS),
        ({}, 0, MINI, RolloutEngine.VLLM),
        ({}, 0, None, RolloutEngine.VLLM),  # a shape unknown where the plan is made
        ({}, 1, TINY, RolloutEngine.VLLM),  # a GPU
        ({"tensorParallel": 2}, 0, TINY, RolloutEngine.VLLM),  # only vLLM splits a model
        ({"engine": "vllm"}, 0, TINY, RolloutEngine.VLLM),  # the user's choice wins
        ({"engine": "transformers"}, 0, MINI, RolloutEngine.TRANSFORMERS),
        ({"engine": "transformers"}, 1, TINY, RolloutEngine.TRANSFORMERS),  # sdpa's fused kernels on a GPU
    ],
)
def test_auto_samples_with_the_transformers_engine_only_a_small_cpu_student(
    base_manifest: dict[str, Any],
    rollout: dict[str, Any],
    gpus: int,
    student: ModelShape | None,
    engine: RolloutEngine,
) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"].update(rollout=rollout, pool={"gpusPerWorker": gpus})
    spec = parse_job(doc).spec
    assert rollout_engine(spec, student) == engine
    rollout_plan = resolve(spec, student=student).rollout
    assert rollout_plan.engine == engine
    # The transformers engine decodes with eager attention on CPU; vLLM and GPUs keep their own kernels.
    eager = engine == RolloutEngine.TRANSFORMERS and not gpus
    assert rollout_plan.decode_attention == ("eager" if eager else None)
    # ... on one thread for a student of up to 1M (the explicit engine's 2.2M MINI keeps every thread)
    one_thread = eager and student == TINY
    assert rollout_plan.decode_threads == (1 if one_thread else None)
    line = rollout_line(spec, student)
    if student is None and not gpus:  # decided where the run reads the student's config.json
        assert "transformers if the student computes at most 1.5M parameters a token, else vllm" in line
        assert (
            "transformers decodes with eager attention (auto: on CPU), on 1 thread for a student of" in line
        )
    else:
        assert f"rollout: 1 {engine} engine(s)" in line
        assert ("decode steps with eager attention" in line) is eager
        assert ("attention on 1 thread" in line) is one_thread
    assert TINY.token_params < CPU_ONE_THREAD_DECODE_MAX_TOKEN_PARAMS < BETWEEN.token_params
    assert BETWEEN.token_params < CPU_TRANSFORMERS_MAX_TOKEN_PARAMS < MINI.token_params


def test_the_transformers_engine_cannot_split_a_model(base_manifest: dict[str, Any]) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"]["rollout"] = {"engine": "transformers", "tensorParallel": 2}
    with pytest.raises(
        InvalidManifest, match=r"spec\.student\.rollout\.tensorParallel: tensorParallel needs"
    ):
        parse_job(doc)


@pytest.mark.parametrize(
    ("edit", "in_trainer"),
    [
        ({}, True),  # one float32 CPU replica: the engine samples with the trainer's module
        ({"student": {"precision": "bfloat16"}}, False),  # bf16 engine weights, float32 masters
        ({"student": {"pool": {"gpusPerWorker": 1}}}, False),  # a GPU: vLLM, synced
        ({"student": {"pool": {"workers": 2}}}, False),  # two trainer ranks
        ({"student": {"rollout": {"replicas": 2}}}, False),  # two engines
        ({"student": {"rollout": {"engine": "vllm"}}}, False),
        ({"student": {"training": {"sharding": "fsdp"}}}, False),  # the module holds shards
        ({"schedule": {"oneStepOff": True}}, False),  # samples with the step before's weights
    ],
)
def test_the_rollout_runs_in_the_trainer_process_only_where_its_weights_are_the_trainers(
    base_manifest: dict[str, Any], edit: dict[str, Any], in_trainer: bool
) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"]["pool"] = {"gpusPerWorker": 0}
    for section, values in edit.items():
        for key, value in values.items():
            part = doc["spec"].setdefault(section, {})
            part[key] = {**part.get(key, {}), **value} if isinstance(value, dict) else value
    spec = parse_job(doc).spec
    plan = resolve(spec, student=TINY)
    assert plan.rollout.in_trainer is in_trainer
    assert resolve(spec).rollout.in_trainer is False  # a shape unknown: vLLM, which has its own process
    assert ("in the trainer's process with its own model" in rollout_line(spec, TINY)) is in_trainer
    # The base manifest's teachers: "math" standalone, computed in the run where a local run gives it no
    # GPU (and then in the trainer's process, where the rollout is); "ext" external, always served.
    local = resolve(spec, student=TINY, local_gpus=0)
    assert local.engines["math"].engine == FORWARD and local.engines["ext"].engine == VLLM
    assert local.teachers_in_trainer == ({"math"} if in_trainer else set())
    assert plan.teachers_in_trainer == set()  # in a cluster a standalone teacher is a vLLM Deployment
    # "ext" computes elsewhere: with "math" and the rollout in the trainer's process, no other process of
    # the run computes on this host
    assert local.trainer_alone is in_trainer
    assert plan.trainer_alone is False  # "math" would be a server on this host
