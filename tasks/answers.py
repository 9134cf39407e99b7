"""Final-answer extraction and matching for GSM8K, MATH-500 and AIME, plus self-consistency voting.

A leaf module: pure functions on strings, no model, no data files, no project imports but the
LaTeX converter. The MATH normalizer follows the spirit of the
MATH / prm800k graders (strip markup, units and spacing; canonical fractions and square roots), then
falls back to numeric and symbolic (sympy) equivalence. Matchers never raise: anything that cannot be
compared counts as "not equal".
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from fractions import Fraction
from typing import NamedTuple

import sympy

from arbor_runtime.tasks.latex import latex_to_sympy

#: absolute tolerance of numeric comparisons (decimals and integer fractions compare exactly)
TOLERANCE = 1e-6
#: seconds ``sympy.simplify`` may take in ``math_equal`` before the pair counts as not equal
SIMPLIFY_TIMEOUT_S = 2.0
#: longest normalized answer handed to sympy; longer ones are compared as strings only
MAX_SYMPY_CHARS = 200

_MARKER = re.compile(r"the answer is|####|answer:", re.IGNORECASE)
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)")
_DECIMAL = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_INT_FRAC = re.compile(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}")
_INT_SLASH = re.compile(r"(-?\d+)/(\d+)")
#: "1\frac{4}{5}" (a mixed number) where the whole part is not itself an exponent, index or digit run
_MIXED = re.compile(r"(?<![\w^.}\\)])(\d+)\\frac\{(\d+)\}\{(\d+)\}")
_CHOICE = re.compile(r"^\(([A-E])\)$")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_LEADING_VAR = re.compile(r"(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?(?:=|\\in)(?=.)")
_TEXT = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm)\{([^{}]*)\}(?:\^\{?\d\}?)?")
_REMOVE = ("\\!", "\\,", "\\;", "\\:", "\\quad", "\\qquad", "\\displaystyle", "\\left", "\\right")
_DEGREES = ("^{\\circ}", "^\\circ", "\\circ", "\\%", "%", "\\$", "$")


# --- GSM8K --------------------------------------------------------------------------------------


def extract_gsm8k_gold(answer_field: str) -> str:
    """The gold number of a GSM8K ``answer`` field: the text after the last "####", commas removed."""
    _, sep, tail = answer_field.rpartition("####")
    return (tail if sep else answer_field).strip().replace(",", "")


def extract_number(text: str | None) -> str | None:
    """The final number a model wrote, as text without commas or "$" ("1,234.50" -> "1234.50").

    Takes the first number after the last "The answer is" / "####" / "Answer:" marker when one is
    followed by a number, else the last number in ``text``; None when there is no number at all.
    """
    if not text:
        return None
    text = text.replace("$", "").replace("\u2212", "-")
    markers = list(_MARKER.finditer(text))
    if markers:
        found = _NUMBER.search(text, markers[-1].end())
        if found:
            return found.group().replace(",", "")
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def gsm8k_match(pred: str | None, gold: str | None) -> bool:
    """Whether two numbers written as text ("$1,000", "18.0", "-3") are equal within 1e-6 (absolute)."""
    a, b = _to_fraction(_plain_number(pred)), _to_fraction(_plain_number(gold))
    return a is not None and b is not None and _close(a, b)


# --- MATH ---------------------------------------------------------------------------------------


def extract_boxed(text: str | None) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text`` (nested braces balanced).

    ``\\boxed 5`` (no braces) gives the token after the space. None when there is no box or its
    braces never close.
    """
    if not text:
        return None
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start + (6 if text.startswith("\\boxed", start) else 5) :]
    if rest[:1].isspace():
        words = rest.strip().split("$")[0].split()
        return words[0] if words else None
    if not rest.startswith("{"):
        return None
    group = _brace_group(rest, 0)
    return None if group is None else rest[1 : group - 1]


