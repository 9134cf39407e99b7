"""The RULER-style long-context suite (benchmarks/longctx): the generator and the bench on the tiny model."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from arbor_runtime.policies import LycheePolicy, QuestPolicy
from arbor_runtime.sparse.reads import read_budget
from benchmarks.longctx.cli import main
from benchmarks.longctx.generator import (
    NEEDLE,
    TASKS,
    answer_prefix,
    contains,
    encode,
    make_item,
    records_example,
    score,
)
from benchmarks.longctx.report import per_task, render
from benchmarks.longctx.run import Method, methods, parse_budget, wilson

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


@pytest.mark.parametrize("task", TASKS)
def test_answer_prefix_follows_the_question(tok, task):
    plain, prefixed = make_item(task, 512, 2, tok), make_item(task, 512, 2, tok, prefix=True)
    assert prefixed.tokens <= 512 and (prefixed.answers == plain.answers or task == "records")  # records: the
    # asked record depends on how many fit
    mark = "? Answer:" if "?" in prefixed.question else ". Answer:"
    head, tail = prefixed.question.split(mark + " ")
    assert tail == answer_prefix(task, head + mark, prefixed.answers).strip()
    assert not any(contains(tail, g) for g in prefixed.answers)  # the prefix never gives the answer away
    _answer_in_place(prefixed)


def test_answer_prefixes_name_what_is_asked(tok):
    q = make_item("niah_multivalue", 512, 0, tok, prefix=True).question
    tail = r"for (\S+) mentioned in the provided text\? Answer: The special magic words for \1 mentioned in the"
    assert re.search(tail + r" provided text are$", q)
    q = make_item("variable_tracking", 512, 0, tok, prefix=True).question
    assert q.endswith("3 variables are assigned the value " + re.search(r"value (\d+)", q).group(1) + ", they are:")
    assert make_item("records", 512, 0, tok, prefix=True).question.endswith(" holds")


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
def _bench(tmp_path, *extra: str) -> tuple[int, dict, list[dict]]:
    out, rows = tmp_path / "ruler_summary.json", tmp_path / "ruler_rows.jsonl"
    code = main(["--model", "tiny-random", "--out", str(out), *extra])
    data = json.loads(out.read_text()) if out.exists() else {}
    return code, data, [json.loads(line) for line in rows.read_text().splitlines()] if rows.exists() else []


def test_bench_runs_end_to_end(tmp_path, one_torch_thread):
    argv = ["--lengths", "256", "--items", "1", "--tasks", "records,niah_single_word",
            "--policies", "lychee,oracle_topk,oracle_chunks,h2o,kvp", "--shares", "0.25,1024"]  # fmt: skip
    code, data, rows = _bench(tmp_path, *argv)
    assert code == 0
    assert data["settings"]["methods"] == [
        "dense", "lychee@25%", "lychee@1024", "oracle_topk@25%", "oracle_topk@1024", "oracle_chunks@25%",
        "oracle_chunks@1024", "h2o@25%", "h2o@1024", "kvp@25%", "kvp@1024",
    ]  # fmt: skip
    assert data["complete"] and data["rows"] == len(rows) == 2 * 11 and len(data["summary"]) == (2 + 1) * 11
    assert all(r["rss_gb"] > 0 for r in rows)  # each row says how much memory the run held after its item
    assert len(data["commit"]) == 40 and data["date"] and data["machine"]["torch_threads"] == 1
    assert data["command"].startswith("python scripts/bench_longctx.py --model tiny-random")
    fields = {"accuracy", "accuracy_ci", "agree", "agree_ci", "first_agree", "first_agree_ci", "kl_first",
              "decode_tok_s", "items", "score", "prefix_agree", "prefix_agree_ci"}  # fmt: skip
    assert all(fields <= set(s) for s in data["summary"])
    assert {s["items"] for s in data["summary"] if s["task"] == "all"} == {2}
    for s in data["summary"]:
        for name in ("accuracy", "agree", "first_agree"):
            lo, hi = s[f"{name}_ci"]
            assert 0.0 <= lo <= s[name] <= hi <= 1.0 and hi - lo > 0.5  # n <= 2: wide intervals
    for r in rows:
        assert 1 <= r["answer_tokens"] <= 24 and r["decode_tok_s"] > 0 and r["model"] == "tiny-random"
        if r["method"] == "dense":
            assert r["agree"] and r["first_agree"] and r["kl_first"] == 0.0 and r["budget_tokens"] is None
        elif r["method"].endswith("@1024"):  # the budget covers the context: dense again, to float tolerance
            assert r["agree"] and r["first_agree"] and r["kl_first"] < 1e-4
        elif r["policy"] == "oracle_topk":  # the exact top-k at lychee's budget: one-token chunks never read more
            # (its KL is not asserted below lychee's here: after the whole question a random model's first
            # answer token can go either way; tests/test_oracle_topk.py compares them on a fixed first step)
            lychee = next(x for x in rows if x["method"] == "lychee@25%" and x["task"] == r["task"])
            assert r["read_fraction"] <= lychee["read_fraction"] < 0.5 and r["kl_first"] >= 0.0
        elif r["policy"] == "oracle_chunks":  # lychee's chunks, exact scores: whole chunks, like lychee's reads
            assert 0.0 < r["read_fraction"] < 0.5 and r["kl_first"] >= 0.0
        else:  # a quarter of the context read / kept: the first answer token's distribution moves
            assert r["kl_first"] > 1e-3
        if r["method"] == "lychee@25%":  # the index's recall of the oracle's keys at the question's step
            assert 0.0 <= r["recall_oracle"] <= 1.0 and len(r["recall_layers"]) == 2  # (1: sinks + window fill 64)
            assert len(r["recall_heads"]) == 2 and all(h is None or 0.0 <= h <= 1.0 for h in r["recall_heads"])
        else:
            assert r["recall_oracle"] is None and r["recall_heads"] is None
    for name in ("h2o", "kvp"):
        assert all(r["kept_tokens"] == r["budget_tokens"] for r in rows if r["method"] == f"{name}@25%")
    lychee = [r for r in rows if r["method"] == "lychee@25%"]
    assert all(r["budget_tokens"] == int(0.25 * r["kept_tokens"]) for r in lychee)  # sparse keeps all, reads 25%
    # the renderer reads the summary as written
    text = render(data)
    assert "| 256 | h2o@25% | 2 |" in text and "| records | 256 | 1 |" in text
    assert text.count("| niah_single_word | 256 | 1 |") == 2  # the accuracy and the agreement tables


def test_resume_skips_done_items_and_redo_remeasures(tmp_path, one_torch_thread, monkeypatch):
    import benchmarks.longctx.run as bench

    calls = []
    real = bench.run_item
    monkeypatch.setattr(bench, "run_item", lambda loaded, item, plan, *a: calls.append((item.index, a[1])) or real(
        loaded, item, plan, *a))  # fmt: skip
    argv = ["--lengths", "160", "--tasks", "records", "--policies", "streaming,quest", "--shares", "0.25"]
    assert _bench(tmp_path, *argv, "--items", "1")[0] == 0
    first = (tmp_path / "ruler_rows.jsonl").read_text()
    with (tmp_path / "ruler_rows.jsonl").open("a") as f:
        f.write('{"task": "records", "len')  # a run killed mid-write leaves a torn last line
    calls.clear()
    code, data, rows = _bench(tmp_path, *argv, "--items", "2")  # resume: item 0 is done
    assert code == 0 and [c[0] for c in calls] == [1] and data["complete"] and len(rows) == 2 * 3
    assert (tmp_path / "ruler_rows.jsonl").read_text().startswith(first)  # done rows kept as they were
    calls.clear()
    code, data, rows = _bench(tmp_path, *argv, "--items", "2", "--redo", "quest")
    assert code == 0 and [c[0] for c in calls] == [0, 1] and all(c[1] == frozenset({"dense", "streaming@25%"})
                                                                for c in calls)  # fmt: skip
    assert sorted(r["method"] for r in rows) == sorted(["dense", "streaming@25%", "quest@25%"] * 2)
    calls.clear()
    assert _bench(tmp_path, *argv, "--items", "1", "--redo", "quest")[0] == 0 and [c[0] for c in calls] == [0]
    assert len(_bench(tmp_path, "--summary-only")[2]) == 6  # item 1's quest row stays: not in that run's items
    calls.clear()
    code, data, rows = _bench(tmp_path, *argv, "--items", "2")
    assert code == 0 and calls == [] and data["complete"]  # all done: nothing runs
    code, again, _ = _bench(tmp_path, "--summary-only")
    assert code == 0 and again["summary"] == data["summary"] and again["complete"] is None
    assert again["settings"]["tasks"] == ["records"] and again["settings"]["methods"] == data["settings"]["methods"]
    assert [r["command"].split("--items ")[-1] for r in again["runs"]] == ["1", "2", "2 --redo quest", "1 --redo quest",
                                                                           "2"]  # fmt: skip
    assert {r["commit"] for r in rows} == {data["commit"]}


def test_rows_of_two_runs_join_into_one_summary_with_both_runs(tmp_path, one_torch_thread):
    """Two runs (one per core: two lengths into two rows files), their rows joined, summarised with
    --runs-from: the summary holds both runs' commands and equals one over the same rows."""
    argv = ["--tasks", "records", "--policies", "streaming", "--shares", "0.25"]
    for part, length, items in (("a", "128", ["--items", "1"]), ("b", "160", ["--first", "1", "--items", "2"])):
        main(["--model", "tiny-random", "--out", str(tmp_path / f"{part}.json"), "--rows",
              str(tmp_path / f"{part}.jsonl"), "--lengths", length, *argv, *items])  # fmt: skip
    assert {json.loads(line)["index"] for line in (tmp_path / "b.jsonl").read_text().splitlines()} == {1}
    joined = tmp_path / "ruler_rows.jsonl"
    joined.write_text((tmp_path / "a.jsonl").read_text() + (tmp_path / "b.jsonl").read_text())
    sources = f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}"
    code, data, rows = _bench(tmp_path, "--summary-only", "--runs-from", sources)
    assert code == 0 and len(rows) == 4 and data["rows"] == 4
    assert [r["command"].split("--lengths ")[1].split()[0] for r in data["runs"]] == ["128", "160"]
    assert {(r["length"], r["index"]) for r in rows} == {(128, 0), (160, 1)}
    assert {(s["task"], s["length"]) for s in data["summary"]} == {("records", 128), ("records", 160)}
    code, again, _ = _bench(tmp_path, "--summary-only")  # rebuilt from the rows alone: the runs stay
    assert code == 0 and again["runs"] == data["runs"] and again["summary"] == data["summary"]


