"""The labels an author may not set: those that NetworkPolicies, Services and KubeRay select on.

A label under `distillery.io/` lets a pod into a shared teacher's NetworkPolicy
(`distillery.io/uses-teacher-<name>`) or the job's own (`distillery.io/ray-node`); one under `ray.io/`, or
`app.kubernetes.io/created-by` (which KubeRay sets to `kuberay-operator`), is enough to join another
RayCluster's Services. The operator writes these itself (`distillery_operator.naming`), after the author's
labels; an author's copy must not reach a pod at all, since a worker carrying the head's label passes the
head's policies. Decided once here: the spec models refuse them (`reserved_labels_rule`) and the operator
drops them from what it copies (`without_reserved`: metadata.labels is no part of the spec and cannot be
refused by the models).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from distillery.api.base import Rule

RESERVED_LABEL_PREFIXES = ("distillery.io/", "ray.io/")
"""Prefixes of the operator's and KubeRay's labels."""
RESERVED_LABEL_KEYS = ("app.kubernetes.io/created-by", "app.kubernetes.io/managed-by")
"""Single keys that KubeRay and the operator select on (created-by: KubeRay's Services and its cache;
managed-by: the operator's own children)."""


def reserved_by(key: str, prefixes: tuple[str, ...] = RESERVED_LABEL_PREFIXES) -> str | None:
    """What reserves `key` (`'ray.io/*'`, or the key itself), None where an author may set it."""
    for prefix in prefixes:
        if key.startswith(prefix):
            return prefix + "*"
    return key if key in RESERVED_LABEL_KEYS else None


def without_reserved(labels: Mapping[str, str]) -> dict[str, str]:
    """`labels` less the reserved ones: what the operator copies of an author's labels onto children."""
    return {k: v for k, v in labels.items() if reserved_by(k) is None}


def reserved_labels_rule(
    field: str, attr: str, prefixes: tuple[str, ...] = RESERVED_LABEL_PREFIXES, hint: str = ""
) -> Rule:
    """No key of the label map `field` (`attr`) is reserved (by `prefixes` or `RESERVED_LABEL_KEYS`).

    The Python message names the first reserved key found; the CEL message (static) lists the set."""
    keys = tuple(k for k in RESERVED_LABEL_KEYS if not k.startswith(prefixes))  # not twice in the CEL
    cel_terms = [f"!k.startsWith('{p}')" for p in prefixes] + [f"k != '{k}'" for k in keys]
    listed = ", ".join([p + "*" for p in prefixes] + list(keys))

    def first(obj: Any) -> tuple[str, str] | None:
        for key in getattr(obj, attr) or {}:
            reason = reserved_by(key, prefixes)
            if reason is not None:
                return key, reason
        return None

    def explain(obj: Any) -> str:
        found = first(obj)
        key, reason = found if found else ("", listed)
        return f"'{key}' is reserved for the operator ({reason}){hint}"

    check: Callable[[Any], bool] = lambda obj: first(obj) is None  # noqa: E731
    return Rule(
        check=check,
        cel=f"!has(self.{field}) || self.{field}.all(k, " + " && ".join(cel_terms) + ")",
        message=f"the operator sets and selects by these labels: {listed}{hint}",
        field=field,
        explain=explain,
    )
