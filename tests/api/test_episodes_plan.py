"""A tool-using student's plan (`distillery/plan/agents/episodes.py`): the turn's end strings, the episode's token
budget, and the context and memory it sizes, decided once; `distillery plan` prints them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from distillery_cli.main import main as cli_main

from distillery.api.environment import ToolCallFormat
from distillery.plan.agents.episodes import CHAT_TEMPLATE_CALL_END, resolve_episodes, response_tokens
from distillery.plan.memory.gpu import base_layout
from distillery.plan.rollout.settings import sequence_length
from distillery.plan.teachers.engines import max_model_len
from distillery.validation import parse_job


def _job(base: dict[str, Any], environment: dict[str, Any] | None, **rollout: Any) -> Any:
    doc = copy.deepcopy(base)
    doc["spec"]["student"]["rollout"] = rollout
    if environment is not None:
        doc["spec"]["environment"] = environment
    return parse_job(doc).spec


def test_no_environment_is_one_response(base_manifest: dict[str, Any]) -> None:
    spec = _job(base_manifest, None, maxNewTokens=300)
    assert resolve_episodes(spec) is None and response_tokens(spec) == 300


def test_chat_template_calls_end_at_the_tool_call_and_the_budget_defaults_to_every_turn(
    base_manifest: dict[str, Any],
) -> None:
    spec = _job(base_manifest, {"url": "http://calc:8000", "maxTurns": 4}, maxNewTokens=256)
    e = resolve_episodes(spec)
    assert e is not None and e.tool_call_format == ToolCallFormat.CHAT_TEMPLATE
    assert e.call_ends == (CHAT_TEMPLATE_CALL_END,)
    assert (e.max_tokens, e.turn_tokens, e.max_turns, e.step_timeout_s) == (1024, 256, 4, 30.0)
    assert e.source == "spec.environment.url http://calc:8000"


def test_stop_sequences_and_a_short_budget(base_manifest: dict[str, Any]) -> None:
    env = {"module": "t:C", "toolCallFormat": "stop_sequence", "stop": ["]", "]", "\n>>"], "maxTokens": 40}
    e = resolve_episodes(_job(base_manifest, env, maxNewTokens=64))
    assert e is not None and e.call_ends == ("]", "\n>>") and e.max_tokens == 40
    assert e.turn_tokens == 40  # a turn never outgrows its episode


def test_the_episode_sizes_the_engines_context_and_the_trainers_memory(base_manifest: dict[str, Any]) -> None:
    pool = {"workers": 1, "gpusPerWorker": 1, "gpuMemoryGiB": 80}
    plain = copy.deepcopy(base_manifest)
    plain["spec"]["student"].update(model="Qwen/Qwen2.5-1.5B-Instruct", pool=pool)
    one = _job(plain, None, maxNewTokens=256)
    episode = _job(plain, {"url": "http://calc:8000", "maxTurns": 4}, maxNewTokens=256)
    prompt = one.data.max_prompt_tokens
    assert sequence_length(one) == prompt + 256 + 1
    assert sequence_length(episode) == prompt + 1024 + 1
    teacher = episode.teachers[0]
    assert max_model_len(episode, teacher) == prompt + 1024 + 1
    small, large = base_layout(one), base_layout(episode)
    assert small is not None and large is not None
    assert large.response_tokens > small.response_tokens


def test_distillery_plan_prints_the_episodes(
    base_manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["environment"] = {"module": "tools.calc:Calculator", "maxTurns": 3, "stepTimeoutSeconds": 5}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    cli_main(["plan", str(path)])
    out = capsys.readouterr().out
    assert (
        "episodes: spec.environment.module tools.calc:Calculator, chat_template tool calls "
        "(a turn ends with a call at '</tool_call>')" in out
    )
    assert "up to 3 turns of at most 1024 tokens, 3072 tokens an episode" in out
    assert "5 s per environment call" in out
