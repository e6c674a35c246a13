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
