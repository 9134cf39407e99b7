"""The results page is generated from committed data (issue 27): rebuilding it changes nothing, every
section says how and when it was measured, README's figures are the data's, rates carry intervals."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.results import page as results_page
from benchmarks.results.data import load_section, write_section_data
from benchmarks.results.sections import Section, render_section
from benchmarks.results.stats import format_rate, overlap, wilson
from benchmarks.results.template import render

REPO = Path(__file__).resolve().parents[1]


def test_rebuilding_the_page_from_docs_data_changes_nothing(tmp_path):
    """`make results-page`'s script without site-packages (`-S`: the standard library only, no model, no
    torch) into a temp dir equals the committed page, and copies the PNGs the page shows next to it (the
    committed files: whether they show the data is test_the_plots_drawn_from_data_are_the_committed_ones)."""
    out = tmp_path / "results.md"
    cmd = [sys.executable, "-S", str(REPO / "scripts" / "results_page.py"), "--out", str(out), "--readme", ""]
    subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True)
    assert out.read_text() == (REPO / "docs" / "results.md").read_text()
    for name in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", out.read_text()):
        assert (tmp_path / name).read_bytes() == (REPO / "docs" / name).read_bytes()


def test_every_section_names_its_command_and_when_it_was_measured():
    text = (REPO / "docs" / "results.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert sections[0].startswith("Summary")
    titles = {data["title"] for data in results_page.load_all().values()}
    assert {s.split("\n", 1)[0] for s in sections[1:]} == titles
    for body in sections[1:]:
        head = body.split("\n\n", 2)[1]
        when = (
            r"Measured \d{4}-\d\d-\d\d( to \d{4}-\d\d-\d\d)? "
            r"(at commit `\w{7,}|by runs at commits `\w{7,}|by rows of several codes: "
            r"|\(commit not recorded; rows committed in `\w{7})"
        )
        assert re.match(when, head), head
        assert "```bash\n" in body.split("\n\n", 3)[2] and "\n```" in body


def test_readme_results_block_is_the_data():
    """A figure in README's results lines that differs from docs/data fails here."""
    readme = (REPO / "README.md").read_text()
    block = readme.split(results_page.BEGIN, 1)[1].split(results_page.END, 1)[0]
    assert block.strip("\n") == results_page.headline().strip("\n")
    rows = load_section(results_page.HEADLINE)["tables"]["main"]["rows"]
    full = next(r for r in rows if r["ratio"] is None)
    assert f"| full | none | {format_rate(full['solved_n'], full['problems'])} | {full['agree']} | 1.00 |" in block
    assert f"n = {full['problems']} problems per row" in block


def test_readme_results_prose_holds_for_the_data():
    """README's sentences over the headline table (no figures, but claims) still hold for docs/data, as do
    docs/notes/e2e-game24.md's: when a rerun changes what the table shows, this names the sentence to rewrite."""
    rows = load_section(results_page.HEADLINE)["tables"]["main"]["rows"]
    full = next(r for r in rows if r["ratio"] is None)
    n = full["problems"]
    ratios = {r["ratio"] for r in rows if r["ratio"] is not None}
    blind = [r for r in rows if r["policy"] in TREE_BLIND]
    assert {r["policy"] for r in blind} == set(TREE_BLIND), "random and every tree-blind policy are in the table"
    assert {r["ratio"] for r in blind} == ratios
    for ratio in ratios:
        arbor = next(r for r in rows if r["policy"] == "arbor" and r["ratio"] == ratio)
        others = [r for r in blind if r["ratio"] == ratio]
        assert arbor["oom_n"] == 0, "arbor runs every puzzle at every budget"
        assert arbor["agree_n"] >= max(r["agree_n"] for r in others), "full's answer on at least as many"
        assert arbor["nodes_as_full"] > max(r["nodes_as_full"] for r in others), "more of full's tree than any"
        # "At this n the answer rates' intervals overlap"
        best = max(others, key=lambda r: r["agree_n"])
        assert overlap((arbor["agree_n"], n), (best["agree_n"], n)), (arbor, best)
    for r in rows:  # "no policy's solve rate separates from full's"
        assert overlap((r["solved_n"], r["problems"]), (full["solved_n"], n)), r


TREE_BLIND = ("random", "h2o", "streaming", "snapkv", "thinkv", "kvp")


def test_gsm8k_table1_prose_holds_for_the_data():
    """docs/notes/e2e-gsm8k.md's claims: arbor runs every question at every budget (all under its floor);
    live, no policy keeps full's sampled search (same nodes for all, same-answer rates within each other's
    intervals); arbor is the slowest policy at every budget (its rows take turns below the floor)."""
    rows = load_section("e2e-gsm8k")["tables"]["main"]["rows"]
    ratios = {r["ratio"] for r in rows if r["ratio"] is not None}
    assert {r["policy"] for r in rows} >= {"full", "arbor", *TREE_BLIND}
    for ratio in ratios:
        at = [r for r in rows if r["ratio"] == ratio]
        arbor = next(r for r in at if r["policy"] == "arbor")
        assert arbor["oom_n"] == 0, "arbor runs every question at every budget"
        assert max(r["nodes_as_full"] for r in at) - min(r["nodes_as_full"] for r in at) < 0.05, "the same small part"
        for a in at:
            for b in at:
                assert overlap((a["agree_n"], a["problems"]), (b["agree_n"], b["problems"])), (a, b)
        assert arbor["p50_s"] == max(r["p50_s"] for r in at), "arbor is the slowest policy here"


def test_fixed_memory_scaling_prose_holds_for_the_data():
    """docs/notes/e2e-scaling-game24.md's and README's claims (issue 50): every search ran the same 100
    puzzles inside full's breadth-5 peak; arbor at breadth 20 solves more than the reference beyond chance
    (exact sign test, p < 0.01) and runs every puzzle; full at breadth 20 runs out of memory on every one;
    breadth 40 solves what breadth 20 does (the same count, gains, losses and agreement) and is slower;
    10 thoughts per state at breadth 5 does not separate from the reference; breadth 10 solves the most
    per hour, breadth 20 at about the reference's rate (within 10%); the budget runs allocate no more KV
    pool than the reference's peak."""
    from benchmarks.results.stats import sign_test

    rows = load_section("e2e-scaling-game24")["tables"]["main"]["rows"]
    ref = next(r for r in rows if r["ratio"] is None)
    by = {(r["policy"], r["setting"]): r for r in rows if r["ratio"] is not None}
    b10, b20, b40 = (by["arbor", f"controller.breadth={b} controller.n_generate=5"] for b in (10, 20, 40))
    more = by["arbor", "controller.breadth=5 controller.n_generate=10"]
    wide_full = by["full", "controller.breadth=20 controller.n_generate=5"]
    assert {r["problems"] for r in rows} == {100}
    assert sign_test(b20["gained_n"], b20["lost_n"]) < 0.01 and b20["gained_n"] > b20["lost_n"]
    assert b20["oom_n"] == b10["oom_n"] == b40["oom_n"] == more["oom_n"] == 0
    assert wide_full["oom_n"] == wide_full["problems"]
    assert [b40[k] for k in ("solved_n", "gained_n", "lost_n", "agree_n")] == [
        b20[k] for k in ("solved_n", "gained_n", "lost_n", "agree_n")
    ]
    assert b40["p50_s"] > b20["p50_s"]
    assert sign_test(more["gained_n"], more["lost_n"]) > 0.5 and abs(more["gained_n"] - more["lost_n"]) <= 1
    assert b10["solved_per_h"] == max(r["solved_per_h"] for r in rows)
    assert abs(b20["solved_per_h"] / ref["solved_per_h"] - 1) < 0.1
    assert all(r["pool_mb"] <= ref["peak_kv_mb"] * 1.01 for r in by.values())


