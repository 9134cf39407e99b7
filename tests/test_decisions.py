"""One decider (issue 48): where the budget is compared, where capabilities are read, what is private.

Read from the source with ``ast`` (nothing runs):

- Outside the planner (arbor_runtime/planner.py) and the pool's hard backstop (arbor_runtime/kv/pool.py)
  no module of the product compares anything against the KV budget: no comparison has a budget name
  on one side and anything but a literal on the other. Budget names are ``budget`` and the names
  ending in ``_budget`` or ``budget_tokens`` (a sparse policy's ``token_budget``, the tokens a decode
  query reads, is not KV memory), and every name that holds one under another name (``limit =
  cfg.budget_tokens``, an attribute set from it in another method: :func:`budget_aliases`). Checking a
  setting itself (``budget_tokens <= 0``: a literal or a constant on the other side), ``is None`` and
  membership (``in``) are not comparisons against the budget.
- Only the planner reads a policy's ``capabilities`` (a policy declares its own, a sparse wrapper from
  the policy it wraps: the policies package is where they are declared), and no module reads the seven
  booleans that capabilities replaced off a policy.
- No module imports a name starting with ``_`` from another module (the product, tests, benchmarks,
  research and scripts).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the installed product: the runtime, the CLI and the folders installed into the runtime's namespace
PRODUCT = ("arbor_runtime", "arbor_cli", "controllers", "tasks", "verifiers")
#: where the budget may be compared: the planner decides, the pool is the backstop
BUDGET_HOMES = {"arbor_runtime/planner.py", "arbor_runtime/kv/pool.py"}
#: the booleans every module used to branch on before ``Capabilities``
OLD_NAMES = {
    "offload", "keep_active_whole", "needs_attention", "frees_memory", "observation_window",
    "restores_active_path", "shrinks_active_path",
}  # fmt: skip


def sources(*folders: str) -> dict[str, ast.Module]:
    """Relative path -> parsed module, for every Python file under ``folders``."""
    return {
        str(p.relative_to(REPO)): ast.parse(p.read_text())
        for folder in folders
        for p in sorted((REPO / folder).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def is_budget_name(name: str) -> bool:
    return name != "token_budget" and (name == "budget" or name.endswith(("_budget", "budget_tokens")))


def budget_aliases(tree: ast.AST) -> set[str]:
    """Names that hold a budget under another name, in ``tree``: a variable or attribute assigned (``=``,
    ``+=``, a ``for`` target, a ``with ... as``, a tuple unpacked) from an expression that reads a budget name
    or another alias (``limit = self.config.budget_tokens``, ``cap, n = budget, 3``,
    ``self.room = limit - used``), followed to a fixpoint; a ``def`` argument named like a budget is one
    already. Names are collected over the whole module (an alias set in ``__init__`` is read elsewhere)."""
    aliases: set[str] = set()

    def reads_budget(expr: ast.AST) -> bool:  # a call's arguments make something else (``KVStore(..., budget)``)
        return any(is_budget_name(n) or n in aliases for n in _names(expr, calls=False))

    grew = True
    while grew:
        grew = False
        for node in ast.walk(tree):
            pairs = []
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                pairs = [(node.target, node.value)]
            elif isinstance(node, ast.For | ast.comprehension):
                pairs = [(node.target, node.iter)]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                pairs = [(node.optional_vars, node.context_expr)]
            elif isinstance(node, ast.NamedExpr):
                pairs = [(node.target, node.value)]
            for target, value in pairs:
                if not reads_budget(value):
                    continue
                for name in _target_names(target):
                    if name not in aliases and not is_budget_name(name):
                        aliases.add(name)
                        grew = True
    return aliases


def _literal(side: ast.AST) -> bool:
    """A literal, a negated one, or a constant's name (``AUTO``): checking a setting, not comparing amounts."""
    if isinstance(side, ast.UnaryOp):
        side = side.operand
    return isinstance(side, ast.Constant) or (isinstance(side, ast.Name) and side.id.isupper())


def _names(expr: ast.AST, calls: bool = True) -> list[str]:
    """Every variable and attribute name read in ``expr`` (``self.config.budget`` reads self, config, budget);
    without ``calls``, not those inside a call's arguments. UPPER_CASE names are constants, not read."""
    skip = set()
    if not calls:
        for node in ast.walk(expr):
            if isinstance(node, ast.Call):
                skip |= {id(n) for arg in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(arg)}
    return [
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(expr)
        if isinstance(n, ast.Name | ast.Attribute)
        and id(n) not in skip
        and not (n.id if isinstance(n, ast.Name) else n.attr).isupper()
    ]


