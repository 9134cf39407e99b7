"""The results page's sections, in page order: each one a data file, a template and an optional hook.

To add a section: have the benchmark call :func:`benchmarks.results.data.write_section_data` with
the section's name, write ``docs/notes/<name>.md`` (prose with ``{{table main}}`` and inline
placeholders, :mod:`benchmarks.results.template`), and add a :class:`Section` to :data:`SECTIONS`.
A section that needs derived columns gives ``prepare``; one whose benchmark renders itself gives
``render`` (a ``"module:function"`` taking the data dict and returning markdown); one the summary's
table should cover gives ``claims`` (:class:`~.summary.Claim`: which column, which way is better,
against what).
"""

from __future__ import annotations

import copy
import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.longctx.report import DENSE_READ

from .data import REPO, load_section
from .stats import format_rate
from .summary import Claim
from .template import render as render_template

NOTES = REPO / "docs" / "notes"


@dataclass(frozen=True, slots=True)
class Section:
    """One ``## `` section: ``docs/data/<name>/results.json`` rendered through ``docs/notes/<name>.md``."""

    name: str
    prepare: Callable[[dict], dict] | None = None
    render: str | None = None  # "module:function" of a benchmark that renders its own section
    optional: bool = False  # skipped while its data file does not exist yet
    file: str = "results.json"  # the data file under docs/data/<name>/
    title: str | None = None  # for a section whose data file has no title of its own
    claims: tuple[Claim, ...] = ()  # what the page's summary says of it (:mod:`.summary`)
    image: str | None = None  # a PNG next to the page (benchmarks/results/plots.py) shown after a rendered body


def with_intervals(data: dict) -> dict:
    """The accuracy table with ``solved`` shown as k/n, rate and 95% Wilson interval."""
    data = copy.deepcopy(data)
    table = data["tables"]["main"]
    for row in table["rows"]:
        row["solved_ci"] = format_rate(row["solved"], row["problems"])
    cols = [c for c in table["columns"] if c["key"] not in ("solved", "problems")]
    at = next(i for i, c in enumerate(table["columns"]) if c["key"] == "solved")
    cols.insert(at, {"key": "solved_ci", "header": "solved (rate, 95% Wilson)", "fmt": "text", "numeric": True})
    table["columns"] = cols
    return data


def _budget(policy: str) -> int | None:
    """``policy.budget_tokens=N`` of a concurrency row's override string, or None (no budget)."""
    m = re.search(r"policy\.budget_tokens=(\d+)", policy)
    return int(m.group(1)) if m else None


def with_concurrency_ratios(data: dict) -> dict:
    """The concurrency table with each setting's budget as a fraction of the summed concurrency-1 peaks
    of ``full`` on the same problems, prefix sharing on/off, and problems/hour over the same setting's
    concurrency-1 rate (rows from before these columns get a dash)."""
    data = copy.deepcopy(data)
    table = data["tables"]["main"]
    rows = table["rows"]
    peaks = {r["search"]: r.get("peak_sum") for r in rows if r["policy"] == "policy=full" and r["concurrency"] == 1}
    rate_1 = {(r["search"], r["policy"]): r["problems_hour"] for r in rows if r["concurrency"] == 1}
    for r in rows:
        budget, peak = _budget(r["policy"]), peaks.get(r["search"])
        r["budget_x"] = f"{budget / peak:.2f}x" if budget and peak else ("none" if budget is None else "-")
        r["sharing"] = "-" if r["policy"] == "naive ToT" else ("off" if "share_prefixes=false" in r["policy"] else "on")
        one = rate_1.get((r["search"], r["policy"]))
        r["x_c1"] = round(r["problems_hour"] / one, 2) if one and r["policy"] != "naive ToT" else "-"
    cols = table["columns"]
    at = next(i for i, c in enumerate(cols) if c["key"] == "policy") + 1
    cols[at:at] = [
        {"key": "budget_x", "header": "budget (x summed full peaks)", "fmt": "text", "numeric": True},
        {"key": "sharing", "header": "prefix sharing", "fmt": "text", "numeric": False},
    ]
    at = next(i for i, c in enumerate(cols) if c["key"] == "problems_hour") + 1
    cols.insert(at, {"key": "x_c1", "header": "x concurrency 1", "fmt": "auto", "numeric": True})
    data["tables"]["by_setting"] = _by_setting(rows)
    slowest = [r["slowest"] for r in data["tables"]["by_setting"]["rows"] if isinstance(r["slowest"], (int, float))]
    facts = data.setdefault("facts", {})
    facts["slowest_x"] = min(slowest) if slowest else "-"
    below = [
        r for r in data["tables"]["by_setting"]["rows"] if isinstance(r["slowest"], (int, float)) and r["slowest"] < 1
    ]
    facts["below_one"] = "; ".join(f"`{r['policy']}` on {r['search']} ({r['slowest']}x)" for r in below) or "none"
    facts["c1_spread_x"], facts["c1_spread"] = _c1_spread(rows)
    for search, peak in peaks.items():  # e.g. facts.summed_peaks_game24_900_915
        facts["summed_peaks_" + re.sub(r"\W", "_", search)] = peak
    return data


