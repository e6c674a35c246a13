"""Writes the chart's Grafana dashboards (operator.json, job.json) from the panel lists below.

The JSON files are what the chart ships (one ConfigMap each); this script is their source, so that a panel
is one line of PromQL and a title instead of forty lines of JSON. tests/chart checks that the files are
what it writes, tests/observability that every expression returns series from the real exporters.
Run: python charts/distillery/dashboards/generate.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
R = "$__rate_interval"


def ds_var() -> dict[str, Any]:
    return {
        "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
        "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": [],
    }  # fmt: skip


def query_var(name: str, label: str, query: str) -> dict[str, Any]:
    """A multi-value variable; "All" sends the regex `.*` (the selectors use =~)."""
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
        "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "allValue": ".*",
        "current": {}, "hide": 0, "options": [], "regex": "",
    }  # fmt: skip


class Layout:
    """Places panels left to right in rows of 24 grid units; `row` starts a titled row."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = self.row_h = 0
        self.next_id = 1

    def _newline(self) -> None:
        self.x, self.y, self.row_h = 0, self.y + self.row_h, 0

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self.next_id
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.next_id += 1
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(panel)

    def row(self, title: str) -> None:
        if self.x:
            self._newline()
        self.panels.append(
            {"type": "row", "title": title, "id": self.next_id, "collapsed": False, "panels": [],
             "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}}
        )  # fmt: skip
        self.next_id += 1
        self.y += 1


def targets(*queries: tuple[str, str], instant: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, (expr, legend) in enumerate(queries):
        target = {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
        if instant:
            target.update(instant=True, range=False, format="table")
        else:
            target["range"] = True
        out.append(target)
    return out


def timeseries(
    title: str, desc: str, unit: str, *queries: tuple[str, str], stack: bool = False
) -> dict[str, Any]:
    custom = {
        "drawStyle": "line", "lineWidth": 1, "fillOpacity": 60 if stack else 10, "showPoints": "never",
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }  # fmt: skip
    return {
        "type": "timeseries", "title": title, "description": desc, "datasource": DS,
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets(*queries),
    }  # fmt: skip


def stat(
    title: str, desc: str, unit: str, expr: str, legend: str = "", red_above: float | None = None
) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if red_above is not None:
        steps.append({"color": "red", "value": red_above})
    return {
        "type": "stat", "title": title, "description": desc, "datasource": DS,
        "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}}, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value", "graphMode": "area", "textMode": "auto", "justifyMode": "auto",
        },
        "targets": targets((expr, legend)),
    }  # fmt: skip


def table(title: str, desc: str, *queries: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "table", "title": title, "description": desc, "datasource": DS,
        "fieldConfig": {"defaults": {}, "overrides": []}, "options": {"showHeader": True},
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ],
        "targets": targets(*queries, instant=True),
    }  # fmt: skip


def dashboard(
    uid: str, title: str, desc: str, variables: list[dict[str, Any]], layout: Layout
) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": desc, "tags": ["distillery"], "editable": True,
        "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s", "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"}, "fiscalYearStartMonth": 0, "liveNow": False,
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [ds_var(), *variables]}, "panels": layout.panels,
    }  # fmt: skip


# ------------------------------------------------------------------------------------------ operator


