"""Prometheus metrics of the runtime: every listed family is exposed, with the step's values."""

from __future__ import annotations

import urllib.request

from distillery_runtime.observe.metrics import METRIC_NAMES, JsonlWriter, RuntimeMetrics, read_jsonl
from distillery_runtime.run.workers import free_port


def test_every_metric_is_served_with_the_recorded_values():
    metrics = RuntimeMetrics()
    port = free_port()
    server = metrics.serve(port, addr="127.0.0.1")
    record = {
        "step": 7, "time/step_s": 1.5, "time/rollout_s": 0.5, "time/teacher_s": 0.25, "time/train_s": 0.5,
        "time/sync_s": 0.25, "tokens_per_s": 321.0, "generated_tokens": 480, "loss": 0.125, "grad_norm": 2.0,
        "lr": 1e-4, "staleness": 1, "kl_per_teacher": {"math": 0.5, "code": 0.25},
        "rollout/response_length_mean": 12.5, "rollout/response_length_max": 40.0,
        "rollout/truncated_fraction": 0.25, "entropy": 1.5, "logprob_gap_mean": 0.001, "logprob_gap_max": 0.03,
    }  # fmt: skip
    metrics.record_step(record, {"math": [0.01, 0.02], "code": [0.03]})
    metrics.record_eval({"kl_per_teacher": {"math": 0.75}, "response_length_mean": 9.0})
    metrics.record_retries({"math": 2})
    metrics.record_retries({"math": 5})
    metrics.checkpoint_seconds.observe(0.5)
    metrics.eval_accuracy.set(0.5)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server[0].shutdown() if isinstance(server, tuple) else None
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in text, name
    assert "distillery_runtime_step 7.0" in text
    assert 'distillery_runtime_kl{teacher="math"} 0.5' in text
    assert 'distillery_runtime_teacher_samples_total{teacher="math"} 2.0' in text
    assert 'distillery_runtime_teacher_retries_total{teacher="math"} 5.0' in text
    assert 'distillery_runtime_step_phase_duration_seconds_count{phase="teacher"} 1.0' in text
    assert "distillery_runtime_generated_tokens_total 480.0" in text
    assert 'distillery_runtime_response_length_tokens{stat="max"} 40.0' in text
    assert "distillery_runtime_response_truncated_ratio 0.25" in text
    assert "distillery_runtime_student_entropy 1.5" in text
    assert 'distillery_runtime_logprob_gap{stat="max"} 0.03' in text
    assert 'distillery_runtime_eval_kl{teacher="math"} 0.75' in text
    assert "distillery_runtime_eval_response_length_tokens 9.0" in text


def test_jsonl_truncation_drops_later_and_torn_lines(tmp_path):
    writer = JsonlWriter(tmp_path / "m.jsonl")
    for step in range(1, 6):
        writer.write({"step": step, "loss": step / 10})
    with open(writer.path, "ab") as handle:
        handle.write(b'{"step": 6, "lo')  # a line torn by SIGKILL
    writer.truncate_after(3)
    assert [r["step"] for r in read_jsonl(writer.path)] == [1, 2, 3]
