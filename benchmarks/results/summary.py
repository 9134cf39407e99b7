"""The page's summary: where each method wins and loses, decided by rules over the section data.

Each rule reads one section's table and returns a sentence (or None when its data is absent), so
the summary changes when the data does and never quotes a figure the tables do not hold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from .stats import format_rate, overlap
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
    """Where sparse decoding is faster or slower than dense, and its fidelity range."""
    if "sparse" not in data:
        return None
    rows = [r for r in data["sparse"]["tables"]["main"]["rows"] if r["method"] != "dense"]
    wins = sorted({(r["model"], r["context"]) for r in rows if r["x_dense"] > 1})
    loses = sorted({(r["model"], r["context"]) for r in rows if r["x_dense"] <= 1})
    top1 = [r[k] for r in rows for k in ("top_1_gsm8k", "top_1_math") if r.get(k) is not None]

    def ctx(pairs: list) -> str:
        return ", ".join(f"{c:,} ({m})" for m, c in pairs) or "none"

    return (
        f"**Sparse decode (lychee, quest) vs dense.** Faster end to end at {ctx(wins)}; slower at {ctx(loses)}; "
        f"top-1 agreement with dense {min(top1):.2f}-{max(top1):.2f}."
    )


def concurrency(data: dict[str, dict]) -> str | None:
    """Problems/hour at the best concurrency against concurrency 1, per policy; naive ToT beside it."""
    if "concurrency" not in data:
        return None
    rows = data["concurrency"]["tables"]["main"]["rows"]
    parts = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        one = next((r for r in mine if r["concurrency"] == 1), None)
        top = max(mine, key=lambda r: r["problems_hour"])
        if one and len(mine) > 1 and top is one:
            parts.append(f"`{policy}` fastest at concurrency 1 ({one['problems_hour']:.0f} problems/hour)")
        elif one and len(mine) > 1:
            parts.append(
                f"`{policy}` {top['problems_hour'] / one['problems_hour']:.2f}x its concurrency-1 rate "
                f"at concurrency {top['concurrency']}"
            )
        elif one:
            parts.append(f"`{policy}` {one['problems_hour']:.0f} problems/hour")
    return "**Concurrency (problems/hour).** " + "; ".join(parts) + "."


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


RULES: tuple[Rule, ...] = (accuracy, budgets, kvp, linear, sparse, concurrency, speed, stale)


def summary(data: dict[str, dict]) -> str:
    """The ``## Summary`` section: one bullet per rule that has data."""
    bullets = [text for rule in RULES if (text := rule(data))]
    return (
        "## Summary\n\nGenerated from docs/data by rules (`benchmarks/results/summary.py`).\n\n"
        + "\n".join(f"- {b}" for b in bullets)
        + "\n"
    )
