"""The page's summary: where each method wins and loses, decided by rules over the section data.

Each rule reads one section's table and returns a sentence (or None when its data is absent), so
the summary changes when the data does and never quotes a figure the tables do not hold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from .stats import format_rate, overlap, sign_test
from .tables import cell

Rule = Callable[[dict[str, dict]], str | None]


def _share(v: float) -> str:
    return f"{v:g}x"


def accuracy(data: dict[str, dict]) -> str | None:
    """Per propose mode: which policy/budget differs from full beyond the 95% intervals, and OOM."""
    if "accuracy" not in data:
        return None
    rows = data["accuracy"]["tables"]["main"]["rows"]
    full = {r["mode"]: r for r in rows if r["policy"] == "full" and "oracle" not in r["verifier"]}
    differs, ooms = [], []
    for r in rows:
        ref = full.get(r["mode"])
        if ref is None or r is ref or "oracle" in r["verifier"]:
            continue
        if not overlap((r["solved"], r["problems"]), (ref["solved"], ref["problems"])):
            differs.append(f"{r['policy']} {r['budget']} in {r['mode']}")
        if r["oom"] == r["problems"]:
            ooms.append(f"{r['policy']} at {r['budget']}")
    best = max(full.values(), key=lambda r: r["solved"])
    text = (
        f"**Accuracy (Game of 24, n={best['problems']} per cell).** Best mode under `full`: {best['mode']}, "
        f"{format_rate(best['solved'], best['problems'])}. "
    )
    text += (
        "No policy or budget differs from `full` beyond the 95% intervals"
        if not differs
        else "Beyond the 95% intervals, differing from `full`: " + "; ".join(differs)
    )
    text += " (at this n the intervals are wide: read ties, not rankings)."
    if ooms:
        counts = {k: ooms.count(k) for k in dict.fromkeys(ooms)}
        listed = "; ".join(f"{k} ({v} of {len(full)} modes)" for k, v in counts.items())
        text += f" Out of memory on every puzzle: {listed}."
    return text


def budgets(data: dict[str, dict]) -> str | None:
    """Per search: the smallest share of full's peak at which each policy rebuilt full's tree exactly."""
    if "budgets" not in data:
        return None
    best: dict[tuple[str, str], float] = {}
    lost: dict[tuple[str, str], float] = {}
    for r in data["budgets"]["tables"]["main"]["rows"]:
        if r["policy"] == "full" or r["x_full_peak"] is None:
            continue
        key = (f"{r['search']} #{r['problem']}", r["policy"])
        if r["same_tree_as_full"] == "yes":
            best[key] = min(best.get(key, 9.0), r["x_full_peak"])
        else:
            lost[key] = max(lost.get(key, 0.0), r["x_full_peak"])
    parts = []
    for search in dict.fromkeys(s for s, _ in best | lost):
        for policy in ("arbor", "h2o"):
            if (search, policy) in best:
                parts.append(f"{policy} exact down to {_share(best[search, policy])} on {search}")
            elif (search, policy) in lost:
                parts.append(f"{policy} never exact on {search} (tried up to {_share(lost[search, policy])})")
    return "**Smallest exact budget (live searches).** " + "; ".join(parts) + "."


def _lowest(rows: list[dict], group: str, policy: str, metric: str) -> dict[str, str]:
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get(metric) is not None:
            by[cell(r[group], "text") if isinstance(r[group], str) else r[group]].append(r)
    return {k: min(v, key=lambda r: r[metric])[policy] for k, v in by.items()}


def _ranges(winners: dict, unit: str = "") -> str:
    by: dict[str, list] = defaultdict(list)
    for share, who in winners.items():
        by[who].append(share)
    return "; ".join(f"{who} at {', '.join(f'{s}{unit}' for s in shares)}" for who, shares in by.items())


def kvp(data: dict[str, dict]) -> str | None:
    """Which policy has the lowest mean KL at each kept share (oracle excluded)."""
    if "kvp" not in data:
        return None
    rows = [r for r in data["kvp"]["tables"]["table2"]["rows"] if r["policy"] != "oracle"]
    winners = _ranges(_lowest(rows, "kept", "policy", "mean_kl"), "%")
    return f"**KVP vs heuristics (lowest mean KL per kept share).** {winners}."


def linear(data: dict[str, dict]) -> str | None:
    """Project policies vs their kvpress press: the KL ratio range per policy."""
    if "linear" not in data:
        return None
    by: dict[str, list[float]] = defaultdict(list)
    for r in data["linear"]["tables"]["main"]["rows"]:
        by[r["policy"]].append(float(str(r["xpress"]).rstrip("×")))
    parts = [f"{p} {min(v):.2f}-{max(v):.2f}x its press's KL" for p, v in by.items()]
    return "**Linear baselines vs kvpress (same contexts).** " + "; ".join(parts) + " (1.00x = identical)."


def sparse(data: dict[str, dict]) -> str | None:
    """Per method, where sparse decoding is faster or slower than dense end to end; its fidelity range."""
    if "sparse" not in data:
        return None
    rows = [r for r in data["sparse"]["tables"]["main"]["rows"] if r["method"] != "dense"]
    top1 = [r[k] for r in rows for k in ("top_1_gsm8k", "top_1_math") if r.get(k) is not None]

    def ctx(pairs: list) -> str:
        return ", ".join(f"{c:,} ({m})" for m, c in sorted(pairs, key=lambda mc: mc[1])) or "none"

    parts = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        faster = ctx([(r["model"], r["context"]) for r in mine if r["x_dense"] > 1])
        slower = ctx([(r["model"], r["context"]) for r in mine if r["x_dense"] <= 1])
        parts.append(f"{method} faster end to end at {faster}, slower at {slower}")
    low, high = f"{min(top1):.2f}", f"{max(top1):.2f}"
    return (
        f"**Sparse decode (lychee, quest) vs dense.** {'; '.join(parts)}; "
        f"top-1 agreement with dense {low if low == high else f'{low}-{high}'}."
    )


def concurrency(data: dict[str, dict]) -> str | None:
    """Problems/hour at the best concurrency against concurrency 1, per policy; naive ToT beside it."""
    if "concurrency" not in data:
        return None
    rows = data["concurrency"]["tables"]["main"]["rows"]
    parts = []
    for search, policy in dict.fromkeys((r["search"], r["policy"]) for r in rows):
        mine = [r for r in rows if (r["search"], r["policy"]) == (search, policy)]
        one = next((r for r in mine if r["concurrency"] == 1), None)
        top = max(mine, key=lambda r: r["problems_hour"])
        name = f"`{policy}` ({search})"
        if one and len(mine) > 1 and top is one:
            parts.append(f"{name} fastest at concurrency 1 ({one['problems_hour']:.0f} problems/hour)")
        elif one and len(mine) > 1:
            parts.append(
                f"{name} {top['problems_hour'] / one['problems_hour']:.2f}x its concurrency-1 rate "
                f"at concurrency {top['concurrency']}"
            )
        elif one:
            parts.append(f"{name} {one['problems_hour']:.0f} problems/hour")
    return "**Concurrency (problems/hour).** " + "; ".join(parts) + "."


def packing(data: dict[str, dict]) -> str | None:
    """arbor's time over full's with evicted blocks read packed and in place (same search, same run)."""
    if "packing" not in data:
        return None
    rows = [r for r in data["packing"]["tables"]["main"]["rows"] if r["policy"] != "full"]
    parts = []
    for r in rows:
        how = "packed" if r["packed"] else "in place"
        tree = "full's tree" if r["same_tree"] else "another tree than full's"
        parts.append(f"{how} {r['time_vs_full']:.2f}x full's time ({tree})")
    share = f"{rows[0]['fraction']:.2f}x" if rows else "a share"
    return f"**Evicted blocks, packed or in place.** arbor at {share} of full's peak: " + "; ".join(parts) + "."


def speed(data: dict[str, dict]) -> str | None:
    """The runtime's time against naive re-prefill on the same trees."""
    if "speed" not in data:
        return None
    ratios = [r["runtime_method_time"] for r in data["speed"]["tables"]["main"]["rows"] if r["method"] == "naive"]
    return (
        f"**Same tree, three ways.** The runtime takes {min(ratios):.2f}-{max(ratios):.2f}x naive ToT's time "
        "(naive re-prefills every path)."
    )