def extract_math_answer(text: str | None) -> str | None:
    """A MATH answer from a final line: the last box, else what follows "The answer is"."""
    boxed = extract_boxed(text)
    if boxed is not None or not text:
        return boxed
    found = list(re.finditer(r"the answer is", text, re.IGNORECASE))
    if not found:
        return None
    answer = text[found[-1].end() :].strip().rstrip(".").strip().strip("$").strip()
    return answer or None


def normalize_math(s: str | None) -> str:
    """Canonical text of a MATH answer, in the spirit of the MATH / prm800k normalizers.

    Unwraps a box, removes "$", spacing commands, \\left/\\right, degrees, percent, \\text units,
    spaces, a trailing "." and a leading "x =" / "x \\in"; "dfrac"/"tfrac" -> "frac"; "\\frac12" ->
    "\\frac{1}{2}", "\\sqrt2" -> "\\sqrt{2}", "3/4" -> "\\frac{3}{4}", "1\\frac{4}{5}" -> "\\frac{9}{5}",
    "10,080" -> "10080", "10.0" -> "10".
    """
    if s is None:
        return ""
    s = str(s).strip()
    if "\\boxed" in s or "\\fbox" in s:
        s = extract_boxed(s) or s
    s = s.replace("\n", " ").replace("tfrac", "frac").replace("dfrac", "frac")
    for token in (*_REMOVE, *_DEGREES):
        s = s.replace(token, "")
    s = _strip_text(s).replace(" ", "").rstrip(".").rstrip(",")
    s = _LEADING_VAR.sub("", s, count=1) if _LEADING_VAR.match(s) else s
    s = _brace_arguments(_brace_arguments(s, "\\frac", 2), "\\sqrt", 1)
    s = _MIXED.sub(_improper, s)
    s = _CHOICE.sub(r"\1", s)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return _canonical_number(s)


def math_equal(pred: str | None, gold: str | None) -> bool:
    """Whether two MATH answers are equivalent; never raises.

    Equal after ``normalize_math``, else numerically equal, else (tuples and intervals element-wise
    with the same brackets) symbolically equal: sympy simplifies the difference to 0 in at most
    ``SIMPLIFY_TIMEOUT_S`` seconds.
    """
    if pred is None or gold is None:
        return False
    a, b = normalize_math(pred), normalize_math(gold)
    if not a or not b:
        return False
    if a == b:
        return True
    seq_a, seq_b = _split_sequence(a), _split_sequence(b)
    if seq_a is None and seq_b is None:
        return _scalar_equal(a, b)
    if seq_a is None or seq_b is None or seq_a[0] != seq_b[0] or len(seq_a[1]) != len(seq_b[1]):
        return False
    return all(_scalar_equal(x, y) for x, y in zip(seq_a[1], seq_b[1], strict=True))


# --- AIME ---------------------------------------------------------------------------------------


def extract_aime(text: str | None) -> str | None:
    """An AIME answer (integer 0..999) as canonical text ("025" -> "25"), from a box or the last number."""
    if text is None:
        return None
    number = extract_number(extract_boxed(text) or text)
    value = _to_fraction(number)
    if value is None or value.denominator != 1 or not 0 <= value <= 999:
        return None
    return str(int(value))


def aime_match(pred: str | None, gold: str | None) -> bool:
    """Whether ``pred`` gives the integer ``gold`` (both 0..999; leading zeros and boxes allowed)."""
    a, b = extract_aime(pred), extract_aime(gold)
    return a is not None and a == b


# --- answer rules -------------------------------------------------------------------------------


class AnswerRule(NamedTuple):
    """How a task reads and compares answers: the answer a final step states, whether two answers
    are equal, and the reference answer in a data row's answer field."""

    extract: Callable[[str | None], str | None]
    match: Callable[[str | None, str | None], bool]
    gold: Callable[[str], str]


