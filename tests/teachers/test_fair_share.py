"""A shared teacher serves jobs fairly and accounts per job: the job header, the fair admission queues, the
busy-time attribution rule, and `JobServing` (admission + metrics) with a fake engine call."""

from __future__ import annotations

import asyncio

import pytest
from distillery_runtime.teachers.serving.busy_time import BusyTime, split_interval
from distillery_runtime.teachers.serving.fair_share import FairShare, next_job
from distillery_runtime.teachers.serving.job_serving import JobServing
from distillery_runtime.teachers.serving.server_metrics import (
    MAX_JOB_LABELS,
    METRIC_NAMES,
    OTHER_JOBS,
    TeacherServerMetrics,
)
from distillery_runtime.teachers.wire import UNKNOWN_JOB, WireSequence, job_identity, parse_job_header
from prometheus_client import CollectorRegistry, generate_latest

# ------------------------------------------------------------------------------------------ job header


def test_job_identity_and_header_parsing() -> None:
    assert job_identity("gsm8k", "team-a") == "team-a/gsm8k"
    assert job_identity("local-run", None) == "local-run"
    assert parse_job_header("team-a/gsm8k") == "team-a/gsm8k"
    assert parse_job_header("  local.run-1 ") == "local.run-1"
    # no header, or one that is not a job identity (it would become a metric label): `unknown`
    for bad in (None, "", "a/b/c", "-x", "x y", 'x"}', "/x", "x/", "é", "n" * 254):
        assert parse_job_header(bad) == UNKNOWN_JOB, bad


# ------------------------------------------------------------------------------------------ scheduler


def test_next_job_prefers_fewest_in_flight_then_least_recently_admitted() -> None:
    assert next_job([], {}, {}) is None
    assert next_job(["a", "b"], {"a": 3, "b": 1}, {}) == "b"
    assert next_job(["a", "b"], {"a": 1, "b": 1}, {"a": 5, "b": 2}) == "b"
    assert next_job(["a", "b"], {"a": 1, "b": 1}, {"a": 5}) == "b"  # never admitted: first
    assert next_job(["a", "b"], {}, {}) == "a"  # then arrival order


class Engine:
    """Records admissions and what is in flight; each request runs until the test releases it."""

    def __init__(self, share: FairShare) -> None:
        self.share = share
        self.order: list[str] = []
        self.peak: dict[str, int] = {}
        self.gates: list[asyncio.Event] = []

    async def request(self, job: str, cost: int = 1) -> None:
        gate = asyncio.Event()
        async with self.share.slot(job, cost):
            self.order.append(job)
            self.peak[job] = max(self.peak.get(job, 0), self.share.in_flight[job])
            self.gates.append(gate)
            await gate.wait()

    async def finish_one(self) -> None:
        """Let the oldest running request finish, and the next admissions happen."""
        self.gates.pop(0).set()
        for _ in range(5):
            await asyncio.sleep(0)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_big_backlog_does_not_delay_another_job_behind_it() -> None:
    share = FairShare(capacity=4)
    engine = Engine(share)
    big = [asyncio.create_task(engine.request("big")) for _ in range(100)]
    await _settle()
    assert engine.order == ["big"] * 4 and share.waiting("big") == 96
    small = [asyncio.create_task(engine.request("small")) for _ in range(10)]
    await _settle()
    while len(engine.order) < 110:
        await engine.finish_one()
    after = engine.order[4:]
    # Each freed slot goes to the job with fewer in flight: `small` takes the first two freed slots, then
    # the two jobs alternate (2 slots each), so all of `small` is in within 2 + 2 * 10 admissions.
    assert after[:2] == ["small", "small"]
    assert max(i for i, job in enumerate(after) if job == "small") < 22
    assert engine.peak["small"] == 2 and engine.peak["big"] == 4
    while engine.gates:
        await engine.finish_one()
    await asyncio.gather(*big, *small)
    assert share.in_flight == {} and share.queues == {}


async def test_a_lone_job_uses_every_slot() -> None:
    share = FairShare(capacity=8)
    engine = Engine(share)
    tasks = [asyncio.create_task(engine.request("only")) for _ in range(20)]
    await _settle()
    assert share.in_flight == {"only": 8} and share.waiting("only") == 12
    while engine.gates:
        await engine.finish_one()
    await asyncio.gather(*tasks)
    assert engine.peak == {"only": 8}


async def test_three_jobs_share_equally_and_costs_count_sequences() -> None:
    share = FairShare(capacity=6)
    engine = Engine(share)
    tasks = [asyncio.create_task(engine.request(job, 2)) for _ in range(10) for job in ("a", "b", "c")]
    await _settle()
    for _ in range(12):
        assert sorted(share.in_flight.values()) == [2, 2, 2]
        await engine.finish_one()
    # a request larger than the whole engine runs alone instead of waiting forever
    huge = asyncio.create_task(engine.request("d", 50))
    while engine.gates:
        await engine.finish_one()
    await asyncio.gather(*tasks, huge)
    assert engine.peak["d"] == 6


async def test_a_cancelled_request_leaves_the_queue_and_frees_nothing_it_did_not_hold() -> None:
    share = FairShare(capacity=1)
    engine = Engine(share)
    first = asyncio.create_task(engine.request("a"))
    queued = asyncio.create_task(engine.request("b"))
    await _settle()
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert share.queues == {} and share.in_flight == {"a": 1}
    await engine.finish_one()
    await first
    assert share.in_flight == {} and engine.order == ["a"]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least one"):
        FairShare(0)


