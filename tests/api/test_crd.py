"""The checked-in CRD is the one generated from the models, and it is a valid structural schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from distillery.api import DistillationJobSpec, Loss
from distillery.crd import CRD_FILE, build_crd, render_crd_yaml, unbounded

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_crd_matches_models() -> None:
    checked_in = (ROOT / "crds" / CRD_FILE).read_text()
    assert checked_in == render_crd_yaml(), "crds/ is stale: run `distillery crd > crds/" + CRD_FILE + "`"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        out.extend(_walk(sub, f"{path}.{name}"))
    if isinstance(node.get("items"), dict):
        out.extend(_walk(node["items"], f"{path}[]"))
    if isinstance(node.get("additionalProperties"), dict):
        out.extend(_walk(node["additionalProperties"], f"{path}{{}}"))
    return out


def test_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
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


def test_every_spec_string_list_and_map_is_bounded() -> None:
    """The API server prices CEL rules by these bounds; an unbounded one made it refuse the CRD."""
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert unbounded(spec) == []
    assert unbounded({"type": "object", "properties": {"a": {"type": "string"}}}, "x") == ["x.a"]


def test_crd_yaml_round_trips() -> None:
    assert yaml.safe_load(render_crd_yaml()) == build_crd()


def test_every_spec_integer_is_bounded_within_what_json_holds() -> None:
    """The server decodes integers as int64 and takes a schema bound only if a float64 holds it exactly."""
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in _walk(spec, "spec"):
        if node.get("type") == "integer":
            assert "minimum" in node and "maximum" in node, path
            assert -(2**53 - 1) <= node["minimum"] <= node["maximum"] <= 2**53 - 1, path
