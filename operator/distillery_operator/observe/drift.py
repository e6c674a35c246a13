"""Drift: does a child still hold what the operator rendered? Pure functions, no API calls.

The API server fills in defaults (imagePullPolicy, terminationMessagePath, a Service's clusterIPs, KubeRay's
numOfHosts ...), other controllers add what is theirs (Kueue's nodeSelector and tolerations on an admitted
RayJob, a webhook's extra env var or volume), and status is never the operator's. So a child is compared
with what the operator renders, and only that: every field the operator renders must hold the rendered
value in the live object; fields it does not render are not its business.

- maps: each rendered key must hold its value; a rendered zero value (false, 0, "", {}, [], null) may be
  absent (the API server drops empty fields of built-in kinds);
- lists of scalars (a command, its args) must be equal, order included;
- lists of objects (containers, env, volumes, ports, tolerations): each rendered item must be held by some
  live item, so that an edited item is drift and an item added by someone else is not;
- quantities under `resources` and an emptyDir's `sizeLimit` compare by value (`500m` is `0.5`).

The live fields (a Deployment's replicas, a RayJob's suspend) are left out here: `decide` handles them.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from distillery_operator.render import without_live_fields

QUANTITY_KEYS = ("resources", "sizeLimit")
"""Where quantities are compared by value: a container's resources and an emptyDir's sizeLimit (the API
server writes `25600Mi` back as `25Gi`)."""
OWNED_PARTS = ("spec", "data")
"""The top-level parts of a child the operator renders, besides its labels (never `status`)."""


def owned_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an object (rendered or live) that drift is judged on: labels, spec or data, without
    the live fields."""
    view: dict[str, Any] = {"labels": dict((obj.get("metadata") or {}).get("labels") or {})}
    view.update({k: obj[k] for k in OWNED_PARTS if k in obj})
    return without_live_fields(view, str(obj.get("kind", "")))


def _zero(value: Any) -> bool:
    return value is None or value is False or value in (0, "", {}, [])


def _same_quantity(want: Any, live: Any) -> bool:
    try:
        return bool(parse_quantity(want) == parse_quantity(live))
    except (ValueError, TypeError, InvalidOperation):
        return False


def differences(want: Any, live: Any, path: str = "", *, quantities: bool = False) -> list[str]:
    """The paths (`spec.template.spec.containers[0].image`) where `live` does not hold `want`."""
    if isinstance(want, Mapping):
        if not isinstance(live, Mapping):
            return [path or "."]
        out: list[str] = []
        for key, value in want.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in live:
                if not _zero(value):
                    out.append(where)
                continue
            out.extend(differences(value, live[key], where, quantities=quantities or key in QUANTITY_KEYS))
        return out
    if isinstance(want, list):
        if not isinstance(live, list):
            return [path]
        if not all(isinstance(item, Mapping) for item in want):
            return [] if want == live else [path]
        return [
            f"{path}[{index}]"
            for index, item in enumerate(want)
            if not any(not differences(item, other, quantities=quantities) for other in live)
        ]
    if want == live and type(want) is type(live):
        return []
    if isinstance(want, bool) or isinstance(live, bool):
        return [path]
    if isinstance(want, int | float | Decimal) and isinstance(live, int | float | Decimal) and want == live:
        return []
    if quantities and _same_quantity(want, live):
        return []
    return [path]


def drifted(rendered: Mapping[str, Any], live_view: Mapping[str, Any]) -> list[str]:
    """Where a live child (its `owned_view`) no longer holds what the operator renders for it."""
    return differences(owned_view(rendered), live_view)