def stale(data: dict[str, dict]) -> str | None:
    """Which sections are not current, from their data's own ``stale`` field."""
    old = [d["title"].split(" (")[0] for d in data.values() if d.get("stale")]
    if not old:
        return None
    return "**Not yet re-measured** (their data says why; `make results` reruns them): " + "; ".join(old) + "."


Verdict = tuple[str, str, str]  # (method, "wins" | "loses" | "matches", what, with the section)


def budget_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """Exact down to which share of full's peak; never exact; out of memory where another policy ran."""
    if "budgets" not in data:
        return []
    rows = [r for r in data["budgets"]["tables"]["main"]["rows"] if r["policy"] != "full"]
    out: list[Verdict] = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        exact = {}
        for r in mine:
            if r["same_tree_as_full"] == "yes":
                key = f"{r['search']} #{r['problem']}"
                exact[key] = min(exact.get(key, 9.0), r["x_full_peak"])
        if exact:
            where = ", ".join(f"{_share(x)} on {k}" for k, x in exact.items())
            out.append((policy, "wins", f"rebuilds full's tree exactly down to {where} (smallest exact budget)"))
        never = sorted({f"{r['search']} #{r['problem']}" for r in mine if r["oom"] == "no"} - set(exact))
        if never:
            out.append((policy, "loses", f"never rebuilds full's tree on {', '.join(never)} (smallest exact budget)"))
        ooms = [r for r in mine if r["oom"] == "yes"]
        if ooms:
            where = ", ".join(sorted({f"{r['search']} #{r['problem']}" for r in ooms}))
            floor = (
                "below its floor (the longest path plus one thought) "
                if all(r["x_full_peak"] < r["floor"] for r in ooms)
                else ""
            )
            others = sorted({r["policy"] for r in rows if r["policy"] != policy and r["oom"] == "no"})
            ran = f", where {', '.join(others)} kept running (inexactly)" if others else ""
            out.append((policy, "loses", f"out of memory {floor}on {where}{ran} (smallest exact budget)"))
    return out