#: answer rules by name (a stepwise task's ``answer`` setting)
ANSWER_RULES: dict[str, AnswerRule] = {
    # a number; the reference is the number after "####" (GSM8K), or the field itself
    "number": AnswerRule(extract_number, gsm8k_match, extract_gsm8k_gold),
    # a LaTeX expression compared after normalization, numerically or symbolically (MATH)
    "math": AnswerRule(extract_math_answer, math_equal, str),
    # an integer 0..999 (AIME)
    "integer": AnswerRule(extract_aime, aime_match, str),
}


# --- voting -------------------------------------------------------------------------------------


def majority_vote(
    answers: Sequence[str | None], equal: Callable[[str, str], bool] = str.__eq__
) -> tuple[str | None, int]:
    """Self-consistency vote: the most common answer under ``equal`` and its count.

    None answers are ignored. Each answer joins the first earlier group whose first member it
    equals; ties go to the group that appeared first. ``(None, 0)`` when no answer is given.
    """
    groups: list[list] = []  # [first member, count], in order of first appearance
    for answer in answers:
        if answer is None:
            continue
        group = next((g for g in groups if equal(g[0], answer)), None)
        if group is None:
            groups.append([answer, 1])
        else:
            group[1] += 1
    if not groups:
        return None, 0
    winner = max(groups, key=lambda g: g[1])  # max keeps the first of equal counts
    return winner[0], winner[1]


# --- helpers: numbers ---------------------------------------------------------------------------


def _close(a: Fraction, b: Fraction) -> bool:
    """Numeric equality within ``TOLERANCE``, absolute: exact rationals, so 1000000 != 1000001."""
    return abs(a - b) <= TOLERANCE


def _plain_number(text: str | None) -> str | None:
    """``text`` without "$", commas, spaces and a trailing period."""
    if text is None:
        return None
    return text.replace("$", "").replace(",", "").replace(" ", "").rstrip(".")


def _to_fraction(text: str | None) -> Fraction | None:
    """A plain decimal, an integer fraction "\\frac{a}{b}" or "a/b", exactly; None otherwise."""
    if not text:
        return None
    if _DECIMAL.fullmatch(text):
        return Fraction(text)
    match = _INT_FRAC.fullmatch(text)
    if match:
        sign, num, den = match.groups()
        return None if int(den) == 0 else (-1 if sign else 1) * Fraction(int(num), int(den))
    match = _INT_SLASH.fullmatch(text)
    if match and int(match[2]) != 0:
        return Fraction(int(match[1]), int(match[2]))
    return None


def _canonical_number(s: str) -> str:
    """Decimals without trailing zeros ("10.0" -> "10", "0.50" -> "0.5"); "a/b" -> "\\frac{a}{b}"."""
    if _DECIMAL.fullmatch(s) and "." in s:
        value = Fraction(s)
        return str(value.numerator) if value.denominator == 1 else s.rstrip("0").rstrip(".")
    match = _INT_SLASH.fullmatch(s)
    if match:
        return f"\\frac{{{match[1]}}}{{{match[2]}}}"
    return s


def _improper(match: re.Match) -> str:
    """A mixed number as an improper fraction: "1\\frac{4}{5}" -> "\\frac{9}{5}"."""
    whole, num, den = match.groups()
    return f"\\frac{{{int(whole) * int(den) + int(num)}}}{{{den}}}"


# --- helpers: LaTeX text ------------------------------------------------------------------------


def _brace_group(s: str, start: int) -> int | None:
    """Index just past the brace group opening at ``s[start] == "{"``; None when it never closes."""
    depth = 0
    for i in range(start, len(s)):
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        if depth == 0:
            return i + 1
    return None


def _strip_text(s: str) -> str:
    """A whole-answer ``\\text{X}`` becomes X; a ``\\text{...}`` after other text is a unit, dropped."""
    whole = _TEXT.fullmatch(s.strip())
    if whole:
        return whole.group(1).strip()
    stripped = _TEXT.sub("", s)
    return stripped if stripped.strip() else s