def test_lookahead_prose_holds_for_the_data():
    """docs/notes/e2e-lookahead-game24.md's claims (issue 50's third widening): every search ran the same 100
    puzzles inside its reference's breadth-5 peak, none out of memory and no pool above the peak; lookahead 1
    at either trial values does not separate from the reference and loses more puzzles than it gains; its p50
    time is over twice the reference's; per hour the reference solves the most, and far more than either (the
    lookahead pays least of the three widenings: the scaling section's every widening solves over twice what
    either lookahead search solves per hour); the reference answers as the scaling section's does."""
    from benchmarks.results.stats import sign_test

    rows = load_section("e2e-lookahead-game24")["tables"]["main"]["rows"]
    ref = next(r for r in rows if r["ratio"] is None)
    by = {r["setting"]: r for r in rows if r["ratio"] is not None}
    model, exact = (by[f"verifier.lookahead=1 verifier.trial_values={t}"] for t in ("model", "exact"))
    assert {r["problems"] for r in rows} == {100} and all(r["oom_n"] == 0 for r in rows)
    assert all(r["pool_mb"] <= ref["peak_kv_mb"] * 1.01 for r in (model, exact))
    for r in (model, exact):
        assert sign_test(r["gained_n"], r["lost_n"]) > 0.05 and r["lost_n"] > r["gained_n"]
        assert r["p50_s"] > 2 * ref["p50_s"] and r["solved_per_h"] < ref["solved_per_h"] / 2
    scaling = load_section("e2e-scaling-game24")["tables"]["main"]["rows"]
    widened = [r for r in scaling if r["policy"] == "arbor"]
    assert min(r["solved_per_h"] for r in widened) > 2 * max(model["solved_per_h"], exact["solved_per_h"])
    scaling_ref = next(r for r in scaling if r["ratio"] is None)
    assert ref["solved_n"] == scaling_ref["solved_n"]  # (the note's row-by-row answer check is on the run dirs)


def test_gsm8k_widening_prose_holds_for_the_data():
    """docs/notes/e2e-widen-gsm8k.md's claims: arbor runs every question at each wider frontier inside full's
    peak (none out of memory, no more pool than full's peak), and no solve rate separates from another."""
    rows = load_section("e2e-widen-gsm8k")["tables"]["main"]["rows"]
    ref = next(r for r in rows if r["ratio"] is None)
    assert {r["problems"] for r in rows} == {50} and all(r["oom_n"] == 0 for r in rows)
    assert all(r["pool_mb"] <= ref["peak_kv_mb"] * 1.01 for r in rows if r["ratio"] is not None)
    for a in rows:
        for b in rows:
            assert overlap((a["solved_n"], a["problems"]), (b["solved_n"], b["problems"])), (a, b)


def test_concurrency_prose_holds_for_the_data():
    """docs/notes/concurrency.md's sentences (claims, the figures come from the data) still hold for
    docs/data/concurrency: when a rerun changes what the table shows, this names the sentence to rewrite."""
    from benchmarks.results.sections import with_concurrency_ratios

    data = with_concurrency_ratios(load_section("concurrency"))
    rows, spread = data["tables"]["main"]["rows"], data["facts"]["c1_spread_x"]
    by = {(r["search"], r["policy"]): r for r in data["tables"]["by_setting"]["rows"]}

    def at(search: str, policy: str, level: int) -> dict:
        return next(r for r in rows if (r["search"], r["policy"], r["concurrency"]) == (search, policy, level))

    g, q, full, off = "game24-900-915", "gsm8k-0-7", "policy=full", " share_prefixes=false"
    tenth = "policy=arbor policy.budget_tokens=1466"
    assert all(r["same"] in ("yes", "-") for r in by.values()), "every setting gives concurrency 1's results"
    assert data["facts"]["slowest_x"] >= 0.95, "loses at most a few percent to one search at a time"
    least = "policy=arbor policy.budget_tokens=445"  # "at a tenth of GSM8K's summed peaks ... nothing to batch"
    assert by[(q, least)]["budget_x"] == "0.10x" and at(q, least, 1)["oom"] > 0 and at(q, least, 1)["rehydrations"] > 0
    for policy in (least, least + off):
        assert at(q, policy, 8)["turn_wait_s"] > 0 and 0.9 <= by[(q, policy)]["x8"] <= 1.1
        assert {r["oom"] for r in rows if (r["search"], r["policy"]) == (q, policy)} == {at(q, least, 1)["oom"]}
    assert by[(g, tenth)]["x2"] > by[(g, tenth + off)]["x2"], "sharing leaves room for more of them"
    assert at(g, tenth, 2)["turn_wait_s"] < at(g, tenth + off, 2)["turn_wait_s"]
    assert by[(q, full)]["x8"] > max(spread, by[(g, full)]["x4"]), "GSM8K's sampled lines batch well"
    for search in (g, q):  # "prefix sharing saves prefill and memory once searches run together"
        assert at(search, full, 8)["prefill_saved"] > 0
        assert at(search, full, 8)["peak_kv_mb"] < at(search, full + off, 8)["peak_kv_mb"]
        assert at(search, full, 1)["prefill_saved"] == 0  # "a search alone gains nothing from it"
        # "the runtime at concurrency 1" against naive ToT
        assert at(search, full, 1)["problems_hour"] > at(search, "naive ToT", 1)["problems_hour"]
    on_1, off_1 = by[(g, full)]["rate_1"], by[(g, full + off)]["rate_1"]
    assert max(on_1, off_1) / min(on_1, off_1) <= spread, "alone, sharing is a tie"
    budgetless = by[(g, "policy=arbor policy.budget_tokens=14660")]
    assert at(g, budgetless["policy"], 1)["rehydrations"] == 0, "arbor's budget never binds there"
    assert by[(g, full)]["rate_1"] / budgetless["rate_1"] > 1.1, "arbor costs time where its budget never binds"


def test_accuracy_cells_show_their_wilson_interval():
    text = (REPO / "docs" / "results.md").read_text()
    acc = text.split("## Accuracy", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"\| (\d+)/(\d+) (\d+)% \[(\d+)-(\d+)%\] \|", acc)
    rows = load_section("accuracy")["tables"]["main"]["rows"]
    assert len(cells) == len(rows) > 0  # one interval per run, whatever modes the committed run had
    assert [(int(k), int(n)) for k, n, *_ in cells] == [(r["solved"], r["problems"]) for r in rows]
    for k, n, _rate, lo, hi in cells:
        want_lo, want_hi = wilson(int(k), int(n))
        assert (int(lo), int(hi)) == (round(100 * want_lo), round(100 * want_hi))


