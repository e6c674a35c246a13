"""Which teacher scores which sample: the route table of a job (multi-teacher distillation, MOPD).

A sample's `data.routeField` value picks the teacher that lists it; a value no teacher lists goes to the
default teacher. A job of one teacher sends everything to it, whatever its routes say.
"""

from __future__ import annotations

from dataclasses import dataclass

from distillery.api.spec import DistillationJobSpec


@dataclass(frozen=True)
class RouteTable:
    """Route value -> teacher name, and the teacher of every other value (None: such a value is an error)."""

    by_route: dict[str, str]
    default: str | None = None

    def teacher_for(self, route: str | None) -> str | None:
        """The name of the teacher that scores a sample with this route value; None when none does."""
        if route is not None and route in self.by_route:
            return self.by_route[route]
        return self.default

    def known_routes(self) -> list[str]:
        return sorted(self.by_route)


def route_table(spec: DistillationJobSpec) -> RouteTable:
    if len(spec.teachers) == 1:
        return RouteTable({}, spec.teachers[0].name)
    by_route = {route: t.name for t in spec.teachers for route in t.routes}
    default = next((t.name for t in spec.teachers if t.default), None)
    return RouteTable(by_route, default)