def accuracy_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """Policies that ran out of memory on every puzzle of a mode."""
    if "accuracy" not in data:
        return []
    rows = data["accuracy"]["tables"]["main"]["rows"]
    modes = {r["mode"] for r in rows}
    ooms: dict[tuple[str, str], int] = defaultdict(int)
    for r in rows:
        if r["oom"] == r["problems"]:
            ooms[r["policy"], r["budget"]] += 1
    return [
        (policy, "loses", f"out of memory on every puzzle at {budget} in {n} of {len(modes)} accuracy modes")
        for (policy, budget), n in ooms.items()
    ]


def kvp_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """Lowest mean KL per kept share among the learned and heuristic scorers."""
    if "kvp" not in data:
        return []
    rows = [r for r in data["kvp"]["tables"]["table2"]["rows"] if r["policy"] != "oracle"]
    winners = _lowest(rows, "kept", "policy", "mean_kl")
    out: list[Verdict] = []
    by: dict[str, list] = defaultdict(list)
    for share, who in winners.items():
        by[who].append(f"{share}%")
    for who, shares in by.items():
        out.append((who, "wins", f"lowest mean KL at {', '.join(shares)} kept (KVP)"))
    learned = [s for s, w in winners.items() if not w.startswith("kvp")]
    if learned:
        out.append(
            ("kvp", "loses", f"h2o-style statistics beat it at {', '.join(f'{s}%' for s in learned)} kept (KVP)")
        )
    return out


