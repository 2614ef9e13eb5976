"""The package's import graph: no cycles between modules, and the layers of docs/architecture.md.

Every ``import`` / ``from ... import`` counts wherever it stands (top level, inside a function, under
``if TYPE_CHECKING:``): a deferred import hides a cycle from Python, not from the reader. Relative imports are
resolved; ``from pkg import name`` where ``name`` is a submodule is an edge to that submodule, otherwise to ``pkg``
(its ``__init__``). Importing ``a.b.c`` is not counted as importing ``a`` and ``a.b``: a package's ``__init__``
re-exporting its own modules is not a cycle anyone has to read around.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "tandemrl"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / PACKAGE

# Modules outside tandemrl.engine the engine may import: they import nothing from tandemrl but each other (the
# tensor-parallel shard model reads models.unwrap; the engine only asks it whether a model is a shard).
ENGINE_MAY_IMPORT = frozenset({"tandemrl.types", "tandemrl.models.unwrap", "tandemrl.models.tensor_parallel"})


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def import_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from X import ...`` reads from, relative levels resolved."""
    if node.level == 0:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def innermost_module(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` itself if it is a module of the package, else its longest prefix that is."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def module_edges(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    targets: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = import_base(node, module, is_package)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.append((submodule if submodule in modules else base, node.lineno))
    edges: dict[str, Edge] = {}  # one edge per imported module, at its first import
    for name, line in sorted(targets, key=lambda t: t[1]):
        target = innermost_module(name, modules) if name.startswith(PACKAGE) else None
        if target is not None and target != module:
            edges.setdefault(target, Edge(module, target, line))
    return list(edges.values())


def import_graph() -> dict[str, list[Edge]]:
    modules = package_modules()
    return {m: module_edges(m, p, modules) for m, p in modules.items()}


def strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Tarjan's components with more than one module (iterative: the package is deep enough to matter)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            edge = next(edges, None)
            if edge is not None:
                nxt = edge.target
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph.get(nxt, []))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def cycle_through(start: str, component: set[str], graph: dict[str, list[Edge]]) -> list[Edge]:
    """One shortest cycle from ``start`` back to itself inside ``component`` (breadth first)."""
    came_by: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in graph[node]:
                if edge.target not in component:
                    continue
                if edge.target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came_by[path[0].source])
                    return path
                if edge.target not in came_by:
                    came_by[edge.target] = edge
                    following.append(edge.target)
        frontier = following
    return []


def describe(cycle: list[Edge]) -> str:
    return " -> ".join(f"{e.source} (line {e.line})" for e in cycle) + f" -> {cycle[0].source}"


def test_no_import_cycles() -> None:
    graph = import_graph()
    reports = []
    for component in strongly_connected(graph):
        members = set(component)
        reports.append(f"{len(component)} modules: {', '.join(component)}\n  e.g. "
                       + describe(cycle_through(component[0], members, graph)))
    assert not reports, "import cycles:\n" + "\n".join(reports)


def edges_from(prefix: str, graph: dict[str, list[Edge]]) -> list[Edge]:
    return [e for m, edges in graph.items() if m == prefix or m.startswith(prefix + ".") for e in edges]


def inside(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def show(edges: list[Edge]) -> str:
    return "\n".join(f"  {e.source}:{e.line} imports {e.target}" for e in edges)


def test_kernels_import_only_kernels() -> None:
    graph = import_graph()
    wrong = [e for e in edges_from("tandemrl.engine.kernels", graph) if not inside(e.target, "tandemrl.engine.kernels")]
    assert not wrong, "the kernels import from layers above them:\n" + show(wrong)


def test_engine_imports_nothing_above_it() -> None:
    graph = import_graph()
    wrong = [e for e in edges_from("tandemrl.engine", graph)
             if not inside(e.target, "tandemrl.engine") and e.target not in ENGINE_MAY_IMPORT]
    assert not wrong, "the engine imports from layers above it:\n" + show(wrong)


def test_engine_allowed_outside_modules_import_only_each_other() -> None:
    graph = import_graph()
    wrong = [e for m in ENGINE_MAY_IMPORT for e in graph[m] if e.target not in ENGINE_MAY_IMPORT]
    assert not wrong, "a module the engine may import imports other tandemrl modules:\n" + show(wrong)


def test_sync_does_not_import_serve() -> None:
    graph = import_graph()
    wrong = [e for e in edges_from("tandemrl.sync", graph) if inside(e.target, "tandemrl.serve")]
    assert not wrong, "sync imports serve (the server imports sync's receiver):\n" + show(wrong)


def test_distributed_does_not_import_train() -> None:
    graph = import_graph()
    wrong = [e for e in edges_from("tandemrl.distributed", graph) if inside(e.target, "tandemrl.train")]
    assert not wrong, "distributed imports train (train -> distributed is the one direction):\n" + show(wrong)