def _c1_spread(rows: list[dict]) -> tuple[float | str, str]:
    """How far one run moves: the largest ratio between the concurrency-1 seconds of one policy with
    prefix sharing on and off where neither attached a prompt token (one search alone: the same work),
    and that pair in words; ``("-", "-")`` without such a pair."""
    c1 = {(r["search"], r["policy"]): r for r in rows if r["concurrency"] == 1}
    pairs = []
    for (search, policy), on in c1.items():
        off = c1.get((search, f"{policy} share_prefixes=false"))
        if off is None or on.get("prefill_saved") or off.get("prefill_saved"):
            continue
        slow, fast = max(on["seconds"], off["seconds"]), min(on["seconds"], off["seconds"])
        pairs.append((slow / fast, search, policy, on["seconds"], off["seconds"]))
    if not pairs:
        return "-", "-"
    x, search, policy, on_s, off_s = max(pairs)
    return round(x, 2), f"{x:.2f}x (`{policy}` on {search}: {on_s} s with sharing, {off_s} s without)"


def _by_setting(rows: list[dict]) -> dict:
    """One row per (search, policy): problems/hour at concurrency 1 and each level's ratio to it, the
    slowest ratio over the levels above 1, and whether every level gave concurrency 1's results; ``method``
    names the policy alone (``policy=arbor policy.budget_tokens=445`` -> ``arbor``) for the summary."""
    levels = sorted({r["concurrency"] for r in rows})
    out = []
    for search, policy in dict.fromkeys((r["search"], r["policy"]) for r in rows):
        mine = {r["concurrency"]: r for r in rows if (r["search"], r["policy"]) == (search, policy)}
        first = mine[min(mine)]
        row = {"search": search, "policy": policy, "budget_x": first["budget_x"], "sharing": first["sharing"]}
        row["method"] = m.group(1) if (m := re.search(r"policy=(\S+)", policy)) else policy
        row["rate_1"] = mine[1]["problems_hour"] if 1 in mine else "-"
        for level in levels[1:]:
            row[f"x{level}"] = mine[level]["x_c1"] if level in mine else "-"
        above = [mine[n]["x_c1"] for n in mine if n > 1 and isinstance(mine[n]["x_c1"], (int, float))]
        row["slowest"] = min(above) if above else "-"
        same = [mine[n].get("same_results_as_1") for n in mine if n > 1]
        row["same"] = "-" if not same else ("yes" if all(v == "yes" for v in same) else "no")
        out.append(row)
    cols = [("search", "search", "text"), ("policy", "policy", "text")]
    cols += [("budget_x", "budget (x summed full peaks)", "text"), ("sharing", "prefix sharing", "text")]
    cols += [("rate_1", "problems/hour at 1", "auto")] + [(f"x{n}", f"x at {n}", "auto") for n in levels[1:]]
    cols += [("slowest", "slowest x (N > 1)", "auto"), ("same", "same results at every N", "text")]
    words = ("search", "policy", "sharing", "same")
    columns = [{"key": k, "header": h, "fmt": f, "numeric": k not in words} for k, h, f in cols]
    return {"columns": columns, "rows": out}


