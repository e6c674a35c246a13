"""The base model of every API object: camelCase in YAML, unknown fields refused, rules shared with CEL.

A cross-field rule is written once, as a `Rule`: a Python predicate that the model validator runs and the
CEL expression that the generated CRD carries, with one message for both, so that the CLI and the API
server refuse the same manifests with the same words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError


@dataclass(frozen=True)
class Rule:
    """A cross-field rule of one object.

    `check(obj)` returns True when the object is valid; `cel` is the same rule as a CEL expression over
    `self` (the object in its YAML form), or None where CEL cannot see the fields it reads (an untyped
    value): the CRD then accepts what the operator refuses, marking the job Invalid; `field` is the
    camelCase field the error is reported on (relative to the object, '' for the object itself);
    `cel_reason` is the Kubernetes `reason` for the CEL rule; `explain(obj)`, where set, is the message the
    Python check reports instead of `message`, naming what it found (CEL's message stays one static text).
    """

    check: Callable[[Any], bool]
    cel: str | None
    message: str
    field: str = ""
    cel_reason: str = "FieldValueInvalid"
    explain: Callable[[Any], str] | None = None


class ApiModel(BaseModel):
    """Base of every spec/status object."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        use_attribute_docstrings=True,
    )

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> ApiModel:
        errors: list[InitErrorDetails] = []
        for rule in type(self).rules:
            if not rule.check(self):
                loc: tuple[str | int, ...] = tuple(rule.field.split(".")) if rule.field else ()
                errors.append(
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "cross_field", rule.explain(self) if rule.explain else rule.message
                        ),
                        loc=loc,
                        input=getattr(self, "__dict__", {}),
                    )
                )
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    def to_yaml_dict(self) -> dict[str, Any]:
        """The object as it appears in YAML: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
