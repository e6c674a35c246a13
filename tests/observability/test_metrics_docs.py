"""docs/metrics.md lists every metric the operator, the runtime and the teacher server define, with their type and labels, and
the metrics follow Prometheus conventions: the package prefix, units in names, `_total` counters, labels
from a small documented set. Every metric is shown on a dashboard or used by an alert.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from chart.helm_chart import CHART
from distillery_operator import metrics as operator_metrics
from distillery_runtime.observe.metrics import METRIC_NAMES as RUNTIME_NAMES
from distillery_runtime.observe.metrics import RuntimeMetrics
from distillery_runtime.teachers.serving.server_metrics import METRIC_NAMES as TEACHER_NAMES
from distillery_runtime.teachers.serving.server_metrics import TeacherServerMetrics
from observability.stack import rendered_rule_groups
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
TYPES = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}
UNITLESS_GAUGES = {
    # Plain counts and dimensionless values: Prometheus' conventions want no unit suffix on these.
    "distillery_operator_jobs",
    "distillery_operator_workqueue_depth",
    "distillery_runtime_step",
    "distillery_runtime_teacher_unavailable",  # a 0/1 state, like `up`
    "distillery_teacher_waiting_sequences",
    "distillery_runtime_total_steps",
    "distillery_runtime_episode_turns",
    "distillery_runtime_loss",
    "distillery_runtime_kl",
    "distillery_runtime_grad_norm",
    "distillery_runtime_learning_rate",
    "distillery_runtime_checkpoint_step",
    "distillery_runtime_tokens_per_second",
    "distillery_runtime_student_entropy",  # nats per token, like the KL
    "distillery_runtime_logprob_gap",
    "distillery_runtime_eval_kl",
    "distillery_teacher_gpus",
}
UNITS = ("_seconds", "_ratio", "_steps", "_bytes", "_tokens")

Row = tuple[str, str, tuple[str, ...]]


def exported(metric: MetricWrapperBase) -> Row:
    """(exposed name, type, label names) of a prometheus_client metric."""
    kind = TYPES[type(metric)]
    name = metric._name + ("_total" if kind == "counter" else "")  # the client appends _total on exposition
    return name, kind, tuple(metric._labelnames)


def operator_rows() -> set[Row]:
    return {exported(m) for m in vars(operator_metrics).values() if isinstance(m, MetricWrapperBase)}


def runtime_rows() -> set[Row]:
    runtime = RuntimeMetrics()
    return {exported(m) for m in vars(runtime).values() if isinstance(m, MetricWrapperBase)}


def teacher_rows() -> set[Row]:
    # Its own registry: the server registers in the default one, which vLLM's /metrics serves.
    teacher = TeacherServerMetrics(CollectorRegistry())
    return {exported(m) for m in vars(teacher).values() if isinstance(m, MetricWrapperBase)}


def all_rows() -> set[Row]:
    return operator_rows() | runtime_rows() | teacher_rows()


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def documented_rows() -> set[Row]:
    rows: set[Row] = set()
    for table in DOC.read_text().split("<!-- metrics-table")[1:]:
        for line in table.split("\n\n", 1)[0].splitlines():
            cells = _cells(line)
            if len(cells) == 4 and cells[0].startswith("`"):
                labels = tuple(c.strip("` ") for c in cells[2].split(",")) if cells[2] != "-" else ()
                rows.add((cells[0].strip("`"), cells[1], labels))
    return rows


def documented_labels() -> set[str]:
    table = DOC.read_text().split("<!-- labels-table", 1)[1].split("\n\n", 1)[0]
    return {_cells(line)[0].strip("`") for line in table.splitlines() if line.startswith("| `")}


def test_docs_list_every_metric_with_type_and_labels() -> None:
    code = all_rows()
    assert len(code) >= 25
    documented = documented_rows()
    assert sorted(code - documented) == [], "metrics missing from docs/metrics.md (or with other labels/type)"
    assert sorted(documented - code) == [], "docs/metrics.md lists metrics the code does not define"


def test_declared_name_lists_match_the_metrics() -> None:
    # The modules publish METRIC_NAMES for the dashboards and alerts; they must be the real names.
    assert set(operator_metrics.METRIC_NAMES) == {name for name, _, _ in operator_rows()}
    assert set(RUNTIME_NAMES) == {name for name, _, _ in runtime_rows()}
    assert set(TEACHER_NAMES) == {name for name, _, _ in teacher_rows()}


@pytest.mark.parametrize("row", sorted(all_rows()), ids=lambda r: r[0])
def test_prometheus_naming_conventions(row: Row) -> None:
    name, kind, labels = row
    assert re.fullmatch(r"distillery_(operator|runtime|teacher)_[a-z][a-z0-9_]*[a-z0-9]", name)
    if kind == "counter":
        assert name.endswith("_total")
    else:
        assert not name.endswith(("_total", "_count", "_sum", "_bucket"))
    if kind == "histogram":
        assert name.endswith("_seconds"), "histograms here are durations"
    elif kind == "gauge" and name not in UNITLESS_GAUGES:
        assert name.endswith(UNITS), (
            f"{name}: a unit suffix ({', '.join(UNITS)}) or an entry in UNITLESS_GAUGES"
        )
    assert "le" not in labels and "quantile" not in labels
    assert set(labels) <= documented_labels(), "every label is in the docs' bounded label table"


def test_every_metric_is_on_a_dashboard_or_in_an_alert() -> None:
    texts = [p.read_text() for p in (CHART / "dashboards").glob("*.json")]
    texts.append(json.dumps(rendered_rule_groups({"prometheusRule": {"enabled": True}})))
    used = "\n".join(texts)
    unused = [n for n, _, _ in all_rows() if not re.search(rf"\b{n}(_bucket|_sum|_count)?\b", used)]
    assert unused == []