def operator_dashboard() -> dict[str, Any]:
    o = 'instance=~"$instance"'
    layout = Layout()
    layout.row("Jobs")
    for phase, red in (("Running", None), ("StartingTeachers", None), ("Pending", None), ("Suspended", None),
                       ("Succeeded", None), ("Failed", 0.5)):  # fmt: skip
        layout.add(
            stat(phase, f"DistillationJobs in phase {phase}.", "none",
                 f'sum(distillery_operator_jobs{{{o}, phase="{phase}"}})', red_above=red),
            4, 4,
        )  # fmt: skip
    layout.add(
        timeseries("Jobs by phase", "DistillationJobs known to the operator, by phase.", "none",
                   (f"sum by (phase) (distillery_operator_jobs{{{o}}})", "{{phase}}"), stack=True),
        12, 8,
    )  # fmt: skip
    layout.add(
        table("Trainers", "Every job whose trainer exports metrics (PodMonitor): progress, loss and throughput.",
              ("max by (namespace, distillery_job) (distillery_runtime_step)", "step"),
              ("max by (namespace, distillery_job) (distillery_runtime_total_steps)", "steps"),
              ("max by (namespace, distillery_job) (distillery_runtime_loss)", "loss"),
              ("sum by (namespace, distillery_job) (distillery_runtime_tokens_per_second)", "tokens/s")),
        12, 8,
    )  # fmt: skip
    layout.row("Reconciles")
    layout.add(
        timeseries("Reconciles by result", "unchanged: nothing to write; changed: objects or status written; "
                   "invalid: the spec is invalid; error: an API call failed (retried with backoff).", "ops",
                   (f"sum by (result) (rate(distillery_operator_reconciles_total{{{o}}}[{R}]))", "{{result}}")),
        8, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Reconciles by trigger", "The kind of object whose change queued the reconcile.", "ops",
                   (f"sum by (kind) (rate(distillery_operator_reconciles_total{{{o}}}[{R}]))", "{{kind}}")),
        8, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Reconcile duration", "Time of one reconcile, API writes included.", "s",
                   *((f"histogram_quantile({q}, sum by (le) (rate(distillery_operator_reconcile_duration_seconds_bucket{{{o}}}[{R}])))",
                      f"p{round(q * 100)}") for q in (0.5, 0.95, 0.99))),
        8, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Work queue", "Jobs waiting for a reconcile, and reconciles requeued with backoff after an error.",
                   "short",
                   (f"sum(distillery_operator_workqueue_depth{{{o}}})", "depth"),
                   (f"sum(rate(distillery_operator_workqueue_retries_total{{{o}}}[{R}]))", "retries/s")),
        8, 8,
    )  # fmt: skip
    layout.row("Kubernetes API and teachers")
    layout.add(
        timeseries("API writes", "Writes to the Kubernetes API by verb, kind and result code.", "ops",
                   (f"sum by (verb, kind, code) (rate(distillery_operator_api_requests_total{{{o}}}[{R}]))",
                    "{{verb}} {{kind}} {{code}}")),
        8, 8,
    )  # fmt: skip
    layout.add(
        timeseries("API errors", "Failed Kubernetes API calls by HTTP status code (0: unreachable).", "ops",
                   (f"sum by (code) (rate(distillery_operator_api_errors_total{{{o}}}[{R}]))", "{{code}}")),
        8, 8,
    )  # fmt: skip
    layout.add(
        timeseries("External teacher probes", "Health checks of external teachers by result.", "ops",
                   (f"sum by (result) (rate(distillery_operator_teacher_probes_total{{{o}}}[{R}]))", "{{result}}")),
        8, 8,
    )  # fmt: skip
    layout.row("Operator process")
    layout.add(
        timeseries("CPU", "", "percentunit", (f"rate(process_cpu_seconds_total{{{o}}}[{R}])", "{{instance}}")),
        12, 7,
    )  # fmt: skip
    layout.add(
        timeseries("Memory", "Resident memory.", "bytes", (f"process_resident_memory_bytes{{{o}}}", "{{instance}}")),
        12, 7,
    )  # fmt: skip
    variables = [query_var("instance", "Operator", "label_values(distillery_operator_jobs, instance)")]
    return dashboard(
        "distillery-operator", "Distillery / Operator",
        "The Distillery operator: jobs by phase, reconciles, work queue, Kubernetes API calls, external teacher "
        "health, and a table of running trainers.",
        variables, layout,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ job


def job_dashboard() -> dict[str, Any]:
    s = 'namespace=~"$namespace", distillery_job=~"$job"'
    by = "namespace, distillery_job"
    layout = Layout()
    _progress_row(layout, s, by)
    _training_row(layout, s, by)
    _generation_row(layout, s, by)
    _throughput_row(layout, s, by)
    _teachers_row(layout, s, by)
    _shared_teachers_row(layout)
    variables = [
        query_var("namespace", "Namespace", "label_values(distillery_runtime_step, namespace)"),
        query_var(
            "job", "Job", 'label_values(distillery_runtime_step{namespace=~"$namespace"}, distillery_job)'
        ),
    ]
    return dashboard(
        "distillery-job", "Distillery / Job",
        "DistillationJobs in training: loss, KL per teacher, step time breakdown, tokens/s, teacher latency and "
        "errors, shared teachers' work per job. Series come from the trainers' /metrics (the chart's PodMonitor "
        "adds namespace and distillery_job) and the teachers' (client_job: the job a request scored for).",
        variables, layout,
    )  # fmt: skip


def _progress_row(layout: Layout, s: str, by: str) -> None:
    """The job dashboard's "Progress" row."""
    layout.row("Progress")
    layout.add(stat("Step", "Last completed training step.", "none",
                    f"max by ({by}) (distillery_runtime_step{{{s}}})", "{{distillery_job}}"), 4, 4)  # fmt: skip
    layout.add(
        stat("Done", "Completed steps / steps of the job.", "percentunit",
             f"max by ({by}) (distillery_runtime_step{{{s}}}) / max by ({by}) (distillery_runtime_total_steps{{{s}}})",
             "{{distillery_job}}"),
        4, 4,
    )  # fmt: skip
    layout.add(stat("Loss", "Distillation loss of the last step.", "none",
                    f"max by ({by}) (distillery_runtime_loss{{{s}}})", "{{distillery_job}}"), 4, 4)  # fmt: skip
    layout.add(stat("Tokens/s", "Response tokens trained per second of step time.", "short",
                    f"sum by ({by}) (distillery_runtime_tokens_per_second{{{s}}})", "{{distillery_job}}"), 4, 4)  # fmt: skip
    layout.add(stat("Eval accuracy", "Held-out accuracy of the student, graded by data.grader.", "percentunit",
                    f"max by ({by}) (distillery_runtime_eval_accuracy_ratio{{{s}}})", "{{distillery_job}}"), 4, 4)  # fmt: skip
    layout.add(stat("Checkpoint", "Step of the newest checkpoint.", "none",
                    f"max by ({by}) (distillery_runtime_checkpoint_step{{{s}}})", "{{distillery_job}}"), 4, 4)  # fmt: skip


def _training_row(layout: Layout, s: str, by: str) -> None:
    """The job dashboard's "Training" row."""
    layout.row("Training")
    layout.add(timeseries("Loss", "Distillation loss per step.", "none",
                          (f"distillery_runtime_loss{{{s}}}", "{{distillery_job}}")), 12, 8)  # fmt: skip
    layout.add(
        timeseries("KL per teacher", "k3 estimate of KL(student || teacher) on the student's samples, nats/token.",
                   "none", (f"distillery_runtime_kl{{{s}}}", "{{distillery_job}} / {{teacher}}")),
        12, 8,
    )  # fmt: skip
    layout.add(timeseries("Gradient norm", "Global gradient norm before clipping.", "none",
                          (f"distillery_runtime_grad_norm{{{s}}}", "{{distillery_job}}")), 8, 7)  # fmt: skip
    layout.add(timeseries("Learning rate", "Learning rate of the last step.", "none",
                          (f"distillery_runtime_learning_rate{{{s}}}", "{{distillery_job}}")), 8, 7)  # fmt: skip
    layout.add(
        timeseries("Policy staleness", "Optimizer steps between the weights that sampled a step's data and the "
                   "weights it trains (1 with one-step-off overlap).", "none",
                   (f"distillery_runtime_policy_staleness_steps{{{s}}}", "{{distillery_job}}")),
        8, 7,
    )  # fmt: skip


def _generation_row(layout: Layout, s: str, by: str) -> None:
    """The job dashboard's "Generation" row."""
    layout.row("Generation")
    layout.add(
        timeseries("Response length", "Tokens per response of each step: the mean and the longest.", "short",
                   (f"distillery_runtime_response_length_tokens{{{s}}}", "{{distillery_job}} {{stat}}"),
                   (f"distillery_runtime_eval_response_length_tokens{{{s}}}", "{{distillery_job}} eval mean")),
        8, 7,
    )  # fmt: skip
    layout.add(
        timeseries("Truncated responses", "Share of sampled responses cut at student.rollout.maxNewTokens "
                   "(finish reason length), still trained on.", "percentunit",
                   (f"distillery_runtime_response_truncated_ratio{{{s}}}", "{{distillery_job}}")),
        8, 7,
    )  # fmt: skip
    layout.add(
        timeseries("Student entropy", "Mean per-token entropy of the student on its responses, nats/token: "
                   "near 0 is a collapsed policy.", "none",
                   (f"distillery_runtime_student_entropy{{{s}}}", "{{distillery_job}}")),
        8, 7,
    )  # fmt: skip
    layout.add(
        timeseries("Rollout vs trainer log-prob gap", "|rollout engine - trainer| log-prob of the same sampled "
                   "tokens (mean, max): ~0 in sync; a wrong weight sync, template or dtype shows here first.", "none",
                   (f"distillery_runtime_logprob_gap{{{s}}}", "{{distillery_job}} {{stat}}")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Episodes (tool-using students)", "Turns per episode (spec.environment), and per second the "
                   "calls the tool answered as a misuse and the environment calls that failed (each ends its "
                   "episode).", "short",
                   (f"distillery_runtime_episode_turns{{{s}}}", "{{distillery_job}} turns"),
                   (f"rate(distillery_runtime_episode_tool_errors_total{{{s}}}[{R}])",
                    "{{distillery_job}} tool errors/s"),
                   (f"rate(distillery_runtime_episode_environment_failures_total{{{s}}}[{R}])",
                    "{{distillery_job}} environment failures/s")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Eval KL per teacher", "Per-token KL(student || teacher) of the student's greedy eval "
                   "responses (first samples of each eval), nats/token.", "none",
                   (f"distillery_runtime_eval_kl{{{s}}}", "{{distillery_job}} / {{teacher}}")),
        12, 8,
    )  # fmt: skip


def _throughput_row(layout: Layout, s: str, by: str) -> None:
    """The job dashboard's "Throughput and step time" row."""
    layout.row("Throughput and step time")
    layout.add(
        timeseries("Tokens per second", "trained: response tokens per second of step time; sampled: tokens the "
                   "student generated per second of wall time.", "short",
                   (f"distillery_runtime_tokens_per_second{{{s}}}", "{{distillery_job}} trained"),
                   (f"sum by ({by}) (rate(distillery_runtime_generated_tokens_total{{{s}}}[{R}]))",
                    "{{distillery_job}} sampled")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Step time breakdown", "Mean seconds per step in each phase: rollout (student sampling), teacher "
                   "(scoring not hidden behind rollout), train (forward, backward, optimizer), sync (weights to the "
                   "rollout engine).", "s",
                   (f"sum by ({by}, phase) (rate(distillery_runtime_step_phase_duration_seconds_sum{{{s}}}[{R}]))"
                    f" / sum by ({by}, phase) (rate(distillery_runtime_step_phase_duration_seconds_count{{{s}}}[{R}]))",
                    "{{distillery_job}} {{phase}}"),
                   stack=True),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Step duration", "Wall time of a training step.", "s",
                   *((f"histogram_quantile({q}, sum by ({by}, le) (rate(distillery_runtime_step_duration_seconds_bucket{{{s}}}[{R}])))",
                      f"{{{{distillery_job}}}} p{round(q * 100)}") for q in (0.5, 0.95))),
        12, 8,
    )  # fmt: skip
    layout.add(timeseries("Steps per minute", "", "none",
                          (f"sum by ({by}) (rate(distillery_runtime_steps_total{{{s}}}[{R}])) * 60",
                           "{{distillery_job}}")), 12, 8)  # fmt: skip


