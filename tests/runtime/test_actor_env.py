"""The environment every Ray actor gets (`local.actor_env`): what the driver's pod or shell sets wins, and
the Hugging Face hub is only switched off when the job names no hub id.

Found on first contact with a cluster: every actor got HF_HUB_OFFLINE=1 unless the pod set otherwise, so
the rollout engine and the colocated teachers of every cluster example (all Hugging Face ids) could not
load their models on a fresh pod.
"""

from __future__ import annotations

from pathlib import Path

from distillery_runtime.data.uris import is_hub_id
from distillery_runtime.run.local import actor_env


def test_hub_ids_leave_the_hub_reachable() -> None:
    env = actor_env({}, ["Qwen/Qwen2.5-1.5B-Instruct", "/models/teacher"])
    assert "HF_HUB_OFFLINE" not in env


def test_local_models_only_switch_the_hub_off(tmp_path: Path) -> None:
    (tmp_path / "student").mkdir()
    env = actor_env({}, [str(tmp_path / "student"), "pvc://models/teacher", "synthetic://addition/student"])
    assert env["HF_HUB_OFFLINE"] == "1"


def test_the_driver_environment_wins() -> None:
    assert actor_env({"HF_HUB_OFFLINE": "0"}, ["/models/x"])["HF_HUB_OFFLINE"] == "0"
    assert actor_env({"HF_HUB_OFFLINE": "1"}, ["Qwen/Qwen2.5-7B"])["HF_HUB_OFFLINE"] == "1"
    assert actor_env({"VLLM_CPU_KVCACHE_SPACE": "4"}, [])["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_hub_ids(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "model").mkdir()
    assert is_hub_id("Qwen/Qwen2.5-7B-Instruct")
    assert is_hub_id("gpt2")
    assert not is_hub_id("org/model")  # an existing relative folder
    assert not is_hub_id("/abs/path")
    assert not is_hub_id("./student")
    assert not is_hub_id("pvc://models/student")
    assert not is_hub_id("s3://bucket/model")