def test_wilson_interval_known_values_and_bad_input():
    lo, hi = wilson(1, 6)  # textbook: 0.0301, 0.5635
    assert abs(lo - 0.0301) < 5e-4 and abs(hi - 0.5635) < 5e-4
    assert wilson(0, 6)[0] == 0.0 and abs(wilson(0, 6)[1] - 0.3903) < 5e-4
    assert wilson(6, 6)[1] == 1.0 and abs(wilson(6, 6)[0] - (1 - 0.3903)) < 5e-4
    assert wilson(0, 0) == (0.0, 1.0)
    assert overlap((1, 6), (2, 6)) and not overlap((0, 20), (15, 20))
    with pytest.raises(ValueError, match="7/6"):
        wilson(7, 6)


def test_a_benchmark_writes_a_section_that_renders_with_its_provenance(tmp_path):
    """write_section_data adds commit, date and machine; the template fills a figure from a row."""
    rows = [{"policy": "full", "solved": 3}, {"policy": "arbor", "solved": 5}]
    path = write_section_data("demo", rows, "python scripts/x.py --n 2", {"n": 2}, title="Demo", root=tmp_path)
    doc = json.loads(path.read_text())
    assert doc["command"] == "python scripts/x.py --n 2" and doc["settings"] == {"n": 2}
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", doc["measured"]) and doc["machine"] and doc["format"] == 1
    assert doc["commit"] is None or re.match(r"[0-9a-f]{40}", doc["commit"])
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "demo.md").write_text("arbor solved {{main[policy=arbor].solved}}.\n\n{{table main}}\n")
    text = render_section(Section("demo"), load_section("demo", tmp_path), notes)
    assert text.startswith("## Demo\n\nMeasured ") and "python scripts/x.py --n 2" in text
    assert "arbor solved 5." in text and "| arbor | 5 |" in text


def test_a_placeholder_that_matches_no_row_is_an_error():
    table = {"columns": [{"key": "p", "header": "p"}], "rows": [{"p": "a"}]}
    data = {"section": "s", "title": "t", "tables": {"main": table}}
    assert render("{{main[p=a].p}}", data) == "a"
    with pytest.raises(ValueError, match="0 rows match"):
        render("{{main[p=b].p}}", data)
    with pytest.raises(ValueError, match="no column 'q'"):
        render("{{main[q=a].p}}", data)
    kept = data | {"carried": {"measured": "2026-11-30", "commit": "abcdef012345"}}
    text = render("kept since {{carried.measured}} (`{{carried.commit}}`)", kept)
    assert text == "kept since 2026-11-30 (`abcdef012345`)"
    with pytest.raises(ValueError, match="carried"):
        render("{{carried.measured}}", data)  # nothing was kept: an error, not an empty date


def test_prose_figures_come_from_the_data():
    """No decimal in a section template outside a placeholder, code span or table line."""
    notes = REPO / "docs" / "notes"
    typed = set()
    for section in results_page.SECTIONS:
        path = notes / f"{section.name}.md"
        if not path.is_file():
            continue
        text = re.sub(r"\{\{[^{}]*\}\}|`[^`]*`|^\|.*$", "", path.read_text(), flags=re.M)
        if re.search(r"(?<![\w.])\d+\.\d+", text):
            typed.add(section.name)
    assert not typed, f"hand-typed decimals in docs/notes/{sorted(typed)}.md: use a placeholder (or a fact)"


def test_a_benchmarks_jsonl_becomes_its_sections_data(tmp_path):
    """bench_concurrency's JSONL (its keys) -> docs/data/concurrency with the collector's columns -> the
    table, with each budget as a fraction of full's summed peaks and each rate over concurrency 1's."""
    from benchmarks.results.collect import write as collect
    from benchmarks.results.sections import with_concurrency_ratios

    run = tmp_path / "bench" / "game24-bfs"
    run.mkdir(parents=True)

    def bench_row(policy, level, seconds, **extra):
        row = {"policy": policy, "concurrency": level, "problems": 8, "seconds": seconds, "solved": 2}
        row |= {"problems_per_hour": round(3600 * 8 / seconds, 1), "peak_device_mb": 43.2, "decode_tokens": 619}
        return row | {"oom": 0, "same_results_as_concurrency_1": True, "turn_wait_seconds": 1.5} | extra

    rows = [
        bench_row("policy=full", 1, 80.0, peak_device_tokens_sum=8000),
        bench_row("policy=full", 4, 40.0, prefix_prefill_saved_tokens=1500),
        bench_row("policy=arbor policy.budget_tokens=2000 share_prefixes=false", 1, 100.0),
        bench_row("policy=arbor policy.budget_tokens=2000 share_prefixes=false", 4, 125.0),
    ]
    (run / "concurrency.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = collect(
        "concurrency", tmp_path / "bench", "python scripts/bench_concurrency.py --levels 1,4", data_root=tmp_path
    )
    data = load_section("concurrency", tmp_path)
    assert path == tmp_path / "concurrency" / "results.json" and data["source"] == "run"
    first = data["tables"]["main"]["rows"][0]
    assert first["search"] == "game24-bfs" and first["problems_hour"] == 360.0 and first["peak_sum"] == 8000
    assert first["same_results_as_1"] == "yes" and first["prefill_saved"] is None
    from benchmarks.results.tables import render_table

    text = render_table(with_concurrency_ratios(data)["tables"]["main"])
    assert "| game24-bfs | policy=full | none | on | 4 | 8 | 2 | 40 | 720 | 2 | 43.2 | 1,500 |" in text
    arbor = "| game24-bfs | policy=arbor policy.budget_tokens=2000 share_prefixes=false | 0.25x | off |"
    assert arbor + " 4 | 8 | 2 | 125 | 230.4 | 0.8 |" in text
    by_setting = with_concurrency_ratios(data)["tables"]["by_setting"]["rows"]
    assert [(r["rate_1"], r["x4"], r["slowest"], r["same"]) for r in by_setting] == [
        (360.0, 2.0, 2.0, "yes"),
        (288.0, 0.8, 0.8, "yes"),
    ]


