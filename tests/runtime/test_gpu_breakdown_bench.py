"""bench/gpu_breakdown.py's Distillery part runs here too (CPU, tiny models, real vLLM engine), so the GPU
benchmark cannot rot between the sessions that have a GPU: its in-process step is the real trainer, the
real vLLM rollout engine and the real weight sync."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_distillery_part_times_every_phase_with_the_vllm_engine(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import e2e_vs_trl
        import gpu_breakdown
    finally:
        sys.path.remove(str(ROOT / "bench"))
    setting = e2e_vs_trl.speed_setting(tmp_path, 3, "tiny", "bfloat16", device="cpu")
    setting = type(setting)(**{**setting.__dict__, "prompts_per_step": 4, "max_new_tokens": 8})
    row = gpu_breakdown.distillery_part(setting, steps=3)
    assert row["vllm"] is True and row["sync_exact"] is True
    for phase in ("hf_generate", "vllm_rollout", "score", "train", "sync"):
        assert row[f"{phase}_median_s"] > 0, phase
    assert row["step_s"] == pytest.approx(row["score_train_sync_s"] + row["vllm_rollout_median_s"])


def test_e2e_bench_on_cuda_puts_the_student_and_its_teacher_on_gpus(tmp_path: Path) -> None:
    from distillery_runtime.run.local_gpus import plan_local_gpus

    from distillery.validation import parse_job

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import e2e_vs_trl
    finally:
        sys.path.remove(str(ROOT / "bench"))
    setting = e2e_vs_trl.Setting("speed-x", "/s", "/t", "/train.jsonl", None, 3, device="cuda")
    spec = parse_job(e2e_vs_trl.distillery_manifest(setting)).spec
    assert spec.student.pool.gpus_per_worker == 1 and spec.student.rollout.enforce_eager is False
    one_gpu, two_gpus = plan_local_gpus(spec, ["0"]), plan_local_gpus(spec, ["0", "1"])
    assert one_gpu.student == ["0"] and one_gpu.teachers["teacher"].shared
    assert two_gpus.teachers["teacher"].devices == ["1"] and not two_gpus.teachers["teacher"].shared
    cpu = e2e_vs_trl.Setting("speed-x", "/s", "/t", "/train.jsonl", None, 3)
    assert parse_job(e2e_vs_trl.distillery_manifest(cpu)).spec.student.pool.gpus_per_worker == 0


def test_e2e_bench_takes_a_distillery_step_apart_and_the_parts_add_up() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import e2e_vs_trl
    finally:
        sys.path.remove(str(ROOT / "bench"))
    record = {
        "time/step_s": 0.30, "time/rollout_s": 0.10, "time/teacher_s": 0.08, "time/sync_s": 0.02,
        "metrics": {"train/forward_backward_s": 0.05, "train/optimizer_s": 0.01},
    }  # fmt: skip
    parts = e2e_vs_trl.distillery_phases(record)
    assert parts["rest"] == pytest.approx(0.04) and sum(parts.values()) == pytest.approx(0.30)
    runs = [{"phases": [(1, {"rollout": 9.0}), (2, {"rollout": 0.1}), (3, {"rollout": 0.3})]}]
    assert e2e_vs_trl.phase_medians(runs) == {"rollout": pytest.approx(0.2)}  # step 1 (warm-up) left out


def test_e2e_bench_counts_the_tokens_hf_generate_sampled_up_to_each_rows_end() -> None:
    """TRL's tokens a step, beside Distillery's: the rows of HF generate's sequences, each counted up to and
    including its first end token (generate pads the rest), the prompt never."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import e2e_vs_trl
    finally:
        sys.path.remove(str(ROOT / "bench"))
    sequences = torch.tensor([[5, 6, 7, 2, 0, 0], [5, 6, 8, 9, 9, 9], [5, 6, 2, 0, 0, 0]])
    prompt = sequences[:, :2]
    assert e2e_vs_trl.sampled_tokens(sequences, prompt, 2) == 2 + 4 + 1
    assert e2e_vs_trl.sampled_tokens(sequences, prompt, [2, 8]) == 2 + 1 + 1
    assert e2e_vs_trl.sampled_tokens(sequences, None, [4]) == 3 * 6  # no prompt given, no end reached


def test_e2e_bench_gives_each_repeats_own_speed_up_for_the_repeats_both_systems_finished() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import e2e_vs_trl
    finally:
        sys.path.remove(str(ROOT / "bench"))

    def run(repeat: int, *seconds: float) -> dict:
        # step 1 is warm-up: left out of every median
        return {"repeat": repeat, "steps": [(1, 9.0, 0), *((i + 2, s, 0) for i, s in enumerate(seconds))]}

    ours = [run(0, 1.0, 1.0, 1.2), run(1, 2.0, 2.0), run(2, 1.0)]
    theirs = [run(0, 1.5, 1.5), run(1, 2.0, 3.0)]  # repeat 2 of theirs failed: no pair
    assert e2e_vs_trl.repeat_speedups(ours, theirs) == pytest.approx([1.5, 1.25])
    assert e2e_vs_trl.repeat_speedups(ours[1:], theirs[:1]) == []
