"""Game of 24 arithmetic: exact solvability, a safe expression checker, the puzzle and number formats.

A leaf module (no project imports): the Game of 24 task and its symbolic verifier both read it.
Everything is exact ``Fraction`` arithmetic, so "8 / (3 - 8/3)" counts as 24 and rounding never
makes a dead end look alive (or the reverse).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from fractions import Fraction
from functools import cache

TARGET = Fraction(24)
#: longest expression ``check_expression`` parses; a 4-number answer is far shorter
MAX_EXPRESSION_CHARS = 200

_UNICODE_OPS = str.maketrans({"×": "*", "÷": "/"})
_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_PUZZLE_NUMBER = re.compile(r"\d+", re.ASCII)


def parse_puzzle(text: str) -> tuple[int, int, int, int]:
    """The four numbers of a puzzle like "4 4 6 8"; ValueError naming ``text`` otherwise."""
    tokens = str(text).split()
    if len(tokens) != 4 or not all(_PUZZLE_NUMBER.fullmatch(t) for t in tokens):
        raise ValueError(
            f"malformed Game of 24 puzzle {text!r}: expected four non-negative integers "
            "separated by spaces, e.g. '4 4 6 8'"
        )
    a, b, c, d = (int(t) for t in tokens)
    return a, b, c, d


def format_number(value: Fraction) -> str:
    """``value`` as the task writes it: "12", "-2", "8/3"."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def solvable(numbers: Iterable[Fraction | int]) -> bool:
    """Whether ``numbers`` can be combined into exactly 24, each used once, with + - * /."""
    key = tuple(sorted(Fraction(n) for n in numbers))
    return bool(key) and _solvable(key)


def check_expression(expr: str, inputs: Sequence[int]) -> bool:
    """Whether ``expr`` uses exactly the multiset ``inputs`` with + - * / and equals 24.

    Parsed with ``ast`` (never ``eval``): only integer literals, the four binary operators and
    parentheses are accepted; × and ÷ are read as * and /. Anything else, including division by
    zero, gives False.
    """
    found = evaluate(expr)
    return found is not None and found[0] == TARGET and Counter(found[1]) == Counter(inputs)


def evaluate(expr: str) -> tuple[Fraction, list[int]] | None:
    """``expr``'s exact value and the integer literals it uses (in order), parsed as :func:`check_expression`
    parses; None when it is not such an expression or divides by zero."""
    tree = _parse(expr)
    if tree is None:
        return None
    used: list[int] = []
    try:
        return _evaluate(tree.body, used), used
    except (ValueError, ZeroDivisionError):
        return None


def apply_op(a: Fraction, op: str, b: Fraction) -> Fraction:
    """``a op b`` for an ASCII operator among + - * /; ZeroDivisionError for ``b == 0`` with /."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    raise ValueError(f"unknown operator {op!r}; expected one of + - * /")


@cache
def _solvable(key: tuple[Fraction, ...]) -> bool:
    """Exact search over every pair and operation; ``key`` is a sorted tuple (the memo key)."""
    if len(key) == 1:
        return key[0] == TARGET
    for i in range(len(key)):
        for j in range(i + 1, len(key)):
            rest = key[:i] + key[i + 1 : j] + key[j + 1 :]
            for value in _combinations(key[i], key[j]):
                if _solvable(tuple(sorted((*rest, value)))):
                    return True
    return False


def _combinations(a: Fraction, b: Fraction) -> set[Fraction]:
    """Every value one operation can make from ``a`` and ``b`` (both orders of - and /)."""
    values = {a + b, a - b, b - a, a * b}
    if b:
        values.add(a / b)
    if a:
        values.add(b / a)
    return values


def _parse(expr: str) -> ast.Expression | None:
    """``expr`` as an expression tree, or None when it is too long or not Python syntax."""
    if not isinstance(expr, str) or len(expr) > MAX_EXPRESSION_CHARS:
        return None
    try:
        return ast.parse(expr.translate(_UNICODE_OPS).strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of an allowed node; appends every literal to ``used``; ValueError otherwise."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        return apply_op(left, _AST_OPS[type(node.op)], right)
    raise ValueError(f"not allowed in a Game of 24 expression: {ast.dump(node)[:60]}")