def _brace_arguments(s: str, command: str, n_args: int) -> str:
    """Wrap single-character arguments of ``command`` in braces: "\\frac12" -> "\\frac{1}{2}"."""
    out, i = [], 0
    while (j := s.find(command, i)) >= 0:
        out.append(s[i : j + len(command)])
        i = j + len(command)
        if i < len(s) and s[i].isalpha():  # a longer command, e.g. \fracx is not \frac x
            continue
        if s.startswith("[", i) and "]" in s[i:]:  # the index of \sqrt[3]{x}
            end = s.index("]", i) + 1
            out.append(s[i:end])
            i = end
        for _ in range(n_args):
            if i >= len(s):
                break
            end = _brace_group(s, i) if s[i] == "{" else i + 1
            if end is None:
                break
            out.append(s[i:end] if s[i] == "{" else "{" + s[i] + "}")
            i = end
    out.append(s[i:])
    return "".join(out)


def _split_sequence(s: str) -> tuple[str, list[str]] | None:
    """("()" / "[)" ..., elements) for a tuple or interval, ("", elements) for a bare comma list;
    None for a single item. Commas inside braces or nested brackets do not split."""
    brackets = ""
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _closes_at_end(s):
        brackets, s = s[0] + s[-1], s[1:-1]
    parts, depth, current = [], 0, []
    for char in s:
        depth += 1 if char in "([{" else -1 if char in ")]}" else 0
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return (brackets, parts) if len(parts) > 1 else None


def _closes_at_end(s: str) -> bool:
    """Whether the bracket opening ``s`` is the one closed by its last character."""
    depth = 0
    for i, char in enumerate(s):
        depth += 1 if char in "([{" else -1 if char in ")]}" else 0
        if depth == 0 and i < len(s) - 1:
            return False
    return True


# --- helpers: equivalence -----------------------------------------------------------------------


def _scalar_equal(a: str, b: str) -> bool:
    """Equality of two normalized single answers: text, numbers, then sympy."""
    if a == b:
        return True
    x, y = _to_fraction(a), _to_fraction(b)
    if x is not None and y is not None:
        return _close(x, y)
    if len(a) > MAX_SYMPY_CHARS or len(b) > MAX_SYMPY_CHARS:
        return False
    try:
        return _sympy_equal(latex_to_sympy(a), latex_to_sympy(b))
    except Exception:  # any parse or sympy failure means "not shown equal"
        return False


def _sympy_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Equal when the difference is numerically 0 (constants) or simplifies to 0 in time.

    Where no timer can bound ``sympy.simplify`` (outside the main thread), expressions with
    variables are compared at a few fixed points instead.
    """
    diff = a - b
    if diff == 0:
        return True
    if not diff.free_symbols:
        return _numerically_zero(diff)
    if _can_time_limit():
        with _time_limit(SIMPLIFY_TIMEOUT_S):
            return sympy.simplify(diff) == 0
    symbols = sorted(diff.free_symbols, key=str)
    points = [{s: sympy.Rational(7 * k + 3 * j + 5, 11) for j, s in enumerate(symbols)} for k in range(3)]
    return all(_numerically_zero(diff.subs(p)) for p in points)


def _numerically_zero(diff: sympy.Expr) -> bool:
    """Whether the constant ``diff`` is 0 within ``TOLERANCE`` (evaluated to 30 digits)."""
    return abs(complex(sympy.N(diff, 30))) <= TOLERANCE


def _can_time_limit() -> bool:
    """Whether ``_time_limit`` can work here: SIGALRM exists, this is the main thread (only it
    takes signals) and nobody else's timer (e.g. pytest-timeout's) is running."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    )


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeoutError inside the block after ``seconds`` (needs ``_can_time_limit()``)."""

    def _alarm(signum, frame):
        raise TimeoutError(f"sympy took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
