"""The teacher server's per-job Prometheus metrics (`distillery_teacher_*`), beside vLLM's own `vllm:*`.

They are registered in prometheus-client's default registry, which vLLM's `/metrics` route serves (its
`get_prometheus_registry()`, in the API-server process where the scoring route runs), so one scrape of a
teacher replica gets both. The `client_job` label is the job a request scores for (`X-Distillery-Job`:
`namespace/name`, `unknown` without one); not `job`, which Prometheus sets to the scrape job, nor
`distillery_job`, which the chart's PodMonitor sets on a standalone teacher's series. Its values are bounded:
past `MAX_JOB_LABELS` distinct jobs in a replica's life, further jobs are counted as `other`.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

LABEL = "client_job"
MAX_JOB_LABELS = 256
OTHER_JOBS = "other"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

METRIC_NAMES = (
    "distillery_teacher_scored_tokens_total",
    "distillery_teacher_scored_sequences_total",
    "distillery_teacher_request_duration_seconds",
    "distillery_teacher_queue_wait_seconds",
    "distillery_teacher_busy_seconds_total",
    "distillery_teacher_gpus",
    "distillery_teacher_waiting_sequences",
)
WAITING_SEQUENCES = METRIC_NAMES[-1]


class TeacherServerMetrics:
    """What one teacher replica did for each job."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY, gpus: int = 0) -> None:
        """`gpus`: the accelerators one replica runs on (0 on CPU)."""
        self.scored_tokens = Counter(
            "distillery_teacher_scored_tokens",
            "Tokens the teacher ran for the job: prompt + response of every sequence scored.",
            [LABEL],
            registry=registry,
        )
        self.scored_sequences = Counter(
            "distillery_teacher_scored_sequences",
            "Sequences (a prompt and one sampled response each) the teacher scored for the job.",
            [LABEL],
            registry=registry,
        )
        self.request_duration = Histogram(
            "distillery_teacher_request_duration_seconds",
            "Time of one compact scoring request, from arrival to answer (queue wait included).",
            [LABEL],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "distillery_teacher_queue_wait_seconds",
            "Time a scoring request waited for its job's fair share of the engine.",
            [LABEL],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.busy = Counter(
            "distillery_teacher_busy_seconds",
            "Busy time of the replica attributed to the job (each interval split by tokens in flight).",
            [LABEL],
            registry=registry,
        )
        self.gpus = Gauge(
            "distillery_teacher_gpus", "Accelerators of one replica (0 on CPU).", registry=registry
        )
        self.gpus.set(gpus)
        self.waiting = Gauge(
            WAITING_SEQUENCES,
            "Sequences waiting for their job's share of the engine, over all jobs (the operator scales a "
            "shared teacher on it with vLLM's own vllm:num_requests_waiting).",
            registry=registry,
        )
        self._labels: set[str] = set()

    def label(self, job: str) -> str:
        """The `client_job` value of a job: itself, or `other` once the label set is full."""
        if job in self._labels:
            return job
        if len(self._labels) >= MAX_JOB_LABELS:
            return OTHER_JOBS
        self._labels.add(job)
        return job

    def waited(self, job: str, seconds: float) -> None:
        self.queue_wait.labels(self.label(job)).observe(seconds)

    def answered(self, job: str, tokens: int, seconds: float, sequences: int = 1) -> None:
        label = self.label(job)
        self.scored_tokens.labels(label).inc(tokens)
        self.scored_sequences.labels(label).inc(sequences)
        self.request_duration.labels(label).observe(seconds)

    def attribute(self, parts: dict[str, float]) -> None:
        for job, seconds in parts.items():
            self.busy.labels(self.label(job)).inc(seconds)