def _teachers_row(layout: Layout, s: str, by: str) -> None:
    """The job dashboard's "Teachers" row."""
    layout.row("Teachers")
    layout.add(
        timeseries("Teacher latency", "Latency of one sample's scoring request per teacher, retries included.", "s",
                   *((f"histogram_quantile({q}, sum by ({by}, teacher, le) "
                      f"(rate(distillery_runtime_teacher_request_duration_seconds_bucket{{{s}}}[{R}])))",
                      f"{{{{distillery_job}}}} {{{{teacher}}}} p{round(q * 100)}") for q in (0.5, 0.95))),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Samples scored per second", "Samples each teacher scored.", "short",
                   (f"sum by ({by}, teacher) (rate(distillery_runtime_teacher_samples_total{{{s}}}[{R}]))",
                    "{{distillery_job}} {{teacher}}")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Teacher errors", "Scoring requests that failed and were retried, per second and teacher. "
                   "Retries with no samples scored mean the teacher is unavailable (an alert fires).", "short",
                   (f"sum by ({by}, teacher) (rate(distillery_runtime_teacher_retries_total{{{s}}}[{R}]))",
                    "{{distillery_job}} {{teacher}}")),
        12, 8,
    )  # fmt: skip
    # The standalone teachers' own vLLM metrics (the chart's teacher PodMonitor): a queue that keeps growing
    # means the teacher, not the student, paces the job; a full KV cache means requests wait for memory.
    layout.add(
        timeseries("Teacher queue (vLLM)", "Scoring requests each standalone teacher holds, over its replicas: "
                   "waiting for a batch slot, and running.", "short",
                   (f"sum by ({by}, teacher) (vllm:num_requests_waiting{{{s}}})", "{{distillery_job}} {{teacher}} waiting"),
                   (f"sum by ({by}, teacher) (vllm:num_requests_running{{{s}}})", "{{distillery_job}} {{teacher}} running")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Teacher KV-cache use (vLLM)", "Share of the KV cache in use, the fullest replica of each "
                   "standalone teacher.", "percentunit",
                   (f"max by ({by}, teacher) (vllm:kv_cache_usage_perc{{{s}}})", "{{distillery_job}} {{teacher}}")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Checkpoint write time", "Mean time to write a checkpoint.", "s",
                   (f"sum by ({by}) (rate(distillery_runtime_checkpoint_duration_seconds_sum{{{s}}}[{R}]))"
                    f" / sum by ({by}) (rate(distillery_runtime_checkpoint_duration_seconds_count{{{s}}}[{R}]))",
                    "{{distillery_job}}")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Prompts truncated or dropped",
                   "Prompts longer than data.maxPromptTokens, cut (overlongPrompts: truncate) or left out (drop), per second.",
                   "short",
                   (f"sum by ({by}) (rate(distillery_runtime_prompts_truncated_total{{{s}}}[{R}]))",
                    "{{distillery_job}} truncated"),
                   (f"sum by ({by}) (rate(distillery_runtime_prompts_dropped_total{{{s}}}[{R}]))",
                    "{{distillery_job}} dropped")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Teacher top-k beyond the student's vocabulary",
                   "Teacher top-k entries at ids the student has no logit for (folded into the loss's tail), per second.",
                   "short",
                   (f"sum by ({by}) (rate(distillery_runtime_teacher_topk_out_of_vocab_total{{{s}}}[{R}]))",
                    "{{distillery_job}}")),
        12, 8,
    )  # fmt: skip


