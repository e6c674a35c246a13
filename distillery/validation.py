"""Reads manifests and turns every problem into one line that names the file, the field path and the reason.

Used by `distillery validate`, `distillery run` and the operator, so that a user sees the same message
wherever a bad spec is caught.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
import yaml
from pydantic import BaseModel, ValidationError

from distillery.api import (
    API_VERSION,
    KIND,
    DistillationJob,
    DistillationJobSpec,
    DistillationJobStatus,
    DistillationTeacherSpec,
)
from distillery.api.shared_teacher import TEACHER_KIND, DistillationTeacher


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest."""

    path: str
    """Field path, e.g. `spec.teachers[1].endpoint` ('' for the document itself)."""
    reason: str

    def format(self, source: str) -> str:
        where = f"{source}: {self.path}: " if self.path else f"{source}: "
        return where + self.reason


class InvalidManifest(ValueError):
    """A manifest that is not a valid DistillationJob; `problems` lists every reason."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(p.format(source) for p in problems))


def format_loc(loc: tuple[str | int, ...]) -> str:
    """('spec', 'teachers', 1, 'endpoint') -> 'spec.teachers[1].endpoint'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def _field_names_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str] | None:
    """The YAML names of the fields of the object at `loc` inside `model`, if it is a model."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        current = _inner_model(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or n for n, f in current.model_fields.items()]
    return None


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def problems_from_error(
    error: ValidationError, root: type[BaseModel], prefix: tuple[str | int, ...] = ()
) -> list[Problem]:
    """One Problem per distinct field path of a pydantic ValidationError, with suggestions for typos."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for err in error.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _is_union_tag(p)))
        path = format_loc(prefix + loc)
        if path in seen:
            continue
        seen.add(path)
        reason = err["msg"]
        if err["type"] == "extra_forbidden":
            known = _field_names_at(root, loc[:-1]) or []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            reason = "unknown field" + (f"; did you mean {close[0]!r}?" if close else "")
            if known and not close:
                reason += f" (known: {', '.join(sorted(known))})"
        elif err["type"] == "missing":
            reason = "required field is missing"
        problems.append(Problem(path, reason))
    return problems


def _is_union_tag(part: str) -> bool:
    # pydantic names union branches in loc ('int', 'str', 'function-after[...]'); they are not fields.
    return part in {"int", "str", "float", "bool"} or "[" in part


def _check_object(document: Any, kind: str, source: str) -> None:
    """InvalidManifest unless `document` is a mapping of our apiVersion and `kind`."""
    if not isinstance(document, dict):
        raise InvalidManifest(
            source, [Problem("", f"expected a mapping (a Kubernetes object), got {type(document).__name__}")]
        )
    problems: list[Problem] = []
    if document.get("apiVersion") != API_VERSION:
        problems.append(Problem("apiVersion", f"must be {API_VERSION!r}, got {document.get('apiVersion')!r}"))
    if document.get("kind") != kind:
        problems.append(Problem("kind", f"must be {kind!r}, got {document.get('kind')!r}"))
    if problems:
        raise InvalidManifest(source, problems)


def parse_job(document: Any, source: str = "<manifest>") -> DistillationJob:
    """Validates one decoded YAML document as a DistillationJob; raises InvalidManifest with every problem."""
    _check_object(document, KIND, source)
    problems: list[Problem] = []
    document = as_decoded(document, problems)
    # An absent (or null) metadata is an empty one: the server then asks for metadata.name.
    document.setdefault("metadata", {})
    problems += _status_problems(document.get("status"))
    try:
        job = DistillationJob.model_validate_json(_as_json(document), strict=True)
    except ValidationError as error:
        problems += _new(problems, problems_from_error(error, DistillationJob))
    if problems:
        raise InvalidManifest(source, problems)
    return job


SpecModel = TypeVar("SpecModel", DistillationJobSpec, DistillationTeacherSpec)


def _parse_bare_spec(model: type[SpecModel], spec: Any, source: str) -> SpecModel:
    problems: list[Problem] = []
    spec = as_decoded(spec, problems, "spec")
    try:
        parsed = model.model_validate_json(_as_json(spec), strict=True)
    except ValidationError as error:
        problems += _new(problems, problems_from_error(error, model, ("spec",)))
    if problems:
        raise InvalidManifest(source, problems)
    return parsed


def parse_teacher_spec(spec: Any, source: str = "<spec>") -> DistillationTeacherSpec:
    """Validates a DistillationTeacher's bare spec (as the operator receives it); paths start with `spec.`."""
    return _parse_bare_spec(DistillationTeacherSpec, spec, source)


def parse_spec(spec: Any, source: str = "<spec>") -> DistillationJobSpec:
    """Validates a bare spec (as the operator receives it); problem paths start with `spec.`."""
    return _parse_bare_spec(DistillationJobSpec, spec, source)


INT64 = (-(2**63), 2**63 - 1)
JSON_INTEGER = 2**53 - 1
"""The largest float the API server's schema check takes for an integer (go-openapi's IsFloat64AJSONInteger)."""


