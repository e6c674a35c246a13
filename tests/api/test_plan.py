"""The teachers' half of the resolved plan (`distillery.plan`): each derived number, the two translations of
one engine's settings (server flags and in-process kwargs) agreeing, the route table, the vLLM environment."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from distillery.api import RolloutEngine
from distillery.plan import JobPlan, resolve
from distillery.plan.env.vllm import vllm_env
from distillery.plan.memory.budget import GpuBudgetExceeded, share_left
from distillery.plan.rollout.settings import LOGPROB_CHECK_EVERY
from distillery.plan.teachers.engines import EngineSettings
from distillery.validation import parse_job


def plan_of(base: dict[str, Any], **spec: Any) -> JobPlan:
    doc = copy.deepcopy(base)
    doc["spec"].update(spec)
    return resolve(parse_job(doc).spec)


def test_max_logprobs_is_the_loss_top_k_and_at_least_one(base_manifest: dict[str, Any]) -> None:
    plan = plan_of(base_manifest)
    assert plan.top_k == 8
    assert {e.max_logprobs for e in plan.engines.values()} == {8}
    reverse_kl = plan_of(base_manifest, loss={"mode": "k3"})  # topK 0: the sampled token only
    assert reverse_kl.top_k == 1 and reverse_kl.engines["math"].max_logprobs == 1


def test_max_model_len_covers_prompt_response_and_one_token_unless_set_higher(
    base_manifest: dict[str, Any],
) -> None:
    plan = plan_of(base_manifest, data={"train": {"path": "/d.jsonl"}, "maxPromptTokens": 100})
    needed = 100 + 1024 + 1  # maxNewTokens defaults to 1024
    assert plan.engines["math"].max_model_len == needed
    teachers = copy.deepcopy(base_manifest["spec"]["teachers"])
    teachers[0]["inference"] = {"maxModelLen": 4096}
    assert plan_of(base_manifest, teachers=teachers).engines["math"].max_model_len == 4096


def test_engine_settings_of_each_placement(base_manifest: dict[str, Any]) -> None:
    teachers = copy.deepcopy(base_manifest["spec"]["teachers"])
    teachers[0].update(pool={"gpusPerReplica": 2, "tensorParallel": 2}, maxConcurrency=7)
    teachers[0]["inference"] = {"dtype": "bfloat16", "extraArgs": ["--enable-prefix-caching"]}
    teachers.append({"name": "co", "model": "m", "placement": "colocated", "routes": ["co"]})
    plan = plan_of(base_manifest, teachers=teachers)
    math, ext, co = plan.engines["math"], plan.engines["ext"], plan.engines["co"]
    assert (math.served_model_name, math.tensor_parallel, math.dtype) == ("math", 2, "bfloat16")
    assert (math.memory_fraction, math.max_concurrency, math.enforce_eager) == (0.9, 7, False)
    assert math.extra_args == ("--enable-prefix-caching",)
    assert ext.served_model_name == "big"  # an external server answers to its own model name
    # A colocated teacher: the student's precision and GPU, eager, one device, what the rollout engine leaves.
    assert (co.dtype, co.enforce_eager, co.tensor_parallel, co.memory_fraction) == ("auto", True, 1, 0.4)


def test_server_args_and_engine_kwargs_say_the_same() -> None:
    engine = EngineSettings("t", 16, 512, memory_fraction=0.4, tensor_parallel=2, dtype="bfloat16")
    flags = engine.server_args()
    kwargs = engine.engine_kwargs(on_gpu=True)
    for flag, key in [
        ("--max-logprobs", "max_logprobs"),
        ("--max-model-len", "max_model_len"),
        ("--tensor-parallel-size", "tensor_parallel_size"),
        ("--gpu-memory-utilization", "gpu_memory_utilization"),
        ("--dtype", "dtype"),
    ]:
        assert flags[flags.index(flag) + 1] == str(kwargs[key])
    assert ("--enforce-eager" in flags) == kwargs["enforce_eager"] is False
    eager = dataclasses.replace(engine, enforce_eager=True)
    assert "--enforce-eager" in eager.server_args() and eager.engine_kwargs(on_gpu=True)["enforce_eager"]
    # Off a GPU neither passes the memory fraction (vLLM would read it as a share of the machine's memory).
    on_cpu = dataclasses.replace(engine, on_gpu=False)
    assert "--gpu-memory-utilization" not in on_cpu.server_args()
    assert "gpu_memory_utilization" not in engine.engine_kwargs(on_gpu=False)


def test_server_args_keep_the_flag_order_of_the_deployment() -> None:
    engine = EngineSettings(
        "t", 8, 64, memory_fraction=0.9, tensor_parallel=1, dtype="auto", extra_args=("-x",)
    )
    assert engine.server_args() == [
        "--served-model-name", "t", "--max-logprobs", "8", "--max-model-len", "64",
        "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9", "--dtype", "auto", "-x",
    ]  # fmt: skip
    # A server launched on this machine is eager; extra args stay last, so a user's flag wins.
    local = dataclasses.replace(engine, enforce_eager=True, on_gpu=False)
    assert local.server_args() == [
        "--served-model-name", "t", "--max-logprobs", "8", "--max-model-len", "64",
        "--tensor-parallel-size", "1", "--dtype", "auto", "--enforce-eager", "-x",
    ]  # fmt: skip


def test_route_table(base_manifest: dict[str, Any]) -> None:
    routes = plan_of(base_manifest).routes
    assert routes.by_route == {"math": "math"} and routes.default == "ext"
    assert routes.teacher_for("math") == "math"
    assert routes.teacher_for("poetry") == routes.teacher_for(None) == "ext"
    teachers = copy.deepcopy(base_manifest["spec"]["teachers"])
    teachers[1] = {**teachers[1], "default": False, "routes": ["ext"]}
    strict = plan_of(base_manifest, teachers=teachers).routes
    assert strict.teacher_for("poetry") is None and strict.known_routes() == ["ext", "math"]
    # One teacher scores everything, whatever its routes say.
    one = plan_of(base_manifest, teachers=[{"name": "only", "model": "m", "routes": ["a"]}]).routes
    assert one.teacher_for("b") == one.teacher_for("a") == "only"


def test_gpu_budget(base_manifest: dict[str, Any]) -> None:
    teachers = copy.deepcopy(base_manifest["spec"]["teachers"])
    teachers += [
        {"name": "co0", "model": "m", "placement": "colocated", "routes": ["a"]},
        {"name": "co1", "model": "m", "placement": "colocated", "routes": ["b"]},
        {
            "name": "co2",
            "model": "m",
            "placement": "colocated",
            "routes": ["c"],
            "inference": {"memoryFraction": 0.1},
        },
    ]
    student = {"model": "s", "rollout": {"memoryFraction": 0.3}}
    budget = plan_of(base_manifest, teachers=teachers, student=student).gpu_budget
    # 0.9 - 0.3 (rollout) - 0.1 (co2's own) = 0.5, split between the two that set none.
    assert budget.teacher_fractions == {"math": 0.9, "ext": 0.9, "co0": 0.25, "co1": 0.25, "co2": 0.1}
    assert budget.student_gpu_taken == pytest.approx(0.9)
    # Ray's logical shares: the rollout engine and the three colocated teachers split 0.4 of rank 0's GPU.
    assert (budget.trainer_gpus, budget.engine_gpus) == (0.5, 0.1)
    alone = plan_of(base_manifest).gpu_budget
    assert (alone.trainer_gpus, alone.engine_gpus, alone.student_gpu_taken) == (0.6, 0.4, 0.5)


def test_share_left_on_a_shared_gpu() -> None:
    assert share_left(0.5, [None, None]) == pytest.approx(0.2)
    assert share_left(0.5, [0.45]) == 0.0  # every engine sets its own: up to 0.95 in all
    with pytest.raises(GpuBudgetExceeded) as exceeded:
        share_left(0.5, [0.5])
    assert exceeded.value.taken == 1.0
    with pytest.raises(GpuBudgetExceeded):
        share_left(0.88, [None])  # leaves 0.02 < 0.05


def test_vllm_env_keeps_the_callers_kv_cache() -> None:
    assert vllm_env({}) == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    assert vllm_env({"VLLM_CPU_KVCACHE_SPACE": "8"})["VLLM_CPU_KVCACHE_SPACE"] == "8"


def test_rollout_settings_and_world_size(base_manifest: dict[str, Any]) -> None:
    base_manifest["spec"]["student"]["rollout"] = {"replicas": 2, "memoryFraction": 0.3}
    base_manifest["spec"]["student"]["pool"] = {"workers": 2, "gpusPerWorker": 4}
    plan = plan_of(base_manifest)
    rollout, spec = plan.rollout, parse_job(base_manifest).spec
    assert (rollout.replicas, rollout.memory_fraction, rollout.engine) == (2, 0.3, RolloutEngine.VLLM)
    # The student's engines and a teacher without its own maxModelLen see the same longest sequence.
    assert rollout.max_model_len == spec.data.max_prompt_tokens + spec.student.rollout.max_new_tokens + 1
    plain = [t.name for t in spec.teachers if t.inference.max_model_len is None]
    assert plain and all(plan.engines[name].max_model_len == rollout.max_model_len for name in plain)
    assert plan.world_size == 8
    base_manifest["spec"]["student"]["pool"] = {"workers": 3, "gpusPerWorker": 0}
    assert plan_of(base_manifest).world_size == 3


def test_engines_sleep_between_phases_only_on_a_gpu(base_manifest: dict[str, Any]) -> None:
    assert plan_of(base_manifest).rollout.sleeps  # the base job's student has a GPU
    base_manifest["spec"]["student"]["pool"] = {"workers": 1, "gpusPerWorker": 0}
    assert not plan_of(base_manifest).rollout.sleeps


@pytest.mark.parametrize(
    ("loss", "every"),
    [
        ({"mode": "forward_kl_topk", "topK": 8}, LOGPROB_CHECK_EVERY),  # the loss never reads them
        ({"mode": "k1", "objective": "policy_gradient"}, 1),  # the ratio of every token
        ({"mode": "k3", "taskRewardCoef": 0.5}, 1),  # the task reward's ratio
    ],
)
def test_the_rollout_returns_log_probs_where_the_loss_reads_them(
    base_manifest: dict[str, Any], loss: dict[str, Any], every: int
) -> None:
    base_manifest["spec"]["loss"] = loss
    assert plan_of(base_manifest).rollout.logprobs_every == every
    from distillery_runtime.run.loop.plan import wants_logprobs

    due = [step for step in range(1, 31) if wants_logprobs(step, every)]
    assert due == (list(range(1, 31)) if every == 1 else [1, 10, 20, 30])


def test_a_run_told_to_stop_early_schedules_its_learning_rate_over_the_steps_it_takes(
    base_manifest: dict[str, Any],
) -> None:
    spec = parse_job(base_manifest).spec
    assert resolve(spec).trainer.total_steps == spec.schedule.steps
    assert resolve(spec, steps=3).trainer.total_steps == 3


@pytest.mark.parametrize(
    ("pool", "rollout", "replicas"),
    [
        ({"workers": 1, "gpusPerWorker": 8}, {}, 8),  # every GPU the job holds samples
        ({"workers": 2, "gpusPerWorker": 4}, {"tensorParallel": 2}, 4),  # one per tensor-parallel group
        ({"workers": 1, "gpusPerWorker": 8}, {"replicas": 2}, 2),  # the user's count wins
        ({"workers": 2, "gpusPerWorker": 0}, {}, 1),  # CPU: engines would only split the same cores
    ],
)
def test_rollout_replicas_default_to_one_engine_per_gpu_group(
    base_manifest: dict[str, Any], pool: dict[str, Any], rollout: dict[str, Any], replicas: int
) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"]["pool"] = pool
    doc["spec"]["student"].setdefault("rollout", {}).update(rollout)
    assert resolve(parse_job(doc).spec).rollout.replicas == replicas
