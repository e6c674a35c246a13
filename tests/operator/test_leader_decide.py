"""Leader election's pure part: what a replica does with the Lease as it reads it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from distillery_operator.k8s.leader import LeaseSettings, decide, lease_spec, micro_time, record

NOW = datetime(2026, 11, 26, 4, 30, tzinfo=UTC)
SETTINGS = LeaseSettings(namespace="ops", identity="me")


def lease(holder: str | None, renewed: datetime | None, duration: int = 15, transitions: int = 0) -> dict:
    spec: dict = {"leaseDurationSeconds": duration, "leaseTransitions": transitions}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed is not None:
        spec["renewTime"] = micro_time(renewed)
        spec["acquireTime"] = micro_time(renewed - timedelta(minutes=5))
    return {"metadata": {"name": "distillery-operator", "resourceVersion": "7"}, "spec": spec}


@pytest.mark.parametrize(
    ("current", "unchanged_for", "action"),
    [
        (None, 0.0, "create"),
        (lease("me", NOW - timedelta(seconds=60)), 60.0, "renew"),  # ours, even if late: renew it
        (lease("other", NOW - timedelta(seconds=3)), 3.0, "wait"),  # held and renewed lately
        (lease("other", NOW - timedelta(seconds=15)), 15.0, "take"),  # unrenewed for its whole duration
        (lease("other", NOW - timedelta(seconds=3), duration=2), 3.0, "take"),  # the holder's own duration
        (lease("", NOW), 0.0, "take"),  # released
        (lease(None, None), 0.0, "take"),  # never held
        # Only our own clock counts: a renewTime an hour old (a skewed node) is live while it changes,
        # and a fresh-looking one is dead once it has not changed for the duration.
        (lease("other", NOW - timedelta(hours=1)), 1.0, "wait"),
        (lease("other", NOW + timedelta(hours=1)), 16.0, "take"),
    ],
)
def test_decide(current: dict | None, unchanged_for: float, action: str) -> None:
    assert decide(current, "me", unchanged_for, SETTINGS.lease_seconds) == action


def test_a_renewal_changes_the_record_a_standby_watches() -> None:
    held = lease("other", NOW - timedelta(seconds=2))
    renewed = {**held, "spec": {**held["spec"], "renewTime": micro_time(NOW)}}
    assert record(renewed) != record(held)
    assert record(held) == record({**held, "metadata": {"resourceVersion": "8"}})  # other writes: no


def test_renewing_keeps_acquire_time_and_transitions() -> None:
    old = lease("me", NOW - timedelta(seconds=2), transitions=3)
    spec = lease_spec("me", NOW, SETTINGS, old)
    assert spec["acquireTime"] == old["spec"]["acquireTime"]
    assert spec["renewTime"] == micro_time(NOW) == "2026-11-26T04:30:00.000000Z"
    assert spec["leaseTransitions"] == 3 and spec["holderIdentity"] == "me"


def test_taking_over_counts_a_transition_and_restarts_acquire_time() -> None:
    spec = lease_spec("me", NOW, SETTINGS, lease("other", NOW - timedelta(seconds=20), transitions=3))
    assert spec["leaseTransitions"] == 4 and spec["acquireTime"] == micro_time(NOW)
    assert lease_spec("me", NOW, SETTINGS, None)["leaseTransitions"] == 0


def test_settings_refuse_a_renew_deadline_past_the_lease() -> None:
    # A leader must give up before a standby may take over, or two would lead at once.
    with pytest.raises(ValueError, match="renew deadline"):
        LeaseSettings(namespace="ops", identity="me", lease_seconds=5, renew_deadline_seconds=5)