# What the summary's table says of each section (:class:`~.summary.Claim`), in page order.
ACCURACY = Claim(
    "solves more puzzles than full", "solves fewer puzzles than full", "solved", place="{mode}", at="{budget}",
    reference=(("policy", "full"),), n="problems", oom="oom",
    skip=(("verifier", "game24_oracle: oracle (upper bound)"),),  # an upper bound, not a policy
)  # fmt: skip
CONCURRENCY = Claim(  # with prefix sharing (the default); within how far one run moves (c1_spread_x) of 1: a tie
    "gains problems/hour at every concurrency above 1", "loses problems/hour at a concurrency above 1", "slowest",
    table="by_setting", method="method", place="{search}", at="{budget_x}", baseline=1.0, spread="c1_spread_x",
    only=(("sharing", "on"),),
)  # fmt: skip
LONGCTX = Claim(  # a row that read the whole context (dense's own answers) is never judged, whatever its
    # share label says (a default row has none: it is not at a share the others were measured at). Ranked by
    # accuracy retained (dense's correct answers kept: where dense is wrong too, a flat distribution flips at
    # random), with the agreement on every item and the speed of the same setting beside it (issue 49)
    "keeps most of dense's correct answers", "keeps fewest of dense's correct answers", "retained", table="summary",
    place="{length:,} tokens", at="{share:.0%}", interval="retained_ci", only=(("task", "all"),),
    skip=(("share", None),), below=(("context_read", DENSE_READ),),
    also=("agreement with dense {agree:.2f}, {x_dense:.2f}x dense's tok/s", "agreement with dense {agree:.2f}"),
)  # fmt: skip
SPARSE = Claim(  # the speed of a fixed read, with the fidelity measured at that same read (issue 49)
    "decodes faster than dense", "decodes slower than dense", "decode_tok_s", method="method", place="{model} model",
    at="{context:,}", reference=(("method", "dense"),),
    also=("reads {read:.3g}%; top-1 agreement with dense: GSM8K {top_1_gsm8k:.2f}, MATH-500 {top_1_math:.2f}",
          "reads {read:.3g}%; no fidelity measured"),
)  # fmt: skip
KVP = Claim(
    "lowest KL to full", "highest KL to full", "mean_kl", table="table2", at="{kept:g}% kept", higher=False,
    samples="mean_kl_per_context",
)  # fmt: skip
E2E = Claim(
    "keeps full's answer most often", "keeps full's answer least often", "agree_n", place="{search}",
    at="{ratio:g}x", n="problems", oom="oom_n", skip=(("ratio", None),),
)  # fmt: skip
FLOOR = (  # top-1 agreement with full, against a paired 95% interval over trees
    Claim(
        "beats every tree-blind policy", "trails the best tree-blind policy", "beyond", table="vs_best",
        place="{task}", at="{budget}", verdict=True,
    ),
    Claim(  # arbor's claim is the one against the best tree-blind policy
        "beats random eviction", "below random eviction", "beyond", table="vs_random", place="{task}",
        at="{budget}", verdict=True, skip=(("policy", "arbor"),),
    ),
)  # fmt: skip
CONFIGL = Claim(  # each search shape against full's reference search, problem by problem
    "solves more than full's reference search in its memory", "solves fewer than full's reference search",
    "solved_n", place="{search}", at="{setting}", reference=(("ratio", None),), n="problems",
    paired=("gained_n", "lost_n"), oom="oom_n",
)  # fmt: skip
SPEED = Claim("fastest", "slowest", "median_s", method="method", place="{trace}", higher=False)

