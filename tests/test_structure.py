"""The import graph of the project: no cycles, and the layering of DESIGN.md.

Every ``import`` that runs counts, also those inside functions (a cycle hidden in a function is
still a cycle); imports under ``if TYPE_CHECKING:`` never run, so they are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("arbor_runtime", "arbor_cli", "controllers", "verifiers", "tasks", "conf")
#: modules of the tasks package that verifiers may import: the interface and leaf modules
TASK_INTERFACE = {"tasks", "tasks.base", "tasks.arith24", "tasks.answers", "tasks.latex"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Module -> project module it imports (``from a import b`` counts as ``a.b`` when that is a module)."""
    files = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            graph.add_edges_from((name, t) for t in targets if t in files and t != name)
    return graph


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                stack.extend(child.orelse)
            else:
                stack.append(child)


GRAPH = import_graph()


def imports_of(prefix: str) -> set[tuple[str, str]]:
    return {(a, b) for a, b in GRAPH.edges if a == prefix or a.startswith(prefix + ".")}


def test_the_graph_sees_the_project():
    assert len(GRAPH) > 60 and ("tasks.game24", "tasks.arith24") in GRAPH.edges
    assert ("verifiers.game24_oracle", "tasks.arith24") in GRAPH.edges
    assert ("verifiers.base", "arbor_runtime") not in GRAPH.edges  # a TYPE_CHECKING import


def test_no_import_cycles():
    assert list(nx.simple_cycles(GRAPH)) == []


def test_verifiers_depend_on_the_task_interface_not_on_task_modules():
    bad = {(a, b) for a, b in imports_of("verifiers") if b.startswith("tasks") and b not in TASK_INTERFACE}
    assert bad == set()


def test_tasks_never_import_verifiers_controllers_or_the_runtime():
    bad = {(a, b) for a, b in imports_of("tasks") if b.split(".")[0] in {"verifiers", "controllers", "arbor_runtime"}}
    assert bad == set()


def test_leaf_modules_import_nothing_but_leaves():
    for leaf in ("tasks.arith24", "tasks.latex", "tasks.answers"):
        assert set(GRAPH.successors(leaf)) <= {"tasks.latex"}, leaf


def test_the_runtime_package_stands_alone():
    outside = {(a, b) for a, b in imports_of("arbor_runtime") if not b.startswith("arbor_runtime")}
    assert outside == set()
    sources = " ".join(p.read_text() for p in (REPO / "arbor_runtime").rglob("*.py"))
    assert "import hydra" not in sources and "from hydra" not in sources and "import rich" not in sources