def _summary_rows(text: str) -> dict[str, tuple[str, str]]:
    """method -> (where it wins, where it loses) from a summary's table."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return {m.strip(): (w.strip(), lose.strip()) for m, w, lose in rows[1:]}


def test_the_summary_follows_the_data():
    """Change the data and the summary changes with it: a difference from the reference beyond the Wilson
    intervals is named, one inside them names nobody, out of memory on every problem loses, and a stale
    section is named."""
    from benchmarks.results.summary import Claim, summary

    claim = Claim("solves more", "solves fewer", "solved", place="{mode}", at="{budget}",
                  reference=(("policy", "full"),), n="problems", oom="oom")  # fmt: skip

    def acc(policy, solved, oom=0, budget="0.5x"):
        return {"mode": "ToT", "policy": policy, "budget": budget, "solved": solved, "problems": 20, "oom": oom}

    rows = [acc("full", 2, budget="none"), acc("arbor", 15), acc("h2o", 0, oom=20), acc("streaming", 5)]
    data = {"accuracy": {"title": "Accuracy (a test)", "tables": {"main": {"rows": rows}}}}
    table = _summary_rows(summary(data, {"accuracy": (claim,)}))
    assert table["arbor"] == ("Solves more at 0.5x on ToT (Accuracy).", "-")  # 15/20 vs 2/20
    assert table["h2o"] == ("-", "Out of memory on every problem at 0.5x on ToT (Accuracy).")
    assert "streaming" not in table  # 5/20 vs 2/20: the intervals overlap, a tie names nobody
    rows[1]["solved"] = 4  # now inside full's interval: arbor is no longer named
    data["accuracy"]["stale"] = "old"
    text = summary(data, {"accuracy": (claim,)})
    assert "arbor" not in _summary_rows(text)
    assert "**Not yet re-measured** (their data says why; `make results` reruns them): Accuracy." in text
    assert summary(data, {}).count("\n| ") == 1  # no claims: the table's header only


def _e2e_row(policy, ratio, agree, oom=0, search="gsm8k"):
    return {"search": search, "policy": policy, "ratio": ratio, "problems": 20, "agree_n": agree, "oom_n": oom}


def test_the_best_method_at_a_setting_wins_only_beyond_every_others_interval():
    """Against the best other method: the one alone above every other's Wilson interval wins there, the one
    alone below loses, a tie at the top names nobody; rows without the claim's columns say nothing."""
    from benchmarks.results.sections import E2E
    from benchmarks.results.summary import findings

    rows = [_e2e_row("full", None, 20), _e2e_row("arbor", 0.5, 20), _e2e_row("h2o", 0.5, 9),
            _e2e_row("kvp", 0.5, 0), _e2e_row("arbor", 0.25, 9), _e2e_row("h2o", 0.25, 8),
            {"search": "gsm8k", "policy": "old", "ratio": 0.5}]  # fmt: skip
    found = {(m, at): kind for m, kind, _, at in findings(E2E, {"tables": {"main": {"rows": rows}}})}
    assert found == {("arbor", "0.5x"): "wins", ("h2o", "0.5x"): None, ("kvp", "0.5x"): "loses",
                     ("arbor", "0.25x"): None, ("h2o", "0.25x"): None}  # fmt: skip
    rows[2]["agree_n"] = 17  # h2o's 17/20 overlaps arbor's 20/20: nobody is best beyond the intervals
    found = {(m, at): kind for m, kind, _, at in findings(E2E, {"tables": {"main": {"rows": rows}}})}
    assert found[("arbor", "0.5x")] is None and found[("kvp", "0.5x")] == "loses"


def test_out_of_memory_everywhere_loses_and_never_wins_and_lose_at_one_setting():
    """A method out of memory on every problem loses at that setting and wins nothing there, whatever
    another claim finds; a win and a loss at one setting of one section cancel, so no method is listed as
    both (the issue-48 page had arbor "wins at 0.5x" and "loses: out of memory at 0.5x")."""
    from benchmarks.results.summary import Claim, judged, verdicts

    fewer = Claim("fewest", "most", "agree_n", place="{search}", at="{ratio:g}x", higher=False)
    more = Claim("most", "fewest", "agree_n", place="{search}", at="{ratio:g}x", n="problems", oom="oom_n")
    rows = [_e2e_row("arbor", 0.5, 20), _e2e_row("h2o", 0.5, 10), _e2e_row("kvp", 0.5, 0, oom=20)]
    data = {"e2e-gsm8k": {"title": "End to end", "tables": {"main": {"rows": rows}}}}
    raw = judged(data, {"e2e-gsm8k": (fewer, more)})
    assert ("kvp", "wins") in {v[:2] for v in raw} and ("arbor", "wins") in {v[:2] for v in raw}
    settled = verdicts(raw)
    assert settled == [("kvp", "loses", "End to end", "out of memory on every problem", "gsm8k", "0.5x")]


def test_the_committed_summary_never_wins_and_loses_at_one_setting_and_fits_one_screen():
    """On docs/data: no method wins and loses at one setting of one section, every cell is one sentence, and
    the whole summary stays short (the issue-48 page had ~2,200 words of bullets)."""
    from benchmarks.results.sections import SECTIONS
    from benchmarks.results.summary import judged, summary, verdicts

    data, claims = results_page.load_all(), {s.name: s.claims for s in SECTIONS}
    sides: dict[tuple, set[str]] = {}
    for method, kind, title, _, place, at in verdicts(judged(data, claims)):
        sides.setdefault((method, title, place, at), set()).add(kind)
    assert sides and all(len(kinds) == 1 for kinds in sides.values())
    text = summary(data, claims)
    assert len(text.split()) < 500, len(text.split())
    for wins, loses in _summary_rows(text).values():
        assert all(c == "-" or (c.endswith(".") and c.count(". ") == 0) for c in (wins, loses)), (wins, loses)
    assert "policy.budget_tokens" not in text and "| arbor |" in text  # budget variants under one name


def test_every_claim_names_columns_its_committed_data_has():
    """A claim naming a column its section's data lacks would silently say nothing: each column a claim
    reads is in the rows of its table in docs/data, and each claim judges at least one row."""
    from benchmarks.results.sections import SECTIONS
    from benchmarks.results.summary import findings

    data = results_page.load_all()
    claimed = [s for s in SECTIONS if s.claims and s.name in data]
    assert {s.name for s in claimed} >= {"accuracy", "e2e-game24", "e2e-gsm8k", "floor", "concurrency"}
    for section in claimed:
        d = data[section.name]
        for claim in section.claims:
            tables = d.get("tables") or {}
            rows = tables[claim.table]["rows"] if claim.table in tables else d[claim.table]
            have = set().union(*(r.keys() for r in rows))
            assert claim.columns() <= have, (section.name, claim.columns() - have)
            assert findings(claim, d), (section.name, claim.wins)
            if claim.spread:
                assert claim.spread in d.get("facts", {}), (section.name, claim.spread)


#: RMS difference (0-255 per channel, matplotlib's compare_images) a redrawn plot may have from the
#: committed one: 0.0 on this machine (byte-identical); one point of the memory plot moved by 5% is 0.86
PNG_RMS_TOL = 0.5


def test_the_plots_drawn_from_data_are_the_committed_ones(tmp_path):
    """Every plot of benchmarks/results/plots.py draws from the committed data alone into the picture
    the page shows (redrawn and compared pixel by pixel, within PNG_RMS_TOL), and the page shows no
    other picture (one no step redraws would go stale)."""
    from matplotlib.testing.compare import compare_images

    from benchmarks.results.plots import PLOTS, draw_all

    written = draw_all(results_page.load_all(), tmp_path)
    assert sorted(p.name for p in written) == sorted(PLOTS)
    page = (REPO / "docs" / "results.md").read_text()
    for path in written:
        assert f"]({path.name})" in page
        assert compare_images(str(REPO / "docs" / path.name), str(path), tol=PNG_RMS_TOL) is None, path.name
    shown = set(re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page))
    assert shown == set(PLOTS), "every picture on the results page is drawn from docs/data"


@pytest.mark.parametrize(("name", "table", "key"), [("memory-steps.png", "steps", "device")])
def test_a_plot_of_other_data_fails_the_comparison(name, table, key, tmp_path):
    """The tolerance can fail: one plotted value moved by 5% gives another picture."""
    from matplotlib.testing.compare import compare_images

    from benchmarks.results.plots import PLOTS

    section, draw = PLOTS[name]
    data = json.loads(json.dumps(results_page.load_all()[section]))
    row = next(r for r in data["tables"][table]["rows"] if r.get(key))
    row[key] *= 1.05
    draw(data, tmp_path / name)
    assert compare_images(str(REPO / "docs" / name), str(tmp_path / name), tol=PNG_RMS_TOL) is not None


