"""A real Prometheus scrapes the operator's, the trainers' and a real vLLM teacher's /metrics; both expositions pass `promtool check
metrics`; the chart's alert rules pass `promtool check rules`; every PromQL expression of the dashboards and
of the alert rules returns series; each alert fires for the job it is about and not for the healthy one.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart.helm_chart import CHART
from observability.prometheus_server import promtool
from observability.stack import TEACHER_JOB, Stack, running_stack

pytestmark = pytest.mark.slow

# What Grafana sends for the dashboards' variables with "All" selected, and a rate window that holds
# several of the test's 1 s scrapes.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$job": ".*", "$instance": ".*"}
ALERTS = {
    "DistilleryJobFailed",
    "DistilleryJobStalled",
    "DistilleryTeacherUnavailable",
    "DistilleryExternalTeacherUnhealthy",
    "DistilleryReconcileErrors",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, vllm_server: Any) -> Iterator[Stack]:
    # vllm_server: the session's real teacher server (tests/conftest.py), whose /metrics a teacher pod serves.
    with running_stack(
        tmp_path_factory.mktemp("prometheus"), urllib.parse.urlsplit(vllm_server.url).netloc
    ) as running:
        yield running


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) of every panel target."""
    out = []
    for path in sorted((CHART / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
    return out


def dashboard_variable_queries() -> list[tuple[str, str]]:
    out = []
    for path in sorted((CHART / "dashboards").glob("*.json")):
        for variable in json.loads(path.read_text())["templating"]["list"]:
            if variable["type"] == "query":
                out.append((path.name, variable["query"]["query"]))
    return out


def substitute(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown dashboard variable in {expr}"
    return expr


def exposition(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_scenario_and_targets(stack: Stack) -> None:
    assert stack.outcome["phases"]["boom"] == "Failed"
    targets = stack.prometheus.targets()
    assert sorted(t["labels"]["job"] for t in targets) == [
        "distillery-operator",
        "distillery-runtime",
        "distillery-runtime",
        TEACHER_JOB,
    ]
    assert all(t["health"] == "up" and not t["lastError"] for t in targets)


@pytest.mark.parametrize("which", ["operator", "demo"])
def test_promtool_check_metrics(stack: Stack, which: str) -> None:
    port = stack.operator_port if which == "operator" else stack.trainers.ports[which]
    text = exposition(port)
    assert "distillery_" in text
    result = promtool("check", "metrics", stdin=text)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


def test_promtool_check_metrics_catches_bad_names() -> None:
    # The linter the test above relies on does reject what our conventions forbid.
    bad = "# HELP jobs_count x\n# TYPE jobs_count counter\njobs_count 1\n"
    assert promtool("check", "metrics", stdin=bad).returncode != 0


@pytest.mark.parametrize("values", ["defaults", "test-windows"])
def test_promtool_check_rules(tmp_path: Path, values: str) -> None:
    from observability.stack import RULE_VALUES, rendered_rule_groups

    groups = rendered_rule_groups(
        {"prometheusRule": {"enabled": True}} if values == "defaults" else RULE_VALUES
    )
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in result.stdout


def test_every_dashboard_expression_returns_series(stack: Stack) -> None:
    queries = dashboard_queries()
    assert len(queries) > 30
    empty = [
        (file, title, expr) for file, title, expr in queries if not stack.prometheus.query(substitute(expr))
    ]
    assert empty == []
    # ... which a wrong name would not: the check can fail.
    assert stack.prometheus.query("distillery_runtime_losss") == []


def test_every_dashboard_variable_has_values(stack: Stack) -> None:
    for file, query in dashboard_variable_queries():
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert match, f"{file}: {query}"
        values = stack.prometheus.label_values(match[2], substitute(match[1]))
        assert values, f"{file}: {query} has no values"


def rule_expressions(stack: Stack) -> list[tuple[str, str]]:
    return [(rule["alert"], rule["expr"]) for group in stack.rule_groups for rule in group["rules"]]


def test_every_alert_expression_returns_series(stack: Stack) -> None:
    rules = rule_expressions(stack)
    assert {name for name, _ in rules} == ALERTS
    empty = [name for name, expr in rules if not stack.prometheus.query(expr)]
    # On failure, show the raw series the empty expressions were computed from.
    raw = {}
    for name, expr in rules:
        if name in empty:
            names = "|".join(re.findall(r"distillery_\w+", expr))
            raw[name] = stack.prometheus.query(f'{{__name__=~"{names}"}}[1m]')
    assert empty == [], raw


def _firing(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    firing: dict[str, list[dict[str, Any]]] = {}
    for alert in stack.prometheus.alerts():
        if alert["state"] == "firing":
            firing.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
    return firing


def test_each_alert_fires_for_what_it_is_about(stack: Stack) -> None:
    firing = stack.prometheus.wait_for(
        lambda: (f := _firing(stack)) and set(f) == ALERTS and f, what="every alert"
    )
    assert [(a["distillery_job"], a.get("teacher")) for a in firing["DistilleryTeacherUnavailable"]] == [
        ("stuck", "math")
    ]
    assert [a["distillery_job"] for a in firing["DistilleryJobStalled"]] == ["stuck"]
    assert all(a["phase"] == "Failed" for a in firing["DistilleryJobFailed"])
