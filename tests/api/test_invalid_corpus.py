"""A corpus of invalid manifests: the CLI rejects each naming the field, and the CRD schema agrees.

Each case mutates a valid base manifest. `crd` says what the API server (our generated CRD, checked
offline with jsonschema + cel-python) does with the same object: AGREE means it rejects it at the same
field path; otherwise the string documents why the two cannot agree.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.openapi import validate as crd_validate

from distillery.cli import main as cli_main
from distillery.validation import InvalidManifest, parse_job

AGREE = "agree"
NOT_IN_SCHEMA = (
    "checked by the API server outside the CRD schema (routing by apiVersion/kind, metadata validation)"
)

DELETE = object()


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = [int(p) if p.isdigit() else p for p in re.split(r"\.|\[|\]", path) if p]
    node: Any = doc
    for part in parts[:-1]:
        node = node[part]
    if value is DELETE:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (id, {path: value}, field path the CLI must name, CRD verdict)
    ("student-model-missing", {"spec.student.model": DELETE}, "spec.student.model", AGREE),
    ("student-model-empty", {"spec.student.model": ""}, "spec.student.model", AGREE),
    ("student-missing", {"spec.student": DELETE}, "spec.student", AGREE),
    ("teachers-empty", {"spec.teachers": []}, "spec.teachers", AGREE),
    ("teachers-missing", {"spec.teachers": DELETE}, "spec.teachers", AGREE),
    ("teachers-not-a-list", {"spec.teachers": {"name": "x"}}, "spec.teachers", AGREE),
    ("teacher-names-duplicate", {"spec.teachers[1].name": "math"}, "spec.teachers", AGREE),
    ("external-without-endpoint", {"spec.teachers[1].endpoint": DELETE}, "spec.teachers[1].endpoint", AGREE),
    (
        "standalone-with-endpoint",
        {"spec.teachers[0].endpoint": "http://x:1"},
        "spec.teachers[0].endpoint",
        AGREE,
    ),
    ("placement-unknown", {"spec.teachers[0].placement": "remote"}, "spec.teachers[0].placement", AGREE),
    ("teacher-name-uppercase", {"spec.teachers[0].name": "Math"}, "spec.teachers[0].name", AGREE),
    ("teacher-name-too-long", {"spec.teachers[0].name": "t" * 41}, "spec.teachers[0].name", AGREE),
    ("endpoint-not-http", {"spec.teachers[1].endpoint": "ftp://x"}, "spec.teachers[1].endpoint", AGREE),
    ("two-defaults", {"spec.teachers[0].default": True}, "spec.teachers", AGREE),
    ("no-route-no-default", {"spec.teachers[1].default": False}, "spec.teachers", AGREE),
    (
        "route-listed-twice",
        {"spec.teachers[1].routes": ["math"], "spec.teachers[1].default": False},
        "spec.teachers",
        AGREE,
    ),
    ("teacher-replicas-negative", {"spec.teachers[0].replicas": -1}, "spec.teachers[0].replicas", AGREE),
    (
        "teacher-gpus-not-multiple-of-tp",
        {"spec.teachers[0].pool": {"gpusPerReplica": 3, "tensorParallel": 2}},
        "spec.teachers[0].pool.gpusPerReplica",
        AGREE,
    ),
    (
        "hf-secret-without-key",
        {"spec.teachers[0].inference": {"hfTokenSecret": {"name": "hf"}}},
        "spec.teachers[0].inference.hfTokenSecret.key",
        AGREE,
    ),
    (
        "toleration-operator",
        {"spec.teachers[0].pool": {"tolerations": [{"key": "a", "operator": "Maybe"}]}},
        "spec.teachers[0].pool.tolerations[0].operator",
        AGREE,
    ),
    (
        "colocated-without-student-gpus",
        {
            "spec.teachers[1]": {"name": "co", "model": "m", "placement": "colocated", "default": True},
            "spec.student.pool": {"gpusPerWorker": 0},
        },
        "spec.teachers",
        AGREE,
    ),
    (
        "colocated-memory-over-the-gpu",
        {
            "spec.teachers[1]": {
                "name": "co",
                "model": "m",
                "placement": "colocated",
                "default": True,
                "inference": {"memoryFraction": 0.5},
            },
            "spec.student.rollout": {"memoryFraction": 0.5},
        },
        "spec.teachers",
        AGREE,
    ),
    (
        "colocated-default-share-left-empty",
        {
            "spec.teachers[1]": {"name": "co", "model": "m", "placement": "colocated", "default": True},
            "spec.student.rollout": {"memoryFraction": 0.88},
        },
        "spec.teachers",
        AGREE,
    ),
    ("pvc-without-path", {"spec.student.model": "pvc://models"}, "spec.student.model", AGREE),
    ("pvc-tokenizer-empty-claim", {"spec.student.tokenizer": "pvc:///tok"}, "spec.student.tokenizer", AGREE),
    ("pvc-claim-uppercase", {"spec.data.train.path": "pvc://Data/x.jsonl"}, "spec.data.train.path", AGREE),
    ("pvc-teacher-model", {"spec.teachers[0].model": "pvc://-models/x"}, "spec.teachers[0].model", AGREE),
    ("loss-mode-unknown", {"spec.loss.mode": "kl"}, "spec.loss.mode", AGREE),
    ("topk-zero-forward-kl", {"spec.loss.topK": 0}, "spec.loss.topK", AGREE),
    ("topk-zero-jsd", {"spec.loss": {"mode": "jsd", "topK": 0}}, "spec.loss.topK", AGREE),
    ("topk-too-large", {"spec.loss.topK": 5000}, "spec.loss.topK", AGREE),
    ("k1-direct", {"spec.loss": {"mode": "k1", "objective": "direct"}}, "spec.loss.objective", AGREE),
    ("pg-with-topk-mode", {"spec.loss.objective": "policy_gradient"}, "spec.loss.objective", AGREE),
    ("beta-above-one", {"spec.loss": {"mode": "jsd", "topK": 8, "beta": 1.5}}, "spec.loss.beta", AGREE),
    ("beta-negative", {"spec.loss": {"mode": "jsd", "topK": 8, "beta": -0.1}}, "spec.loss.beta", AGREE),
    ("loss-temperature-zero", {"spec.loss.temperature": 0}, "spec.loss.temperature", AGREE),
    ("add-tail-with-k3", {"spec.loss": {"mode": "k3", "addTail": True}}, "spec.loss.addTail", AGREE),
    ("reduction-unknown", {"spec.loss.reduction": "mean"}, "spec.loss.reduction", AGREE),
    ("lambda-without-responses", {"spec.loss.onPolicyFraction": 0.5}, "spec.loss.onPolicyFraction", AGREE),
    ("lambda-above-one", {"spec.loss.onPolicyFraction": 2.0}, "spec.loss.onPolicyFraction", AGREE),
    ("clamp-negative", {"spec.loss.lossMaxClamp": -1.0}, "spec.loss.lossMaxClamp", AGREE),
    ("steps-zero", {"spec.schedule": {"steps": 0}}, "spec.schedule.steps", AGREE),
    ("steps-string", {"spec.schedule": {"steps": "ten"}}, "spec.schedule.steps", AGREE),
    ("steps-numeric-string", {"spec.schedule": {"steps": "10"}}, "spec.schedule.steps", AGREE),
    (
        "micro-batch-above-step",
        {"spec.schedule": {"promptsPerStep": 4, "microBatchSize": 8}},
        "spec.schedule.microBatchSize",
        AGREE,
    ),
    ("eval-every-without-eval", {"spec.schedule": {"evalEvery": 5}}, "spec.schedule.evalEvery", AGREE),
    ("checkpoint-keep-zero", {"spec.checkpoint": {"keep": 0}}, "spec.checkpoint.keep", AGREE),
    ("resume-policy-unknown", {"spec.checkpoint": {"resume": "sometimes"}}, "spec.checkpoint.resume", AGREE),
    ("checkpoint-pvc-bad-name", {"spec.checkpoint": {"pvc": "My_PVC"}}, "spec.checkpoint.pvc", AGREE),
    ("top-p-zero", {"spec.student.rollout": {"topP": 0}}, "spec.student.rollout.topP", AGREE),
    (
        "rollout-temperature-negative",
        {"spec.student.rollout": {"temperature": -1}},
        "spec.student.rollout.temperature",
        AGREE,
    ),
    (
        "max-new-tokens-zero",
        {"spec.student.rollout": {"maxNewTokens": 0}},
        "spec.student.rollout.maxNewTokens",
        AGREE,
    ),
    (
        "rollout-engine-unknown",
        {"spec.student.rollout": {"engine": "sglang"}},
        "spec.student.rollout.engine",
        AGREE,
    ),
    ("lr-zero", {"spec.student.optimizer": {"lr": 0}}, "spec.student.optimizer.lr", AGREE),
    ("lr-string", {"spec.student.optimizer": {"lr": "fast"}}, "spec.student.optimizer.lr", AGREE),
    (
        "betas-wrong-length",
        {"spec.student.optimizer": {"betas": [0.9]}},
        "spec.student.optimizer.betas",
        AGREE,
    ),
    ("workers-zero", {"spec.student.pool": {"workers": 0}}, "spec.student.pool.workers", AGREE),
    (
        "node-selector-not-strings",
        {"spec.student.pool": {"nodeSelector": {"a": 1}}},
        "spec.student.pool.nodeSelector.a",
        AGREE,
    ),
    ("data-train-missing", {"spec.data.train": DELETE}, "spec.data.train", AGREE),
    ("data-format-unknown", {"spec.data.train.format": "csv"}, "spec.data.train.format", AGREE),
    ("max-prompt-tokens-zero", {"spec.data.maxPromptTokens": 0}, "spec.data.maxPromptTokens", AGREE),
    ("overlong-policy-unknown", {"spec.data.overlongPrompts": "drop"}, "spec.data.overlongPrompts", AGREE),
    ("suspend-not-bool", {"spec.suspend": "yes"}, "spec.suspend", AGREE),
    ("backoff-negative", {"spec.backoffLimit": -1}, "spec.backoffLimit", AGREE),
    ("deadline-zero", {"spec.activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", AGREE),
    ("labels-not-strings", {"spec.labels": {"team": 7}}, "spec.labels.team", AGREE),
    ("unknown-spec-field", {"spec.studnet": {"model": "x"}}, "spec.studnet", AGREE),
    ("unknown-loss-field", {"spec.loss.topk": 8}, "spec.loss.topk", AGREE),
    ("unknown-teacher-field", {"spec.teachers[1].endpont": "http://x"}, "spec.teachers[1].endpont", AGREE),
    ("api-version-wrong", {"apiVersion": "distillery.io/v1"}, "apiVersion", NOT_IN_SCHEMA),
    ("kind-wrong", {"kind": "DistillJob"}, "kind", NOT_IN_SCHEMA),
    ("name-missing", {"metadata.name": DELETE}, "metadata.name", NOT_IN_SCHEMA),
]


def _mutated(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    for path, value in changes.items():
        _set(doc, path, value)
    return doc


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


def test_base_manifest_is_valid(base_manifest: dict[str, Any], crd_schema: dict[str, Any]) -> None:
    parse_job(base_manifest)
    assert crd_validate(base_manifest, crd_schema) == []


@pytest.mark.parametrize(("case", "changes", "field", "crd"), CASES, ids=[c[0] for c in CASES])
def test_cli_rejects_naming_the_field(
    base_manifest: dict[str, Any], case: str, changes: dict[str, Any], field: str, crd: str
) -> None:
    with pytest.raises(InvalidManifest) as raised:
        parse_job(_mutated(base_manifest, changes), source=f"{case}.yaml")
    paths = [p.path for p in raised.value.problems]
    # A list error may name the element (betas[1]); it still names the field.
    assert any(p == field or p.startswith(field + "[") for p in paths), (
        f"{case}: expected {field}, got {raised.value}"
    )
    assert all(p.reason for p in raised.value.problems)


@pytest.mark.parametrize(("case", "changes", "field", "crd"), CASES, ids=[c[0] for c in CASES])
def test_crd_schema_agrees(
    base_manifest: dict[str, Any],
    crd_schema: dict[str, Any],
    case: str,
    changes: dict[str, Any],
    field: str,
    crd: str,
) -> None:
    doc = _mutated(base_manifest, changes)
    errors = crd_validate(
        {k: v for k, v in doc.items() if k in ("spec",)} | {"metadata": doc.get("metadata", {})}, crd_schema
    )
    if crd == AGREE:
        paths = [e.path for e in errors]
        # jsonschema reports a missing required property at its parent object.
        parent = field.rsplit(".", 1)[0] if "." in field else ""
        assert field in paths or parent in paths, f"{case}: CRD errors {errors} do not name {field}"
    else:
        # The schema alone accepts it; the reason it still never reaches the operator is documented above.
        assert errors == [], errors


def test_unknown_field_suggests_nearest(base_manifest: dict[str, Any]) -> None:
    with pytest.raises(InvalidManifest) as raised:
        parse_job(_mutated(base_manifest, {"spec.loss.topk": 8}))
    assert "did you mean 'topK'?" in str(raised.value)


def test_validate_cli_prints_one_line_per_problem(
    tmp_path: Path, base_manifest: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _mutated(base_manifest, {"spec.teachers[1].endpoint": DELETE, "spec.loss.beta": 3.0})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(base_manifest))
    assert cli_main(["validate", str(good)]) == 0
    assert cli_main(["validate", str(good), str(path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert sorted(lines) == sorted(
        [
            f"{path}: spec.teachers[1].endpoint: is required for placement external and not allowed for the other placements",
            f"{path}: spec.loss.beta: Input should be less than or equal to 1",
        ]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spec:\n  student: {model: x\n", "YAML syntax error: line 3, column 1"),
        ("spec:\n\tstudent: 1\n", "YAML syntax error: line 2, column 1"),
        ("", "no YAML document in the file"),
        ("- a\n- b\n", "expected a mapping"),
    ],
    ids=["unclosed-flow", "tab-indent", "empty-file", "not-a-mapping"],
)
def test_bad_yaml_names_line_and_column(
    tmp_path: Path, text: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    assert cli_main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: ") and expected in out, out
