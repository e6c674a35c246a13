"""The sleep levels the plan decides (distillery/plan/rollout/sleep.py): the rollout engine discards its weights
(level 2, the weight sync after each wake-up reloads them), a colocated vLLM teacher keeps them in host
memory (level 1), nothing sleeps on CPU; the host-memory plan counts only what level 1 keeps, and
`distillery plan` says which level and why."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from distillery_cli.main import main as cli_main

from distillery.model_shapes import known_shape
from distillery.plan import resolve
from distillery.plan.pods.host_memory import plan_host_memory
from distillery.plan.rollout.sleep import SleepLevel, sleep_level, sleep_lines
from distillery.validation import load_jobs, parse_job

REPO = Path(__file__).resolve().parents[2]
COLOCATED = REPO / "examples" / "colocated-teacher.yaml"


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    return doc


def test_the_rule_discards_only_weights_that_are_reloaded_after_wake() -> None:
    assert sleep_level(sleeps=True, weights_synced_after_wake=True) == SleepLevel.DISCARD_WEIGHTS
    assert sleep_level(sleeps=True, weights_synced_after_wake=False) == SleepLevel.OFFLOAD_WEIGHTS
    for synced in (True, False):
        assert sleep_level(sleeps=False, weights_synced_after_wake=synced) == SleepLevel.NONE


def test_on_gpus_the_rollout_engine_sleeps_at_2_and_a_colocated_teacher_at_1() -> None:
    plan = resolve(parse_job(example("colocated-teacher.yaml")).spec)
    assert plan.rollout.sleeps and plan.rollout.sleep_level == SleepLevel.DISCARD_WEIGHTS
    assert plan.engines["teacher"].sleep_level == SleepLevel.OFFLOAD_WEIGHTS


@pytest.mark.parametrize("name", ["standalone-teacher.yaml", "external-teacher.yaml", "shared-teacher.yaml"])
def test_teachers_that_are_not_colocated_never_sleep(name: str) -> None:
    (job,) = load_jobs(REPO / "examples" / name)
    plan = resolve(job.spec)
    assert plan.rollout.sleep_level == SleepLevel.DISCARD_WEIGHTS
    assert {e.sleep_level for e in plan.engines.values()} == {SleepLevel.NONE}


def test_nothing_sleeps_on_cpu_nor_the_transformers_engine() -> None:
    doc = example("colocated-teacher.yaml")
    cpu = copy.deepcopy(doc)
    cpu["spec"]["student"]["pool"] = {"workers": 1, "gpusPerWorker": 0}
    plan = resolve(parse_job(cpu).spec)
    assert plan.rollout.sleep_level == SleepLevel.NONE
    assert plan.engines["teacher"].sleep_level == SleepLevel.NONE
    transformers = copy.deepcopy(doc)
    transformers["spec"]["student"]["rollout"]["engine"] = "transformers"
    transformers["spec"]["teachers"][0]["inference"]["engine"] = "transformers"
    plan = resolve(parse_job(transformers).spec)
    assert plan.rollout.sleep_level == SleepLevel.NONE  # its sleep and wake-up do nothing
    assert plan.engines["teacher"].sleep_level == SleepLevel.NONE


def test_host_memory_holds_the_colocated_teacher_not_the_rollout_engines() -> None:
    spec = parse_job(example("colocated-teacher.yaml")).spec
    host = plan_host_memory(spec)
    teacher = known_shape("Qwen/Qwen2.5-3B-Instruct")
    assert host is not None and teacher is not None
    training = dict(host.parts["training"])
    assert not any("rollout engines asleep" in what for what in training)
    # bf16 (the student's precision, auto, on a GPU): 2 bytes a parameter of the one colocated teacher.
    assert training["colocated teachers asleep (weights in host memory)"] == 2 * teacher.params


def test_plan_says_which_level_and_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plan", str(COLOCATED)]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  sleep ")]
    assert "rollout engine level 2 (weights discarded: the weight sync after each wake-up" in line
    assert "colocated teacher teacher level 1 (weights kept in host memory: nothing reloads them)" in line
    doc = example("local-addition.yaml")
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(doc))
    cli_main(["plan", str(path)])
    assert "  sleep: none (no vLLM engine on the student's GPUs" in capsys.readouterr().out


def test_with_one_step_off_the_line_says_they_sleep_after_the_last_rollout_only() -> None:
    (line,) = sleep_lines(SleepLevel.DISCARD_WEIGHTS, {}, one_step_off=True)
    assert line.startswith("sleep after the last rollout only (schedule.oneStepOff")