SECTIONS: tuple[Section, ...] = (
    Section("budgets"),
    Section("accuracy", prepare=with_intervals, claims=(ACCURACY,)),
    Section("wide"),
    Section("concurrency", prepare=with_concurrency_ratios, claims=(CONCURRENCY,)),
    Section("packing", optional=True),
    Section(
        "longctx",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="suite_summary.json",
        title="Long context: RULER-style suite on SmolLM2 at 2K, 4K and 8K",
        claims=(LONGCTX,),
    ),
    Section(  # issue 49's oracle bound next to the indexes, on a few items of the same suite (no summary claim)
        "longctx-oracle",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="suite_summary.json",
        title="Long context: lychee and quest against the exact top-k oracle at the same read (pilot)",
        image="longctx-oracle-curves.png",
    ),
    Section(  # issue 49: the chunkings, chunk scores and read shares the defaults were chosen from (18 items)
        "longctx-pilot49",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="suite_summary.json",
        title="Long context: chunk size, chunk score and read share at 8K (the pilot that chose the sparse defaults)",
    ),
    Section(  # issue 49: the sparse defaults on the suite's 180 items at 8K, with the oracle at the same read
        "longctx-default",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="suite_summary.json",
        title="Long context: the sparse defaults at 8K, against dense and the exact top-k oracle at the same read",
    ),
    Section(  # issue 49: lychee's candidates reranked by exact key scores (rerank), 18 items
        "longctx-rerank-pilot",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="suite_summary.json",
        title="Long context: exact rerank of lychee's candidates (pilot)",
    ),
    Section(  # issue 49: the rerank on the suite's 180 items at 8K, beside the defaults in the same run
        "longctx-rerank",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="suite_summary.json",
        title="Long context: exact rerank of lychee's candidates at 8K, beside the defaults in the same run",
    ),
    Section(  # issue 49: SmolLM2's layer 7 read whole (dense_layers=[7]) on the suite's 180 items at 8K
        "longctx-layer7",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="suite_summary.json",
        title="Long context: lychee with SmolLM2's layer 7 read whole at 8K",
    ),
    Section(  # issue 49: the CPU kernels (native.py) and SmolLM2's measured layer on the suite's 180 items at 8K
        "longctx-native",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="suite_summary.json",
        title=(
            "Long context: lychee with the sparse step's CPU kernels at 8K: every layer sparse (lychee@default, "
            "the default when measured) and layer 7 whole (what lychee's default dense_layers=auto reads on "
            "SmolLM2 since ed0cbc1)"
        ),
    ),
    Section(  # issue 49: lychee as it ships (layer 7 whole on SmolLM2, the kernels) on 180 items of seed 1
        "longctx-seed1",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="suite_summary.json",
        title=(
            "Long context: lychee's shipped defaults at 8K on 180 items of another seed (held out from every "
            "choice), beside every layer sparse"
        ),
    ),
    Section("sparse", claims=(SPARSE,)),
    Section("rehydrate"),
    Section("linear"),
    Section("kvp", claims=(KVP,)),
    Section("kvp-loss"),  # issue 66: which KVP weights ship, two losses paired on 14 held-out contexts
    Section("e2e-game24", claims=(E2E,)),
    Section("e2e-gsm8k", claims=(E2E,)),
    Section("replay"),
    Section("floor", optional=True, claims=FLOOR),
    Section("msve-calibration"),  # issue 65: MSVE's fit judged on held-out trees, every signal alone
    Section("ablation", optional=True),  # issue 65: arbor's parts, each switched off, against its default
    Section("ablation-live"),  # issue 65: the same parts switched off in arbor-solve's own searches at 0.25x
    Section("overhead", optional=True),
    Section("memory-steps"),
    Section("e2e-configl-game24", optional=True),  # its summary line is e2e-scaling-game24's, at n = 100
    Section("e2e-configl-gsm8k", claims=(CONFIGL,)),
    Section("e2e-scaling-game24", claims=(CONFIGL,)),
    Section("e2e-lookahead-game24"),  # issue 50's third widening, at its own reference (one runtime code)
    Section("e2e-widen-gsm8k", claims=(CONFIGL,)),
    Section("speed", claims=(SPEED,)),
    Section("weights", optional=True),  # issue 64: model.weights, what each format costs and keeps
    Section("peer", optional=True),  # issue 64: llama.cpp on the same GGUF (needs the peer extra to rerun)
    Section("peer-tot", optional=True),  # issue 64: the CLI's ToT search, llama.cpp serving it two ways
    Section("step-overhead", optional=True),  # issue 64: the runtime's own time a step, by tree size and rows
    Section("per-head", optional=True),  # issue 66: each layer and KV head keeps its own tokens, both granularities
    Section("per-head-replay", optional=True),  # issue 66: the replay below the floor at both granularities
    Section("controllers"),
    Section("make-results-full", optional=True),
    Section("make-results-quick", optional=True),
)


def provenance(data: dict) -> str:
    """Where the section's numbers come from: date, commit (or that it was not recorded), machine, command."""
    measured = data.get("measured") or data.get("date", "(date not recorded)")
    if data.get("row_codes"):  # a benchmark's rows searched by several codes (or some not recorded)
        shown = ", ".join(f"{_code(c)} ({n} rows)" for c, n in data["row_codes"].items())
        when = f"Measured {measured} by rows of several codes: {shown}"
    elif len(data.get("commits") or []) > 1:  # rows joined from runs made at several commits
        shown = ", ".join(_code(c) for c in data["commits"])
        when = f"Measured {measured} by runs at commits {shown}"
    elif data.get("commit"):
        when = f"Measured {measured} at commit {_code(data['commit'])}"
    elif data.get("committed_in"):
        when = f"Measured {measured} (commit not recorded; rows committed in `{data['committed_in'][:7]}`)"
    else:
        when = f"Measured {measured} (commit not recorded)"
    machine = data.get("machine", "(machine not recorded)")
    if isinstance(machine, dict):
        machine = ", ".join(f"{k} {v}" for k, v in machine.items())
    lines = [
        f"{when} on {machine}. Data: `docs/data/{data['section']}/`. Command:",
        "",
        "```bash",
        data.get("command", "(command not recorded)"),
        "```",
    ]
    if data.get("carried"):
        c = data["carried"]
        kept = ", ".join(
            [f"table `{t}`" for t in c["tables"]]
            + [f"column `{col}`" for col in c.get("columns", [])]
            + kept_facts(c["facts"], data.get("facts", {}))
        )
        if kept:  # only settings were carried over: nothing measured is older than the header says
            lines += ["", f"Kept from the measurement of {c['measured']} (`{c['commit']}`), not rerun: {kept}."]
    if data.get("stale"):
        lines += ["", f"**Not current:** {data['stale']}; `make results` reruns it."]
    if data.get("images") and data.get("source", "").startswith("migrated"):
        lines += ["", "Plots: the committed PNGs; their input traces are not in docs/data, so the page keeps them."]
    return "\n".join(lines)