def test_overlapping_runs_joined_count_each_item_once(tmp_path, one_torch_thread, capsys):
    """Two runs over overlapping item ranges (items 0-1 and 1-2), rows joined with cat: item 1 is in
    both, measured twice with the same answers; the summary counts it once and says so, and the
    joined file keeps one row of each item and method."""
    argv = ["--tasks", "records", "--lengths", "128", "--policies", "streaming", "--shares", "0.25"]
    for part, items in (("a", ["--items", "2"]), ("b", ["--first", "1", "--items", "3"])):
        main(["--model", "tiny-random", "--out", str(tmp_path / f"{part}.json"), "--rows",
              str(tmp_path / f"{part}.jsonl"), *argv, *items])  # fmt: skip
    joined = tmp_path / "ruler_rows.jsonl"
    joined.write_text((tmp_path / "a.jsonl").read_text() + (tmp_path / "b.jsonl").read_text())
    capsys.readouterr()
    code, data, rows = _bench(tmp_path, "--summary-only", "--runs-from", f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}")
    assert code == 0 and len(rows) == data["rows"] == 6  # 3 items x (dense, streaming@25%): the file rewritten
    assert {s["items"] for s in data["summary"]} == {3} and [(r["index"], r["method"]) for r in rows] == [
        (i, m) for i in range(3) for m in ("dense", "streaming@25%")
    ]
    assert "2 repeated rows (an item and method already there) left out, 0 of them with another answer" in (
        " ".join(capsys.readouterr().out.split())
    )
    joined.write_text((tmp_path / "a.jsonl").read_text() + (tmp_path / "b.jsonl").read_text())
    code, resumed, rows = _bench(tmp_path, *argv, "--items", "3")  # a run resuming the joined file: all done
    assert code == 0 and resumed["complete"] and len(rows) == resumed["rows"] == 6
    assert resumed["summary"] == data["summary"]
    assert "2 repeated rows" in " ".join(capsys.readouterr().out.split())