def _shared_teachers_row(layout: Layout) -> None:
    """The job dashboard's "Shared teachers" row."""
    # Shared teachers (DistillationTeacher): the teacher server's own account of each job it serves,
    # labelled client_job="namespace/name" by the job header (the teacher's pods carry no job label).
    t = 'namespace=~"$namespace", client_job=~"$namespace/$job"'
    tby = "namespace, teacher, client_job"
    layout.row("Shared teachers")
    layout.add(
        timeseries("Tokens scored per job", "Tokens (prompt + response) each teacher ran for each job, per second, "
                   "over its replicas: jobs using a shared teacher at the same time get equal shares of its engine.",
                   "short",
                   (f"sum by ({tby}) (rate(distillery_teacher_scored_tokens_total{{{t}}}[{R}]))",
                    "{{teacher}} {{client_job}}"),
                   (f"sum by ({tby}) (rate(distillery_teacher_scored_sequences_total{{{t}}}[{R}]))",
                    "{{teacher}} {{client_job}} sequences"),
                   stack=True),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Teacher-side latency per job", "p90 of a scoring request's time in the teacher server, from "
                   "arrival to answer, and of the part spent waiting for the job's fair share of the engine.", "s",
                   (f"histogram_quantile(0.9, sum by ({tby}, le) "
                    f"(rate(distillery_teacher_request_duration_seconds_bucket{{{t}}}[{R}])))",
                    "{{teacher}} {{client_job}} p90"),
                   (f"histogram_quantile(0.9, sum by ({tby}, le) "
                    f"(rate(distillery_teacher_queue_wait_seconds_bucket{{{t}}}[{R}])))",
                    "{{teacher}} {{client_job}} p90 queue wait")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Teacher busy time per job", "Replica-seconds per second each job kept a teacher busy: each "
                   "interval with requests in the engine split among them by tokens (1 = one replica busy "
                   "all the time for this job).", "short",
                   (f"sum by ({tby}) (rate(distillery_teacher_busy_seconds_total{{{t}}}[{R}]))",
                    "{{teacher}} {{client_job}}"),
                   stack=True),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Shared teacher queue", "Sequences waiting per teacher, over its replicas: in the teacher "
                   "server's fair queue (by job) and in vLLM's own. The operator adds a replica while this per "
                   "replica is above the DistillationTeacher's scaling.targetWaitingPerReplica.", "short",
                   ('sum by (namespace, teacher) (distillery_teacher_waiting_sequences{namespace=~"$namespace"})',
                    "{{teacher}} fair queue"),
                   ('sum by (namespace, teacher) (vllm:num_requests_waiting{namespace=~"$namespace"})',
                    "{{teacher}} vLLM queue")),
        12, 8,
    )  # fmt: skip
    layout.add(
        timeseries("Teacher GPUs per job", "GPU-seconds per second attributed to each job: its busy time on each "
                   "replica times the replica's GPUs (0 for a teacher on CPU).", "short",
                   (f"sum by ({tby}) (rate(distillery_teacher_busy_seconds_total{{{t}}}[{R}])"
                    " * on (instance) group_left max by (instance) (distillery_teacher_gpus))",
                    "{{teacher}} {{client_job}}"),
                   stack=True),
        12, 8,
    )  # fmt: skip


DASHBOARDS = {"operator.json": operator_dashboard, "job.json": job_dashboard}


def render_all() -> dict[str, str]:
    """File name -> JSON text, exactly as written to disk."""
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main(out_dir: Path = HERE) -> int:
    for name, text in render_all().items():
        (out_dir / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
