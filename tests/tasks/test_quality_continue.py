"""bench/quality.py's continuation protocol, its pure parts: each on-policy method's job is the example with
its loss, budget and seed (a mix reads the rows' traces for its off-policy steps), and the summary's mean,
spread and per-step mean curve. The runs themselves are the benchmark's (minutes each)."""

from __future__ import annotations

import pytest
import yaml
from support.bench_modules import bench_module

from distillery.api.spec import DistillationJobSpec


@pytest.fixture(scope="module")
def quality():
    return bench_module("quality")


def test_every_method_runs_the_example_with_its_loss_budget_and_seed(quality):
    example = quality.example_path("worked-sum")
    for method, loss in quality.CONTINUE.items():
        doc = quality.job_manifest(example, loss, steps=40, eval_every=20, name="continue-x", seed=2)
        spec = DistillationJobSpec.model_validate(doc["spec"])  # a job the API accepts, as run
        assert (spec.schedule.steps, spec.schedule.eval_every, spec.schedule.seed) == (40, 20, 2), method
        assert spec.student.model == "synthetic://worked-sum/student"  # the SFT checkpoint, every method
        assert spec.student.optimizer.min_lr_ratio == 1.0  # from the start: constant after warm-up
        # The continuation runs the example's own schedule, the one its README line quotes.
        kept = quality.job_manifest(example, loss, steps=40, eval_every=20, name="c", min_lr_ratio=None)
        example_optimizer = yaml.safe_load(example.read_text())["spec"]["student"]["optimizer"]
        assert kept["spec"]["student"]["optimizer"] == example_optimizer
        assert spec.loss.on_policy_fraction == loss.get("onPolicyFraction", 1.0)


def test_a_mix_reads_the_rows_traces_for_its_off_policy_steps(quality):
    example = quality.example_path("fibonacci")  # an example that names no responseField
    mixed, on_policy = (
        DistillationJobSpec.model_validate(
            quality.job_manifest(example, loss, steps=10, eval_every=5, name="x")["spec"]
        )
        for loss in (quality.CONTINUE["mix-0.5-reverse-kl-topk"], quality.CONTINUE["opd-k3"])
    )
    assert mixed.data.response_field == "response" and on_policy.data.response_field is None


def test_the_summary_is_the_mean_and_spread_over_seeds(quality):
    result = quality.spread([0.5, 0.7, 0.6])
    assert result["mean"] == pytest.approx(0.6) and result["std"] == pytest.approx(0.1)
    assert (result["min"], result["max"], result["per_seed"]) == (0.5, 0.7, [0.5, 0.7, 0.6])
    assert quality.spread([0.3])["std"] == 0.0
    curves = [
        quality.Curve("a", points=[(0, 0.0, 0.0), (25, 0.4, 1.0)]),
        quality.Curve("a", points=[(0, 0.2, 0.0)]),  # a seed that evaluated step 0 only
    ]
    assert quality.mean_curve(curves) == ([0, 25], [pytest.approx(0.1), pytest.approx(0.4)])


def test_the_tools_task_runs_its_on_policy_methods_with_its_environment_and_no_mix(quality):
    methods = quality.continue_methods("tools")
    assert methods and all(quality.CONTINUE[m].get("onPolicyFraction", 1.0) == 1.0 for m in methods)
    assert set(quality.continue_methods("worked-sum")) == set(quality.CONTINUE)
    for method in methods:
        loss = quality.CONTINUE[method]
        doc = quality.job_manifest(
            quality.example_path("tools"), loss, steps=80, eval_every=20, name="c", seed=1
        )
        spec = DistillationJobSpec.model_validate(doc["spec"])
        assert spec.environment is not None and spec.environment.module.endswith("tools:Calculator")
        assert spec.student.model == "synthetic://tools/student"


def test_the_sft_arm_trains_the_teachers_turns_and_not_the_tools_answers(quality):
    from distillery_runtime.tasks.measure.episodes import Episode

    played = Episode("1234*5678=", turns=["[1234*567]", "[1234*5678]", "7006652"],
                     observations=[">E;", ">7006652;", ""], errors=1, done=True)  # fmt: skip
    [(prompt, segments)] = quality.episode_pairs([{"prompt": "1234*5678="}], [played])
    assert prompt == "1234*5678="
    assert segments == [
        ("[1234*567]", True),
        (">E;", False),
        ("[1234*5678]", True),
        (">7006652;", False),
        ("7006652", True),
    ]


def test_turns_and_tool_errors_are_averaged_over_seeds_per_step(quality):
    def record(step: int, turns: float, errors: int) -> dict:
        return {"step": step, "episode/turns_mean": turns, "episode/tool_errors": errors}

    runs = {
        "opd-k3": [[record(1, 2.0, 4), record(2, 3.0, 0)], [record(1, 4.0, 2), record(2, 1.0, 2)]],
        "opd-none": [[{"step": 1}]],  # no episodes: left out
    }
    summary = quality.episode_summary(runs)
    assert summary == {"opd-k3": {"steps": [1, 2], "turns_mean": [3.0, 2.0], "tool_errors": [3.0, 1.0]}}


def test_a_method_is_summarised_over_every_seed_and_kernel_path(quality):
    def child(finals: list[float], teacher: float = 1.0, plateau: float = 0.0) -> dict:
        curves = [[[0, 0.0, 0.0], [400, final, 9.0]] for final in finals]
        result = {"per_seed": finals, "curves": curves, "wall_seconds": [9.0] * len(finals)}
        return {"seeds": [0, 1, 2][: len(finals)], "teacher": teacher, "sft_plateau": plateau,
                "methods": {"opd-forward-kl-topk": result}}  # fmt: skip

    merged = quality.merged_methods({"default": child([0.9, 1.0, 0.8]), "avx2": child([0.2, 0.3, 0.4], 0.5)})
    summary = merged["opd-forward-kl-topk"]
    # The spread is over all six runs, not one path's: a path that stays low pulls the minimum down.
    assert (summary["min"], summary["max"]) == (0.2, 1.0) and summary["mean"] == pytest.approx(0.6)
    assert summary["kernels"] == ["default", "avx2"] and summary["seeds"] == [0, 1, 2]
    assert summary["by_kernels"]["avx2"]["max"] == 0.4 and summary["by_kernels"]["default"]["min"] == 0.8
    # Each path's gap is its own teacher's: avx2 closed (0.2 + 0.3 + 0.4) / 3 / 0.5 of it.
    assert summary["gap_closed"] == pytest.approx((0.9 + 0.6) / 2)
    assert [(r["seed"], r["kernels"]) for r in summary["runs"]][:4] == [
        (0, "default"),
        (1, "default"),
        (2, "default"),
        (0, "avx2"),
    ]


def test_a_kernel_path_runs_with_its_own_capability_and_task_cache(quality, tmp_path, monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")  # this shell's own choice must not leak to a child
    default, avx2 = quality.kernel_env("default", tmp_path), quality.kernel_env("avx2", tmp_path)
    assert "ATEN_CPU_CAPABILITY" not in default and default["DISTILLERY_CACHE"] == str(tmp_path)
    assert avx2["ATEN_CPU_CAPABILITY"] == "avx2" and avx2["DISTILLERY_CACHE"] == str(
        tmp_path / "kernels-avx2"
    )
