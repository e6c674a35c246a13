"""Reads manifests and turns every problem into one line that names the file, the field path and the reason.

Used by `distillery validate`, `distillery run` and the operator, so that a user sees the same message
wherever a bad spec is caught.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import BaseModel, ValidationError

from distillery.api import API_VERSION, KIND, DistillationJob, DistillationJobSpec


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


def parse_job(document: Any, source: str = "<manifest>") -> DistillationJob:
    """Validates one decoded YAML document as a DistillationJob; raises InvalidManifest with every problem."""
    if not isinstance(document, dict):
        raise InvalidManifest(
            source, [Problem("", f"expected a mapping (a Kubernetes object), got {type(document).__name__}")]
        )
    problems: list[Problem] = []
    if document.get("apiVersion") != API_VERSION:
        problems.append(Problem("apiVersion", f"must be {API_VERSION!r}, got {document.get('apiVersion')!r}"))
    if document.get("kind") != KIND:
        problems.append(Problem("kind", f"must be {KIND!r}, got {document.get('kind')!r}"))
    if problems:
        raise InvalidManifest(source, problems)
    try:
        return DistillationJob.model_validate_json(_as_json(document), strict=True)
    except ValidationError as error:
        raise InvalidManifest(source, problems_from_error(error, DistillationJob)) from None


def parse_spec(spec: Any, source: str = "<spec>") -> DistillationJobSpec:
    """Validates a bare spec (as the operator receives it); problem paths start with `spec.`."""
    try:
        return DistillationJobSpec.model_validate_json(_as_json(spec), strict=True)
    except ValidationError as error:
        raise InvalidManifest(source, problems_from_error(error, DistillationJobSpec, ("spec",))) from None


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


def load_jobs(path: str | Path) -> list[DistillationJob]:
    """Every DistillationJob in a YAML file; InvalidManifest lists all problems of all documents."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise InvalidManifest(source, [Problem("", f"cannot read: {error.strerror or error}")]) from None
    jobs: list[DistillationJob] = []
    problems: list[Problem] = []
    documents = list(iter_documents(text, source))
    if not documents:
        raise InvalidManifest(source, [Problem("", "no YAML document in the file")])
    for index, document in enumerate(documents):
        try:
            jobs.append(parse_job(document, source))
        except InvalidManifest as error:
            tag = f"document {index + 1}: " if len(documents) > 1 else ""
            problems.extend(Problem(p.path, tag + p.reason) for p in error.problems)
    if problems:
        raise InvalidManifest(source, problems)
    return jobs


def load_job(path: str | Path) -> DistillationJob:
    """The single DistillationJob of a file."""
    jobs = load_jobs(path)
    if len(jobs) != 1:
        raise InvalidManifest(str(path), [Problem("", f"expected one DistillationJob, found {len(jobs)}")])
    return jobs[0]
