"""The DistillationTeacher CRD judged by the real kube-apiserver: it is accepted and Established with its
short name and printer columns, a valid teacher is stored with exactly the models' defaults, and the
invalid ones (the scaling bounds, minReplicas over maxReplicas through CEL, the pool rules shared with a job's teacher) are
refused by the server naming the field, as pydantic refuses them."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

sys.path.insert(0, str(Path(__file__).parent))

from harness import REPO, Installation, kubectl, yaml_stream

from distillery.api import DistillationTeacher
from distillery.crd import build_teacher_crd

VALID: dict[str, Any] = {
    "apiVersion": "distillery.io/v1alpha1",
    "kind": "DistillationTeacher",
    "metadata": {"name": "qwen-7b"},
    "spec": {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "pool": {"gpusPerReplica": 2, "tensorParallel": 2},
        "scaling": {"minReplicas": 0, "maxReplicas": 4, "targetWaitingPerReplica": 2, "idleSeconds": 60},
    },
}

# (id, spec changes, the field the server and pydantic must name)
INVALID = [
    ("min-over-max", {"scaling": {"minReplicas": 3, "maxReplicas": 2}}, "spec.scaling.minReplicas"),
    ("min-negative", {"scaling": {"minReplicas": -1}}, "spec.scaling.minReplicas"),
    ("max-zero", {"scaling": {"maxReplicas": 0}}, "spec.scaling.maxReplicas"),
    ("max-over-bound", {"scaling": {"maxReplicas": 257}}, "spec.scaling.maxReplicas"),
    ("target-negative", {"scaling": {"targetWaitingPerReplica": -1}}, "spec.scaling.targetWaitingPerReplica"),
    ("idle-negative", {"scaling": {"idleSeconds": -1}}, "spec.scaling.idleSeconds"),
    (
        "gpus-not-multiple-of-tp",
        {"pool": {"gpusPerReplica": 3, "tensorParallel": 2}},
        "spec.pool.gpusPerReplica",
    ),
    ("model-missing", {"model": None}, "spec.model"),
    ("pvc-without-path", {"model": "pvc://models"}, "spec.model"),
]


def manifest(namespace: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(VALID)
    doc["metadata"]["namespace"] = namespace
    for key, value in (changes or {}).items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    return doc


def test_generated_teacher_crd_is_accepted_by_the_server(installation: Installation) -> None:
    result = installation.admin(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "-f",
        "-",
        input=yaml_stream([build_teacher_crd()]),
    )
    assert "distillationteachers.distillery.io" in result.stdout


def test_chart_teacher_crd_is_established(installation: Installation) -> None:
    crd = installation.get("crd", "distillationteachers.distillery.io", "")
    assert crd is not None
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {**conditions, "Established": "True", "NamesAccepted": "True"}
    assert crd["spec"]["names"]["shortNames"] == ["dt"]


def test_a_valid_teacher_is_stored_with_the_models_defaults(
    installation: Installation, namespace: str
) -> None:
    doc = manifest(namespace)
    installation.admin("apply", "-f", "-", input=yaml_stream([doc]))
    stored = json.loads(installation.admin("get", "dt", "qwen-7b", "-n", namespace, "-o", "json").stdout)
    ours = DistillationTeacher.model_validate(VALID).spec.model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    assert _without_empties(stored["spec"]) == _without_empties(ours)
    # The printer columns are served (empty until the operator writes a status).
    table = installation.admin("get", "dt", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "REPLICAS", "ENDPOINT", "AGE"]
    assert table[1].split()[0] == "qwen-7b"


@pytest.mark.parametrize(("case", "changes", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_the_server_and_pydantic_refuse_an_invalid_teacher_naming_the_field(
    installation: Installation, namespace: str, case: str, changes: dict[str, Any], field: str
) -> None:
    doc = manifest(namespace, changes)
    with pytest.raises(ValidationError) as refused:
        DistillationTeacher.model_validate(doc)
    ours = {".".join(str(p) for p in e["loc"]) for e in refused.value.errors(include_url=False)}
    alias = {"min_replicas": "minReplicas", "max_replicas": "maxReplicas"}
    ours = {".".join(alias.get(part, part) for part in loc.split(".")) for loc in ours}
    assert any(loc == field or loc.startswith(field + ".") for loc in ours), (case, ours)
    result = kubectl(
        installation.plane.admin_kubeconfig,
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        input=yaml_stream([doc]),
        check=False,
    )
    assert result.returncode != 0, f"{case}: the server accepted it"
    assert field in result.stderr, f"{case}: {result.stderr}"


@pytest.mark.parametrize(
    "example", sorted((REPO / "examples" / "teachers").glob("*.yaml")), ids=lambda p: p.name
)
def test_example_teacher_is_accepted_with_the_models_defaults(
    installation: Installation, namespace: str, example: Path
) -> None:
    doc = yaml.safe_load(example.read_text())
    doc["metadata"]["namespace"] = namespace
    result = installation.admin(
        "apply", "--dry-run=server", "-o", "json", "-f", "-", input=yaml_stream([doc])
    )
    ours = DistillationTeacher.model_validate(doc).spec.model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    assert _without_empties(json.loads(result.stdout)["spec"]) == _without_empties(ours)


def _without_empties(node: Any) -> Any:
    if isinstance(node, dict):
        kept = {k: _without_empties(v) for k, v in node.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [])}
    if isinstance(node, list):
        return [_without_empties(v) for v in node]
    return node