def kept_facts(kept: list[str], facts: dict) -> list[str]:
    """How the provenance line names the kept figures: all of them, or those (by key) when others were rerun."""
    if not kept:
        return []
    if set(kept) >= set(facts):
        return ["the figures its prose quotes"]
    return ["the figures " + ", ".join(f"`{k}`" for k in kept)]


def _code(code: str) -> str:
    """A commit as the page shows it: its first 12 hex digits, and whether the tree had uncommitted
    changes (``+dirty``); anything else (``not recorded``, a package version) as it is."""
    sha, dirty = code.removesuffix("+dirty"), code.endswith("+dirty")
    if not all(ch in "0123456789abcdef" for ch in sha) or len(sha) < 7:
        return code
    return f"`{sha[:12]}`" + (" (with uncommitted changes)" if dirty else "")


def commits_of(data: dict) -> list[str]:
    """Every commit a section's numbers were measured at: its runs' or its rows' when they name
    several, else its own (none when not recorded)."""
    several = data.get("commits") or [c for c in data.get("row_codes") or {} if _code(c) != c]
    return several or ([data["commit"]] if data.get("commit") else [])


def with_runs(data: dict) -> dict:
    """A summary rebuilt from the rows of earlier runs (``runs``: each one's command, commit and date)
    is shown as measured by those runs: their commands (a command rerun to resume it once, with how many
    times it ran), then the summary's own; their commit when they share one, else every commit they ran
    at (``commits``, oldest first; ``commit`` the latest), and the span of their dates."""
    runs = data.get("runs") or []
    if not runs or "--summary-only" not in data.get("command", ""):
        return data
    runs = sorted(runs, key=lambda r: str(r.get("date", "")))
    commits = list(dict.fromkeys(r.get("commit") for r in runs if r.get("commit")))
    dates = [str(r.get("date", ""))[:10] for r in runs]
    times = {}
    for r in runs:  # first-seen order of the commands as given (the parallel runs' order), counted
        times[r["command"]] = times.get(r["command"], 0) + 1
    commands = [c if n == 1 else f"{c}  # run {n} times, each resuming the rows file" for c, n in times.items()]
    commands += ["# the runs' rows joined into one rows file, then", data["command"]]
    measured = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    out = data | {
        "command": "\n".join(commands),
        "commit": commits[-1] if commits else data.get("commit"),
        "dirty": any(r.get("dirty") for r in runs),
        "measured": measured,
        "date": measured,
    }
    if len(commits) > 1:
        out["commits"] = commits
    return out


def load(section: Section, root: Path | None = None) -> dict | None:
    """The section's data (prepared), or None for an optional section without data."""
    path = (root or REPO / "docs" / "data") / section.name / section.file
    if section.optional and not path.is_file():
        return None
    if section.file == "results.json":
        data = load_section(section.name, root)
    else:  # a benchmark's own format (its own provenance keys), rendered by its own function
        data = {"section": section.name, "title": section.title or section.name} | json.loads(path.read_text())
        data.setdefault("measured", str(data.get("date", "(date not recorded)"))[:10])
        data = with_runs(data)
    return section.prepare(data) if section.prepare else data


def render_section(section: Section, data: dict, notes: Path = NOTES) -> str:
    """``## title``, the provenance, then the body (the benchmark's own renderer or the template)."""
    if section.render:
        module, func = section.render.split(":")
        body = getattr(importlib.import_module(module), func)(data)
        if section.image:
            body = f"{body.rstrip()}\n\n![{data['title']}]({section.image})\n"
    else:
        body = render_template((notes / f"{section.name}.md").read_text(), data)
    return f"## {data['title']}\n\n{provenance(data)}\n\n{body.strip()}\n"