def test_resume_refuses_rows_of_other_settings(tmp_path, capsys):
    (tmp_path / "ruler_rows.jsonl").write_text(json.dumps({"model": "tiny-random", "max_new": 8, "seed": 0}) + "\n")
    assert _bench(tmp_path, "--lengths", "256", "--items", "1")[0] == 2
    err = capsys.readouterr().err
    assert "holds rows of model=tiny-random max_new=8 seed=0 prefix=False protocol=1 weights=dense, not" in err
    assert "tiny-random / 24 / 0 / True / 2 / dense: use another --rows" in err  # nor the first-line protocol's


def test_dense_prefill_reuse_gives_the_same_rows(tiny, one_torch_thread):
    from benchmarks.longctx.run import run_item

    item = make_item("niah_single_number", 160, 0, tiny.tokenizer)
    plan = methods(["kvp", "streaming", "h2o"], ["0.25"])  # with h2o: dense and all copy h2o's prefill
    timing = {"prefill_s", "decode_tok_s"}
    reused, fresh = (run_item(tiny, item, plan, 8, reuse_prefill=flag) for flag in (True, False))
    assert [{k: v for k, v in r.items() if k not in timing} for r in reused] == [
        {k: v for k, v in r.items() if k not in timing} for r in fresh
    ]
    assert all(r["kl_first"] > 1e-3 for r in reused if r["share"] == 0.25)  # compression happened


