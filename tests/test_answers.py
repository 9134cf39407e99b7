"""Answer matchers on GSM8K / MATH-500 / AIME rows (synthetic ones, real rows inlined under
tests/fixtures, whole real files when the full data sets are present), hand-made equivalences, and voting."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from synthetic_data import AIME, GSM8K_TEST, MATH500

from arbor_runtime.tasks.answers import (
    aime_match,
    extract_aime,
    extract_boxed,
    extract_gsm8k_gold,
    extract_math_answer,
    extract_number,
    gsm8k_match,
    latex_to_sympy,
    majority_vote,
    math_equal,
    normalize_math,
)


def rows(path: Path) -> list[dict]:
    """Rows of a JSONL data file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def gsm8k(full_data) -> list[dict]:
    return rows(full_data / "gsm8k" / "test.jsonl")


@pytest.fixture(scope="module")
def math500(full_data) -> list[dict]:
    return rows(full_data / "math500" / "test.jsonl")


@pytest.fixture(scope="module")
def aime(full_data) -> list[dict]:
    return rows(full_data / "aime" / "aime_2024_2025.jsonl")


# --- synthetic rows -----------------------------------------------------------------------------


@pytest.mark.parametrize(("row", "gold"), list(zip(GSM8K_TEST, ["34", "2500", "-10", "12"], strict=True)))
def test_gsm8k_gold_on_synthetic_rows(row, gold):
    assert extract_gsm8k_gold(row["answer"]) == gold
    assert extract_number(row["answer"]) == gold  # "#### N" is an answer marker
    assert gsm8k_match(f"${int(gold):,}.00", gold) and not gsm8k_match(str(int(gold) + 1), gold)


@pytest.mark.parametrize("row", MATH500)
def test_math500_boxed_solution_matches_answer_on_synthetic_rows(row):
    assert math_equal(extract_boxed(row["solution"]), row["answer"])


@pytest.mark.parametrize("row", AIME)
def test_aime_synthetic_rows_match_their_integer(row):
    value = int(row["answer"])
    assert aime_match(f"so $\\boxed{{{value:03d}}}$", row["answer"])
    assert not aime_match(str((value + 1) % 1000), row["answer"])


# --- real rows inlined as fixtures ---------------------------------------------------------------


def test_fixture_rows_are_the_rows_of_the_full_files(real_rows, gsm8k, math500, aime):
    full = {"gsm8k": gsm8k, "math500": math500, "aime": aime}
    assert set(real_rows) == set(full)
    for name, rows_by_index in real_rows.items():
        assert rows_by_index and all(full[name][i] == row for i, row in rows_by_index.items()), name


# --- GSM8K --------------------------------------------------------------------------------------

#: row -> gold; includes thousands separators (146, 611) and a negative answer (489)
GSM8K_GOLDS = {0: "18", 1: "3", 2: "70000", 146: "2125", 489: "-10", 611: "1450000"}


@pytest.mark.parametrize("index", sorted(GSM8K_GOLDS))
def test_gsm8k_gold_on_real_rows(real_rows, index):
    answer = real_rows["gsm8k"][index]["answer"]
    gold = extract_gsm8k_gold(answer)
    assert gold == GSM8K_GOLDS[index]
    assert gsm8k_match(gold, gold)
    assert extract_number(answer) == gold  # "#### N" is an answer marker
    assert not gsm8k_match(str(int(gold) + 1), gold)
    assert gsm8k_match(f"${int(gold):,}.00", gold)


