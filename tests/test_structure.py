"""The import graph of the project: no cycles, and the layering of DESIGN.md; and the wheel's layout.

Every ``import`` that runs counts, also those inside functions (a cycle hidden in a function is
still a cycle); imports under ``if TYPE_CHECKING:`` never run, so they are left out of ``GRAPH``.
``TYPED_GRAPH`` counts them too: inside the runtime package a module does not even name, for its
types, a module that imports it (such a circle is a layering that only works by not running).
Modules go by their installed names: the top-level folders controllers/, tasks/, verifiers/ and
conf/ install under the project's namespace (pyproject.toml ``[tool.setuptools.package-dir]``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import networkx as nx

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
#: source folder -> the package it installs as
PACKAGES = {"arbor_runtime": "arbor_runtime", "arbor_cli": "arbor_cli"} | {
    folder: package for package, folder in PYPROJECT["package-dir"].items()
}
#: modules of the tasks package that verifiers may import: the interface and leaf modules
TASK_INTERFACE = {f"arbor_runtime.tasks{m}" for m in ("", ".base", ".arith24", ".answers", ".latex")}


def module_name(path: Path) -> str:
    folder, *parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join([PACKAGES[folder], *(parts[:-1] if parts[-1] == "__init__" else parts)])


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


#: installed module name -> its source file
FILES = {module_name(p): p for folder in PACKAGES for p in sorted((REPO / folder).rglob("*.py"))}
#: the runtime proper: the modules of the arbor_runtime/ folder (not the folders mapped into its namespace)
CORE = {name for name, path in FILES.items() if path.relative_to(REPO).parts[0] == "arbor_runtime"}


def import_graph(type_checking: bool = False) -> nx.DiGraph:
    """Module -> project module it imports (``from a import b`` counts as ``a.b`` when that is a module).

    ``type_checking``: count the imports under ``if TYPE_CHECKING:`` too.
    """
    files = FILES
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        targets = imported_names(path.read_text(), name, path.name == "__init__.py", set(files), type_checking)
        graph.add_edges_from((name, t) for t in targets if t in files and t != name)
    return graph


def imported_names(
    source: str, module: str, is_package: bool, modules: set[str], type_checking: bool = True
) -> list[str]:
    """Absolute names ``source`` (the text of ``module``) imports: relative imports resolved, and
    ``from a import b`` read as ``a.b`` when that is one of ``modules``, else as ``a``; also the
    string given to ``importlib.import_module``."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    names: list[str] = []
    for node in ast.walk(tree) if type_checking else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            names += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append(node.args[0].value)
    return names


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
TYPED_GRAPH = import_graph(type_checking=True)
#: top-level packages beside the installed ones (benchmarks, research tools) that they must never import
OUTSIDE_THE_PRODUCT = {"benchmarks", "research"}
#: where that code lived inside the package before it moved out: nothing may name these again
FORMER_HOMES = ("arbor_cli.bench", "arbor_cli.kvp", "arbor_cli.calibrate", "arbor_cli.calibration")


def outside_the_product(name: str) -> bool:
    """``name`` (a module) is benchmark or research code, or one of the package paths it left."""
    return name.split(".")[0] in OUTSIDE_THE_PRODUCT or any(inside(name, home) for home in FORMER_HOMES)


def imports_of(prefix: str) -> set[tuple[str, str]]:
    return {(a, b) for a, b in GRAPH.edges if inside(a, prefix)}


def test_the_graph_sees_the_project():
    assert len(GRAPH) > 60 and ("arbor_runtime.tasks.game24", "arbor_runtime.tasks.arith24") in GRAPH.edges
    assert ("arbor_runtime.verifiers.game24_oracle", "arbor_runtime.tasks.arith24") in GRAPH.edges
    assert ("arbor_runtime.verifiers.base", "arbor_runtime") not in GRAPH.edges  # a TYPE_CHECKING import
    assert ("arbor_cli.build", "arbor_runtime.tasks.base") in GRAPH.edges
    assert {"arbor_runtime", "arbor_runtime.tasks.base", "arbor_cli.conf"} <= set(GRAPH) and "tasks" not in GRAPH


