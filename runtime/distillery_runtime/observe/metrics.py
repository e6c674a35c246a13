"""The runtime's Prometheus metrics and its JSONL metrics file.

Names are prefixed `distillery_runtime_`, carry their unit, counters end in `_total`; labels are bounded
(teacher names from the spec, a fixed set of phases). `METRIC_NAMES` lists every family: the chart's
dashboards and alerts are written against it (docs/metrics.md). In a cluster the trainer serves them on
`RuntimeConfig.metrics_port`; locally the same values go to `metrics.jsonl` in the output directory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PREFIX = "distillery_runtime_"
PHASES = ("rollout", "teacher", "train", "sync")
"""Breakdown of a step: student sampling, teacher scoring not hidden by rollout, the optimizer step,
and the weight sync to the rollout engine."""

_STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

METRIC_NAMES = (
    "distillery_runtime_step",
    "distillery_runtime_total_steps",
    "distillery_runtime_steps_total",
    "distillery_runtime_step_duration_seconds",
    "distillery_runtime_step_phase_duration_seconds",
    "distillery_runtime_tokens_per_second",
    "distillery_runtime_generated_tokens_total",
    "distillery_runtime_loss",
    "distillery_runtime_kl",
    "distillery_runtime_grad_norm",
    "distillery_runtime_learning_rate",
    "distillery_runtime_policy_staleness_steps",
    "distillery_runtime_teacher_request_duration_seconds",
    "distillery_runtime_teacher_retries_total",
    "distillery_runtime_teacher_samples_total",
    "distillery_runtime_teacher_unavailable",
    "distillery_runtime_checkpoint_duration_seconds",
    "distillery_runtime_checkpoint_step",
    "distillery_runtime_eval_accuracy_ratio",
    "distillery_runtime_prompts_truncated_total",
    "distillery_runtime_prompts_dropped_total",
    "distillery_runtime_teacher_topk_out_of_vocab_total",
    "distillery_runtime_response_length_tokens",
    "distillery_runtime_response_truncated_ratio",
    "distillery_runtime_student_entropy",
    "distillery_runtime_logprob_gap",
    "distillery_runtime_eval_kl",
    "distillery_runtime_eval_response_length_tokens",
    "distillery_runtime_episode_turns",
    "distillery_runtime_episode_tool_errors_total",
    "distillery_runtime_episode_environment_failures_total",
)
STATS = ("mean", "max")
"""Values of the `stat` label: a step's mean and its largest."""