def as_decoded(value: Any, problems: list[Problem], path: str = "") -> Any:
    """The value as the API server holds it after decoding the JSON body and before validating it.

    - A null field of an object or map is dropped (the server prunes nulls of non-nullable fields, or puts
      the field's default there, as if it were left out); a null list item stays and is refused.
    - An integer outside int64 becomes a float (Go decodes it so; an integer field then refuses it).
    - An integral float up to 2^53 - 1 becomes an integer (`steps: 10.0` is an integer to the server; a
      `number` field takes it all the same). Infinity and NaN are not JSON: a problem.
    """
    if isinstance(value, dict):
        return {k: as_decoded(v, problems, _join(path, k)) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [as_decoded(v, problems, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        try:
            value = float(value)
        except OverflowError:
            problems.append(Problem(path, "number out of range"))
            return 0
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            problems.append(Problem(path, f"{value} is not a JSON number"))
            return 0
        if value.is_integer() and abs(value) <= JSON_INTEGER:
            return int(value)
    return value


def _new(known: list[Problem], found: list[Problem]) -> list[Problem]:
    """The problems at paths not named yet (a non-JSON number is one problem, not that and a bound)."""
    named = {p.path for p in known}
    return [p for p in found if p.path not in named]


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _status_problems(status: Any) -> list[Problem]:
    """Unknown fields of a status: strict decoding refuses them; a create drops the status' values, so
    nothing else of it is checked."""
    if not isinstance(status, dict):
        return []
    try:
        DistillationJobStatus.model_validate(status)
    except ValidationError as error:
        unknown = [e for e in error.errors(include_url=False) if e["type"] == "extra_forbidden"]
        return [Problem(format_loc(("status", *e["loc"])), "unknown field") for e in unknown]
    return []


def _as_json(document: Any) -> bytes:
    # Strict JSON-mode validation types values as the API server does: "yes" is not a boolean, "5" is not
    # an integer, while enums still come as strings.
    return orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS)


def iter_documents(text: str, source: str) -> Iterator[Any]:
    """The YAML documents of a file, skipping empty ones; syntax errors name the line and column."""
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InvalidManifest(
            source, [Problem("", f"YAML syntax error: {where}{error.problem or error}")]
        ) from None
    except yaml.YAMLError as error:
        raise InvalidManifest(source, [Problem("", f"YAML error: {error}")]) from None
    yield from (d for d in documents if d is not None)


def _read_documents(path: str | Path) -> list[Any]:
    """The YAML documents of a file (at least one); InvalidManifest if it cannot be read or has none."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise InvalidManifest(source, [Problem("", f"cannot read: {error.strerror or error}")]) from None
    documents = list(iter_documents(text, source))
    if not documents:
        raise InvalidManifest(source, [Problem("", "no YAML document in the file")])
    return documents


def load_jobs(path: str | Path) -> list[DistillationJob]:
    """Every DistillationJob in a YAML file; InvalidManifest lists all problems of all documents."""
    jobs, _ = load_manifests(path, teachers=False)
    return jobs


def load_manifests(
    path: str | Path, *, teachers: bool = True
) -> tuple[list[DistillationJob], list[DistillationTeacher]]:
    """Every DistillationJob and (with `teachers`) DistillationTeacher in a YAML file, each document read as
    its kind says; InvalidManifest lists all problems of all documents."""
    source = str(path)
    documents = _read_documents(path)
    jobs: list[DistillationJob] = []
    problems: list[Problem] = []
    found: list[DistillationTeacher] = []
    for index, document in enumerate(documents):
        try:
            if teachers and isinstance(document, dict) and document.get("kind") == TEACHER_KIND:
                found.append(parse_teacher(document, source))
            else:
                jobs.append(parse_job(document, source))
        except InvalidManifest as error:
            tag = f"document {index + 1}: " if len(documents) > 1 else ""
            problems.extend(Problem(p.path, tag + p.reason) for p in error.problems)
    if problems:
        raise InvalidManifest(source, problems)
    return jobs, found


def parse_teacher(document: Any, source: str = "<manifest>") -> DistillationTeacher:
    """Validates one decoded YAML document as a DistillationTeacher; raises InvalidManifest with every
    problem (its status, the operator's, is not read)."""
    _check_object(document, TEACHER_KIND, source)
    problems: list[Problem] = []
    document = {k: v for k, v in as_decoded(document, problems).items() if k != "status"}
    document.setdefault("metadata", {})
    try:
        teacher = DistillationTeacher.model_validate_json(_as_json(document), strict=True)
    except ValidationError as error:
        problems += _new(problems, problems_from_error(error, DistillationTeacher))
    if problems:
        raise InvalidManifest(source, problems)
    return teacher


def load_teacher(path: str | Path) -> DistillationTeacher:
    """The single DistillationTeacher of a file."""
    source = str(path)
    documents = _read_documents(path)
    if len(documents) != 1:
        raise InvalidManifest(
            source, [Problem("", f"expected one DistillationTeacher, found {len(documents)}")]
        )
    return parse_teacher(documents[0], source)


def load_job(path: str | Path) -> DistillationJob:
    """The single DistillationJob of a file."""
    jobs = load_jobs(path)
    if len(jobs) != 1:
        raise InvalidManifest(str(path), [Problem("", f"expected one DistillationJob, found {len(jobs)}")])
    return jobs[0]
