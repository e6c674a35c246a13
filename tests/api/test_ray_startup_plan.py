"""The raylet's wait for its agents, for every Ray node we start (distillery.plan.ray_startup)."""

from __future__ import annotations

from distillery.plan.ray_startup import AGENT_REGISTER_TIMEOUT_MS, AGENT_REGISTER_TIMEOUT_VAR, ray_startup_env


def test_two_minutes_unless_the_caller_says_otherwise() -> None:
    assert ray_startup_env() == {AGENT_REGISTER_TIMEOUT_VAR: "120000"} == ray_startup_env({"OTHER": "1"})
    assert AGENT_REGISTER_TIMEOUT_MS == 120_000
    assert ray_startup_env({AGENT_REGISTER_TIMEOUT_VAR: "5000"}) == {AGENT_REGISTER_TIMEOUT_VAR: "5000"}