def test_a_rerun_keeps_what_it_did_not_remeasure_and_says_so(tmp_path):
    """bench_sparse's JSONL replaces the sparse main table; the int8 before/after table and the prose's
    figures are kept from the committed data, named in the provenance line, and the template renders."""
    from benchmarks.results.collect import kept_from
    from benchmarks.results.collect import write as collect

    committed = load_section("sparse")
    (tmp_path / "bench").mkdir()
    lines = []
    for r in committed["tables"]["main"]["rows"]:  # the committed rows under bench_sparse's own keys
        row = {"model": r["model"], "context": r["context"], "method": r["method"], "decode_tok_s": r["decode_tok_s"]}
        row |= {"speedup": r["x_dense"] * 1.5, "attn_ms_step": r["attn_ms_step"], "attn_speedup": r["attn_x_dense"]}
        row |= {"index_ms_step": r["index_ms"], "sparse_attn_ms_step": r["sparse_attn_ms"], "build_s": r["build_s"]}
        row |= {"read_fraction": r["read"] / 100, "index_pct": r["index_pct_kv"], "top1_gsm8k": r["top_1_gsm8k"]}
        row |= {"kl_gsm8k": r["kl_gsm8k"], "top1_math500": r["top_1_math"], "kl_math500": r["kl_math"]}
        lines.append(json.dumps(row))
    (tmp_path / "bench" / "sparse.jsonl").write_text("\n".join(lines) + "\n")
    collect("sparse", tmp_path / "bench", "python scripts/bench_sparse.py --contexts 2048", data_root=tmp_path)
    data = load_section("sparse", tmp_path)
    assert data["tables"]["table2"] == committed["tables"]["table2"] and data["facts"] == committed["facts"]
    first = kept_from(committed)["measured"]  # table2's own date, however many reruns kept it since
    only_settings = {"measured": "d2", "commit": "c2", "carried": {"measured": "d1", "commit": "c1", "tables": [],
                                                                  "facts": [], "settings": ["x"]}}  # fmt: skip
    assert kept_from(only_settings) == {"measured": "d2", "commit": "c2"}  # settings do not date the tables
    assert data["carried"]["tables"] == ["table2"] and data["carried"]["measured"] == first
    text = render_section(Section("sparse"), data)
    assert f"Kept from the measurement of {first}" in text and "table `table2`" in text
    lychee_8k = next(r for r in committed["tables"]["main"]["rows"] if (r["context"], r["method"]) == (8192, "lychee"))
    assert f"**{lychee_8k['x_dense'] * 1.5:.2f}x dense**" in text  # the prose follows the new table
    read_8k = f"| {lychee_8k['read']:.1f}% |"
    assert read_8k in text  # read_fraction shown as a percentage again

    # the run measured lychee's float16 index beside its int8 one (make results' sparse-int8 step): table2 is
    # this run's, one row per context, and nothing is kept
    (tmp_path / "bench" / "int8").mkdir()
    methods = (("lychee", 2.1, 0.004), ("lychee-fp16", 3.6, 0.003))
    int8 = [{"context": c, "method": m, "index_pct": pct, "index_mb": c * pct / 1e5, "top1_gsm8k": 1.0,
             "kl_gsm8k": kl, "top1_math500": 1.0, "kl_math500": kl / 2}
            for c in (2048, 4096, 8192) for m, pct, kl in methods]  # fmt: skip
    (tmp_path / "bench" / "int8" / "sparse.jsonl").write_text("".join(json.dumps(r) + "\n" for r in int8))
    collect("sparse", tmp_path / "bench", "python scripts/bench_sparse.py --contexts 2048", data_root=tmp_path)
    data = load_section("sparse", tmp_path)
    table2 = data["tables"]["table2"]["rows"]
    assert [r["context"] for r in table2] == [2048, 4096, 8192] and not data.get("carried", {}).get("tables")
    assert table2[2]["index_pct_kv_fp16"] == 3.6 and table2[2]["index_pct_kv_int8"] == 2.1
    text = render_section(Section("sparse"), data)
    assert "Kept from" not in text and "| 8,192 | 3.60% | 2.10% |" in text and "int8 takes 0.58x" in text


def test_a_benchmark_with_its_own_format_renders_its_own_section(tmp_path):
    """The longctx hook: a summary in the benchmark's own format (date as ISO time, machine as a dict)
    gets the same provenance line, and its body comes from the benchmark's renderer."""
    from benchmarks.results.sections import load

    summary = {"command": "python scripts/bench_longctx.py --lengths 1024", "commit": "ab" * 20}
    summary |= {"date": "2026-12-01T15:38:30+00:00", "machine": {"cpu": "x86_64", "torch_threads": 1}}
    (tmp_path / "longctx").mkdir()
    (tmp_path / "longctx" / "ruler_summary.json").write_text(json.dumps(summary))
    section = Section("longctx", render="json:dumps", optional=True, file="ruler_summary.json", title="Long")
    data = load(section, tmp_path)
    text = render_section(section, data)
    assert text.startswith("## Long\n\nMeasured 2026-12-01 at commit `abababababab` on cpu x86_64, torch_threads 1.")
    assert "python scripts/bench_longctx.py --lengths 1024" in text and '"torch_threads": 1' in text
    assert load(section, tmp_path / "nothing") is None


def _joined_summary(tmp_path, runs: list[dict], dirty: bool, date: str) -> tuple[Section, dict]:
    """A longctx summary rebuilt with --summary-only from ``runs`` (at commit ef..., on ``date``), written
    under ``tmp_path`` and loaded as the page loads it: (its section, its prepared data)."""
    from benchmarks.results.sections import load

    summary = {"command": "python scripts/bench_longctx.py --summary-only --runs-from a.json,b.json",
               "commit": "ef" * 20, "dirty": dirty, "date": f"{date}T01:00:00+00:00", "runs": runs}  # fmt: skip
    (tmp_path / "longctx").mkdir()
    (tmp_path / "longctx" / "s.json").write_text(json.dumps(summary | {"machine": {"cpu": "x86_64"}}))
    section = Section("longctx", render="json:dumps", optional=True, file="s.json", title="Long")
    return section, load(section, tmp_path)


def test_a_summary_of_joined_runs_shows_the_runs_commands_commit_and_dates(tmp_path):
    """A longctx summary rebuilt from the rows of two parallel runs (--summary-only --runs-from) is shown
    as measured by those runs: both commands before the summary's own, their shared commit, their dates."""

    runs = [{"command": f"python scripts/bench_longctx.py --lengths {n}", "commit": "cd" * 20, "dirty": False,
             "date": f"2026-12-0{d}T05:40:14+00:00"} for n, d in ((2048, 3), (8160, 4))]  # fmt: skip
    section, data = _joined_summary(tmp_path, runs, dirty=True, date="2026-12-05")
    assert data["commit"] == "cd" * 20 and data["dirty"] is False and data["measured"] == "2026-12-03 to 2026-12-04"
    text = render_section(section, data)
    assert "--lengths 2048\npython scripts/bench_longctx.py --lengths 8160\n# the runs' rows joined" in text
    assert text.index("--lengths 8160") < text.index("--summary-only") and "`cdcdcdcdcdcd`" in text


