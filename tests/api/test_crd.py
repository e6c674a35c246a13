"""The checked-in CRD is the one generated from the models, and it is a valid structural schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from distillery.api import DistillationJobSpec, DistillationTeacherSpec, Loss, Scaling
from distillery.crd import CRD_FILES, build_crd, build_teacher_crd, render_crd_yaml, unbounded

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", sorted(CRD_FILES))
def test_checked_in_crd_matches_models(kind: str) -> None:
    checked_in = (ROOT / "crds" / CRD_FILES[kind]).read_text()
    assert checked_in == render_crd_yaml(kind), (
        f"crds/ is stale: run `distillery crd --kind {kind} > crds/{CRD_FILES[kind]}`"
    )


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        out.extend(_walk(sub, f"{path}.{name}"))
    if isinstance(node.get("items"), dict):
        out.extend(_walk(node["items"], f"{path}[]"))
    if isinstance(node.get("additionalProperties"), dict):
        out.extend(_walk(node["additionalProperties"], f"{path}{{}}"))
    return out


@pytest.mark.parametrize("build", [build_crd, build_teacher_crd])
def test_schema_is_structural(build: Any) -> None:
    schema = build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        # Structural: every node typed (or int-or-string / preserve-unknown), no refs or unions.
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), path
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "prefixItems", "title", "const"):
            assert banned not in node, f"{path}: {banned}"
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("type") == "array":
            assert "items" in node, path


def test_crd_carries_the_contract() -> None:
    crd = build_crd()
    version = crd["spec"]["versions"][0]
    assert crd["metadata"]["name"] == "distillationjobs.distillery.io"
    assert crd["spec"]["names"]["shortNames"] == ["dj"]
    assert version["subresources"] == {"status": {}}
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {
        "Phase",
        "Step",
        "Steps",
        "Teachers",
        "Age",
    }
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    loss = spec["properties"]["loss"]["properties"]
    assert loss["mode"]["enum"] == [m.value for m in Loss.model_fields["mode"].annotation]  # type: ignore[union-attr]
    assert loss["beta"]["minimum"] == 0 and loss["beta"]["maximum"] == 1
    assert loss["temperature"]["exclusiveMinimum"] is True
    assert loss["topK"]["default"] == 0
    # An omitted object defaults to its filled-in value: the API server checks a default against the
    # object's CEL rules without applying nested defaults first.
    assert spec["properties"]["loss"]["default"] == Loss().model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    # Every Rule of every model is a CEL rule with the same message.
    rules = [r["message"] for _, node in _walk(spec) for r in node.get("x-kubernetes-validations", [])]
    assert set(rules) >= {r.message for r in DistillationJobSpec.rules} | {r.message for r in Loss.rules}
    # Descriptions come from the field docstrings.
    assert (
        "Unique within the job"
        in spec["properties"]["teachers"]["items"]["properties"]["name"]["description"]
    )


@pytest.mark.parametrize("build", [build_crd, build_teacher_crd])
def test_every_spec_string_list_and_map_is_bounded(build: Any) -> None:
    """The API server prices CEL rules by these bounds; an unbounded one made it refuse the CRD."""
    spec = build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert unbounded(spec) == []
    assert unbounded({"type": "object", "properties": {"a": {"type": "string"}}}, "x") == ["x.a"]


def test_crd_yaml_round_trips() -> None:
    assert yaml.safe_load(render_crd_yaml()) == build_crd()
    assert yaml.safe_load(render_crd_yaml("DistillationTeacher")) == build_teacher_crd()


@pytest.mark.parametrize("build", [build_crd, build_teacher_crd])
def test_every_spec_integer_is_bounded_within_what_json_holds(build: Any) -> None:
    """The server decodes integers as int64 and takes a schema bound only if a float64 holds it exactly."""
    spec = build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in _walk(spec, "spec"):
        if node.get("type") == "integer":
            assert "minimum" in node and "maximum" in node, path
            assert -(2**53 - 1) <= node["minimum"] <= node["maximum"] <= 2**53 - 1, path


def test_teacher_crd_carries_the_contract() -> None:
    crd = build_teacher_crd()
    version = crd["spec"]["versions"][0]
    assert crd["metadata"]["name"] == "distillationteachers.distillery.io"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == ["dt"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready",
        "Replicas",
        "Endpoint",
        "Age",
    ]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    scaling = spec["properties"]["scaling"]
    assert scaling["properties"]["minReplicas"]["minimum"] == 0
    assert scaling["properties"]["maxReplicas"]["minimum"] == 1
    assert scaling["default"] == Scaling().model_dump(by_alias=True, mode="json")
    assert [r["rule"] for r in scaling["x-kubernetes-validations"]] == [
        "self.minReplicas <= self.maxReplicas"
    ]
    # The pool and vLLM settings are the job's teacher models: the same schema in both CRDs.
    job_teacher = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    job_teacher = job_teacher["properties"]["teachers"]["items"]["properties"]
    assert spec["properties"]["pool"] == job_teacher["pool"]
    assert spec["properties"]["inference"] == job_teacher["inference"]
    rules = [r["message"] for _, node in _walk(spec) for r in node.get("x-kubernetes-validations", [])]
    assert set(rules) >= {r.message for r in DistillationTeacherSpec.rules}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(status) >= {"replicas", "readyReplicas", "endpoint", "jobs", "conditions"}
