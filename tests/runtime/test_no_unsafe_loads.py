"""Nothing the runtime or the shared package reads is unpickled as code (issue 52, item 4).

A checkpoint claim may be written by other jobs of the namespace, and the weight sync's store takes no
credentials: so no `torch.load` without `weights_only=True`, no pickle of what is read, and the collectives
that pickle (torch.distributed's `*_object*`) only within the trainers' own group, each one listed here.
Read from the source (ast), so a new call site fails here before it ships.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "runtime" / "distillery_runtime", ROOT / "distillery"]
UNPICKLING = {"load", "loads", "Unpickler"}
"""The pickle module's entry points that build objects from bytes."""
RESTRICTED_UNPICKLERS = {"distillery_runtime/checkpoints/optimizer_shards.py"}
"""Where a `pickle.Unpickler` may be subclassed: one that resolves only an allowlist (its `find_class`)."""
PICKLING_COLLECTIVES = {"broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"}
OWN_GROUP_COLLECTIVES = {("distillery_runtime/run/workers.py", "broadcast_object_list")}
"""Pickling collectives over the trainers' own process group (rank 0's staging folder to the other trainer
ranks): its members are the job's trainer processes, which already trust one another with their weights."""


def _sources() -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(package.parent)), ast.parse(path.read_text(), filename=str(path)))
        for package in PACKAGES
        for path in sorted(package.rglob("*.py"))
    ]


def _calls(tree: ast.Module, owner: str, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == owner
    ]


def unsafe_loads(path: str, tree: ast.Module) -> list[str]:
    """What in one module could unpickle code: each as `path:line what`."""
    found = [
        f"{path}:{call.lineno} torch.load without weights_only=True"
        for call in _calls(tree, "torch", "load")
        if not any(k.arg == "weights_only" and _is(k.value, True) for k in call.keywords)
    ]
    for node in ast.walk(tree):
        what = _unsafe(path, node)
        if what:
            found.append(f"{path}:{getattr(node, 'lineno', '?')} {what}")
    return found


def _unsafe(path: str, node: ast.AST) -> str | None:
    """What `node` does that could unpickle code, or None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pickle":
        restricted = node.attr == "Unpickler" and path in RESTRICTED_UNPICKLERS
        return f"pickle.{node.attr}" if node.attr in UNPICKLING and not restricted else None
    if isinstance(node, ast.Import | ast.ImportFrom):
        modules = [a.name for a in node.names] + (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        )
        if isinstance(node, ast.ImportFrom) and node.module == "pickle":
            return "from pickle import ..."
        unpicklers = [m for m in modules if m.split(".")[0] in {"cloudpickle", "dill", "marshal", "shelve"}]
        return f"import {unpicklers[0]}" if unpicklers else None
    if isinstance(node, ast.Attribute) and node.attr in PICKLING_COLLECTIVES:
        own = (path, node.attr) in OWN_GROUP_COLLECTIVES
        return None if own else f"{node.attr} (pickles what it receives)"
    if isinstance(node, ast.keyword) and node.arg in {"weights_only", "allow_pickle"}:
        unsafe = _is(node.value, node.arg == "allow_pickle")
        return f"{node.arg}={node.arg == 'allow_pickle'}" if unsafe else None
    return None


def _is(value: ast.expr, constant: bool) -> bool:
    return isinstance(value, ast.Constant) and value.value is constant


def test_nothing_in_the_runtime_or_the_shared_package_unpickles_what_it_reads() -> None:
    found = [line for path, tree in _sources() for line in unsafe_loads(path, tree)]
    assert not found, "unsafe loads:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_unsafe_load() -> None:
    """The scan above can fail: each of these is found, the safe forms are not."""
    unsafe = {
        "torch.load(p, weights_only=False)": "torch.load without weights_only=True",
        "torch.load(p)": "torch.load without weights_only=True",
        "pickle.loads(raw)": "pickle.loads",
        "pickle.load(f)": "pickle.load",
        "import cloudpickle": "import cloudpickle",
        "from pickle import loads": "from pickle import",
        "dist.all_gather_object(out, x)": "all_gather_object",
        "np.load(p, allow_pickle=True)": "allow_pickle=True",
        "f(weights_only=False)": "weights_only=False",
    }
    for code, what in unsafe.items():
        found = unsafe_loads("distillery_runtime/x.py", ast.parse(code))
        assert any(what in line for line in found), (code, found)
    safe = "torch.load(p, weights_only=True, map_location='cpu')\nmsgspec.json.decode(raw)\npickle.dumps(x)"
    assert unsafe_loads("distillery_runtime/x.py", ast.parse(safe)) == []
    restricted = "class U(pickle.Unpickler): pass"
    assert unsafe_loads("distillery_runtime/x.py", ast.parse(restricted))
    assert not unsafe_loads("distillery_runtime/checkpoints/optimizer_shards.py", ast.parse(restricted))