def test_joined_runs_resumed_at_several_commits_show_each_command_once_and_every_commit(tmp_path):
    """A run resumed at later commits (the same command again) is listed once with how many times it ran,
    and the header names every commit the rows were measured at, not the summary's own."""
    from benchmarks.longctx.report import measured_at

    def run(n, commit, day, dirty=False):
        return {"command": f"python scripts/bench_longctx.py --lengths {n}", "commit": commit * 20, "dirty": dirty,
                "date": f"2026-12-0{day}T05:40:14+00:00"}  # fmt: skip

    runs = [run(2048, "aa", 3), run(8160, "aa", 3), run(2048, "bb", 4, dirty=True), run(2048, "cc", 5)]
    section, data = _joined_summary(tmp_path, runs, dirty=False, date="2026-12-06")
    assert data["commits"] == ["aa" * 20, "bb" * 20, "cc" * 20] and data["commit"] == "cc" * 20 and data["dirty"]
    text = render_section(section, data)
    command = text.split("```bash\n")[1].split("```")[0]
    assert command.count("--lengths 2048") == 1 and "--lengths 2048  # run 3 times" in command
    assert "by runs at commits `aaaaaaaaaaaa`, `bbbbbbbbbbbb`, `cccccccccccc`" in text and "efefefef" not in text
    assert measured_at(data) == "commits aaaaaaaaaa, bbbbbbbbbb, cccccccccc"


def test_the_header_says_a_dirty_tree_and_rows_searched_by_several_codes():
    """``+dirty`` is shown as uncommitted changes (the 12-digit sha alone hid it); a section whose rows
    name several codes lists each with its rows, and the page header counts every one of them."""
    from benchmarks.results.sections import commits_of, provenance

    base = {"section": "s", "measured": "2026-12-03", "machine": "m", "command": "c"}
    dirty = provenance(base | {"commit": "ab" * 20 + "+dirty"})
    assert dirty.startswith("Measured 2026-12-03 at commit `abababababab` (with uncommitted changes) on m.")
    rows = base | {"commit": "cd" * 20, "row_codes": {"cd" * 20: 40, "not recorded": 30, "ef" * 20 + "+dirty": 2}}
    assert provenance(rows).startswith(
        "Measured 2026-12-03 by rows of several codes: `cdcdcdcdcdcd` (40 rows), not recorded (30 rows), "
        "`efefefefefef` (with uncommitted changes) (2 rows) on m."
    )
    assert commits_of(rows) == ["cd" * 20, "ef" * 20 + "+dirty"] and commits_of(base | {"commit": None}) == []


def test_longctx_defaults_say_what_each_default_kept_and_which_reads_kept_95_percent():
    """A default that read the whole context is dense there: its agreement with dense is not quoted as a
    fidelity result; a default that read less, and every measured share, gives its fidelity (accuracy
    retained, agreement) and its speed at that one setting."""
    from benchmarks.longctx.report import defaults

    def entry(method, share, agree, n=20, tok_s=5.0, read=None, retained=None, x=None):
        cell = {"task": "all", "length": 4096, "method": method, "policy": method.split("@")[0], "share": share}
        return cell | {"items": n, "agree": agree, "agree_ci": [agree - 0.1, 1.0], "decode_tok_s": tok_s,
                       "read_fraction": read, "x_dense": x}  # fmt: skip

    summary = [entry("dense", None, 1.0, tok_s=4.0), entry("lychee@default", None, 1.0, read=1.0),
               entry("lychee@50%", 0.5, 0.95, read=0.5, x=1.25), entry("lychee@25%", 0.25, 0.9),
               entry("quest@default", None, 0.9, read=0.4), entry("quest@50%", 0.5, 0.5)]  # fmt: skip
    summary[2] |= {"retained": 0.9, "retained_ci": [0.8, 0.95], "dense_correct": 10}
    text = defaults({"summary": summary})
    lychee, quest = text.splitlines()
    assert lychee == (
        "- 4,096 tokens, **lychee**: its default read rule read 100% of the context, so here it is dense (its "
        "answers are dense's: no fidelity result); 5.0 tok/s (dense 4.0). Measured read shares: 25%: agreement "
        "with dense 0.90 [0.80, 1.00]; 50%: accuracy retained 0.90 [0.80, 0.95] of dense's 10 correct, agreement "
        "with dense 0.95 [0.85, 1.00], 1.25x dense's tok/s. Agreement >= 95%: 50%."
    )
    assert "1.00 [0.90, 1.00]" not in lychee  # dense against itself is never quoted
    assert quest.startswith("- 4,096 tokens, **quest** at its defaults read 40% of the context: agreement with "
                            "dense 0.90 [0.80, 1.00] (n = 20); 5.0 tok/s (dense 4.0).")  # fmt: skip
    assert quest.endswith("Agreement >= 95%: none.")
    assert defaults({"summary": summary[:1]}) == ""


def test_accuracy_retained_counts_only_the_items_dense_answers_correctly():
    """Accuracy retained: of the items dense answers correctly, the share the method answers correctly
    too (Wilson interval, n = dense's correct items); agreement still counts every item; the share of
    dense's context read is kept share x read share; the speed ratio is per item against dense's row."""
    from benchmarks.longctx.run import summarise, wilson

    def row(index, method, correct, agree, tok_s, kept=100, read=1.0):
        return {"task": "t", "length": 2048, "index": index, "seed": 0, "method": method,
                "policy": method.split("@")[0], "share": None if method == "dense" else 0.1, "tokens": 110,
                "answer": "a" if agree else "b", "score": float(correct), "correct": correct, "agree": agree,
                "first_agree": agree, "kl_first": 0.0, "decode_tok_s": tok_s, "prefill_s": 1.0,
                "kept_tokens": kept, "read_fraction": read}  # fmt: skip

    dense = [row(i, "dense", c, True, 10.0) for i, c in enumerate((True, True, True, False))]
    # lychee: right on 2 of dense's 3 right items, and on the item dense gets wrong (agreeing nowhere there)
    lychee = [row(i, "lychee@10%", c, a, 12.0 + i, read=0.1)
              for i, (c, a) in enumerate(((True, True), (False, False), (True, True), (True, False)))]  # fmt: skip
    kvp = [row(i, "kvp@10%", False, False, 20.0, kept=10) for i in range(4)]
    by = {e["method"]: e for e in summarise(dense + lychee + kvp)}
    assert by["lychee@10%"]["retained"] == 2 / 3 and by["lychee@10%"]["dense_correct"] == 3
    assert by["lychee@10%"]["retained_ci"] == list(wilson(2, 3))
    assert by["lychee@10%"]["accuracy"] == 3 / 4 and by["lychee@10%"]["agree"] == 2 / 4
    assert by["dense"]["retained"] == 1.0 and by["kvp@10%"]["retained"] == 0.0
    assert by["lychee@10%"]["context_read"] == pytest.approx(0.1) and by["kvp@10%"]["context_read"] == 0.1
    assert by["dense"]["context_read"] == 1.0 and by["lychee@10%"]["x_dense"] == pytest.approx(1.35)
    no_dense = {e["method"]: e for e in summarise(lychee)}["lychee@10%"]
    assert no_dense["retained"] is None and no_dense["x_dense"] is None and no_dense["dense_correct"] is None