def test_prefix_agreement_forgives_an_answer_that_ran_on():
    from benchmarks.longctx.run import prefix_agree

    assert prefix_agree(": tiger.", ": tiger. The special magic word") and prefix_agree("A 39", "a  39")
    assert not prefix_agree(": tiger.", ": carpet.") and not prefix_agree("", "39") and prefix_agree("", "")


def test_wilson_interval():
    assert wilson(0, 10)[0] == 0.0 and wilson(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson(10, 10)[0] == pytest.approx(0.7225, abs=1e-4) and wilson(10, 10)[1] == 1.0
    lo, hi = wilson(5, 20)
    assert lo == pytest.approx(0.1119, abs=1e-4) and hi == pytest.approx(0.4687, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_renderer_is_a_pure_function_of_the_summary():
    entry = {"task": "records", "length": 2048, "method": "dense", "policy": "dense", "share": None, "items": 20,
             "accuracy": 0.5, "accuracy_ci": [0.3, 0.7], "agree": 1.0, "agree_ci": [0.84, 1.0], "first_agree": 1.0,
             "first_agree_ci": [0.84, 1.0], "kl_first": 0.0, "decode_tok_s": 9.5, "score": 0.5}  # fmt: skip
    other = entry | {"method": "h2o@10%", "policy": "h2o", "share": 0.1, "items": 19, "accuracy": 0.25, "agree": 0.4}
    data = {"settings": {"model": "smollm2", "max_new": 16}, "commit": "abc", "rows": 39, "complete": False,
            "summary": [entry, other]}  # fmt: skip
    text = render(data)
    assert text == render(data)
    assert "| 2,048 | dense | 20 | 0.50 [0.30, 0.70] |  | 1.00 [0.84, 1.00] |  | 1.00 | 0.000 | 9.5 |  |  |" in text
    data["summary"][0] |= {"prefix_agree": 1.0, "read_fraction": 1.0}
    assert "| 1.00 [0.84, 1.00] | 1.00 | 1.00 | 0.000 | 9.5 |  | 1.00 |" in render(data)
    assert "| records | 2,048 | 20 | 0.50 | 0.25 (n=19) |" in per_task(data, "accuracy")
    assert "(run not complete)" in text
    with pytest.raises(ValueError, match="metric 'x'"):
        per_task(data, "x")


def test_bad_arguments_are_errors_before_the_model_loads(capsys):
    assert main(["--policies", "lychee,flash"]) == 2
    err = capsys.readouterr().err
    valid = "valid: lychee, quest, oracle_topk, oracle_chunks, kvp"
    assert f"bench_longctx.py: error: --policies: unknown 'flash'; {valid}" in err
    assert main(["--shares", "0.5,2.5"]) == 2
    assert "budget '2.5' must be a share in (0, 1)" in capsys.readouterr().err
    assert main(["--tasks", "records,ruler"]) == 2
    assert "--tasks: unknown 'ruler'" in capsys.readouterr().err
    assert main(["--lengths", "2048,x"]) == 2
    assert "--lengths '2048,x' must be comma-separated integers" in capsys.readouterr().err
    assert main(["--model", "gpt5"]) == 2
    assert "--model 'gpt5' is not one of smollm2, tiny-random" in capsys.readouterr().err
    assert main(["--redo", "lychee,dense"]) == 2
    assert "--redo: unknown 'dense'; valid: lychee" in capsys.readouterr().err
    assert main(["--first", "20", "--items", "20"]) == 2
    assert "--first 20 must be below --items 20" in capsys.readouterr().err
    assert main(["--policies", "lychee:max_chunks=4"]) == 2
    assert "--policies: policy 'lychee:max_chunks=4': " in capsys.readouterr().err
    assert main(["--policies", "lychee:max_chunk_tokens=2+min_chunk_tokens=4"]) == 2
    assert "chunk lengths must satisfy 1 <= min_len <= max_len, got 4, 2" in capsys.readouterr().err
    assert main(["--policies", "h2o:keep=2"]) == 2
    assert "--policies: unknown 'h2o:keep=2'" in capsys.readouterr().err
    assert main(["--policies", "lychee:dense_layers=[7/7]"]) == 2  # a list of layers, "/" apart
    assert "dense_layers=[7, 7]: a list must hold distinct layer indices" in capsys.readouterr().err


def test_a_sparse_variant_runs_beside_its_policy_with_its_knobs(tmp_path, one_torch_thread, monkeypatch):
    """``lychee:min_chunk_tokens=4+max_chunk_tokens=8``: its own rows and label, the knobs on the policy it
    reads through, the shares' read rule as for any sparse method."""
    built = []
    real = Method.build

    def spy(self, context_tokens):
        policy = real(self, context_tokens)
        built.append((self.policy, policy.min_chunk_tokens, policy.max_chunk_tokens, policy.token_share))
        return policy

    monkeypatch.setattr(Method, "build", spy)
    variant = "lychee:min_chunk_tokens=4+max_chunk_tokens=8"
    argv = [
        "--lengths",
        "256",
        "--items",
        "1",
        "--tasks",
        "records",
        "--policies",
        f"lychee,{variant}",
        "--shares",
        "0.25",
    ]
    code, data, rows = _bench(tmp_path, *argv)
    assert code == 0
    assert data["settings"]["methods"] == ["dense", "lychee@25%", f"{variant}@25%"]
    assert [r["policy"] for r in rows] == ["dense", "lychee", variant]
    assert ("lychee", 2, 4, 0.0) in built and (variant, 4, 8, 0.0) in built


def test_variant_names_parse_into_policies_and_bad_ones_are_refused():
    from benchmarks.longctx.variants import variant_policy

    policy = variant_policy("quest:b=512,s=0.25,d=2")
    assert (type(policy).__name__, policy.token_budget, policy.token_share, policy.dense_layers) == (
        "QuestPolicy",
        512,
        0.25,
        2,
    )
    with pytest.raises(ValueError, match="unknown knob 'x'"):
        variant_policy("lychee:x=1")
    from benchmarks.longctx.run import sparse_policy

    assert sparse_policy("lychee:dense_layers=[7/9]")().dense_layers == [7, 9]
    assert sparse_policy("lychee:dense_layers=3")().dense_layers == 3
    with pytest.raises(ValueError, match="must be one of lychee, quest, oracle_topk"):
        variant_policy("h2o:b=1")
    assert variant_policy("oracle_topk:b=256,s=0.25").token_budget == 256
    with pytest.raises(ValueError, match="oracle_topk reads single keys, it has no knob p"):
        variant_policy("oracle_topk:p=8")


def test_early_stop_keeps_the_answer(tiny, one_torch_thread):
    from arbor_runtime import Runtime
    from benchmarks.longctx.run import answer, answer_done, answer_text, fork

    item = make_item("records", 160, 1, tiny.tokenizer)
    ctx, question = encode(tiny.tokenizer, item.context, item.question)
    base = Runtime(tiny, "full")
    root = base.new_tree_ids(ctx)
    whole, short = (answer(*fork(base, root), question, 16, first_line=flag) for flag in (False, True))
    assert len(whole.ids) == 16 and short.ids == whole.ids[: len(short.ids)]
    assert answer_text(tiny.tokenizer, short.ids) == answer_text(tiny.tokenizer, whole.ids)
    text = tiny.tokenizer.decode(short.ids, skip_special_tokens=True)
    assert len(short.ids) == 16 or answer_done(text) or short.ids[-1] == tiny.tokenizer.eos_token_id


def test_the_answer_is_the_first_sentence_of_the_first_line():
    from benchmarks.longctx.run import answer_done, answer_key

    class Tok:  # decodes "ids" that are already text pieces
        def decode(self, ids, skip_special_tokens=True):
            return "".join(ids)

    from benchmarks.longctx.run import answer_text

    assert answer_text(Tok(), [": tiger.", " The special magic word for"]) == ": tiger."
    assert answer_text(Tok(), ["\n", " 1. glass 2. stone 3. paper.", "\nmore"]) == "1. glass 2. stone 3. paper."
    assert answer_text(Tok(), ["4581042."]) == "4581042." and answer_text(Tok(), []) == ""
    assert answer_key(": 14018b40-4754.") == answer_key('"14018B40-4754"') == "14018b40-4754"
    assert answer_key("4.") != answer_key("4581042.") and answer_key("tiger. The") == "tiger. the"
    assert not answer_done("  ") and not answer_done(" 1. glass 2. ") and not answer_done(" 4581042.")
    assert answer_done(" tiger. The") and answer_done(" 4581042.\n") and answer_done("\n\n 12\n")


def test_forcing_keeps_the_tokenization_it_was_given(tiny, one_torch_thread):
    """Dense's leading whitespace is forced token by token: [198, 198] ("\\n", "\\n") stays two
    tokens, though a regex of "\\n\\n" as a whole admits the one token 1116 (a 4K item broke on it)."""
    from arbor_runtime import Runtime
    from benchmarks.longctx.run import force

    tok = tiny.tokenizer
    nl = tok.encode("\n", add_special_tokens=False)
    assert len(nl) == 1 and len(tok.encode("\n\n", add_special_tokens=False)) == 1  # "\n\n" is one token too
    rt = Runtime(tiny, "full")
    root = rt.new_tree("Some text")
    node = force(rt, root, nl + nl)
    assert list(node.token_ids) == nl and list(node.parent.token_ids) == nl and node.parent.parent is root


def test_probe_table_groups_rows_by_length_and_rule():
    from benchmarks.sparse_probe import table

    base = {"length": 2048, "first_agree": True, "kl": 0.5, "read": 0.25, "mass": 0.9}
    rows = [base | {"rule": "a"}, base | {"rule": "a", "first_agree": False, "kl": 1.5}, base | {"rule": "b"}]
    lines = table(rows).splitlines()
    assert lines[0].startswith("| length | rule | items | first token agrees") and "answer agrees" not in lines[0]
    assert lines[2] == "| 2,048 | `a` | 2 | 1/2 | 1.0000 | 0.25 | 0.900 |" and len(lines) == 4
    forced = [r | {"answer_agree": r["rule"] == "b", "kl_steps": 0.1} for r in rows]
    assert table(forced).splitlines()[2].endswith("| 0/2 | 0.1000 |")


def test_probe_rules_read_named_layers_whole():
    """``d`` (layers read whole, as the policies' dense_layers=[...]) and ``o`` (one layer alone sparse: its
    own loss, the per-layer sweep of issue 49); a layer the rule reads whole is attended dense (None)."""
    from benchmarks.sparse_probe import Rule, selector

    rule = Rule.parse("lychee:s=0.15,p=4,d=7/9")
    assert [layer for layer in range(12) if rule.dense_at(layer)] == [7, 9]
    only = Rule.parse("lychee:s=0.15,p=4,o=3")
    assert [layer for layer in range(6) if not only.dense_at(layer)] == [3]
    assert not any(Rule.parse("lychee:s=0.15").dense_at(layer) for layer in range(30))
    select, _ = selector(rule, index=type("Index", (), {"starts": torch.tensor([0, 4, 8])})(), n_ctx=8,
                         n_total=10, probe=None)  # fmt: skip
    assert select(7, None, None) is None
    with pytest.raises(ValueError, match="unknown knob 'x'"):
        Rule.parse("lychee:x=1")


def test_layer_ablation_cases_and_items():
    """The per-layer ablation's cases (every layer sparse, every layer whole, each asked layer alone whole
    and alone sparse) and its item list, a bad item refused by name before the model loads."""
    from benchmarks.longctx.layer_ablation import cases, main, parse_items

    assert cases([7], 9) == [("sparse", []), ("dense", list(range(9))), ("whole:7", [7]),
                             ("alone:7", [0, 1, 2, 3, 4, 5, 6, 8])]  # fmt: skip
    assert parse_items("niah_single_number:11,niah_multikey:12") == [("niah_single_number", 11), ("niah_multikey", 12)]
    with pytest.raises(SystemExit) as exit_:
        main(["--items", "niah_nothing:3", "--out", "unused.jsonl"])
    assert exit_.value.code == 2


def test_held_out_table_leaves_out_the_named_items(tmp_path):
    """benchmarks.longctx.held_out: per method over the items left, dense's row the reference; a method's
    first row of an item counts once (the first file's)."""
    from benchmarks.longctx.held_out import by_item, table

    def row(method, index, correct, agree, kl=0.0):
        return {"task": "t", "length": 8, "index": index, "method": method, "correct": correct, "agree": agree,
                "kl_first": kl}  # fmt: skip

    rows = [row("dense", 0, True, True), row("m", 0, False, False, 0.5), row("dense", 1, True, True),
            row("m", 1, True, True, 0.1), row("dense", 2, False, True), row("m", 2, False, True)]  # fmt: skip
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in rows))
    second.write_text(json.dumps(row("m", 0, True, True)) + "\n")  # a repeat: the first file's row counts
    items = by_item([str(first), str(second)])
    (whole,) = table(items, ["m"], set())
    assert (whole["n"], whole["kept"], whole["dense_correct"], round(whole["kl_first"], 3)) == (3, 1, 2, 0.2)
    (held,) = table(items, ["m"], {("t", 0)})
    assert (held["n"], held["kept"], held["dense_correct"], held["agreement"]) == (2, 1, 1, 1.0)
