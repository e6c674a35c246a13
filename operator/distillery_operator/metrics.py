"""The operator's Prometheus metrics. Dashboards and alert rules are written against `METRIC_NAMES`.

Names carry units and counters end in `_total` (prometheus-client adds the suffix to Counter names).
They live in the operator's own registry, with the client's process, platform and GC collectors: what
/metrics serves is exactly this, whatever else the process has imported and registered globally.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

REGISTRY = CollectorRegistry(auto_describe=True)
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

PREFIX = "distillery_operator_"

RECONCILES = Counter(
    PREFIX + "reconciles",
    "Reconciles of DistillationJobs, by the kind of object whose change triggered them and the result "
    "(unchanged, changed, invalid, waiting (for a claim), error, deleted).",
    ["kind", "result"],
    registry=REGISTRY,
)
RECONCILE_DURATION = Histogram(
    PREFIX + "reconcile_duration_seconds",
    "Time of one reconcile, API writes included.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
JOBS = Gauge(
    PREFIX + "jobs", "DistillationJobs known to the operator, by phase.", ["phase"], registry=REGISTRY
)
API_ERRORS = Counter(
    PREFIX + "api_errors",
    "Failed Kubernetes API calls, by HTTP status code (0: unreachable).",
    ["code"],
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    PREFIX + "api_requests",
    "Kubernetes API requests made by the operator (its writes, and the reads of the claims a job names), "
    "by verb, kind and result code.",
    ["verb", "kind", "code"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(PREFIX + "workqueue_depth", "Jobs waiting for a reconcile.", registry=REGISTRY)
RETRIES = Counter(
    PREFIX + "workqueue_retries", "Reconciles requeued with backoff after an error.", registry=REGISTRY
)
TEACHER_PROBES = Counter(
    PREFIX + "teacher_probes",
    "Health checks of external teachers, by result (ok, failed).",
    ["result"],
    registry=REGISTRY,
)

METRIC_NAMES: list[str] = [
    PREFIX + "reconciles_total",
    PREFIX + "reconcile_duration_seconds",
    PREFIX + "jobs",
    PREFIX + "api_errors_total",
    PREFIX + "api_requests_total",
    PREFIX + "workqueue_depth",
    PREFIX + "workqueue_retries_total",
    PREFIX + "teacher_probes_total",
]
"""The exposed metric names (histograms add _bucket, _sum and _count)."""
