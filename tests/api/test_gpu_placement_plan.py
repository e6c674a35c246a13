"""The plan's GPU placement (pure): which bundle each actor takes, and `distillery plan`'s lines of it.
Ray's own assignment of these bundles is tested in tests/runtime/test_gpu_placement.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from distillery_cli.main import main as cli_main

from distillery.api import DistillationJobSpec
from distillery.plan.placement.gpus import GpuSlot, Role, plan_gpu_placement
from distillery.validation import load_jobs, parse_spec

ROOT = Path(__file__).resolve().parents[2]
COLOCATED = ROOT / "examples" / "colocated-teacher.yaml"
SPECS = [
    job.spec
    for path in [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "tests" / "golden" / "variants.yaml"]
    for job in load_jobs(path)
]


def _spec(workers: int, gpus: int, tp: int = 1, replicas: int | None = None) -> DistillationJobSpec:
    base = load_jobs(COLOCATED)[0].spec.model_dump(by_alias=True, exclude_none=True)
    rollout = {**base["student"]["rollout"], "tensorParallel": tp}
    if replicas is not None:
        rollout["replicas"] = replicas
    student = {**base["student"], "pool": {"workers": workers, "gpusPerWorker": gpus}, "rollout": rollout}
    return parse_spec({**base, "student": student})


def test_the_colocated_example_puts_one_rank_on_each_gpu_and_the_engines_beside_rank_0() -> None:
    placement = plan_gpu_placement(load_jobs(COLOCATED)[0].spec)
    assert placement is not None
    assert [placement.trainer(r).slot for r in range(2)] == [GpuSlot(0, 0), GpuSlot(0, 1)]
    assert [a.slot for a in placement.rollout(0) + placement.rollout(1)] == [GpuSlot(0, 0), GpuSlot(0, 1)]
    assert placement.teacher(0).slot == GpuSlot(0, 0)
    assert placement.teacher(0).memory_fraction == 0.4
    assert placement.bundles == [{"GPU": 1.0}, {"GPU": 1.0}]


def test_tensor_parallel_replicas_take_consecutive_gpus_of_one_worker() -> None:
    placement = plan_gpu_placement(_spec(workers=2, gpus=4, tp=2))
    assert placement is not None
    slots = [[a.slot for a in placement.rollout(r)] for r in range(4)]
    assert slots == [[GpuSlot(w, g), GpuSlot(w, g + 1)] for w in (0, 1) for g in (0, 2)]
    assert [a.name for a in placement.rollout(3)] == [
        "rollout engine 3 (tp rank 0)",
        "rollout engine 3 (tp rank 1)",
    ]
    one = plan_gpu_placement(_spec(workers=1, gpus=4, tp=2, replicas=1))
    assert one is not None and [a.slot.gpu for a in one.actors if a.role == Role.ROLLOUT] == [0, 1]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.student.model)
def test_every_example_and_variant_places_one_rank_a_gpu_within_its_shares(spec: DistillationJobSpec) -> None:
    placement = plan_gpu_placement(spec)
    if spec.student.pool.gpus_per_worker == 0:
        assert placement is None
        return
    assert placement is not None
    ranks = Counter(a.slot for a in placement.actors if a.role == Role.TRAINER)
    assert set(ranks) == set(placement.slots()) and set(ranks.values()) == {1}
    for slot in placement.slots():
        assert sum(a.gpu_share for a in placement.on(slot)) <= 1.0 + 1e-9


def test_distillery_plan_prints_each_gpu_and_who_shares_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plan", str(COLOCATED)]) == 0
    out = capsys.readouterr().out
    assert (
        "    worker 0 GPU 0: trainer rank 0 (Ray share 0.5); rollout engine 0 (Ray share 0.2, vLLM memory 0.30); "
        "teacher teacher (Ray share 0.2, vLLM memory 0.40) = 0.9 of the GPU" in out
    )
    assert (
        "    worker 0 GPU 1: trainer rank 1 (Ray share 0.5); rollout engine 1 (Ray share 0.2, vLLM memory 0.30)"
        in out
    )
