"""Where a local run puts the student and its standalone teachers on this machine's GPUs (pure: the
machine's GPUs are given as a list, so every case runs on a CPU machine too)."""

from __future__ import annotations

from typing import Any

import pytest
from distillery_runtime.run.local import teacher_server_command
from distillery_runtime.run.local_gpus import NotEnoughGpus, TeacherGpus, plan_local_gpus

from distillery.plan import resolve
from distillery.validation import parse_job


def job(student_gpus: int = 1, workers: int = 1, rollout: float = 0.5, **teacher: Any) -> Any:
    teacher = {"name": "t", "model": "m", **teacher}
    doc = {
        "apiVersion": "distillery.io/v1alpha1",
        "kind": "DistillationJob",
        "metadata": {"name": "local"},
        "spec": {
            "student": {
                "model": "s",
                "rollout": {"memoryFraction": rollout},
                "pool": {"workers": workers, "gpusPerWorker": student_gpus},
            },
            "teachers": [teacher],
            "data": {"train": {"path": "/d.jsonl"}},
        },
    }
    return parse_job(doc)


def test_cpu_machine_runs_a_cpu_job_and_refuses_a_gpu_one() -> None:
    plan = plan_local_gpus(job(student_gpus=0).spec, [])
    assert plan.student == [] and plan.teachers == {}
    with pytest.raises(NotEnoughGpus, match="this machine has no CUDA GPU") as error:
        plan_local_gpus(job(student_gpus=1).spec, [])
    assert error.value.field == "student.pool.gpusPerWorker"


def test_one_gpu_per_trainer_rank() -> None:
    spec = job(student_gpus=4, workers=2, placement="colocated").spec
    assert plan_local_gpus(spec, [str(i) for i in range(8)]).student == [str(i) for i in range(8)]
    with pytest.raises(NotEnoughGpus, match=r"2 worker\(s\) x 4 GPU\(s\) = 8, and this machine has 7"):
        plan_local_gpus(spec, [str(i) for i in range(7)])


def test_a_standalone_teacher_takes_the_next_free_gpus_as_this_machine_names_them() -> None:
    spec = job(pool={"gpusPerReplica": 2, "tensorParallel": 2}).spec
    plan = plan_local_gpus(spec, ["4", "6", "7"])  # CUDA_VISIBLE_DEVICES=4,6,7
    assert plan.student == ["4"]
    assert plan.teachers == {"t": TeacherGpus(["6", "7"], 0.9, 2, shared=False)}
    assert plan.describe() == "GPUs: student 4; teacher t 6,7 (0.9 of memory)"


def test_a_teacher_with_no_gpu_left_shares_the_students_in_what_the_rollout_engine_leaves() -> None:
    plan = plan_local_gpus(job(rollout=0.5).spec, ["0"])
    assert plan.teachers == {"t": TeacherGpus(["0"], 0.4, 1, shared=True)}
    assert plan.describe() == "GPUs: student 0; teacher t 0 shared with the student (0.4 of memory)"
    plan = plan_local_gpus(job(rollout=0.3, inference={"memoryFraction": 0.6}).spec, ["0"])
    assert plan.teachers["t"].memory_fraction == 0.6


def test_a_shared_gpu_that_cannot_hold_the_teacher_is_refused_naming_its_fraction() -> None:
    with pytest.raises(NotEnoughGpus, match="share the student's") as error:
        plan_local_gpus(job(rollout=0.5, inference={"memoryFraction": 0.9}).spec, ["0"])
    assert error.value.field == "teachers[0].inference.memoryFraction"
    with pytest.raises(NotEnoughGpus):
        plan_local_gpus(job(rollout=0.88).spec, ["0"])  # leaves 0.02 < 0.05 for the teacher


def test_a_teacher_asking_for_more_gpus_than_the_machine_has_is_refused() -> None:
    with pytest.raises(NotEnoughGpus, match="asks for 4 GPU") as error:
        plan_local_gpus(job(pool={"gpusPerReplica": 4}).spec, ["0", "1"])
    assert error.value.field == "teachers[0].pool.gpusPerReplica"


def test_cpu_teachers_and_external_ones_get_no_gpu() -> None:
    assert plan_local_gpus(job(pool={"gpusPerReplica": 0}).spec, ["0", "1"]).teachers == {}
    external = job(placement="external", endpoint="http://x:8000", pool={"gpusPerReplica": 1})
    assert plan_local_gpus(external.spec, ["0", "1"]).teachers == {}


def test_the_teacher_server_is_started_with_its_gpu_share() -> None:
    j = job()
    engine = resolve(j.spec).engines[j.spec.teachers[0].name]
    cpu = teacher_server_command(engine, "/m", 8000)
    assert "--gpu-memory-utilization" not in cpu
    gpu = teacher_server_command(engine, "/m", 8000, TeacherGpus(["1"], 0.4, 1, shared=True))
    assert gpu[gpu.index("--gpu-memory-utilization") + 1] == "0.4"
    assert gpu[gpu.index("--tensor-parallel-size") + 1] == "1"
