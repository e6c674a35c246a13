"""Bounds, patterns and the label-key rule shared by the spec's models (`spec.py` and its sections, `pod.py`).

Every string, list and map of the spec has a bound: the API server estimates the cost of each CEL rule
from the largest value a field may hold, and refuses a CRD whose rules could exceed its budget.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from distillery.api.base import Rule

QuantityValue = int | str
"""A Kubernetes quantity ("8Gi", "500m", 2)."""

MAX_LOCATION = 1024
"""A model, tokenizer, dataset or checkpoint location, or an image reference."""
MAX_NAME = 253
"""A Kubernetes object name or a label key (DNS subdomain)."""
MAX_LABEL_VALUE = 63
MAX_MAP = 64
"""Entries of a label, node-selector or resources map."""
MAX_LIST = 64
"""Entries of a tolerations list."""
MAX_ROUTES = 64
"""Route values of one teacher: the route-uniqueness rule costs teachers^2 x routes^2 string compares."""
MAX_ROUTE = 128
MAX_ROUTES_IN_ALL = 512
"""Route values of all teachers together: the route-uniqueness rule compares every route with every route,
and the API server stops a rule at about a million such steps (its per-call cost limit, at admission),
although the CRD's static estimate, bounded by 10 million, passed with 32 teachers x 64 routes."""

MAX_STOP_STRINGS = 16
"""Stop strings of the rollout: each is matched against the tail of every response as it is decoded."""
MAX_STOP_LENGTH = 256
MAX_TOP_K = 1 << 20
"""Above any vocabulary (the largest are ~256k tokens)."""

MAX_INT = 2**53 - 1
"""Every integer field is bounded, at most by this: the server decodes JSON integers as int64 (a larger one
is refused), and a schema bound must itself be an integer that a float64 holds exactly (the server refused
the CRD with `maximum: 2^63 - 1`, "Maximum boundary value must be of type integer")."""
MIN_INT = -MAX_INT

WHITESPACE = "\\t\\n\\v\\f\\r "
"""ASCII whitespace, spelled out: a pattern's \\s is ASCII in Go's RE2 (the API server) but Unicode in
Python and in Rust (pydantic), and RE2's leaves out \\v."""

Location = Annotated[str, Field(min_length=1, max_length=MAX_LOCATION)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
FieldName = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
"""A field of the dataset's rows."""
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LENGTH)]

LABEL_NAME_RE = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE_RE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
POSITIVE_QUANTITY_RE = (
    r"^[+]?(([0-9]*[1-9][0-9]*([.][0-9]*)?)|([0-9]*[.][0-9]*[1-9][0-9]*))"
    r"(([KMGTPE]i)|[kMGTPE]|([eE][+-]?(([0-9]+([.][0-9]*)?)|([.][0-9]+))))?$"
)
"""A storage size, a Kubernetes quantity (`100Gi`, `1.5T`, `5e11`) above zero: the API's quantity grammar
(controller-gen's pattern for resource.Quantity) with a non-zero digit required, no minus sign, and no
milli, micro or nano suffix (`100m` is a tenth of a byte, never what was meant)."""
MAX_QUANTITY = 32
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE, pattern=LABEL_VALUE_RE)]
LABEL_KEY_RE = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
"""A label key, [DNS-subdomain prefix/]name (written without backslashes: it is embedded in CEL)."""


def label_keys_rule(field: str, attr: str) -> Rule:
    """Every key of a label map is a label key (the API server refuses the child objects otherwise)."""
    return Rule(
        check=lambda m: all(is_label_key(k) for k in getattr(m, attr) or {}),
        cel=f"!has(self.{field}) || self.{field}.all(k, k.matches('{LABEL_KEY_RE}') && k.indexOf('/') <= {MAX_NAME})",
        message="keys must be label keys: [prefix/]name, the prefix a DNS subdomain (<= 253), the name <= 63 "
        "alphanumerics, '-', '_' or '.', starting and ending alphanumeric",
        field=field,
    )


def is_label_key(key: str) -> bool:
    prefix, _, _ = key.rpartition("/")
    return re.fullmatch(LABEL_KEY_RE, key) is not None and len(prefix) <= MAX_NAME


# Every pattern is anchored with ^ and $ and read as Go's RE2 does: `$` is the end of the text (Python's
# re also matches it before a final newline, so a Python check uses re.fullmatch).
