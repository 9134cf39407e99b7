"""A small LaTeX -> sympy converter for answer equivalence (sympy's parse_latex needs antlr 4.11).

Covers what final answers use: numbers, + - * / ^, \\frac, \\sqrt, \\pi, \\cdot, \\times,
implicit multiplication, a few functions and Greek letters. Anything else raises ValueError.
"""

from __future__ import annotations

import re

import sympy

# --- LaTeX -> sympy -----------------------------------------------------------------------------
_TOKEN = re.compile(r"\d+(?:\.\d+)?|\\[a-zA-Z]+|[a-zA-Z]|[-+*/^(){}\[\]]")
_FUNCTIONS = {
    "\\sin": sympy.sin, "\\cos": sympy.cos, "\\tan": sympy.tan, "\\cot": sympy.cot,
    "\\sec": sympy.sec, "\\csc": sympy.csc, "\\ln": sympy.log, "\\log": sympy.log, "\\exp": sympy.exp,
}  # fmt: skip
_CONSTANTS = {"\\pi": sympy.pi, "\\infty": sympy.oo}
_TIMES = ("*", "\\cdot", "\\times")
_GREEK = frozenset("alpha beta gamma delta theta lambda mu phi psi omega sigma tau rho".split())
#: largest exponent of a numeric power, so "2^{10^{9}}" cannot stall the grader
_MAX_EXPONENT = 1000


def latex_to_sympy(s: str) -> sympy.Expr:
    """A small LaTeX subset as a sympy expression; ValueError for anything outside it.

    Covers numbers, one-letter variables (and Greek ones), + - * / ^, \\cdot, \\times, \\div,
    \\frac, \\sqrt (with an optional index), \\pi, \\infty, a few functions, parentheses, brackets
    and braces; juxtaposition multiplies ("2\\sqrt{3}x"). Decimals become exact rationals.
    """
    tokens = _tokenize(s)
    parser = _Parser(tokens)
    expr = parser.expression()
    if parser.pos != len(tokens):
        raise ValueError(f"unexpected {tokens[parser.pos]!r} in {s!r}")
    return expr


def _tokenize(s: str) -> list[str]:
    """Tokens of ``s``; ValueError when some character is not covered."""
    s = s.replace("\\div", "/").replace(" ", "")
    tokens, pos = [], 0
    while pos < len(s):
        match = _TOKEN.match(s, pos)
        if match is None:
            raise ValueError(f"cannot read {s[pos : pos + 10]!r}")
        tokens.append(match.group())
        pos = match.end()
    return tokens


class _Parser:
    """Recursive descent: expression := term (+|- term)*; term := factor ([*/]? factor)*;
    factor := (+|-) factor | power; power := atom (^ argument)*."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"expected {expected or 'more input'}, got {token!r}")
        self.pos += 1
        return token

    def expression(self) -> sympy.Expr:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> sympy.Expr:
        value = self.factor()
        while (token := self.peek()) is not None and token not in ("+", "-", ")", "]", "}"):
            if token in _TIMES or token == "/":
                self.take()
            right = self.factor()
            value = value / right if token == "/" else value * right
        return value

    def factor(self) -> sympy.Expr:
        if self.peek() in ("+", "-"):
            return -self.factor() if self.take() == "-" else self.factor()
        return self.power()

    def power(self) -> sympy.Expr:
        value = self.atom()
        while self.peek() == "^":
            self.take()
            exponent = self.argument()
            if exponent.is_number and value.is_number and abs(exponent) > _MAX_EXPONENT:
                raise ValueError(f"exponent {exponent} too large")
            value = value**exponent
        return value

    def argument(self) -> sympy.Expr:
        """A braced group, or one character of the next token (LaTeX: "2^10" is 2^1 then 0)."""
        if self.peek() == "{":
            return self.atom()
        token = self.take()
        if token[0].isdigit() and len(token) > 1:
            self.tokens.insert(self.pos, token[1:])
            token = token[0]
        return self.atom_of(token)

    def atom(self) -> sympy.Expr:
        return self.atom_of(self.take())

    def atom_of(self, token: str) -> sympy.Expr:
        closing = {"(": ")", "[": "]", "{": "}"}
        if token in closing:
            value = self.expression()
            self.take(closing[token])
            return value
        if token[0].isdigit():
            return sympy.Rational(token)
        if token.isalpha():
            return sympy.Symbol(token)
        if token == "\\frac":
            return self.argument() / self.argument()
        if token == "\\sqrt":
            return self.sqrt()
        if token in _CONSTANTS:
            return _CONSTANTS[token]
        if token in _FUNCTIONS:
            return _FUNCTIONS[token](self.power())
        if token[1:] in _GREEK:
            return sympy.Symbol(token[1:])
        raise ValueError(f"unsupported token {token!r}")

    def sqrt(self) -> sympy.Expr:
        """\\sqrt{x} or \\sqrt[n]{x}."""
        if self.peek() == "[":
            self.take()
            index = self.expression()
            self.take("]")
            return sympy.root(self.argument(), index)
        return sympy.sqrt(self.argument())