def test_no_import_cycles():
    assert list(nx.simple_cycles(GRAPH)) == []


def test_verifiers_depend_on_the_task_interface_not_on_task_modules():
    bad = {
        (a, b)
        for a, b in imports_of("arbor_runtime.verifiers")
        if inside(b, "arbor_runtime.tasks") and b not in TASK_INTERFACE
    }
    assert bad == set()


def test_tasks_never_import_verifiers_controllers_or_the_runtime():
    tasks = imports_of("arbor_runtime.tasks")
    bad = {(a, b) for a, b in tasks if inside(b, "arbor_runtime") and not inside(b, "arbor_runtime.tasks")}
    assert tasks and bad == set()


def test_leaf_modules_import_nothing_but_leaves():
    for leaf in ("arbor_runtime.tasks.arith24", "arbor_runtime.tasks.latex", "arbor_runtime.tasks.answers"):
        assert set(GRAPH.successors(leaf)) <= {"arbor_runtime.tasks.latex"}, leaf


def test_the_runtime_package_stands_alone():
    """The runtime proper imports neither the CLI nor the controllers, tasks and verifiers in its namespace."""
    outside = {(a, b) for a, b in GRAPH.edges if a in CORE and b not in CORE}
    assert len(CORE) > 20 and outside == set()
    sources = " ".join(p.read_text() for p in (REPO / "arbor_runtime").rglob("*.py"))
    assert "import hydra" not in sources and "from hydra" not in sources and "import rich" not in sources


def test_the_typed_graph_counts_type_checking_imports():
    # backend names SparseAttention / SparseStep for its annotations only
    assert ("arbor_runtime.backend", "arbor_runtime.sparse") in TYPED_GRAPH.edges
    assert ("arbor_runtime.backend", "arbor_runtime.sparse") not in GRAPH.edges
    assert set(GRAPH.edges) <= set(TYPED_GRAPH.edges)


def test_no_import_cycles_in_the_runtime_counting_type_checking_imports():
    runtime = TYPED_GRAPH.subgraph(n for n in TYPED_GRAPH if n.split(".")[0] == "arbor_runtime")
    assert sorted(sorted(c) for c in nx.simple_cycles(runtime)) == []


def test_a_cycle_through_a_type_checking_import_is_found():
    modules = {"pkg", "pkg.a", "pkg.b"}
    a = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n"
    b = "from .a import thing\n"
    graph = nx.DiGraph()
    for name, source in (("pkg.a", a), ("pkg.b", b)):
        graph.add_edges_from((name, t) for t in imported_names(source, name, False, modules) if t in modules)
    assert list(nx.simple_cycles(graph)) != []
    assert imported_names(a, "pkg.a", False, modules, type_checking=False) == ["typing"]


def test_the_product_never_imports_benchmarks_or_research():
    """Every installed module (arbor_runtime/, arbor_cli/ and the folders mapped into them), every
    import counted: in functions, under TYPE_CHECKING, through importlib; and no Hydra ``_target_``."""
    modules = set(GRAPH)
    bad = []
    for name, path in FILES.items():
        names = imported_names(path.read_text(), name, path.name == "__init__.py", modules)
        bad += [(name, n) for n in names if outside_the_product(n)]
    assert len(FILES) > 60 and bad == []
    targets = [
        (str(path.relative_to(REPO)), line.split(":", 1)[1].strip())
        for path in sorted((REPO / "conf").rglob("*.yaml"))
        for line in path.read_text().splitlines()
        if line.strip().startswith("_target_:")
    ]
    assert len(targets) > 10 and [(f, t) for f, t in targets if outside_the_product(t)] == []