# ------------------------------------------------------------------------------------------ attribution


def test_an_interval_is_split_by_tokens_in_flight() -> None:
    assert split_interval(2.0, {}) == {}
    assert split_interval(0.0, {"a": 5}) == {}
    assert split_interval(2.0, {"a": 300, "b": 100}) == {"a": 1.5, "b": 0.5}
    assert split_interval(2.0, {"a": 0, "b": 0}) == {"a": 1.0, "b": 1.0}


def test_busy_time_adds_up_to_the_replica_busy_wall_time() -> None:
    now = [0.0]
    busy = BusyTime(lambda: now[0])
    total: dict[str, float] = {}

    def add(parts: dict[str, float]) -> None:
        for job, seconds in parts.items():
            total[job] = total.get(job, 0.0) + seconds

    add(busy.start(1, "a", 100))  # t=0: a alone
    now[0] = 1.0
    add(busy.start(2, "b", 300))  # t=1: a and b, b has 3x the tokens
    now[0] = 3.0
    add(busy.finish(1))  # t=3: b alone
    now[0] = 4.0
    add(busy.finish(2))
    now[0] = 10.0  # idle: nobody's
    add(busy.start(3, "a", 10))
    now[0] = 10.5
    add(busy.finish(3))
    assert total == pytest.approx({"a": 1.0 + 0.5 + 0.5, "b": 1.5 + 1.0})
    assert sum(total.values()) == pytest.approx(4.0 + 0.5)  # busy wall time, idle time excluded


# ------------------------------------------------------------------------------------------ serving


def _value(text: str, name: str, job: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{client_job="{job}"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {job} in:\n{text}")


async def test_job_serving_admits_fairly_and_accounts_per_job() -> None:
    registry = CollectorRegistry()
    metrics = TeacherServerMetrics(registry, gpus=2)
    now = [0.0]
    serving = JobServing(2, metrics, clock=lambda: now[0])
    gate = asyncio.Event()

    async def engine_call() -> str:
        await gate.wait()
        return "scores"

    seq = WireSequence([1, 2, 3, 4], 2)
    tasks = [asyncio.create_task(serving.run("ns/big", [seq], engine_call)) for _ in range(4)]
    await _settle()
    tasks.append(asyncio.create_task(serving.run("ns/small", [seq, seq], engine_call)))
    await _settle()
    # Two `big` in the engine; two `big` and the two sequences of `small` wait: the gauge the operator
    # scales a shared teacher on.
    assert "distillery_teacher_waiting_sequences 4.0" in generate_latest(registry).decode()
    now[0] = 2.0
    gate.set()
    assert await asyncio.gather(*tasks) == ["scores"] * 5
    text = generate_latest(registry).decode()
    assert _value(text, "distillery_teacher_scored_tokens_total", "ns/big") == 16
    assert _value(text, "distillery_teacher_scored_tokens_total", "ns/small") == 8
    assert _value(text, "distillery_teacher_scored_sequences_total", "ns/big") == 4
    assert _value(text, "distillery_teacher_scored_sequences_total", "ns/small") == 2
    assert _value(text, "distillery_teacher_request_duration_seconds_count", "ns/big") == 4
    assert _value(text, "distillery_teacher_queue_wait_seconds_count", "ns/small") == 1
    # 2 s with two `big` requests in flight (the small one waited, then ran in no time)
    assert _value(text, "distillery_teacher_busy_seconds_total", "ns/big") == pytest.approx(2.0)
    assert "distillery_teacher_gpus 2.0" in text
    assert serving.share.in_flight == {} and serving.share.queues == {}
    assert "distillery_teacher_waiting_sequences 0.0" in text


def test_metric_names_and_bounded_job_labels() -> None:
    registry = CollectorRegistry()
    metrics = TeacherServerMetrics(registry)
    for i in range(MAX_JOB_LABELS):
        metrics.answered(f"ns/job-{i}", 1, 0.1)
    metrics.answered("ns/one-too-many", 1, 0.1)
    metrics.answered("ns/job-0", 1, 0.1)
    text = generate_latest(registry).decode()
    assert _value(text, "distillery_teacher_scored_tokens_total", OTHER_JOBS) == 1
    assert _value(text, "distillery_teacher_scored_tokens_total", "ns/job-0") == 2
    families = {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}
    assert families == set(METRIC_NAMES)


def test_a_compact_client_built_for_a_job_sends_its_identity() -> None:
    from distillery_runtime.teachers.clients.compact_http import CompactTeacher
    from distillery_runtime.teachers.scoring import build_client
    from distillery_runtime.teachers.wire import JOB_HEADER
    from distillery_runtime.testing.teacher_server import cpu_engine

    from distillery.api import Placement
    from distillery.runtime_config import ResolvedTeacher, TeacherProtocol

    teacher = ResolvedTeacher(
        name="t",
        placement=Placement.SHARED,
        protocol=TeacherProtocol.COMPACT,
        endpoints=["http://t.team-a.svc:8000"],
        served_model_name="t",
        max_logprobs=8,
        max_model_len=64,
    )
    client = build_client(teacher, cpu_engine("t"), job=job_identity("gsm8k", "team-a"))
    assert isinstance(client, CompactTeacher) and client.headers == {JOB_HEADER: "team-a/gsm8k"}
    anonymous = build_client(teacher, cpu_engine("t"))
    assert isinstance(anonymous, CompactTeacher) and anonymous.headers == {}