def linear_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """Each linear policy against its kvpress press: identical, or how far from it."""
    if "linear" not in data:
        return []
    out: list[Verdict] = []
    by: dict[str, list[dict]] = defaultdict(list)
    for r in data["linear"]["tables"]["main"]["rows"]:
        by[r["policy"]].append(r)
    for policy, rows in by.items():
        ratios = [r["xpress"] for r in rows]
        if all(abs(x - 1) < 0.005 for x in ratios):
            out.append((policy, "matches", "kvpress's press exactly at every share (Linear)"))
            continue
        worst = max(rows, key=lambda r: r["xpress"])
        if worst["xpress"] > 1:
            out.append(
                (policy, "loses", f"{worst['xpress']:.2f}x its kvpress press's KL at {worst['kept']:g}% kept (Linear)")
            )
        best = min(rows, key=lambda r: r["xpress"])
        if best["xpress"] < 1:
            out.append(
                (policy, "wins", f"{best['xpress']:.2f}x its kvpress press's KL at {best['kept']:g}% kept (Linear)")
            )
    return out


def sparse_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """Contexts where each sparse method decodes faster or slower than dense."""
    if "sparse" not in data:
        return []
    out: list[Verdict] = []
    rows = data["sparse"]["tables"]["main"]["rows"]
    for method in ("lychee", "quest"):
        mine = [r for r in rows if r["method"] == method]
        for kind, test in (("wins", lambda x: x > 1), ("loses", lambda x: x <= 1)):
            hits = [r for r in mine if test(r["x_dense"])]
            if hits:
                where = ", ".join(f"{r['context']:,} ({r['x_dense']:.2f}x)" for r in hits)
                word = "faster" if kind == "wins" else "slower"
                out.append((method, kind, f"decodes {word} than dense at {where} (Sparse)"))
    return out


def rehydrate_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """Rehydration orders against each other at the pools where they differ."""
    if "rehydrate" not in data:
        return []
    rows = data["rehydrate"]["tables"]["main"]["rows"]
    out: list[Verdict] = []
    for pool in dict.fromkeys(r["pool_tokens"] for r in rows if r["pool_tokens"]):
        at = {r["configuration"]: r for r in rows if r["pool_tokens"] == pool}
        ranked, position = at.get("ranked"), at.get("position")
        if ranked and position and ranked["tokens_full"] is not None and position["tokens_full"] is not None:
            kind = "wins" if ranked["tokens_full"] > position["tokens_full"] else "loses"
            text = (
                f"{ranked['tokens_full']} of answer tokens equal full's vs position order's {position['tokens_full']}"
            )
            out.append(("rehydrate=ranked", kind, f"{text} at pool {pool} (Returning to a compressed branch)"))
        whole = at.get("whole")
        if whole and whole["ran"].startswith("0/"):
            out.append(("rehydrate=whole", "loses", f"cannot run at pool {pool} ({whole['ran']} trees)"))
    return out


def concurrency_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """Throughput gained from concurrency, per policy, and naive ToT against the runtime."""
    if "concurrency" not in data:
        return []
    rows = data["concurrency"]["tables"]["main"]["rows"]
    out: list[Verdict] = []
    for search, policy in dict.fromkeys((r["search"], r["policy"]) for r in rows if r["policy"] != "naive ToT"):
        mine = [r for r in rows if (r["search"], r["policy"]) == (search, policy)]
        one = next((r for r in mine if r["concurrency"] == 1), None)
        top = max(mine, key=lambda r: r["problems_hour"])
        if one is None or len(mine) < 2:
            continue
        where = f"(Concurrency, {search})"
        if top is one:
            out.append((f"`{policy}`", "loses", f"no more problems/hour at any concurrency than at 1 {where}"))
        else:
            gain = top["problems_hour"] / one["problems_hour"]
            out.append(
                (f"`{policy}`", "wins", f"{gain:.2f}x problems/hour at concurrency {top['concurrency']} {where}")
            )
    for naive in (r for r in rows if r["policy"] == "naive ToT"):
        best_runtime = max(
            (r for r in rows if r["policy"] != "naive ToT" and r["search"] == naive["search"]),
            key=lambda r: r["problems_hour"],
            default=None,
        )
        if best_runtime is None:
            continue
        kind = "wins" if naive["problems_hour"] > best_runtime["problems_hour"] else "loses"
        rates = f"{naive['problems_hour']:.0f} problems/hour vs the runtime's best {best_runtime['problems_hour']:.0f}"
        tokens = f"{naive['decode_tokens']:,} vs {best_runtime['decode_tokens']:,} decode tokens"
        out.append(("naive ToT", kind, f"{rates} (other samples: {tokens}; Concurrency, {naive['search']})"))
    return out


