"""The observed system for the observability tests: the real operator, two trainers' exporters, Prometheus.

- the operator runs in-process against the emulated API server (tests/operator's harness) through the
  scenario of tests/chart/operator_scenario.py: a failed job, an external teacher nobody serves, a
  burst of injected API errors. Its /metrics is the operator's own aiohttp endpoint.
- two trainers are `distillery_runtime.observe.metrics.RuntimeMetrics` exporters served in-process, fed through
  the calls the training loop makes (record_step, record_retries, total_steps, checkpoint, eval):
  `demo` trains (a step every 0.25 s, two teachers answering, a few retries), `stuck` finished one
  step and since then waits for its teacher `math`, which never answers (the loop's OutageTracker sets
  `teacher_down` the moment the client's retries are spent).
- a standalone teacher's own /metrics: the session's real vLLM teacher server (`vllm_server`, shared with
  the scoring tests), whose `vllm:*` gauges the job dashboard's teacher panels read; it scores one compact
  request for the `demo` job first, so that its per-job `distillery_teacher_*` series exist.
- Prometheus scrapes all four every second, with the labels the chart's PodMonitors add (namespace,
  distillery_job; teacher on the teacher's), and evaluates the chart's alert rules (rendered with short
  windows).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from chart.helm_chart import by_kind, render_objects
from chart.operator_scenario import NAMESPACE, drive, scenario_operator
from distillery_runtime.observe.metrics import PHASES, RuntimeMetrics
from distillery_runtime.teachers.wire import (
    JOB_HEADER,
    SCORE_PATH,
    WireSequence,
    encode_request,
    job_identity,
)
from observability.prometheus_server import Prometheus, Target, free_port, run_prometheus

RULE_VALUES = {
    "prometheusRule": {"enabled": True, "for": "0s", "jobStalledSeconds": 4, "reconcileErrorRate": 0}
}
"""The chart's alerts with windows short enough for a test (the expressions are the chart's own)."""
TEACHERS = ("math", "code")
TEACHER_JOB = "distillery-teacher"
"""The scrape job of the teacher server (the chart's teacher PodMonitor)."""


def rendered_rule_groups(values: dict[str, Any] = RULE_VALUES) -> list[dict[str, Any]]:
    """The `spec.groups` of the chart's PrometheusRule: a Prometheus rule file's content."""
    (rule,) = by_kind(render_objects(values), "PrometheusRule")
    return list(rule["spec"]["groups"])


def step_record(step: int, rng: random.Random) -> dict[str, Any]:
    """A training loop record (the keys loop.py writes) with plausible numbers."""
    phases = {phase: rng.uniform(0.01, 0.1) for phase in PHASES}
    tokens = rng.randint(200, 400)
    return {
        "step": step,
        "loss": 2.0 / (1 + step) + rng.uniform(0, 0.01),
        "kl": 0.5 / (1 + step),
        "kl_per_teacher": {t: rng.uniform(0.1, 0.5) / (1 + step) for t in TEACHERS},
        "grad_norm": rng.uniform(0.5, 1.5),
        "lr": 1e-6,
        "staleness": 0,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / sum(phases.values()),
        "time/step_s": sum(phases.values()),
        **{f"time/{phase}_s": seconds for phase, seconds in phases.items()},
    }


@dataclass
class Trainers:
    """The two trainers' exporters and the thread that feeds them."""

    demo: RuntimeMetrics = field(default_factory=RuntimeMetrics)
    stuck: RuntimeMetrics = field(default_factory=RuntimeMetrics)
    ports: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        for name, metrics in (("demo", self.demo), ("stuck", self.stuck)):
            self.ports[name] = free_port()
            metrics.serve(self.ports[name], addr="127.0.0.1")
            metrics.total_steps.set(100)
        rng = random.Random(0)
        self.stuck.record_step(step_record(1, rng), {"code": [0.05]})
        self.stuck.teacher_down("math", True)
        self.demo.teacher_down("code", False)  # it was down once and came back
        self.demo.eval_accuracy.set(0.25)
        # An eval, as the loop records it: each teacher's KL of the student's eval responses, their length.
        self.demo.record_eval({"kl_per_teacher": dict.fromkeys(TEACHERS, 0.3), "response_length_mean": 5.0})
        self.demo.checkpoint_seconds.observe(0.4)
        self.demo.checkpoint_step.set(0)
        threading.Thread(target=self._feed, args=(rng,), name="trainers", daemon=True).start()

    def _feed(self, rng: random.Random) -> None:
        step, retries = 0, {"demo": 0, "stuck": 0}
        while not self.stop.wait(0.25):
            step += 1
            latencies = {t: [rng.uniform(0.01, 0.2) for _ in range(4)] for t in TEACHERS}
            self.demo.record_step(step_record(step, rng), latencies)
            if step % 4 == 0:
                retries["demo"] += 1
                self.demo.record_retries({"code": retries["demo"]})
            if step % 20 == 0:
                self.demo.checkpoint_seconds.observe(rng.uniform(0.2, 0.6))
                self.demo.checkpoint_step.set(step)
            retries["stuck"] += 2
            self.stuck.record_retries({"math": retries["stuck"]})


@dataclass
class Stack:
    prometheus: Prometheus
    operator_port: int
    trainers: Trainers
    rule_groups: list[dict[str, Any]]
    outcome: dict[str, Any]


class _OperatorScenario:
    """The emulator, the operator and the scenario on an event loop of their own thread, kept alive
    after the scenario (the operator goes on probing its external teacher) until `close`."""

    def __init__(self, tmp_path: Path, metrics_port: int) -> None:
        self.tmp_path, self.metrics_port = tmp_path, metrics_port
        self.operator_up = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()
        self.stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.outcome: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="scenario", daemon=True)

    async def _main(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            async with scenario_operator(self.tmp_path, metrics_port=self.metrics_port) as cluster:
                self.operator_up.set()
                # Counters that appear and move between two scrapes show no rate: the scenario starts
                # once Prometheus scrapes the operator.
                await asyncio.to_thread(self.go.wait, 60)
                # A burst of API errors over a few seconds (backoff 0.05 s doubling to 0.5 s), so that
                # several scrapes see the error counter grow.
                self.outcome = await drive(cluster, flaky_failures=12)
                self.done.set()
                await self.stop.wait()
        except BaseException as error:
            self.error = error
            self.done.set()

    def start(self, prometheus: Prometheus, timeout: float = 120) -> dict[str, Any]:
        self.thread.start()
        if not self.operator_up.wait(60):
            raise AssertionError(f"the operator did not start: {self.error!r}")
        prometheus.wait_for(
            lambda: any(
                t["labels"]["job"] == "distillery-operator" and t["health"] == "up"
                for t in prometheus.targets()
            ),
            what="a scrape of the operator",
        )
        self.go.set()
        self.done.wait(timeout)
        if self.error is not None:
            raise self.error
        if not self.done.is_set():
            raise AssertionError(f"the operator scenario did not finish in {timeout} s")
        return self.outcome

    def close(self) -> None:
        self.go.set()
        if self.loop is not None and self.stop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


def score_for_job(teacher_address: str, job: str) -> None:
    """One compact scoring request to the teacher server, sent as `job`'s trainer sends it."""
    request = urllib.request.Request(
        f"http://{teacher_address}{SCORE_PATH}",
        data=encode_request([WireSequence([1, 2, 3, 4], 2, "s0")], 1),
        headers={JOB_HEADER: job},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


@contextlib.contextmanager
def running_stack(workdir: Path, teacher_address: str) -> Iterator[Stack]:
    """The stack; `teacher_address` (host:port) serves a real vLLM teacher's /metrics, labelled as the
    `demo` job's teacher `math`."""
    score_for_job(teacher_address, job_identity("demo", NAMESPACE))
    trainers = Trainers()
    trainers.start()
    operator_port = free_port()
    groups = rendered_rule_groups()
    rules = workdir / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    targets = [
        Target("distillery-operator", f"127.0.0.1:{operator_port}", {}),
        *(
            Target(
                "distillery-runtime", f"127.0.0.1:{port}", {"namespace": NAMESPACE, "distillery_job": name}
            )
            for name, port in trainers.ports.items()
        ),
        Target(
            TEACHER_JOB,
            teacher_address,
            {"namespace": NAMESPACE, "distillery_job": "demo", "teacher": "math"},
        ),
    ]
    scenario = _OperatorScenario(workdir, operator_port)
    try:
        with run_prometheus(workdir, targets, [rules]) as prometheus:
            outcome = scenario.start(prometheus)
            # Past the stalled window and a few evaluations, with every target scraped.
            time.sleep(RULE_VALUES["prometheusRule"]["jobStalledSeconds"] + 2)
            prometheus.wait_for(
                lambda: (
                    all(t["health"] == "up" for t in prometheus.targets())
                    and len(prometheus.targets()) == len(targets)
                ),
                what="all targets up",
            )
            yield Stack(prometheus, operator_port, trainers, groups, outcome)
    finally:
        scenario.close()
        trainers.stop.set()
