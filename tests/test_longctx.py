"""The RULER-style long-context suite (benchmarks/longctx): the generator and the bench on the tiny model."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from arbor_runtime.policies import LycheePolicy, QuestPolicy
from arbor_runtime.sparse.reads import read_budget
from benchmarks.longctx.cli import main
from benchmarks.longctx.generator import NEEDLE, TASKS, contains, encode, make_item, records_example, score
from benchmarks.longctx.run import Method, methods, parse_budget

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny.tokenizer


# ---- generator ------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_item_other_seed_differs(tok, task):
    a, b = make_item(task, 384, 3, tok, seed=7), make_item(task, 384, 3, tok, seed=7)
    assert a == b
    other = make_item(task, 384, 3, tok, seed=8)
    assert (other.context, other.answers) != (a.context, a.answers)
    assert make_item(task, 384, 4, tok, seed=7).context != a.context  # items of one seed differ too


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("length", [256, 1024])
def test_length_target_met(tok, task, length):
    item = make_item(task, length, 0, tok)
    ctx, question = encode(tok, item.context, item.question)
    assert item.tokens == len(ctx) + len(question)
    assert 0.9 * length <= item.tokens <= length


def _answer_in_place(item) -> None:
    """The gold occurs where the question points (the needle of the asked key, the asked record, ...)."""
    q, ctx = item.question, item.context
    if item.task.startswith("niah"):
        key = re.search(r"for (\S+) mentioned", q).group(1)
        kind = re.search(r"special magic (\w+?)s? for", q).group(1)
        for gold in item.answers:
            assert NEEDLE.format(kind=kind, key=key, value=gold) in ctx
    elif item.task.startswith("records"):
        sector, record = re.search(r"sector (\d+) hold in record (\d+)\?", q).groups()
        assert f"Record {record}: the warehouse in sector {sector} holds {item.answers[0]} crates" in ctx
    elif item.task == "variable_tracking":
        value = re.search(r"the value (\d+)", q).group(1)
        first, *rest = item.answers
        assert f"VAR {first} = {value}." in ctx
        for a, b in zip(item.answers, rest, strict=False):
            assert ctx.index(f"VAR {b} = VAR {a}.") > ctx.index(f"VAR {a} =")  # assigned after its source
    else:  # common words: every gold is more frequent than any other word
        counts = Counter(re.findall(r"\d+\. (\w+)", ctx))
        others = max(c for w, c in counts.items() if w not in item.answers)
        assert min(counts[g] for g in item.answers) > others


@pytest.mark.parametrize("task", TASKS)
def test_items_are_answerable(tok, task):
    for index in range(3):
        item = make_item(task, 512, index, tok)
        assert item.answers and all(contains(item.context, g) for g in item.answers)
        assert item.question.endswith("Answer:")
        _answer_in_place(item)
        assert item.correct(" " + ", ".join(item.answers) + ".")
        assert item.correct(", ".join(item.answers).upper())  # normalised: case does not matter
        assert not item.correct("I do not know")
        if len(item.answers) > 1:
            assert item.score(item.answers[0]) == pytest.approx(1 / len(item.answers))
            assert not item.correct(item.answers[0])


def test_checker_matches_whole_words_only():
    assert score(" 812 crates", ["812"]) == 1.0
    assert score(" 8120", ["812"]) == 0.0 and score("a812", ["812"]) == 0.0
    assert score("The  DAPPER-lantern\n", ["dapper-lantern"]) == 1.0
    assert score("KPJC, ZLSK", ["KPJC", "ZLSK", "IKTJ"]) == pytest.approx(2 / 3)


def test_too_short_length_is_an_error(tok):
    with pytest.raises(ValueError, match="too short"):
        make_item("records", 16, 0, tok)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        make_item("nope", 256, 0, tok)


def test_budgets_are_shares_or_tokens():
    assert parse_budget("0.25") == (0.25, None) and parse_budget("1024") == (None, 1024)
    for bad in ("0", "1.5", "-3", "x"):
        with pytest.raises(ValueError, match="must be a share"):
            parse_budget(bad)
    plan = methods(["lychee", "h2o"], ["0.5", "1024"])
    assert [m.label for m in plan] == ["dense", "lychee@50%", "lychee@1024", "h2o@50%", "h2o@1024"]
    assert Method("quest", 0.1).budget(2000) == 200 and Method("quest", tokens=64).budget(2000) == 64


def test_default_budget_is_the_policys_own_read_rule():
    assert parse_budget("default") == (None, None)
    plan = methods(["lychee", "quest", "h2o"], ["default", "0.5"])  # h2o has no default read rule
    assert [m.label for m in plan] == ["dense", "lychee@default", "lychee@50%", "quest@default", "quest@50%", "h2o@50%"]
    for name, cls in (("lychee", LycheePolicy), ("quest", QuestPolicy)):
        policy = Method(name).build(8000)
        assert policy == cls()  # the defaults, not a token_budget of the share
        want = read_budget(8000, policy.token_budget, policy.token_share)
        assert Method(name).budget(8000) == want
        fixed = Method(name, 0.5).build(8000)
        assert (fixed.token_budget, fixed.token_share, fixed.dense_layers) == (4000, 0.0, 0)


def test_records_example_asks_the_record_it_names(tok):
    item = records_example(tok)
    assert item == records_example(tok) and item.task == "records_example"
    assert "in record 39? Answer:" in item.question and item.context.count("\nRecord ") == 240
    _answer_in_place(item)
    with pytest.raises(ValueError, match="asked=300"):
        records_example(tok, asked=300)


def test_benchmarks_stay_out_of_the_wheel():
    # pyproject lists the installed packages one by one (tests/test_structure.py builds the wheel)
    text = (REPO / "pyproject.toml").read_text()  # no tomllib: the project supports Python 3.10
    listed = re.findall(r'"([^"]+)"', re.search(r"^packages = \[(.*?)\]", text, re.S | re.M).group(1))
    assert "arbor_runtime" in listed and "arbor_runtime.tasks" in listed
    assert not any(name.split(".")[0] == "benchmarks" for name in listed)


# ---- the bench, end to end ---------------------------------------------------------------------------
def test_bench_runs_end_to_end(tmp_path, one_torch_thread):
    out = tmp_path / "longctx.json"
    argv = ["--model", "tiny-random", "--lengths", "256", "--items", "2", "--tasks", "records,niah_single_word",
            "--policies", "lychee,h2o", "--shares", "0.25,1024", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["methods"] == ["dense", "lychee@25%", "lychee@1024", "h2o@25%", "h2o@1024"]
    rows = data["rows"]
    assert len(rows) == 2 * 2 * 5 and len(data["items"]) == 4 and len(data["summary"]) == (2 + 1) * 5  # + all tasks
    fields = {"accuracy", "score", "agree", "first_agree", "kl_first", "decode_tok_s", "items"}
    assert all(fields <= set(s) for s in data["summary"])
    assert {s["items"] for s in data["summary"] if s["task"] == "all"} == {4}
    for r in rows:
        assert 1 <= r["answer_tokens"] <= 16 and r["decode_tok_s"] > 0
        if r["method"] == "dense":
            assert r["agree"] and r["first_agree"] and r["kl_first"] == 0.0 and r["budget_tokens"] is None
        elif r["method"].endswith("@1024"):  # the budget covers the context: dense again, to float tolerance
            assert r["agree"] and r["first_agree"] and r["kl_first"] < 1e-4
        else:  # a quarter of the context read / kept: the first answer token's distribution moves
            assert r["kl_first"] > 1e-3
    h2o = [r for r in rows if r["method"] == "h2o@25%"]
    lychee = [r for r in rows if r["method"] == "lychee@25%"]
    assert all(r["kept_tokens"] == r["budget_tokens"] for r in h2o)
    assert all(r["budget_tokens"] == int(0.25 * r["kept_tokens"]) for r in lychee)  # sparse keeps all, reads 25%


def test_bad_arguments_are_errors_before_the_model_loads(capsys):
    assert main(["--policies", "lychee,flash"]) == 2
    assert "bench_longctx.py: error: --policies: unknown 'flash'; valid: lychee, quest, kvp" in capsys.readouterr().err
    assert main(["--shares", "0.5,2.5"]) == 2
    assert "budget '2.5' must be a share in (0, 1)" in capsys.readouterr().err
    assert main(["--tasks", "records,ruler"]) == 2
    assert "--tasks: unknown 'ruler'" in capsys.readouterr().err
    assert main(["--lengths", "2048,x"]) == 2
    assert "--lengths '2048,x' must be comma-separated integers" in capsys.readouterr().err
    assert main(["--model", "gpt5"]) == 2
    assert "--model 'gpt5' is not one of smollm2, tiny-random" in capsys.readouterr().err


def test_variant_names_parse_into_policies_and_bad_ones_are_refused():
    from benchmarks.longctx.variants import variant_policy

    policy = variant_policy("quest:b=512,s=0.25,d=2")
    assert (type(policy).__name__, policy.token_budget, policy.token_share, policy.dense_layers) == (
        "QuestPolicy", 512, 0.25, 2
    )
    with pytest.raises(ValueError, match="unknown knob 'x'"):
        variant_policy("lychee:x=1")
    with pytest.raises(ValueError, match="lychee or quest"):
        variant_policy("h2o:b=1")