def _longctx_cells(data: dict[str, dict]) -> dict[int, dict[float, list[dict]]]:
    """length -> share -> the over-all-tasks entries of every method at that share (longctx section)."""
    summary = data["longctx"]["summary"]
    task = "all" if any(e["task"] == "all" for e in summary) else summary[0]["task"]
    out: dict[int, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for e in summary:
        if e["task"] == task and e["share"]:
            out[e["length"]][e["share"]].append(e)
    return out


def longctx(data: dict[str, dict]) -> str | None:
    """Per length: which method kept the most of dense's answers at each read / kept share, and what the
    sparse policies' defaults kept."""
    if "longctx" not in data:
        return None
    summary = data["longctx"]["summary"]
    task = "all" if any(e["task"] == "all" for e in summary) else summary[0]["task"]
    parts = []
    for length, shares in sorted(_longctx_cells(data).items()):
        best = []
        for share, cells in sorted(shares.items(), reverse=True):
            top = max(e["agree"] for e in cells)
            names = "/".join(e["policy"] for e in cells if e["agree"] == top)  # all of them on a tie
            best.append(f"{share:.0%} {names} {top:.2f}")
        text = "; ".join(best)
        n = max(e["items"] for cells in shares.values() for e in cells)
        mine = [e for e in summary if e["task"] == task and e["length"] == length]
        defaults = [e for e in mine if e["method"].endswith("@default")]
        kept = ", ".join(f"{e['policy']} {e['agree']:.2f} reading {e['read_fraction']:.0%}" for e in defaults
                         if e.get("read_fraction") is not None)  # fmt: skip
        parts.append(f"{length:,} tokens (n={n}): {text}" + (f"; defaults: {kept}" if kept else ""))
    return (
        "**Long context (RULER-style suite, SmolLM2).** Most of dense's answers kept at each read / kept share, "
        "over all tasks: " + ". ".join(parts) + "."
    )


def longctx_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """At each length and share, the method that alone kept the most of dense's answers wins there and the
    one that alone kept the fewest loses; one verdict per method and outcome, listing lengths and shares."""
    if "longctx" not in data:
        return []
    where: dict[tuple[str, str], dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for length, shares in sorted(_longctx_cells(data).items()):
        for share, cells in sorted(shares.items(), reverse=True):
            rates = sorted(e["agree"] for e in cells)
            for kind, rate in (("wins", rates[-1]), ("loses", rates[0])):
                alone = [e for e in cells if e["agree"] == rate]
                if len(alone) == 1 and rates[0] < rates[-1]:  # a tie names nobody
                    where[(alone[0]["policy"], kind)][length].append(f"{share:.0%}")
    words = {"wins": "most", "loses": "fewest"}
    out: list[Verdict] = []
    for (policy, kind), at in where.items():
        cells = ", ".join(f"{length:,} ({'/'.join(shares)})" for length, shares in at.items())
        out.append((policy, kind, f"{words[kind]} of dense's answers kept at {cells} (Long context)"))
    return out


def _e2e_tables(data: dict[str, dict]) -> dict[str, list[dict]]:
    """search -> the rows of each end-to-end section in benchmarks/e2e.py's format (reference first);
    sections still in the migrated format (no ``agree_n``) are left to the stale rule."""
    out: dict[str, list[dict]] = {}
    for name, d in data.items():
        rows = d["tables"]["main"]["rows"] if name.startswith("e2e-") and "tables" in d else []
        if rows and all("agree_n" in r for r in rows):
            for r in rows:
                out.setdefault(r["search"], []).append(r)
    return out


def _e2e_cells(data: dict[str, dict]):
    """(search, its reference row, budget ratio, the rows at that ratio) per end-to-end search, budgets
    from large to small."""
    for search, rows in _e2e_tables(data).items():
        ref = next(r for r in rows if r["ratio"] is None)
        for ratio in sorted({r["ratio"] for r in rows if r["ratio"] is not None}, reverse=True):
            yield search, ref, ratio, [r for r in rows if r["ratio"] == ratio]


def _e2e_label(r: dict) -> str:
    return r["policy"] + (f" {r['setting']}" if r.get("setting") else "")


def e2e(data: dict[str, dict]) -> str | None:
    """Per search: full's solve rate; at each budget, which policies kept full's answer on the most and
    fewest problems, which rebuilt full's whole tree, whose solve rate differs from full's beyond the
    intervals, and which ran out of memory."""
    texts: dict[str, str] = {}
    for search, ref, ratio, cells in _e2e_cells(data):
        if search not in texts:
            texts[search] = f"{search} (n={ref['problems']}): full solves {ref['solved']}"
        top, low = max(r["agree_n"] for r in cells), min(r["agree_n"] for r in cells)
        best = "/".join(_e2e_label(r) for r in cells if r["agree_n"] == top)
        text = f"; at {_share(ratio)} full's answer kept by {best} on {top}/{ref['problems']}"
        if low < top:
            worst = "/".join(_e2e_label(r) for r in cells if r["agree_n"] == low)
            text += f", fewest {worst} {low}/{ref['problems']}"
        whole = [_e2e_label(r) for r in cells if r["nodes_as_full"] == 1.0 and not r["oom_n"]]
        if whole:
            text += f", full's whole tree rebuilt by {'/'.join(whole)}"
        differs = [_e2e_label(r) for r in cells
                   if not overlap((r["solved_n"], r["problems"]), (ref["solved_n"], ref["problems"]))]  # fmt: skip
        if differs:
            text += f", solve rate differs from full's beyond the 95% intervals: {'/'.join(differs)}"
        ooms = [f"{_e2e_label(r)} {r['oom_n']}/{r['problems']}" for r in cells if r["oom_n"]]
        if ooms:
            text += f", out of memory: {', '.join(ooms)}"
        texts[search] += text
    if not texts:
        return None
    return "**End to end (policy x budget, set from the start).** " + ". ".join(texts.values()) + "."


def _shape(setting: str) -> str:
    """A search shape as the summary names it: ``controller.breadth=20 controller.n_generate=5`` ->
    ``breadth=20 n_generate=5``."""
    return setting.replace("controller.", "")


def _paired(r: dict) -> str:
    """What the same problems say of a row against the reference (when its data holds the pairs)."""
    if "gained_n" not in r:
        return ""
    p = sign_test(r["gained_n"], r["lost_n"])
    return f"; {r['gained_n']} solved that full did not, {r['lost_n']} the reverse: exact sign test p = {p:.2f}"


def scaling(data: dict[str, dict]) -> str | None:
    """Per fixed-memory scaling section (``e2e-configl-*``): the reference's solve rate; the searches that
    ran out of memory in its peak (on how many problems); every search that ran there on every problem,
    best solve rate first, with its p50 time and, problem by problem against the reference, an exact
    sign test: a difference the test does not find is reported as none."""
    texts = []
    for name, d in data.items():
        rows = d["tables"]["main"]["rows"] if name.startswith("e2e-configl-") and "tables" in d else []
        ref = next((r for r in rows if r.get("ratio") is None), None)
        if ref is None or not all("solved_n" in r for r in rows):
            continue
        text = f"{ref['search']} (n={ref['problems']}): full at the reference search solves {ref['solved']}"
        text += f" (p50 {ref['p50_s']:.0f} s)"
        ran = [r for r in rows if r["ratio"] is not None and not r["oom_n"]]
        no_room = [f"{_shape(_e2e_label(r))} on {r['oom_n']}/{r['problems']}" for r in rows if r["oom_n"]]
        if no_room:
            text += f"; in that memory out of memory: {', '.join(no_room)}"
        ran.sort(key=lambda r: -r["solved_n"])
        each = [f"{_e2e_label(r).replace('controller.', '')} solves {r['solved']} (p50 {r['p50_s']:.0f} s{_paired(r)})"
                for r in ran]  # fmt: skip
        text += "; within it " + ", ".join(each)
        tested = [r for r in ran if "gained_n" in r]
        if tested:
            better = [f"{r['policy']} {_shape(r['setting'])}" for r in tested
                      if r["gained_n"] > r["lost_n"] and sign_test(r["gained_n"], r["lost_n"]) < 0.05]  # fmt: skip
            if better:
                text += ". Solves more than full's reference beyond chance (p < 0.05): " + ", ".join(better)
            else:
                text += ". No search here solves more than full's reference beyond chance at this n (p < 0.05)"
        texts.append(text)
    if not texts:
        return None
    return "**Fixed-memory scaling (Config-L analog, within full's reference peak).** " + ". ".join(texts) + "."


def _e2e_where(r: dict, search: str) -> str:
    """Where a verdict holds: the budget and search, with the search's shape when the sweep varied it."""
    return f"{_share(r['ratio'])} on {search}" + (f" ({r['setting']})" if r.get("setting") else "")


def e2e_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """At each search and budget, the policy that alone kept full's answer on the most problems wins there,
    the one that alone kept it on the fewest loses; a policy that rebuilt full's whole tree on every
    problem wins; one out of memory on every problem loses."""
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for search, _, _, cells in _e2e_cells(data):
        counts = sorted(r["agree_n"] for r in cells)
        for kind, n in (("most", counts[-1]), ("fewest", counts[0])):
            alone = [r for r in cells if r["agree_n"] == n]
            if len(alone) == 1 and counts[0] < counts[-1]:  # a tie names nobody
                where[(alone[0]["policy"], kind)].append(_e2e_where(alone[0], search))
        for r in cells:
            if r["nodes_as_full"] == 1.0 and not r["oom_n"]:
                where[(r["policy"], "tree")].append(_e2e_where(r, search))
            if r["oom_n"] == r["problems"]:
                where[(r["policy"], "oom")].append(_e2e_where(r, search))
    words = {
        "most": ("wins", "full's answer kept on the most problems at"),
        "fewest": ("loses", "full's answer kept on the fewest problems at"),
        "tree": ("wins", "rebuilds full's whole tree on every problem at"),
        "oom": ("loses", "out of memory on every problem at"),
    }
    return [
        (policy, words[key][0], f"{words[key][1]} {', '.join(at)} (End to end)") for (policy, key), at in where.items()
    ]


def _floor_rows(data: dict[str, dict], table: str) -> list[dict]:
    d = data.get("floor")
    return d["tables"][table]["rows"] if d and table in d.get("tables", {}) else []


def floor(data: dict[str, dict]) -> str | None:
    """Below the floor, replayed: per task, arbor's top-1 agreement against the best tree-blind policy's at
    each budget, and where the difference lies beyond its paired interval."""
    rows = _floor_rows(data, "vs_best")
    if not rows:
        return None
    main = {(r["task"], r["budget"], r["policy"]): r for r in _floor_rows(data, "main")}
    texts = []
    for task in dict.fromkeys(r["task"] for r in rows):
        parts = []
        for r in (r for r in rows if r["task"] == task):
            mine, theirs = main[(task, r["budget"], "arbor")], main[(task, r["budget"], r["against"])]
            verdict = {"better": "better", "worse": "worse", "no": "not separable"}[r["beyond"]]
            parts.append(
                f"{r['budget']} {cell(mine['top1_mean'], '{:.2f}')} vs {r['against']} "
                f"{cell(theirs['top1_mean'], '{:.2f}')} ({verdict})"
            )
        texts.append(f"{task}: " + ", ".join(parts))
    ooms = sum(r["oom"] for r in _floor_rows(data, "main") if r["policy"] == "arbor")
    return (
        "**Below the floor, replayed (top-1 agreement with full, arbor vs the best tree-blind policy, "
        "paired 95% intervals over trees).** " + "; ".join(texts) + f"; arbor OOMs: {ooms}."
    )


def floor_verdicts(data: dict[str, dict]) -> list[Verdict]:
    """Arbor wins at a task and budget where it keeps more of full's top-1 choices than the best tree-blind
    policy beyond the paired interval, loses where it keeps fewer; a tree-blind scorer beyond random's
    interval either way wins or loses against random there."""
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in _floor_rows(data, "vs_best"):
        if r["beyond"] != "no":
            where[("arbor", "wins" if r["beyond"] == "better" else "loses")].append(f"{r['budget']} on {r['task']}")
    for r in _floor_rows(data, "vs_random"):
        if r["policy"] != "arbor" and r["beyond"] != "no":
            where[(r["policy"], "vs random " + r["beyond"])].append(f"{r['budget']} on {r['task']}")
    words = {
        "wins": ("wins", "keeps more of full's top-1 choices than the best tree-blind policy at"),
        "loses": ("loses", "keeps fewer of full's top-1 choices than the best tree-blind policy at"),
        "vs random better": ("wins", "beats random eviction at"),
        "vs random worse": ("loses", "below random eviction at"),
    }
    section = "(Below the floor, replayed)"
    return [(m, words[k][0], f"{words[k][1]} {', '.join(at)} {section}") for (m, k), at in where.items()]


def overhead(data: dict[str, dict]) -> str | None:
    """What arbor costs: its time over full's per search and setting (median over repeats)."""
    d = data.get("overhead")
    if not d:
        return None
    texts = []
    rows = d["tables"]["main"]["rows"]
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task and r["setting"] != "full"]
        parts = [f"{r['setting'].removeprefix('arbor ')} {cell(r['x_full'], '{:.2f}')}x" for r in mine]
        texts.append(f"{task}: " + ", ".join(parts))
    return "**What arbor costs (time over full's, median of repeats).** " + "; ".join(texts) + "."


VERDICTS = (
    budget_verdicts, accuracy_verdicts, kvp_verdicts, linear_verdicts, sparse_verdicts, rehydrate_verdicts,
    concurrency_verdicts, longctx_verdicts, e2e_verdicts, floor_verdicts,
)  # fmt: skip


def by_method(data: dict[str, dict]) -> str:
    """One bullet per method: where it wins, matches and loses, from every verdict rule."""
    per: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for rule in VERDICTS:
        for method, kind, text in rule(data):
            per[method][kind].append(text)
    lines = []
    for method, kinds in per.items():
        parts = [f"{kind}: " + "; ".join(kinds[kind]) for kind in ("wins", "matches", "loses") if kinds.get(kind)]
        lines.append(f"- **{method}** " + ". ".join(parts) + ".")
    return "\n".join(lines)


RULES: tuple[Rule, ...] = (
    accuracy, budgets, e2e, floor, overhead, scaling, packing, kvp, linear, sparse, longctx, concurrency, speed, stale,
)  # fmt: skip


def summary(data: dict[str, dict]) -> str:
    """The ``## Summary`` section: one bullet per rule that has data."""
    bullets = [text for rule in RULES if (text := rule(data))]
    return (
        "## Summary\n\nGenerated from docs/data by rules (`benchmarks/results/summary.py`); each claim names the "
        "section it comes from.\n\n### Where each method wins and loses\n\n"
        + by_method(data)
        + "\n\n### By benchmark\n\n"
        + "\n".join(f"- {b}" for b in bullets)
        + "\n"
    )