def _target_names(target: ast.AST) -> list[str]:
    """The names an assignment target binds: a name, an attribute's last part, each part of a tuple."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute):
        return [target.attr]
    if isinstance(target, ast.Tuple | ast.List):
        return [name for elt in target.elts for name in _target_names(elt)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return []  # a subscript: the container is not the budget


def budget_comparisons(tree: ast.AST) -> list[str]:
    """Comparisons in ``tree`` of a budget name, or of a name holding one (:func:`budget_aliases`),
    against anything but a literal (``is None`` aside)."""
    aliases = budget_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if all(isinstance(op, ast.Is | ast.IsNot | ast.In | ast.NotIn) for op in node.ops):
            continue  # identity and membership: nothing is compared against an amount
        if any(_literal(s) for s in sides):
            continue
        if any(is_budget_name(n) or n in aliases for n in _names(node)):
            found.append((node.lineno, f"{node.lineno}: {ast.unparse(node)}"))
    return [line for _, line in sorted(found)]


def capability_reads(tree: ast.AST) -> list[str]:
    """Reads of ``.capabilities``, and of the old booleans off something named like a policy."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        receiver = ast.unparse(node.value)
        if node.attr == "capabilities" or (node.attr in OLD_NAMES and receiver.endswith(("policy", "inner"))):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


#: the project's own top-level packages: a private name of a third-party package (torch's profiler
#: event types) is that package's business, not this project's structure
OWN_PACKAGES = ("arbor_runtime", "arbor_cli", "benchmarks", "controllers", "tasks", "verifiers", "research", "tests")


def private_imports(tree: ast.AST) -> list[str]:
    """``from module import _name`` of this project's modules in ``tree``."""
    return [
        f"{node.lineno}: from {node.module} import {alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.level or (node.module or "").split(".")[0] in OWN_PACKAGES)
        for alias in node.names
        if alias.name.startswith("_")
    ]  # fmt: skip


@pytest.fixture(scope="module")
def product() -> dict[str, ast.Module]:
    return sources(*PRODUCT)


def test_only_the_planner_and_the_pool_compare_against_the_budget(product):
    found = {path: budget_comparisons(tree) for path, tree in product.items() if path not in BUDGET_HOMES}
    assert {path: lines for path, lines in found.items() if lines} == {}
    assert len(budget_comparisons(product["arbor_runtime/planner.py"])) >= 5  # the check sees them where they are


def test_only_the_planner_reads_capabilities(product):
    found = {
        path: capability_reads(tree)
        for path, tree in product.items()
        if path != "arbor_runtime/planner.py" and not path.startswith("arbor_runtime/policies/")
    }
    assert {path: lines for path, lines in found.items() if lines} == {}
    assert capability_reads(product["arbor_runtime/planner.py"])


def test_no_module_imports_a_private_name_from_another():
    found = {
        path: private_imports(tree)
        for path, tree in sources(*PRODUCT, "tests", "benchmarks", "research", "scripts").items()
    }
    assert {path: lines for path, lines in found.items() if lines} == {}


def test_a_budget_compared_through_an_alias_is_seen():
    """A budget read into another name, or into an attribute set elsewhere, and compared there is still a
    comparison against the budget (checking names alone let ``limit = cfg.budget_tokens; used > limit`` pass)."""
    source = (
        "limit = self.config.budget_tokens\n"
        "if used > limit: pass\n"  # through a variable
        "class A:\n"
        "    def __init__(self, config):\n"
        "        self.cap, n = config.kv_budget_tokens - 8, 3\n"  # into an attribute, unpacked
        "    def full(self, used):\n"
        "        return used >= self.cap\n"  # read in another method
        "room = [x for x in (limit,)]\n"
        "if room[0] < 5 + need: pass\n"  # a container holding it, through a subscript
        "store = KVStore(shape, budget)\n"  # built from it: a store, not a budget
        "if block in store: pass\n"
        "if n == AUTO: pass\n"  # a constant: checking a setting
    )
    assert budget_comparisons(ast.parse(source)) == [
        "2: used > limit",
        "7: used >= self.cap",
        "9: room[0] < 5 + need",
    ]


def test_the_checks_see_what_they_look_for():
    source = (
        "if used + need > self.budget: pass\n"  # a decision against the budget
        "if pool.kv_budget_tokens < 1: pass\n"  # checking the setting itself
        "if budget is None: pass\n"
        "if reads >= select.token_budget: pass\n"  # a sparse read budget, not KV memory
        "caps = rt.policy.capabilities\n"
        "if self.policy.offload: pass\n"
        "from arbor_runtime.loading import _tiny_random\n"
        "from benchmarks.results.collect import _budgets_losses\n"
    )
    tree = ast.parse(source)
    assert budget_comparisons(tree) == ["1: used + need > self.budget"]
    assert capability_reads(tree) == ["5: rt.policy.capabilities", "6: self.policy.offload"]
    assert private_imports(tree) == [
        "7: from arbor_runtime.loading import _tiny_random",
        "8: from benchmarks.results.collect import _budgets_losses",
    ]