def test_a_claim_reads_an_interval_column_and_the_datas_own_verdicts():
    """Long context: a share's best method wins only above every other's interval (a column of the data);
    below the floor: the data's own paired verdicts (better / worse / no) are the outcome."""
    from benchmarks.results.sections import FLOOR, LONGCTX
    from benchmarks.results.summary import findings

    def cell(policy, retained, low, high, length=2048, share=0.5, task="all"):
        return {"task": task, "length": length, "policy": policy, "share": share, "retained": retained,
                "retained_ci": [low, high], "context_read": share or 1.0}  # fmt: skip

    cells = [cell("dense", 1.0, 0.9, 1.0, share=None), cell("lychee", 0.9, 0.85, 0.95), cell("h2o", 0.3, 0.2, 0.4),
             cell("quest", 0.6, 0.5, 0.7), cell("lychee", 0.5, 0.4, 0.6, share=0.1), cell("h2o", 0.45, 0.35, 0.55,
             share=0.1), cell("h2o", 0.0, 0.0, 0.1, task="niah")]  # fmt: skip
    found = {(m, at): kind for m, kind, _, at in findings(LONGCTX, {"summary": cells})}
    assert found == {("lychee", "50%"): "wins", ("quest", "50%"): None, ("h2o", "50%"): "loses",
                     ("lychee", "10%"): None, ("h2o", "10%"): None}  # fmt: skip
    vs = [{"task": "gsm8k", "budget": b, "policy": "arbor", "beyond": v} for b, v in
          (("0.5x", "better"), ("0.25x", "no"), ("0.1x", "worse"))]  # fmt: skip
    got = [(at, kind) for _, kind, _, at in findings(FLOOR[0], {"tables": {"vs_best": {"rows": vs}}})]
    assert got == [("0.5x", "wins"), ("0.25x", None), ("0.1x", "loses")]


def test_a_row_that_read_the_whole_context_is_dense_and_never_wins():
    """Long context: a row that read >= 99% of dense's context is dense against dense, whatever its share label
    says (a share row that happened to read everything too): it is never judged, so never a win, and the
    others at its share are judged without it. Rows rank by accuracy retained (dense's correct answers
    kept), and a win carries the agreement on every item and the speed of its setting."""
    from benchmarks.results.sections import LONGCTX
    from benchmarks.results.summary import findings, summary

    def cell(policy, retained, low, high, read, share=0.5):
        return {"task": "all", "length": 8160, "policy": policy, "share": share, "retained": retained,
                "retained_ci": [low, high], "context_read": read, "agree": retained - 0.1, "x_dense": 1.25}  # fmt: skip

    cells = [cell("dense", 1.0, 0.98, 1.0, 1.0, share=None), cell("lychee", 1.0, 0.98, 1.0, 1.0),
             cell("quest", 0.9, 0.85, 0.95, 0.995), cell("h2o", 0.3, 0.2, 0.4, 0.5)]  # fmt: skip
    # judged by its label alone, lychee (read 100%) would win at 50% above quest and h2o
    assert findings(LONGCTX, {"summary": cells}) == []  # h2o alone is left: nothing to compare it with
    cells.append(cell("kvp", 0.6, 0.5, 0.7, 0.5))
    found = findings(LONGCTX, {"summary": cells})
    assert {m for m, *_ in found} == {"h2o", "kvp"} and ("kvp", "wins", "8,160 tokens", "50%") in found
    data = {"longctx": {"title": "Long context: a test", "summary": cells}}
    text = summary(data, {"longctx": (LONGCTX,)})
    assert "lychee" not in text and "quest" not in text
    assert _summary_rows(text)["kvp"][0] == (
        "Keeps most of dense's correct answers at 50% (agreement with dense 0.50, 1.25x dense's tok/s) on 8,160 "
        "tokens (Long context)."
    )


def test_a_speed_finding_states_the_fidelity_of_its_own_row():
    """Sparse decode: each setting where a method is faster or slower than dense carries the read share and
    the fidelity measured in the same row, from the data (no range hides them); a row without fidelity says
    so rather than borrow another row's."""
    from benchmarks.results.sections import SPARSE
    from benchmarks.results.summary import summary

    def row(model, context, method, tok_s, read=100.0, top1=None, math=None):
        return {"model": model, "context": context, "method": method, "decode_tok_s": tok_s, "read": read,
                "top_1_gsm8k": top1, "kl_gsm8k": None, "top_1_math": math, "kl_math": None}  # fmt: skip

    rows = [row("smollm2", 2048, "dense", 10.0), row("smollm2", 2048, "lychee", 9.0, 50.0, 0.97, 0.99),
            row("smollm2", 4096, "dense", 10.0), row("smollm2", 4096, "lychee", 12.0, 25.0, 0.9, 0.8),
            row("smollm2", 8192, "dense", 10.0), row("smollm2", 8192, "lychee", 13.0, 12.5, 0.75, 1.0),
            row("random", 16384, "dense", 5.0), row("random", 16384, "lychee", 9.0, 6.25)]  # fmt: skip
    data = {"sparse": {"title": "Sparse decode attention (a test)", "tables": {"main": {"rows": rows}}}}
    wins, loses = _summary_rows(summary(data, {"sparse": (SPARSE,)}))["lychee"]
    assert wins == (
        "Decodes faster than dense at 4,096 (reads 25%; top-1 agreement with dense: GSM8K 0.90, MATH-500 0.80), "
        "8,192 (reads 12.5%; top-1 agreement with dense: GSM8K 0.75, MATH-500 1.00) on smollm2 model and at "
        "16,384 (reads 6.25%; no fidelity measured) on random model (Sparse decode attention)."
    )
    assert loses == (
        "Decodes slower than dense at 2,048 (reads 50%; top-1 agreement with dense: GSM8K 0.97, MATH-500 0.99) "
        "on smollm2 model (Sparse decode attention)."
    )


def test_sign_test_is_mcnemars_exact_two_sided_p():
    from benchmarks.results.stats import sign_test

    assert sign_test(0, 0) == 1.0 and sign_test(3, 1) == 2 * (1 + 4) / 16
    assert sign_test(5, 0) == sign_test(0, 5) == 2 / 32 and sign_test(6, 0) == 2 / 64 < 0.05
    with pytest.raises(ValueError):
        sign_test(-1, 2)


