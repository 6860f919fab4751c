"""The import graph is layered: no module imports itself back through others, no subpackage
imports back a subpackage that depends on it, and nothing inside stoker imports the package root
(which only re-exports the public API), except scripts that use it as a user does. Checked on the
source, function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

ROOT = Path(stoker.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """The stoker modules ``path`` imports, anywhere in the file; ``from pkg import mod`` counts as mod."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {name for name in found if name in MODULES}


GRAPH = {name: imports(path) - {name} for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def subpackage(name: str) -> str:
    return ".".join(name.split(".")[:2])


def test_no_module_imports_itself_back():
    # A package's __init__ re-exports its modules; edges into an __init__ from its own modules would be cycles.
    assert cycles(GRAPH) == []


def test_subpackages_are_layered():
    packages: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        if name == "stoker":
            continue
        packages.setdefault(subpackage(name), set()).update(subpackage(t) for t in targets if subpackage(t) != subpackage(name))
    assert cycles(packages) == []


def test_nothing_imports_the_package_root():
    # The benchmark's reader scripts run in processes of their own and use the public API as a user does.
    users = [name for name, targets in GRAPH.items() if "stoker" in targets and name != "stoker"]
    assert [name for name in users if not name.startswith("stoker.bench.readers.")] == []


def test_augment_stands_on_its_own():
    # The loader imports augment and never the other way; augment and the loader share only the
    # crop rule (stoker.boxes), which imports nothing of stoker; Augment's state follows the one
    # resume protocol (stoker.state, with its ranges and errors).
    assert GRAPH["stoker.boxes"] == set()
    for name, targets in GRAPH.items():
        if subpackage(name) == "stoker.augment":
            allowed = {"stoker.augment", "stoker.boxes", "stoker.state", "stoker.ranges", "stoker.errors"}
            assert {subpackage(t) for t in targets} <= allowed, name


def test_the_pipeline_model_is_pure():
    # stoker.tune (the model and the tuner's decisions) is shared by the Loader and the doctor, so it
    # imports neither, nor anything that reads files or runs threads: only what options and states need.
    for name, targets in GRAPH.items():
        if subpackage(name) == "stoker.tune":
            assert {subpackage(t) for t in targets} <= {"stoker.tune", "stoker.errors", "stoker.ranges", "stoker.state"}, name
