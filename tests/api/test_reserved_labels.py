"""The labels an author may not set (`distillery.api.labels`), refused where they are written, one line
naming the field and the key: each reserved prefix and key in spec.labels of a DistillationJob and of a
DistillationTeacher and in every pod section's podLabels. Labels beside them stay accepted. (The CRD's
CEL twin of each rule is checked against the same cases in tests/api/corpus.py.)"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from api.corpus import BASE, mutated, split_path

from distillery.api.labels import RESERVED_LABEL_KEYS, RESERVED_LABEL_PREFIXES, reserved_by, without_reserved
from distillery.validation import InvalidManifest, parse_job, parse_teacher

ROOT = Path(__file__).resolve().parents[2]
TEACHER = yaml.safe_load((ROOT / "examples" / "teachers" / "qwen-7b.yaml").read_text())
RESERVED = [
    ("distillery.io/uses-teacher-victim", "distillery.io/*"),
    ("distillery.io/ray-node", "distillery.io/*"),
    ("ray.io/node-type", "ray.io/*"),
    ("ray.io/cluster", "ray.io/*"),
    ("app.kubernetes.io/created-by", "app.kubernetes.io/created-by"),
    ("app.kubernetes.io/managed-by", "app.kubernetes.io/managed-by"),
]
POD_SECTIONS = ["spec.student.pool", "spec.student.head", "spec.teachers[0].pool"]


def test_every_reserved_prefix_and_key_is_a_case() -> None:
    assert {r for _, r in RESERVED} == {p + "*" for p in RESERVED_LABEL_PREFIXES} | set(RESERVED_LABEL_KEYS)


def _one_line(parse: Any, document: dict[str, Any]) -> str:
    with pytest.raises(InvalidManifest) as refused:
        parse(document, "job.yaml")
    (line,) = str(refused.value).splitlines()
    return line


@pytest.mark.parametrize(("key", "reason"), RESERVED)
def test_a_jobs_spec_labels_refuse_each_reserved_key(key: str, reason: str) -> None:
    document = mutated(BASE, {"spec.labels": {"team": "ml", key: "x"}})
    assert _one_line(parse_job, document) == (
        f"job.yaml: spec.labels: '{key}' is reserved for the operator ({reason})"
    )


def _with_pod_labels(section: str, labels: dict[str, str]) -> dict[str, Any]:
    """BASE with `labels` as the podLabels of the pod section at `section` (made where BASE has none)."""
    document = copy.deepcopy(BASE)
    node: Any = document
    for part in split_path(section):
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node["podLabels"] = labels
    return document


@pytest.mark.parametrize("section", POD_SECTIONS)
@pytest.mark.parametrize(("key", "reason"), RESERVED)
def test_each_pod_sections_pod_labels_refuse_each_reserved_key(section: str, key: str, reason: str) -> None:
    document = _with_pod_labels(section, {key: "x"})
    # podLabels' prefixes include app.kubernetes.io/ as a whole (the Services select the pods by it).
    expected = "app.kubernetes.io/*" if key.startswith("app.kubernetes.io/") else reason
    assert _one_line(parse_job, document) == (
        f"job.yaml: {section}.podLabels: '{key}' is reserved for the operator ({expected})"
    )


@pytest.mark.parametrize(("key", "reason"), RESERVED)
def test_a_distillation_teachers_spec_labels_refuse_each_reserved_key(key: str, reason: str) -> None:
    document = copy.deepcopy(TEACHER)
    document["spec"]["labels"] = {key: "x"}
    assert _one_line(parse_teacher, document) == (
        f"job.yaml: spec.labels: '{key}' is reserved for the operator ({reason})"
    )


def test_labels_outside_the_reserved_set_are_accepted() -> None:
    fine = {"team": "ml", "example.com/cost-center": "c42", "app.kubernetes.io/version": "1"}
    # Only a prefix up to its "/" reserves: a domain that merely starts the same is the author's.
    fine["distillery.io.example/x"] = "y"
    job = parse_job(mutated(_with_pod_labels("spec.student.pool", {"team": "ml"}), {"spec.labels": fine}))
    assert job.spec.labels == fine
    document = copy.deepcopy(TEACHER)
    document["spec"]["labels"] = fine
    assert parse_teacher(document).spec.labels == fine
    # metadata.labels is not the spec's: accepted (Helm's managed-by among them), dropped by the operator.
    helm = parse_job(mutated(BASE, {"metadata.labels": {"app.kubernetes.io/managed-by": "Helm"}}))
    assert helm.metadata.labels == {"app.kubernetes.io/managed-by": "Helm"}


def test_without_reserved_keeps_exactly_the_unreserved() -> None:
    labels = {key: "x" for key, _ in RESERVED} | {"team": "ml", "kueue.x-k8s.io/queue-name": "q"}
    assert without_reserved(labels) == {"team": "ml", "kueue.x-k8s.io/queue-name": "q"}
    assert all(reserved_by(key) == reason for key, reason in RESERVED)