class RuntimeMetrics:
    """Every metric family of the runtime, in one registry (a fresh one per run, so tests can make many)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        # One group at a time, in this order: a registry lists its families in the order they were made.
        self._step_families(r)
        self._teacher_families(r)
        self._run_families(r)
        self._response_families(r)
        self._retries_seen: dict[str, int] = {}

    def _step_families(self, r: CollectorRegistry) -> None:
        """The step: its progress, durations, throughput and training values."""
        self.step = Gauge(PREFIX + "step", "Last completed training step.", registry=r)
        self.total_steps = Gauge(PREFIX + "total_steps", "Steps the job will run.", registry=r)
        self.steps = Counter(PREFIX + "steps", "Training steps completed by this process.", registry=r)
        self.step_seconds = Histogram(
            PREFIX + "step_duration_seconds",
            "Wall time of a training step.",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.phase_seconds = Histogram(
            PREFIX + "step_phase_duration_seconds",
            "Wall time of each phase of a step (rollout, teacher, train, sync).",
            ["phase"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.tokens_per_second = Gauge(
            PREFIX + "tokens_per_second", "Response tokens trained per second of step time.", registry=r
        )
        self.generated_tokens = Counter(
            PREFIX + "generated_tokens", "Response tokens sampled by the student.", registry=r
        )
        self.loss = Gauge(PREFIX + "loss", "Distillation loss of the last step.", registry=r)
        self.kl = Gauge(
            PREFIX + "kl",
            "k3 estimate of KL(student || teacher) on the student's samples, per teacher (nats/token).",
            ["teacher"],
            registry=r,
        )
        self.grad_norm = Gauge(PREFIX + "grad_norm", "Global gradient norm before clipping.", registry=r)
        self.lr = Gauge(PREFIX + "learning_rate", "Learning rate of the last step.", registry=r)
        self.staleness = Gauge(
            PREFIX + "policy_staleness_steps",
            "Optimizer steps between the weights that sampled a step's data and the weights it trains.",
            registry=r,
        )

    def _teacher_families(self, r: CollectorRegistry) -> None:
        """The teachers' scoring: latency, retries, samples, outages."""
        self.teacher_seconds = Histogram(
            PREFIX + "teacher_request_duration_seconds",
            "Latency of one sample's scoring request, per teacher (retries included).",
            ["teacher"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.teacher_retries = Counter(
            PREFIX + "teacher_retries", "Scoring requests retried, per teacher.", ["teacher"], registry=r
        )
        self.teacher_samples = Counter(
            PREFIX + "teacher_samples", "Samples scored, per teacher.", ["teacher"], registry=r
        )
        self.teacher_unavailable = Gauge(
            PREFIX + "teacher_unavailable",
            "1 while the trainer waits for this teacher (unreachable past its retries), else 0.",
            ["teacher"],
            registry=r,
        )

    def _run_families(self, r: CollectorRegistry) -> None:
        """Checkpoints, held-out accuracy, and the prompts and top-k entries the data lost."""
        self.checkpoint_seconds = Histogram(
            PREFIX + "checkpoint_duration_seconds",
            "Time to write a checkpoint.",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.checkpoint_step = Gauge(PREFIX + "checkpoint_step", "Step of the newest checkpoint.", registry=r)
        self.eval_accuracy = Gauge(
            PREFIX + "eval_accuracy_ratio", "Held-out accuracy by data.grader (0-1).", registry=r
        )
        self.truncated = Counter(
            PREFIX + "prompts_truncated", "Prompts cut to data.maxPromptTokens.", registry=r
        )
        self.dropped = Counter(
            PREFIX + "prompts_dropped",
            "Prompts longer than data.maxPromptTokens left out (overlongPrompts: drop).",
            registry=r,
        )
        self.topk_out_of_vocab = Counter(
            PREFIX + "teacher_topk_out_of_vocab",
            "Teacher top-k entries at ids beyond the student's vocabulary, folded into the loss's tail.",
            registry=r,
        )

    def _response_families(self, r: CollectorRegistry) -> None:
        """What the student writes: its responses' lengths, truncation, entropy, log-prob gap, and on eval."""
        self.response_length = Gauge(
            PREFIX + "response_length_tokens",
            "Length of the step's responses in tokens (stat: mean, max).",
            ["stat"],
            registry=r,
        )
        self.truncated_responses = Gauge(
            PREFIX + "response_truncated_ratio",
            "Fraction of the step's sampled responses cut at student.rollout.maxNewTokens (finish reason length).",
            registry=r,
        )
        self.entropy = Gauge(
            PREFIX + "student_entropy",
            "Mean per-token entropy of the student's distribution on its responses (nats/token).",
            registry=r,
        )
        self.logprob_gap = Gauge(
            PREFIX + "logprob_gap",
            "|rollout engine - trainer| log-prob of the same sampled tokens (stat: mean, max); ~0 when in sync.",
            ["stat"],
            registry=r,
        )
        self.eval_kl = Gauge(
            PREFIX + "eval_kl",
            "Per-token KL(student || teacher) of the student's greedy eval responses, per teacher (nats/token).",
            ["teacher"],
            registry=r,
        )
        self.episode_turns = Gauge(
            PREFIX + "episode_turns",
            "Mean turns the student took in the step's episodes (spec.environment).",
            registry=r,
        )
        self.episode_tool_errors = Counter(
            PREFIX + "episode_tool_errors",
            "Tool calls the environment answered as a misuse (a malformed call), in training episodes.",
            registry=r,
        )
        self.episode_environment_failures = Counter(
            PREFIX + "episode_environment_failures",
            "Environment calls that raised, timed out or answered wrongly (each ended its episode).",
            registry=r,
        )
        self.eval_response_length = Gauge(
            PREFIX + "eval_response_length_tokens",
            "Mean length of the student's eval responses in tokens.",
            registry=r,
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Expose /metrics on `port` (a daemon thread); returns the server."""
        return start_http_server(port, addr=addr, registry=self.registry)

    def record_step(self, record: dict[str, Any], teacher_seconds: dict[str, list[float]]) -> None:
        self.step.set(record["step"])
        self.steps.inc()
        self.step_seconds.observe(record["time/step_s"])
        for phase in PHASES:
            self.phase_seconds.labels(phase).observe(record.get(f"time/{phase}_s", 0.0))
        self.tokens_per_second.set(record["tokens_per_s"])
        self.generated_tokens.inc(record.get("generated_tokens", 0))
        self.topk_out_of_vocab.inc(record.get("metrics", {}).get("distill/teacher_topk_out_of_vocab", 0))
        _set(self.loss, record.get("loss"))
        _set(self.grad_norm, record.get("grad_norm"))
        _set(self.lr, record.get("lr"))
        self.staleness.set(record.get("staleness", 0))
        for name, value in record.get("kl_per_teacher", {}).items():
            _set(self.kl.labels(name), value)
        for stat in STATS:
            _set(self.response_length.labels(stat), record.get(f"rollout/response_length_{stat}"))
            _set(self.logprob_gap.labels(stat), record.get(f"logprob_gap_{stat}"))
        _set(self.truncated_responses, record.get("rollout/truncated_fraction"))
        _set(self.entropy, record.get("entropy"))
        _set(self.episode_turns, record.get("episode/turns_mean"))
        self.episode_tool_errors.inc(record.get("episode/tool_errors", 0))
        self.episode_environment_failures.inc(record.get("episode/environment_failures", 0))
        for name, latencies in teacher_seconds.items():
            for seconds in latencies:
                self.teacher_seconds.labels(name).observe(seconds)
            self.teacher_samples.labels(name).inc(len(latencies))

    def record_eval(self, entry: dict[str, Any]) -> None:
        """An eval's distillation-native signals: the teacher-student KL and the response length."""
        for name, value in entry.get("kl_per_teacher", {}).items():
            _set(self.eval_kl.labels(name), value)
        _set(self.eval_response_length, entry.get("response_length_mean"))

    def teacher_down(self, teacher: str, down: bool) -> None:
        """Set at once when a teacher goes down or comes back (not at step end: no step ends meanwhile)."""
        self.teacher_unavailable.labels(teacher).set(1 if down else 0)

    def record_retries(self, totals: dict[str, int]) -> None:
        for name, total in totals.items():
            delta = total - self._retries_seen.get(name, 0)
            if delta > 0:
                self.teacher_retries.labels(name).inc(delta)
            self._retries_seen[name] = total


def _set(gauge: Gauge, value: float | None) -> None:
    if value is not None and math.isfinite(value):
        gauge.set(value)


class JsonlWriter:
    """Appends one JSON object per line, flushed at once (a killed run keeps every completed step)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: list[dict[str, Any]]) -> None:
        """Append records in one write."""
        lines = b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for r in records)
        with open(self.path, "ab") as handle:
            handle.write(lines)

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (a resumed run redoes them)."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_bytes().splitlines() if line.strip() and _step(line) <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(b"".join(line + b"\n" for line in kept))
        tmp.replace(self.path)


def _step(line: bytes) -> int:
    try:
        return int(orjson.loads(line).get("step", 0))
    except orjson.JSONDecodeError:  # a line torn by a kill: drop it
        return 1 << 62


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return out
