"""The packages stay layered: the API (`distillery`) at the bottom, the operator and the runtime beside each
other on top of it, the CLI above all three, and no import circle anywhere.

The graph is read from the source (ast), not by importing: every `import` and `from ... import`, at module
level or inside a function (a lazy import is still a dependency), relative imports resolved. An edge goes
to the module named, or to the submodule when `from package import name` names one. Importing `a.b.c`
also runs `a/__init__.py`, but that implicit edge is not counted: Python finishes a package's own imports
before it loads the package's modules, so it never closes a circle.

Inside the runtime, its rooms (the subpackages of `distillery_runtime`) are layered too: a room imports only
the rooms below it in `RUNTIME_ROOMS`, so every arrow between two rooms points one way. So are the rooms of
the plan (`distillery.plan`'s subpackages, `PLAN_ROOMS`: the decisions) and of the operator
(`distillery_operator`'s, `OPERATOR_ROOMS`). A module at a package's top level (`distillery.plan.job`,
`distillery_operator.main`, the runtime's `prestop`) is in no room: it may import any room, and any room
may import it, but the circle test still holds for it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "distillery": ROOT / "distillery",
    "distillery_operator": ROOT / "operator" / "distillery_operator",
    "distillery_runtime": ROOT / "runtime" / "distillery_runtime",
    "distillery_cli": ROOT / "cli" / "distillery_cli",
}
TESTING = "distillery_runtime.testing"
# The runtime's rooms, bottom first: each may import the rooms before it, none after it. The tasks and the
# losses stand alone; data and weight sync serve everything above; checkpoints serve the trainer; teachers
# and rollout are the two sides a step scores and samples with; agents play a tool-using student's episodes
# on the rollout; observe reports a step; run drives it all.
RUNTIME_ROOMS = (
    "tasks",
    "losses",
    "sync",
    "data",
    "checkpoints",
    "training",
    "teachers",
    "rollout",
    "agents",
    "observe",
    "run",
)

# The plan's rooms, bottom first. Its order is not the runtime's: the plan derives the trainer's settings from
# the memory plan, which counts the rollout engines, so the rollout's decisions sit below the memory's and the
# trainer's (`distillery.plan.training`, at the top with the loss and the LoRA adapter that every room
# reads). The teachers' engines read the padding and the rollout's context; the pods' resources read the
# teachers' engines (a worker pod's host memory holds the sleeping colocated teachers); placement reads all.
PLAN = "distillery.plan"
PLAN_ROOMS = (
    "agents",
    "env",
    "access",
    "checkpoints",
    "rollout",
    "memory",
    "data",
    "teachers",
    "pods",
    "placement",
)
# The operator's rooms, bottom first: render makes objects, observe summarises what the watches see, jobs
# decides a job's writes and status from both, k8s talks to the API, reconcile runs the jobs' loop on it,
# and teachers runs the DistillationTeachers' loop beside the jobs' (it queues the jobs that use a teacher).
OPERATOR = "distillery_operator"
OPERATOR_ROOMS = (
    "render",
    "observe",
    "jobs",
    "k8s",
    "reconcile",
    "teachers",
)
ROOMS = {"distillery_runtime": RUNTIME_ROOMS, PLAN: PLAN_ROOMS, OPERATOR: OPERATOR_ROOMS}
PACKAGE_DIRS = {
    "distillery_runtime": PACKAGES["distillery_runtime"],
    PLAN: PACKAGES["distillery"] / "plan",
    OPERATOR: PACKAGES["distillery_operator"],
}

Graph = Mapping[str, set[str]]


def module_files() -> dict[str, Path]:
    """Every module of the four packages by dotted name (a package by its `__init__.py`)."""
    modules = {}
    for package, directory in PACKAGES.items():
        for path in sorted(directory.rglob("*.py")):
            parts = path.relative_to(directory).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def imports_of(name: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The modules of the four packages that module `name` (source at `path`) imports, by the name it uses
    (one that is not in `modules` is an import that would fail)."""
    known = set(modules)
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in known else base)
    roots = {module.partition(".")[0] for module in known}
    return {target for target in targets if target != name and target.partition(".")[0] in roots}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: Graph) -> list[list[str]]:
    """One circle (`[a, b, ..., a]`) per strongly connected component that has one (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_circle_in(component, graph) for component in components]


def _circle_in(component: set[str], graph: Graph) -> list[str]:
    """A shortest circle through the component's first module, staying inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for succ in sorted(graph.get(node, ())):
                if succ == start:
                    return [*paths[node], start]
                if succ in component and succ not in paths:
                    paths[succ] = [*paths[node], succ]
                    nxt.append(succ)
        frontier = nxt
    raise AssertionError(f"no circle through {start} in {sorted(component)}")  # Tarjan gave a non-component


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _violations(graph: Graph, importer: str, forbidden: Iterable[str]) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if _in(module, importer)
        for target in targets
        if any(_in(target, package) for package in forbidden)
    )


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_import_names_a_module(graph):
    missing = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if target not in graph
    )
    assert missing == []


def test_the_walk_sees_every_package_and_lazy_imports(graph):
    for package in PACKAGES:
        assert package in graph
    # A function-level import counts: the CLI loads the operator only inside `_render`.
    assert "distillery_operator.render" in graph["distillery_cli.main"]


