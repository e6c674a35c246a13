"""Shared teachers without a cluster, the pure parts: a DistillationTeacher's engine settings (the flags
that `distillery serve-teacher` and the operator's Deployment pass), a local run's `--shared-teacher NAME=URL`
mapping in the runtime config (and its one-line refusal when a teacher has none), the DistillationTeacher
loader, and the job's demands against what a served teacher reports at /distillery/v1/info."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import pytest
from distillery_cli.main import build_parser
from distillery_runtime.teachers.checks.served_limits import served_limit_problems

from distillery.api import DistillationTeacher, Placement
from distillery.plan.shared_teacher import SHARED_MAX_MODEL_LEN, shared_teacher_engine
from distillery.runtime_config import TeacherProtocol, UnservedSharedTeacher, resolve_runtime_config
from distillery.validation import InvalidManifest, load_teacher, parse_job, parse_teacher

ROOT = Path(__file__).resolve().parents[2]


def shared_job(base: dict[str, Any], *refs: str) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    doc["spec"]["teachers"] = [
        {
            "name": f"t{i}",
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "placement": "shared",
            "teacherRef": {"name": ref},
        }
        for i, ref in enumerate(refs)
    ]
    for i, teacher in enumerate(doc["spec"]["teachers"][1:], start=1):
        teacher["routes"] = [f"r{i}"]
    if len(refs) > 1:
        doc["spec"]["teachers"][0]["default"] = True
    return doc


def test_the_example_teacher_becomes_the_servers_flags() -> None:
    teacher = load_teacher(ROOT / "examples" / "teachers" / "qwen-7b.yaml")
    engine = shared_teacher_engine(teacher.metadata.name, teacher.spec)
    assert engine.served_model_name == "qwen-7b" and engine.max_logprobs == 20
    assert engine.max_model_len == SHARED_MAX_MODEL_LEN and engine.on_gpu and not engine.enforce_eager
    args = engine.server_args()
    assert args[:6] == ["--served-model-name", "qwen-7b", "--max-logprobs", "20", "--max-model-len", "4096"]
    assert "--gpu-memory-utilization" in args and "--enforce-eager" not in args


def test_a_teachers_inference_and_pool_settings_are_passed_through() -> None:
    teacher = DistillationTeacher.model_validate(
        {
            "metadata": {"name": "big"},
            "spec": {
                "model": "/models/big",
                "maxLogprobs": 64,
                "pool": {"gpusPerReplica": 0, "tensorParallel": 1},
                "inference": {"maxModelLen": 1024, "dtype": "float32", "extraArgs": ["--seed", "3"]},
            },
        }
    )
    engine = shared_teacher_engine("big", teacher.spec)
    assert (engine.max_logprobs, engine.max_model_len, engine.dtype) == (64, 1024, "float32")
    assert not engine.on_gpu and engine.extra_args == ("--seed", "3")
    assert "--gpu-memory-utilization" not in engine.server_args()  # CPU: vLLM sizes its cache otherwise
    assert engine.server_args()[-2:] == ["--seed", "3"]


def test_a_teacher_manifest_is_validated_with_every_problem_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidManifest) as raised:
        parse_teacher(
            {
                "apiVersion": "distillery.io/v1alpha1",
                "kind": "DistillationTeacher",
                "metadata": {"name": "x"},
                "spec": {"model": "m", "maxLogprobs": 0, "scaling": {"minReplicas": 3, "maxReplicas": 2}},
            },
            "t.yaml",
        )
    paths = {p.path for p in raised.value.problems}
    assert "spec.maxLogprobs" in paths and "spec.scaling.minReplicas" in paths
    with pytest.raises(InvalidManifest, match="kind"):
        parse_teacher({"apiVersion": "distillery.io/v1alpha1", "kind": "DistillationJob", "metadata": {}})


def test_a_local_run_reaches_a_shared_teacher_at_the_url_it_is_given(base_manifest: dict[str, Any]) -> None:
    job = parse_job(shared_job(base_manifest, "qwen-7b", "qwen-7b"))
    config = resolve_runtime_config(
        job,
        None,
        in_cluster=False,
        shared_teachers={"qwen-7b": "http://127.0.0.1:8123/", "other": "http://x:1"},
    )
    for teacher in config.teachers:
        assert teacher.placement == Placement.SHARED and teacher.protocol == TeacherProtocol.COMPACT
        assert teacher.endpoints == ["http://127.0.0.1:8123"] and teacher.served_model_name == "qwen-7b"
    # In a cluster the Service is the teacher's address, whatever a mapping says.
    cluster = resolve_runtime_config(
        job, "team-a", in_cluster=True, shared_teachers={"qwen-7b": "http://x:1"}
    )
    assert cluster.teachers[0].endpoints == ["http://qwen-7b.team-a.svc:8000"]


def test_a_local_run_of_a_shared_teacher_without_a_server_is_one_line_per_teacher(
    base_manifest: dict[str, Any],
) -> None:
    job = parse_job(shared_job(base_manifest, "qwen-7b", "llama"))
    with pytest.raises(UnservedSharedTeacher) as raised:
        resolve_runtime_config(job, None, in_cluster=False, shared_teachers={"qwen-7b": "http://127.0.0.1:1"})
    assert str(raised.value) == (
        "spec.teachers[1].teacherRef: DistillationTeacher llama has no local server; start one with "
        "distillery serve-teacher and pass --shared-teacher llama=URL"
    )
    with pytest.raises(UnservedSharedTeacher) as raised:
        resolve_runtime_config(job, None, in_cluster=False)
    assert len(str(raised.value).splitlines()) == 2


def test_the_cli_only_translates_name_url_pairs() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["run", "j.yaml", "--shared-teacher", "a=http://h:1", "--shared-teacher", "b=https://h:2/x"]
    )
    assert args.shared_teacher == [("a", "http://h:1"), ("b", "https://h:2/x")]
    assert parser.parse_args(["serve-teacher", "t.yaml", "--port", "0"]).port == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "j.yaml", "--shared-teacher", "no-url"])
    assert isinstance(parser.parse_args(["run", "j.yaml"]), argparse.Namespace)


def test_a_served_teachers_limits_below_the_jobs_are_refused_naming_the_field(
    base_manifest: dict[str, Any],
) -> None:
    doc = shared_job(base_manifest, "qwen-7b")
    doc["spec"]["loss"] = {"mode": "forward_kl_topk", "topK": 32}
    config = resolve_runtime_config(
        parse_job(doc), None, in_cluster=False, shared_teachers={"qwen-7b": "http://127.0.0.1:9"}
    )
    needed = config.teachers[0].max_model_len
    fine = {"t0": {"max_logprobs": 32, "max_model_len": needed, "model": ["qwen-7b"]}}
    assert served_limit_problems(config, fine) == []
    (top_k,) = served_limit_problems(config, {"t0": {**fine["t0"], "max_logprobs": 20}})
    assert top_k.startswith("spec.loss.topK: 32 is more than DistillationTeacher qwen-7b")
    assert "maxLogprobs 20" in top_k
    (length,) = served_limit_problems(config, {"t0": {**fine["t0"], "max_model_len": needed - 1}})
    assert length.startswith("spec.data.maxPromptTokens:") and str(needed) in length
    (name,) = served_limit_problems(config, {"t0": {**fine["t0"], "model": ["llama"]}})
    assert name.startswith("spec.teachers[0]:") and "serves llama, not qwen-7b" in name