def test_gsm8k_every_test_gold_is_a_number(gsm8k):
    golds = [extract_gsm8k_gold(r["answer"]) for r in gsm8k]
    assert all(gsm8k_match(g, g) for g in golds)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is $1,234.50.", "1234.50"),
        ("She has 9 - 3 = 6 left.\nThe answer is 6.", "6"),
        ("#### -7", "-7"),
        ("Answer: 12 apples and 3 pears", "12"),
        ("It costs $5. Then 7 are left", "7"),
        ("so x = -0.5.", "-0.5"),
        ("10-5=5", "5"),
        ("The answer is -$5.", "-5"),
        ("The answer is unclear, but 42 is likely", "42"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_number(text, number):
    assert extract_number(text) == number


def test_gsm8k_match_is_exact_beyond_tolerance():
    assert gsm8k_match("18.0", "18") and gsm8k_match("$1,000", "1000") and gsm8k_match("0.3333333", "0.3333334")
    assert not gsm8k_match("1000001", "1000000")
    assert not gsm8k_match(None, "3") and not gsm8k_match("three", "3")


# --- MATH ---------------------------------------------------------------------------------------

#: rows checked by hand: tuples (0, 60), fractions (2, 106, 305), sqrt (8, 31), degrees (7), text (4),
#: list (25), interval (103, 293), thousands (198, 242), units (257), mixed number (264)
MATH_ROWS = (0, 2, 4, 7, 8, 25, 31, 60, 103, 106, 198, 242, 257, 264, 293, 305)
#: row -> a wrong answer close to the reference
MATH_WRONG = {
    0: "\\left( 3, \\pi \\right)",
    2: "\\frac{14}{5}",
    4: "\\text{Navin}",
    8: "3\\sqrt{31}",
    25: "1,2",
    31: "11\\sqrt3",
    60: "(6,31,1)",
    103: "(3,4)",
    106: "\\frac34",
    198: "10,081",
    264: "1\\frac{3}{5}",
    305: "\\frac{19}{9}",
}
#: row -> the reference in another form
MATH_OTHER_FORM = {
    0: "(3, \\pi/2)",
    2: "4\\frac{2}{3}",
    7: "90",
    8: "\\sqrt{117}",
    31: "\\sqrt{242}",
    106: "1\\frac13",
    198: "10080",
    242: "32348",
    257: "864",
    264: "1.8",
    305: "\\dfrac{9}{19}",
}


@pytest.mark.parametrize("index", MATH_ROWS)
def test_math500_boxed_solution_matches_answer(real_rows, index):
    row = real_rows["math500"][index]
    assert math_equal(extract_boxed(row["solution"]), row["answer"])


def test_math500_every_boxed_solution_matches(math500):
    mismatched = [i for i, r in enumerate(math500) if not math_equal(extract_boxed(r["solution"]), r["answer"])]
    assert mismatched == []


@pytest.mark.parametrize("index", sorted(MATH_WRONG))
def test_math500_perturbed_answer_is_wrong(real_rows, index):
    assert not math_equal(MATH_WRONG[index], real_rows["math500"][index]["answer"])


@pytest.mark.parametrize("index", sorted(MATH_OTHER_FORM))
def test_math500_answer_in_other_form(real_rows, index):
    assert math_equal(MATH_OTHER_FORM[index], real_rows["math500"][index]["answer"])


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac12", "0.5"),
        ("\\frac{1}{2}", "\\dfrac12"),
        ("10", "10.0"),
        ("$10$", "10"),
        ("10.0", "$10$"),
        ("(1,2)", "(1, 2)"),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
        ("\\sqrt[3]{8}", "2"),
        ("2^{10}", "1024"),
        ("x = 5", "5"),
        ("5\\text{ cm}", "5"),
        ("50\\%", "50"),
        ("\\text{(C)}", "C"),
        ("\\boxed{3\\pi}", "3\\pi"),
        ("\\frac{x^2-1}{x-1}", "x+1"),
        ("(-\\infty, 0]", "(-\\infty,0]"),
    ],
)
def test_math_equivalent(a, b):
    assert math_equal(a, b) and math_equal(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("(1,2)", "[1,2]"),
        ("(1,2)", "(2,1)"),
        ("(1,2)", "1"),
        ("0.333", "\\frac13"),
        ("10^{6}", "1000001"),
        ("\\frac{x^2-1}{x-1}", "x+2"),
        ("\\frac{", "1"),
        ("", ""),
        (None, "1"),
        ("2^{2^{100}}", "1"),
    ],
)
def test_math_not_equivalent(a, b):
    assert not math_equal(a, b)


def test_math_equal_outside_main_thread_uses_sampling():
    results = []
    worker = threading.Thread(
        target=lambda: results.append((math_equal("x^2+2x+1", "(x+1)^2"), math_equal("x^2", "x^3")))
    )
    worker.start()
    worker.join()
    assert results == [(True, False)]


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("so $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\fbox{2}", "2"),
        ("$\\boxed{(1, \\{2\\})}$", "(1, \\{2\\})"),
        ("\\boxed 5$.", "5"),
        ("\\boxed{1", None),
        ("\\boxed $5$", None),
        ("\\boxed", None),
        ("no box", None),
    ],
)
def test_extract_boxed(text, content):
    assert extract_boxed(text) == content


def test_normalize_math_examples():
    assert normalize_math("\\left( \\frac12, \\sqrt2 \\right).") == "(\\frac{1}{2},\\sqrt{2})"
    assert normalize_math("\\$32,\\!348") == "32348"
    assert normalize_math("864 \\mbox{ inches}^2") == "864"
    assert normalize_math("3/4") == "\\frac{3}{4}"
    assert extract_math_answer("The answer is $\\boxed{\\frac{11}{12}}$.") == "\\frac{11}{12}"
    assert extract_math_answer("The answer is $3\\sqrt{5}$.") == "3\\sqrt{5}"
    assert latex_to_sympy("2\\sqrt{3}x").equals(latex_to_sympy("x\\cdot 2\\sqrt{3}"))
    with pytest.raises(ValueError):
        latex_to_sympy("\\begin{pmatrix}1\\end{pmatrix}")


# --- AIME ---------------------------------------------------------------------------------------


def test_aime_rows_match_their_integer(aime):
    assert len(aime) == 60
    for row in aime:
        value = int(row["answer"])
        assert aime_match(row["answer"], row["answer"])
        assert aime_match(f"The answer is {value}.", row["answer"])
        assert aime_match(f"so $\\boxed{{{value:03d}}}$", row["answer"])
        assert not aime_match(str((value + 1) % 1000), row["answer"])


def test_aime_match_edges():
    assert aime_match("025", "25") and aime_match("25.0", "025")
    assert extract_aime("1000") is None and extract_aime("2.5") is None and extract_aime(None) is None
    assert not aime_match(None, "25") and not aime_match("1000", "1000")


# --- voting -------------------------------------------------------------------------------------


def test_majority_vote():
    assert majority_vote(["1", "0.5", None, "\\frac12", "2", "2"], equal=math_equal) == ("0.5", 2)
    assert majority_vote(["0.5", "1/2", "\\dfrac{1}{2}", "2", "2"], equal=math_equal) == ("0.5", 3)
    assert majority_vote(["b", "a", "a", "b"]) == ("b", 2)  # tie: first seen wins
    assert majority_vote(["18", "18.0", "$18", "17"], equal=gsm8k_match) == ("18", 3)
    assert majority_vote([None, None]) == (None, 0)
    assert majority_vote([]) == (None, 0)