def test_a_search_shape_against_full_in_its_memory_is_judged_problem_by_problem():
    """Fixed memory: each shape against full's reference search by the exact sign test over the problems
    only one of them solved (5 vs 0 is p = 0.06: no win; 6 vs 0 is); out of memory on every problem loses;
    the summary names the shape without its Hydra group."""
    from benchmarks.results.sections import CONFIGL
    from benchmarks.results.summary import findings, summary

    def row(policy, setting, solved, ratio=1.0, oom=0, gained=0, lost=0):
        return {"search": "configl-game24", "policy": policy, "setting": setting, "ratio": ratio, "problems": 30,
                "solved_n": solved, "oom_n": oom, "gained_n": gained, "lost_n": lost}  # fmt: skip

    b = "controller.breadth={} controller.n_generate=5"
    rows = [row("full", "", 12, ratio=None), row("full", b.format(20), 0, oom=30, lost=12),
            row("arbor", b.format(20), 17, gained=5), row("arbor", b.format(10), 18, gained=6),
            row("arbor", b.format(5), 10, oom=1, lost=9)]  # fmt: skip
    data = {"e2e-configl-game24": {"title": "Fixed-memory scaling (Game of 24)", "tables": {"main": {"rows": rows}}}}
    found = [(m, kind, at) for m, kind, _, at in findings(CONFIGL, data["e2e-configl-game24"])]
    assert found == [
        ("full", "oom", "breadth=20 n_generate=5"),
        ("arbor", None, "breadth=20 n_generate=5"),
        ("arbor", "wins", "breadth=10 n_generate=5"),
        ("arbor", "loses", "breadth=5 n_generate=5"),
    ]
    table = _summary_rows(summary(data, {"e2e-configl-game24": (CONFIGL,)}))
    assert table["arbor"] == (
        "Solves more than full's reference search in its memory at breadth=10 n_generate=5 on configl-game24 "
        "(Fixed-memory scaling).",
        "Solves fewer than full's reference search at breadth=5 n_generate=5 on configl-game24 (Fixed-memory scaling).",
    )  # fmt: skip


def test_a_cell_collapses_settings_into_ranges_of_measured_neighbours():
    """Three or more settings that are neighbours among those measured at a place read as one range; places
    with the same settings share them; a gap breaks the range."""
    from benchmarks.results.summary import cell

    measured = {("Below the floor", p): ["0.5x", "0.35x", "0.25x", "0.15x", "0.1x"] for p in ("game24", "gsm8k")}
    found = [("kvp", "wins", "Below the floor", "beats random", p, at)
             for p, ats in (("game24", measured["Below the floor", "game24"]), ("gsm8k", ["0.5x", "0.35x", "0.1x"]))
             for at in ats]  # fmt: skip
    assert cell(found, measured) == (
        "Beats random at 0.1x-0.5x on game24 and at 0.1x, 0.35x, 0.5x on gsm8k (Below the floor)."
    )
    assert cell(found[:5] + [f[:4] + ("gsm8k", f[5]) for f in found[:5]], measured) == (
        "Beats random at 0.1x-0.5x on game24, gsm8k (Below the floor)."
    )
    assert cell([], measured) == "-"


def test_the_runtime_code_map_names_every_commit_in_docs_data_and_agrees_with_git():
    """docs/data/runtime-codes.json maps every commit a section names (the header groups sections by it
    without git); each commit git knows maps to the runtime code of its trees, a dirty one to null."""
    from benchmarks.results.data import load_runtime_codes, runtime_code
    from benchmarks.results.sections import commits_of

    codes = load_runtime_codes()
    named = {c for d in results_page.load_all().values() for c in commits_of(d)}
    assert named and named <= set(codes), sorted(named - set(codes))
    known = [c for c in named if not c.endswith("+dirty") and runtime_code(rev=c) is not None]
    assert known or not (REPO / ".git").exists()  # a git checkout knows the commits it measured at
    for c in named:
        assert codes[c] == (None if c.endswith("+dirty") else runtime_code(rev=c) or codes[c]), c


def test_the_header_groups_sections_by_runtime_code(tmp_path):
    """A commit of a checkout maps to the code its clean tree has; ``+dirty`` to unknown; the header lists
    the sections measured on each code, and those whose code is not known with why."""
    from benchmarks.results.data import runtime_code, update_runtime_codes

    repo = tmp_path / "repo"
    (repo / "arbor_runtime").mkdir(parents=True)
    (repo / "arbor_runtime" / "x.py").write_text("A = 1\n")

    def git(*args):
        cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
        return subprocess.run(cmd, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "one")
    one, code_one = git("rev-parse", "HEAD"), runtime_code(repo)
    (repo / "docs.md").write_text("a page\n")
    git("add", ".")
    git("commit", "-qm", "docs only")
    two = git("rev-parse", "HEAD")
    (repo / "arbor_runtime" / "x.py").write_text("A = 2\n")
    git("commit", "-qam", "runtime")
    three = git("rev-parse", "HEAD")
    root = tmp_path / "data"
    codes = update_runtime_codes([one, two, three, three + "+dirty", "f" * 40], root, repo)
    assert codes[one] == codes[two] == code_one and codes[three] == runtime_code(repo) != code_one
    assert codes[three + "+dirty"] is None and "f" * 40 not in codes  # a commit git lacks: left out
    assert json.loads((root / "runtime-codes.json").read_text()) == codes
    data = {
        "a": {"commit": one, "measured": "2026-12-01"},
        "b": {"commit": two, "measured": "2026-12-02"},
        "c": {"commit": three, "measured": "2026-12-03"},
        "d": {"commit": three + "+dirty", "measured": "2026-12-03"},
        "e": {"commit": "f" * 40, "measured": "2026-12-03"},
    }
    lines = results_page.runtime_lines(data, root).splitlines()
    assert lines[2:] == [
        f"- `{codes[three]}` (1 of 5 sections): c",
        f"- `{code_one}` (2 of 5 sections): a, b",
        f"- not known (2 sections): d (`{three[:12]}`, uncommitted changes), e (`ffffffffffff`, not in the map)",
    ]


def test_the_scaling_figure_names_each_widening_by_the_one_key_it_raises():
    """fixed_memory_scaling's curves (issue 50): breadth, thoughts per state and value-prompt lookahead (at
    the model's or the exact trial values) each against the reference's shape; a search that changes two
    keys, or lowers one, is on no curve."""
    from benchmarks.results.plots import shape_of, widening_of

    ref = shape_of("")
    assert ref == (5, 5, 0, "model")
    assert shape_of("controller.breadth=20 controller.n_generate=5") == (20, 5, 0, "model")
    cases = {
        "controller.breadth=10": "breadth",
        "controller.n_generate=10": "thoughts",
        "verifier.lookahead=2 verifier.trial_values=model": "lookahead",
        "verifier.lookahead=1 verifier.trial_values=exact": "lookahead exact",
        "controller.breadth=10 verifier.lookahead=1": None,
        "controller.breadth=10 controller.n_generate=10": None,
        "controller.breadth=3": None,
        "verifier.trial_values=exact": None,
    }
    assert {s: widening_of(shape_of(s), ref) for s in cases} == cases


def test_step_overhead_prose_holds_for_the_data():
    """docs/notes/step-overhead.md's claims (issue 64): with one row the runtime's bookkeeping does not grow
    with the tree (within a tenth of a millisecond from a hundred to ten thousand blocks); at a thousand
    blocks it stays under a millisecond with every row count, for both policies."""
    rows = load_section("step-overhead")["tables"]["main"]["rows"]
    for policy in ("full", "arbor"):
        mine = [r for r in rows if r["policy"] == policy]
        single = [r["bookkeeping_ms"] for r in mine if r["rows"] == 1]
        assert len(single) == 3 and max(single) - min(single) < 0.1, (policy, single)
        at_1000 = [r for r in mine if r["blocks"] == 1000]
        assert {r["rows"] for r in at_1000} == {1, 8, 64}
        assert all(r["bookkeeping_ms"] < 1.0 for r in at_1000), (policy, at_1000)
