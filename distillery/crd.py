"""Generates the DistillationJob and DistillationTeacher CustomResourceDefinitions from the pydantic models.

Pydantic's JSON schema is turned into a Kubernetes *structural* schema: references inlined, optional
fields without the `null` branch, `int | str` as `x-kubernetes-int-or-string`, exclusive bounds in the
OpenAPI v3.0 form, and each model's `Rule`s as CEL `x-kubernetes-validations`. `crds/` holds the output
(one file per kind, `CRD_FILES`); a test fails when the two drift.
"""

from __future__ import annotations

from typing import Any

import yaml

from distillery.api import (
    GROUP,
    KIND,
    PLURAL,
    TEACHER_KIND,
    TEACHER_PLURAL,
    VERSION,
    ApiModel,
    DistillationJobSpec,
    DistillationJobStatus,
    DistillationTeacherSpec,
    DistillationTeacherStatus,
)

CRD_FILE = "distillery.io_distillationjobs.yaml"
TEACHER_CRD_FILE = "distillery.io_distillationteachers.yaml"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Steps", "type": "integer", "jsonPath": ".spec.schedule.steps"},
    {"name": "Teachers", "type": "string", "jsonPath": ".status.teachersReady", "description": "ready/total"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

TEACHER_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _models_by_name() -> dict[str, type[ApiModel]]:
    """Every model reachable from the specs and statuses, by the name pydantic gives its schema definition
    (the two kinds share their teacher models, so a name means one model)."""
    found: dict[str, type[ApiModel]] = {}

    def walk(model: type[ApiModel]) -> None:
        if model.__name__ in found:
            return
        found[model.__name__] = model
        for field in model.model_fields.values():
            for arg in _type_args(field.annotation):
                if isinstance(arg, type) and issubclass(arg, ApiModel):
                    walk(arg)

    for root in (
        DistillationJobSpec,
        DistillationJobStatus,
        DistillationTeacherSpec,
        DistillationTeacherStatus,
    ):
        walk(root)
    return found


def _type_args(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", None)
    if not args:
        return [annotation]
    out: list[Any] = []
    for arg in args:
        out.extend(_type_args(arg))
    return out


SCALAR_TYPES = frozenset({"boolean", "integer", "number", "string"})


def _structural(node: Any, defs: dict[str, Any], models: dict[str, Any]) -> Any:
    """Rewrites one pydantic JSON-schema node into a structural OpenAPI v3.0 node."""
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        return _with_rules(_structural(merged, defs, models), models.get(name))
    branches = node.get("anyOf")
    if branches is not None:
        non_null = [b for b in branches if b.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "title")}
        types = {b.get("type") for b in non_null}
        if types == {"integer", "string"}:
            return _finish({**rest, "x-kubernetes-int-or-string": True})
        if len(types) > 2 and types <= SCALAR_TYPES:
            # A scalar of several types (a chat template variable) has no structural schema: the value is
            # kept as written, and the model's rule (the operator's check) refuses one that is no scalar.
            return _finish({**rest, "x-kubernetes-preserve-unknown-fields": True})
        if len(non_null) != 1:
            raise ValueError(f"cannot express union {branches} structurally")
        merged = {**_structural(non_null[0], defs, models), **rest}
        if merged.get("default", "absent") is None:
            merged.pop("default")
        return _finish(merged)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "properties":
            out[key] = {
                name: _with_object_default(prop, _structural(prop, defs, models))
                for name, prop in value.items()
            }
        elif key == "additionalProperties" and isinstance(value, dict):
            values = _structural(value, defs, models)
            if "type" in values or not values.get("x-kubernetes-preserve-unknown-fields"):
                out[key] = values
            else:
                # A map of untyped values is invisible to CEL (the API server drops it from the rules'
                # types: `has(self.map)` does not compile); an object that keeps unknown fields is seen.
                out["x-kubernetes-preserve-unknown-fields"] = True
        elif key == "items" and isinstance(value, dict):
            out[key] = _structural(value, defs, models)
        elif key == "prefixItems":
            # Fixed-length tuples: an array of the (single) item type with exact bounds.
            out["items"] = _structural(value[0], defs, models)
            out["minItems"] = out["maxItems"] = len(value)
        else:
            out[key] = value
    return _finish(out)


def _with_object_default(original: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """A nested object that is not optional defaults to its fully defaulted value.

    Without a default an omitted `schedule:` stays absent and a CEL rule reading `self.schedule.evalEvery`
    fails with "no such key" instead of seeing the default. The default must be the filled-in object, not
    `{}`: the API server checks a default against the object's own CEL rules *without* applying the nested
    defaults first, and rejects the CRD when a rule reads a key that `{}` lacks.
    """
    if (
        "anyOf" not in original
        and out.get("type") == "object"
        and "properties" in out
        and not out.get("required")
    ):
        out.setdefault("default", _defaulted(out))
    return out


def _defaulted(node: dict[str, Any]) -> dict[str, Any]:
    """The value the API server's defaulting gives an empty object of this (already structural) schema."""
    return {name: prop["default"] for name, prop in node.get("properties", {}).items() if "default" in prop}


def _finish(out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(out.get("description"), str):
        # Attribute docstrings wrap at the code's line length; kubectl explain re-wraps them itself.
        out["description"] = " ".join(out["description"].split())
    if out.get("additionalProperties") is False:
        # Structural schemas may not combine properties with additionalProperties: false; the API
        # server's strict field validation (kubectl's default) reports unknown fields instead.
        out.pop("additionalProperties")
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), int | float) and not isinstance(out.get(bound), bool):
            out[flag] = out.pop(bound)
            out[bound] = True
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "string" and "enum" in out:
        # The API server bounds a rule's cost by each string's maxLength; an enum's is its longest value.
        out.setdefault("maxLength", max(len(v) for v in out["enum"]))
    return out


def unbounded(node: Any, path: str = "") -> list[str]:
    """Paths of strings without maxLength, arrays without maxItems and maps without maxProperties.

    The API server estimates a CEL rule's cost from these bounds (an unbounded string is taken to be as
    long as a whole request), so the spec must bound every one of them.
    """
    if not isinstance(node, dict):
        return []
    found = []
    kind = node.get("type")
    if kind == "string" and "maxLength" not in node:
        found.append(path)
    if kind == "array" and "maxItems" not in node:
        found.append(path)
    if (
        kind == "object"
        and isinstance(node.get("additionalProperties"), dict)
        and "maxProperties" not in node
    ):
        found.append(path)
    for name, prop in node.get("properties", {}).items():
        found += unbounded(prop, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += unbounded(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += unbounded(node["additionalProperties"], f"{path}{{}}")
    return found


def _with_rules(out: dict[str, Any], model: type[ApiModel] | None) -> dict[str, Any]:
    if model is not None and model.rules:
        rules = [_cel(rule) for rule in model.rules if rule.cel is not None]
        if rules:
            out["x-kubernetes-validations"] = rules
    return out


def _cel(rule: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"rule": rule.cel, "message": rule.message}
    if rule.field:
        entry["fieldPath"] = "." + rule.field
    entry["reason"] = rule.cel_reason
    return entry


def object_schema(model: type[ApiModel]) -> dict[str, Any]:
    """The structural schema of one model."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return _with_rules(_structural(schema, schema.get("$defs", {}), _models_by_name()), model)


def build_crd() -> dict[str, Any]:
    """The DistillationJob CustomResourceDefinition."""
    return _custom_resource_definition(
        kind=KIND,
        plural=PLURAL,
        short_name="dj",
        spec=DistillationJobSpec,
        status=DistillationJobStatus,
        columns=PRINTER_COLUMNS,
        description="DistillationJob distills one or more teacher LLMs into a student with on-policy distillation.",
    )


def build_teacher_crd() -> dict[str, Any]:
    """The DistillationTeacher CustomResourceDefinition."""
    return _custom_resource_definition(
        kind=TEACHER_KIND,
        plural=TEACHER_PLURAL,
        short_name="dt",
        spec=DistillationTeacherSpec,
        status=DistillationTeacherStatus,
        columns=TEACHER_PRINTER_COLUMNS,
        description="DistillationTeacher serves one teacher LLM to every DistillationJob of its namespace that "
        "references it, with replicas scaled by their demand.",
    )


def _custom_resource_definition(
    *,
    kind: str,
    plural: str,
    short_name: str,
    spec: type[ApiModel],
    status: type[ApiModel],
    columns: list[dict[str, Any]],
    description: str,
) -> dict[str, Any]:
    spec_schema = object_schema(spec)
    loose = unbounded(spec_schema, "spec")
    if loose:
        raise ValueError(f"unbounded fields (give each a max_length): {', '.join(loose)}")
    status_schema = object_schema(status)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "distillery", "app.kubernetes.io/part-of": "distillery"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short_name],
                "categories": ["all", "distillery", "ml"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd_yaml(kind: str = KIND) -> str:
    """The CRD of `kind` as the YAML file checked into crds/ (`CRD_FILES[kind]`)."""
    flag = "" if kind == KIND else f" --kind {kind}"
    header = f"# Generated by `distillery crd{flag}` from distillery/api. Do not edit by hand.\n"
    return header + yaml.safe_dump(BUILDERS[kind](), sort_keys=False, width=120)


BUILDERS = {KIND: build_crd, TEACHER_KIND: build_teacher_crd}
CRD_FILES = {KIND: CRD_FILE, TEACHER_KIND: TEACHER_CRD_FILE}
"""The file in crds/ (and the chart's crds/) of each kind's CRD."""