def test_the_api_imports_none_of_the_layers_above_it(graph):
    assert (
        _violations(graph, "distillery", ["distillery_operator", "distillery_runtime", "distillery_cli"])
        == []
    )


def test_the_operator_and_the_runtime_do_not_import_each_other_or_the_cli(graph):
    assert _violations(graph, "distillery_operator", ["distillery_runtime", "distillery_cli"]) == []
    assert _violations(graph, "distillery_runtime", ["distillery_operator", "distillery_cli"]) == []


def test_only_tests_and_benchmarks_import_the_testing_scaffolding(graph):
    users = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if not _in(module, TESTING)
        for target in targets
        if _in(target, TESTING)
    )
    assert users == []


def room_of(module: str, package: str = "distillery_runtime") -> str | None:
    """The room of `package` (a subpackage of it) that `module` is in (None: a module of the package's top
    level, or not in the package)."""
    if not module.startswith(package + "."):
        return None
    parts = module.removeprefix(package + ".").split(".")
    return parts[0] if len(parts) > 1 else None


def room_violations(graph: Graph, rooms: tuple[str, ...], package: str = "distillery_runtime") -> list[str]:
    """Imports from a room of `package` to a room above it in `rooms` (bottom first)."""
    rank = {room: i for i, room in enumerate(rooms)}

    def rank_of(module: str) -> int | None:
        room = room_of(module, package)
        return None if room is None else rank.get(room)

    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if (low := rank_of(module)) is not None
        for target in targets
        # Each room has its own rank, so an equal rank is an import inside one room.
        if (high := rank_of(target)) is not None and high > low
    )


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_every_room_has_a_place_in_the_order(package):
    rooms = {
        path.parent.name
        for path in PACKAGE_DIRS[package].glob("*/__init__.py")
        if f"{package}.{path.parent.name}" != TESTING
    }
    assert rooms == set(ROOMS[package])


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_the_rooms_import_only_the_rooms_below_them(graph, package):
    assert room_violations(graph, ROOMS[package], package) == []


def test_no_import_circle(graph):
    circles = find_cycles(graph)
    assert circles == [], "import circles:\n" + "\n".join(" -> ".join(circle) for circle in circles)


# ------------------------------------------------------------------------------- the checks themselves


def test_a_planted_circle_is_found_and_named():
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a", "p.d"}, "p.d": set(), "p.e": {"p.d"}}
    assert find_cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    assert find_cycles({"p.a": {"p.a"}}) == [["p.a", "p.a"]]
    assert find_cycles({**graph, "p.c": {"p.d"}}) == []


def test_a_planted_upward_import_is_found_and_a_sibling_package_name_is_not_a_prefix():
    graph = {
        "distillery.x": {"distillery_runtime.y", "distillery.z"},
        "distillery_cli.main": {"distillery_runtime.y"},
    }
    assert _violations(graph, "distillery", ["distillery_runtime"]) == [
        "distillery.x imports distillery_runtime.y"
    ]


def test_a_planted_upward_room_import_is_found():
    graph = {
        "distillery_runtime.data.samples": {"distillery_runtime.run.loop.plan", "distillery_runtime.tasks"},
        "distillery_runtime.run.cli": {"distillery_runtime.data.samples", "distillery_runtime.run.local"},
        "distillery_runtime.prestop": {"distillery_runtime.run.prestop"},
    }
    assert room_violations(graph, ("tasks", "data", "run")) == [
        "distillery_runtime.data.samples imports distillery_runtime.run.loop.plan"
    ]


def test_a_planted_upward_import_between_the_plans_rooms_is_found_and_the_top_level_is_in_none():
    graph = {
        "distillery.plan.rollout.settings": {"distillery.plan.teachers.engines", "distillery.plan.lora"},
        "distillery.plan.teachers.engines": {"distillery.plan.rollout.settings", "distillery.plan.job"},
        "distillery.plan.job": {"distillery.plan.teachers.engines", "distillery.plan.rollout.settings"},
        "distillery_runtime.rollout.base": {"distillery_runtime.teachers.base"},
    }
    assert room_of("distillery.plan.job", PLAN) is None
    assert room_of("distillery.planner.x.y", PLAN) is None
    assert room_violations(graph, ("rollout", "teachers"), PLAN) == [
        "distillery.plan.rollout.settings imports distillery.plan.teachers.engines"
    ]


def test_relative_and_lazy_imports_resolve(tmp_path):
    modules = ["pkg", "pkg.inner", "pkg.inner.mod", "pkg.inner.sibling", "pkg.inner.sub.leaf", "pkg.other"]
    package = tmp_path / "__init__.py"  # pkg.inner: `.` is pkg.inner itself
    package.write_text(
        "from . import sibling\n"
        "from .sub.leaf import thing\n"
        "def later():\n"
        "    from ..other import helper\n"
        "    import pkg.other\n"
        "    import json\n"
    )
    assert imports_of("pkg.inner", package, modules) == {
        "pkg.inner.sibling",
        "pkg.inner.sub.leaf",
        "pkg.other",
    }
    module = tmp_path / "mod.py"  # pkg.inner.mod: `.` is its package, pkg.inner
    module.write_text("from . import sibling\nfrom .. import other\nfrom pkg import inner\n")
    assert imports_of("pkg.inner.mod", module, modules) == {"pkg.inner.sibling", "pkg.other", "pkg.inner"}