def test_benchmark_and_research_code_is_no_longer_in_the_package():
    assert not any((REPO / home.replace(".", "/")).exists() for home in FORMER_HOMES)
    assert not any((REPO / (home.replace(".", "/") + ".py")).exists() for home in FORMER_HOMES)
    assert {"benchmarks", "research"} <= {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    listed = PYPROJECT["packages"] + list(PYPROJECT["package-dir"])
    assert [p for p in listed if outside_the_product(p)] == []


def test_imports_of_benchmarks_or_research_are_seen():
    source = (
        "import importlib\nfrom typing import TYPE_CHECKING\n"
        "def f():\n    from benchmarks.speed import run\n    return importlib.import_module('research.kvp')\n"
        "if TYPE_CHECKING:\n    import research.msve\n"
    )
    names = imported_names(source, "arbor_cli.x", False, set())
    assert {n.split(".")[0] for n in names} >= OUTSIDE_THE_PRODUCT
    assert {"benchmarks.speed", "research.kvp", "research.msve"} <= set(names)
    # the package paths the code left count too, also as a relative import from inside arbor_cli
    old = "from .bench.trace import load_trace\nfrom typing import TYPE_CHECKING\n"
    old += "if TYPE_CHECKING:\n    import arbor_cli.kvp\n"
    names = imported_names(old, "arbor_cli.run", False, set())
    assert [n for n in names if outside_the_product(n)] == ["arbor_cli.bench.trace", "arbor_cli.kvp"]
    assert not outside_the_product("arbor_cli.build") and not outside_the_product("arbor_runtime.policies.kvp")


def _runtime_uses(path: Path) -> set[str]:
    """Attributes read off the runtime in ``path``: ``rt.x`` and ``self.rt.x``."""
    return {
        n.attr
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Attribute) and ast.unparse(n.value) in ("rt", "self.rt")
    }


def test_the_engine_and_choose_receive_their_collaborators_not_the_runtime():
    # the engine's modules and choose.py read nothing off a runtime and name no module that imports it
    engine = sorted((REPO / "arbor_runtime/engine").glob("*.py"))
    assert len(engine) >= 6
    for path in [*engine, REPO / "arbor_runtime/choose.py"]:
        assert _runtime_uses(path) == set(), path.name
        assert "Host" not in {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}
    for module in ("arbor_runtime.engine.core", "arbor_runtime.engine.executor", "arbor_runtime.choose"):
        assert "arbor_runtime.runtime" not in set(nx.descendants(TYPED_GRAPH, module)), module


def test_the_wheel_holds_only_the_projects_names_and_every_source_file(tmp_path):
    """Build the wheel (about 3 s) from a copy of the sources (a stale build/ in the checkout would leak
    into it) and list it: top level only arbor_runtime, arbor_cli and the dist-info, and each file of
    the package folders at its installed path (a subpackage missing from pyproject's list fails here);
    no file of benchmarks/ or research/ (copied beside them), nor of the package paths they left."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (src / name).write_bytes((REPO / name).read_bytes())
    # benchmarks/ and research/ sit beside the packages in the copy too, as in the checkout: only
    # pyproject's list keeps them out of the wheel
    for folder in sorted(OUTSIDE_THE_PRODUCT):
        for path in (REPO / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                (src / path.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
                (src / path.relative_to(REPO)).write_bytes(path.read_bytes())
    sources = {}  # path in the wheel -> source file
    for folder, package in PACKAGES.items():
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                rel = path.relative_to(REPO / folder)
                (src / folder / rel).parent.mkdir(parents=True, exist_ok=True)
                (src / folder / rel).write_bytes(path.read_bytes())
                sources["/".join([*package.split("."), *rel.parts])] = path
    out = tmp_path / "wheel"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr  # needs setuptools>=77 here (the dev extra)
    assert "absent from the `packages` configuration" not in build.stdout + build.stderr, build.stdout + build.stderr
    [wheel] = out.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/")[0] for n in names} == {"arbor_runtime", "arbor_cli", wheel.name.split("-py")[0] + ".dist-info"}
    assert {n for n in names if ".dist-info/" not in n} == set(sources)
    assert [n for n in names if outside_the_product(n.removesuffix(".py").replace("/", "."))] == []
    assert {"arbor_runtime/tasks/game24.py", "arbor_cli/conf/config.yaml", "arbor_cli/conf/policy/kvp.yaml"} <= names
