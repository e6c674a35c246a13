"""Several operator replicas (`--leader-elect`): real operator processes against the emulated API server.

One leads and reconciles, a standby takes over when the leader crashes (after the Lease expires) or
stops (at once: it releases the Lease), and a leader that loses its Lease exits so that it restarts as a
standby. Timings are shortened (lease 5 s, renew deadline 3 s, retry 0.5 s) to keep the test short.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from distillery_operator.leader import micro_time
from operator_harness import Cluster, free_port, load_example, spawn_operator, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

LEASES = "coordination.k8s.io/v1/leases"
LEASE = "distillery-operator"
TIMING = (
    "--leader-elect-lease-duration", "5", "--leader-elect-renew-deadline", "3",
    "--leader-elect-retry-period", "0.5",
)  # fmt: skip
"""Short, with room for a loaded 2-core CI machine: a leader starved for 3 s would give up."""


def replica(c: Cluster, log: Path) -> Any:
    ports = ("--metrics-port", str(free_port()), "--health-port", str(free_port()))
    return spawn_operator(
        c, "--leader-elect", "--leader-elect-namespace", c.namespace, *TIMING, *ports, log=log
    )


def kill_all(procs: list[Any]) -> None:
    """Ends the replicas a test left running (a failed assertion must not leak operator processes)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def holder(c: Cluster) -> str | None:
    lease = c.emulator.obj(LEASES, c.namespace, LEASE) or {}
    return (lease.get("spec") or {}).get("holderIdentity")


def phase(c: Cluster, name: str) -> str | None:
    return c.status(name).get("phase")


async def test_one_replica_leads_and_a_standby_takes_over(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    logs = [tmp_path / "replica-0.log", tmp_path / "replica-1.log"]
    procs = [replica(c, log) for log in logs]
    try:
        first = await wait_for(lambda: holder(c), what="a leader")
        await c.create(load_example("gkd.yaml", name="led-1"))
        await wait_for(lambda: phase(c, "led-1") == "StartingTeachers", what="the leader to reconcile")
        await wait_for(lambda: any("leading as" in log.read_text() for log in logs), what="the leader's log")
        leading = [i for i, log in enumerate(logs) if "leading as" in log.read_text()]
        assert len(leading) == 1, [log.read_text()[-500:] for log in logs]
        standby = 1 - leading[0]

        # The leader crashes (no release): the standby takes over once the Lease has expired.
        killed = time.monotonic()
        procs[leading[0]].kill()
        procs[leading[0]].wait(10)
        second = await wait_for(
            lambda: holder(c) not in (None, "", first) and holder(c), timeout=20, what="a new leader"
        )
        assert time.monotonic() - killed > 3.5, "the standby did not wait for the Lease to expire"
        assert second != first
        await wait_for(lambda: "leading as" in logs[standby].read_text(), what="the standby to lead")
        await c.create(load_example("gkd.yaml", name="led-2"))
        await wait_for(lambda: phase(c, "led-2") == "StartingTeachers", timeout=20, what="the new leader")

        # A clean stop releases the Lease: the next replica need not wait for it to expire.
        procs[standby].terminate()
        # Waited for off the loop: the emulator serving the release runs on this loop.
        assert await asyncio.to_thread(procs[standby].wait, 20) == 0
        assert holder(c) == ""
        lease = c.emulator.obj(LEASES, c.namespace, LEASE)
        assert lease["spec"]["leaseTransitions"] >= 1
    finally:
        kill_all(procs)


async def test_a_leader_that_loses_its_lease_exits_to_restart_as_a_standby(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    proc = replica(c, tmp_path / "replica.log")
    try:
        await wait_for(lambda: holder(c), what="a leader")
        # Another replica (played here) holds the Lease now and keeps renewing it: the leader cannot renew.
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            now = micro_time(datetime.now(UTC))
            spec = {
                "holderIdentity": "intruder",
                "renewTime": now,
                "acquireTime": now,
                "leaseDurationSeconds": 3,
            }
            await c.emulator.play(LEASES, c.namespace, LEASE, {"spec": spec}, subresource="")
            await asyncio.sleep(0.2)
        assert proc.poll() == 1, (tmp_path / "replica.log").read_text()[-2000:]
        assert "lost the lease" in (tmp_path / "replica.log").read_text()
        assert holder(c) == "intruder"  # it did not release what it no longer held
    finally:
        kill_all([proc])


async def test_a_standby_stops_at_once_and_leaves_the_lease_alone(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    logs = [tmp_path / "replica-0.log", tmp_path / "replica-1.log"]
    procs = [replica(c, log) for log in logs]
    try:
        leader = await wait_for(lambda: holder(c), what="a leader")
        await wait_for(lambda: any("leading as" in log.read_text() for log in logs), what="the leader's log")
        standby = next(i for i, log in enumerate(logs) if "leading as" not in log.read_text())
        await wait_for(lambda: "standing by" in logs[standby].read_text(), what="the standby's log")
        # A standby holds no kopf, so our own signal handler stops it while it waits for the Lease.
        procs[standby].terminate()
        started = time.monotonic()
        assert await asyncio.to_thread(procs[standby].wait, 20) == 0, logs[standby].read_text()[-2000:]
        assert time.monotonic() - started < 4.5
        assert holder(c) == leader
    finally:
        kill_all(procs)
