"""Checks an object against a CRD's `openAPIV3Schema` roughly as the API server would, offline: a fast
pre-check, not the judge.

The judge is a real kube-apiserver: tests/cluster/ (test_invalid_corpus_on_server.py, test_api_on_server.py)
run one and send it the same manifests. This emulation, used where none runs, does in order what
kube-apiserver does for a custom resource: prune nulls (or put the default there), apply schema defaults,
reject unknown fields (kubectl's default strict field validation), validate types/enums/bounds/patterns
(jsonschema, OpenAPI v3.0 = draft 4 bounds, patterns read as Go's RE2 reads `$`), then evaluate every
`x-kubernetes-validations` CEL rule with cel-python, with numbers typed by the schema as CEL does.
Known differences from the real server: no CEL cost limits (the server refused 32 teachers x 64 routes
at admission for the cost of a rule that this passed), no metadata validation and no strict decoding
outside the schema it is given, Python's regex classes (`\\s` is Unicode here, ASCII in RE2), and
cel-python's CEL dialect lacks some Kubernetes extension libraries (`sum` and `indexOf` are added here).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

import celpy
import jsonschema


@dataclass(frozen=True)
class SchemaError:
    path: str
    reason: str


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def decoded(obj: Any) -> Any:
    """As the server's JSON decoding leaves it: nulls of object fields and map values dropped (the server
    prunes a non-nullable null, or puts the default there), integral floats up to 2^53 - 1 as integers."""
    if isinstance(obj, dict):
        return {k: decoded(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [decoded(v) for v in obj]
    if isinstance(obj, float) and obj.is_integer() and abs(obj) <= 2**53 - 1:
        return int(obj)
    return obj


def apply_defaults(obj: Any, schema: dict[str, Any]) -> Any:
    """Fills defaults top-down, as the API server does before validation."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(obj[name], sub)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in obj]
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: apply_defaults(v, schema["additionalProperties"]) for k, v in obj.items()}
    return obj


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[SchemaError]:
    errors: list[SchemaError] = []
    if (
        isinstance(obj, dict)
        and "properties" in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        for key, value in obj.items():
            sub = schema["properties"].get(key)
            if sub is None:
                errors.append(SchemaError(_join(path, key), "unknown field"))
            else:
                errors.extend(unknown_fields(value, sub, _join(path, key)))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            errors.extend(unknown_fields(item, schema["items"], _join(path, i)))
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in obj.items():
            errors.extend(unknown_fields(value, schema["additionalProperties"], _join(path, key)))
    return errors


def _to_cel(obj: Any, schema: dict[str, Any]) -> Any:
    """JSON -> CEL values, numbers typed by the schema (a `number` field is a CEL double even when 1)."""
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        extra = (
            schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else {}
        )
        return celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): _to_cel(v, props.get(k, extra or {})) for k, v in obj.items()}
        )
    if isinstance(obj, list):
        return celpy.celtypes.ListType([_to_cel(v, schema.get("items", {})) for v in obj])
    if isinstance(obj, bool):
        return celpy.celtypes.BoolType(obj)
    if isinstance(obj, int | float):
        if schema.get("type") == "number":
            return celpy.celtypes.DoubleType(float(obj))
        if isinstance(obj, int):
            return celpy.celtypes.IntType(obj)
        return celpy.celtypes.DoubleType(obj)
    if isinstance(obj, str):
        return celpy.celtypes.StringType(obj)
    return obj


def _list_sum(items: Any) -> Any:
    """`list.sum()` of the Kubernetes CEL list library, which celpy lacks. Kubernetes types an empty list
    from the schema; this one only sums `number` fields, so an empty sum is the double 0.0."""
    total: Any = celpy.celtypes.DoubleType(0.0)
    for item in items:
        total = total + item
    return total


_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}
_PASSED: dict[tuple[str, int, str], bool] = {}
_SCHEMAS: dict[int, dict[str, Any]] = {}


def _index_of(text: Any, sub: Any) -> Any:
    """`string.indexOf(sub)` of the Kubernetes CEL strings library: the first index, or -1."""
    from celpy import celtypes

    return celtypes.IntType(str(text).find(str(sub)))


_KUBERNETES_FUNCTIONS = {"sum": _list_sum, "indexOf": _index_of}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule), functions=_KUBERNETES_FUNCTIONS)
    return _PROGRAMS[rule]


def _failing(rules: list[dict[str, Any]], obj: Any, schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The rules that `obj` fails. A verdict is kept per rule, schema node and value (its JSON): the corpora's
    thousands of manifests each differ from one base in one field, so most subtrees repeat, and celpy's
    tree-walking evaluation was most of their validation (tests/api/test_invalid_corpus.py took 4 min)."""
    if not rules:
        return []
    _SCHEMAS.setdefault(id(schema), schema)  # kept alive: its id is never another node's
    text, value = json.dumps(obj, sort_keys=True), None
    failing = []
    for rule in rules:
        key = (rule["rule"], id(schema), text)
        if key not in _PASSED:
            value = _to_cel(obj, schema) if value is None else value  # once for the node's rules
            result = _program(rule["rule"]).evaluate({"self": value})
            _PASSED[key] = not isinstance(result, Exception) and bool(result)
        if not _PASSED[key]:
            failing.append(rule)
    return failing


def cel_errors(obj: Any, schema: dict[str, Any], path: str = "") -> list[SchemaError]:
    """Every failing x-kubernetes-validations rule, reported at its fieldPath."""
    errors: list[SchemaError] = []
    for rule in _failing(schema.get("x-kubernetes-validations", []), obj, schema):
        where = path + rule.get("fieldPath", "") if path else rule.get("fieldPath", "").lstrip(".")
        errors.append(SchemaError(where, rule["message"]))
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj:
                errors.extend(cel_errors(obj[name], sub, _join(path, name)))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            errors.extend(cel_errors(item, schema["items"], _join(path, i)))
    return errors


def _go_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Any:
    # RE2's `$` (no multi-line flag) is the end of the text; Python's also matches before a final newline.
    if isinstance(instance, str) and not re.search(re.sub(r"(?<!\\)\$", r"\\Z", pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _int_or_string(validator: Any, flag: bool, instance: Any, schema: dict[str, Any]) -> Any:
    if flag and (isinstance(instance, bool) or not isinstance(instance, int | str)):
        yield jsonschema.ValidationError(f"{instance!r} is not an integer or a string")


def _integer_in_range(validator: Any, types: Any, instance: Any, schema: dict[str, Any]) -> Any:
    yield from jsonschema._keywords.type(validator, types, instance, schema)
    if types == "integer" and isinstance(instance, int) and not -(2**63) <= instance < 2**63:
        yield jsonschema.ValidationError(f"{instance} is outside int64")


_Validator = jsonschema.validators.extend(
    jsonschema.Draft4Validator,
    {"pattern": _go_pattern, "x-kubernetes-int-or-string": _int_or_string, "type": _integer_in_range},
)


def validate(obj: Any, schema: dict[str, Any]) -> list[SchemaError]:
    """All errors the API server would report for `obj` (schema checks first; CEL only on a well-typed object)."""
    obj = apply_defaults(decoded(copy.deepcopy(obj)), schema)
    errors = unknown_fields(obj, schema)
    validator = _Validator(schema)
    for error in validator.iter_errors(obj):
        path = ""
        for part in error.absolute_path:
            path = _join(path, part)
        errors.append(SchemaError(path, error.message))
    if not errors:
        errors.extend(cel_errors(obj, schema))
    return errors
