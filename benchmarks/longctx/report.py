"""Markdown tables of a long-context summary (``ruler_summary.json``, written by ``scripts/bench_longctx.py``).

Pure functions of the loaded JSON: nothing here reads files, runs a model or looks at the clock,
so a results page can call :func:`render` on committed data and get the same text every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: the per-task tables' metrics: summary field -> what the table calls it
METRICS = {
    "accuracy": "accuracy (all golds in the answer)",
    "agree": "answer agreement with dense",
    "prefix_agree": "answer prefix agreement with dense (the shorter answer begins the longer)",
    "first_agree": "first-token agreement with dense",
    "kl_first": "mean KL(dense || method) of the first answer token",
}


def _ci(entry: dict[str, Any], name: str) -> str:
    lo, hi = entry[f"{name}_ci"]
    return f"{entry[name]:.2f} [{lo:.2f}, {hi:.2f}]"


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def _ordered(values) -> list:
    return list(dict.fromkeys(values))


def overview(data: dict[str, Any]) -> str:
    """Per length and method, over every task (task "all"; the task itself when there is one): n,
    accuracy and agreement with dense with their 95% Wilson intervals, prefix agreement,
    first-token agreement, mean KL of the first answer token, median decode tokens/s, and the share
    of the context the decode read (summaries from before it was recorded leave it empty)."""
    summary = data["summary"]
    tasks = _ordered(s["task"] for s in summary)
    task = "all" if "all" in tasks else tasks[0]
    lines = [
        "| length | method | n | accuracy [95% CI] | agree with dense [95% CI] | prefix agree | 1st-token agree "
        "| KL 1st | tok/s | read |",
        "|---:|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        if s["task"] != task:
            continue
        lines.append(
            f"| {s['length']:,} | {s['method']} | {s['items']} | {_ci(s, 'accuracy')} | {_ci(s, 'agree')} | "
            f"{_num(s.get('prefix_agree'), '{:.2f}')} | {s['first_agree']:.2f} | {s['kl_first']:.3f} | "
            f"{_num(s['decode_tok_s'], '{:.1f}')} | {_num(s.get('read_fraction'), '{:.2f}')} |"
        )
    return "\n".join(lines)


def per_task(data: dict[str, Any], metric: str = "accuracy", methods: Sequence[str] | None = None) -> str:
    """One row per task and length, one column per method: ``metric`` (a key of :data:`METRICS`);
    n is the dense row's item count (a cell whose n differs shows it: "0.40 (n=5)")."""
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}; valid: {', '.join(METRICS)}")
    summary = data["summary"]
    cols = list(methods) if methods is not None else _ordered(s["method"] for s in summary)
    cells = {(s["task"], s["length"], s["method"]): s for s in summary}
    fmt = "{:.3f}" if metric == "kl_first" else "{:.2f}"
    lines = ["| task | length | n | " + " | ".join(cols) + " |", "|---|---:|---:|" + "---:|" * len(cols)]
    for task, length in _ordered((s["task"], s["length"]) for s in summary):
        row = [cells.get((task, length, m)) for m in cols]
        n = next((c["items"] for c in row if c is not None), 0)
        out = []
        for c in row:
            if c is None:
                out.append("")
            else:
                out.append(fmt.format(c[metric]) + ("" if c["items"] == n else f" (n={c['items']})"))
        lines.append(f"| {task} | {length:,} | {n} | " + " | ".join(out) + " |")
    return "\n".join(lines)


#: the answer agreement with dense a read rule has to keep (issue 24: sparse defaults that keep the answer)
KEEPS = 0.95
SPARSE = ("lychee", "quest", "oracle_topk")


def _overall(summary: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    """(length, method) -> the entry over all tasks ("all"; the task itself when there is one)."""
    tasks = _ordered(s["task"] for s in summary)
    task = "all" if "all" in tasks else tasks[0]
    return {(s["length"], s["method"]): s for s in summary if s["task"] == task}


def defaults(data: dict[str, Any]) -> str:
    """Per length and sparse policy: its default read rule's answer agreement with dense (n, 95%
    interval), the share it read and its decode tokens/s next to dense's; then the smallest measured
    read share that kept :data:`KEEPS` of dense's answers (or that none did). Empty without default rows."""
    cells = _overall(data["summary"])
    lines = []
    for length in sorted({n for n, _ in cells}):
        dense = cells.get((length, "dense"))
        for policy in SPARSE:
            d = cells.get((length, f"{policy}@default"))
            if d is None or dense is None:
                continue
            shares = sorted(
                (s["share"], s) for (n, m), s in cells.items() if n == length and s["policy"] == policy and s["share"]
            )
            kept = [f"{share:.0%}" for share, s in shares if s["agree"] >= KEEPS]
            measured = ", ".join(f"{x:.0%}" for x, _ in shares)
            verdict = f"reads that kept >= {KEEPS:.0%}: {', '.join(kept)}" if kept else (
                f"no measured read share ({measured}) kept >= {KEEPS:.0%}"
            )  # fmt: skip
            speed, dense_speed = _num(d["decode_tok_s"], "{:.1f}") or "?", _num(dense["decode_tok_s"], "{:.1f}") or "?"
            lines.append(
                f"- {length:,} tokens, **{policy}** at its defaults: agreement with dense {_ci(d, 'agree')} "
                f"(n = {d['items']}), read {_num(d.get('read_fraction'), '{:.0%}') or '?'} of the context, "
                f"{speed} tok/s (dense {dense_speed}); {verdict}."
            )
    return "\n".join(lines)


def _one(value: Any) -> str:
    """A setting as text: a list (a summary rebuilt from rows lists what they hold) joined by commas."""
    return ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)


def measured_at(data: dict[str, Any]) -> str:
    """The commit the rows were measured at, or every commit when they come from runs at several."""
    several = data.get("commits") or []
    if len(several) > 1:
        return "commits " + ", ".join(str(c)[:10] for c in several)
    return f"commit {str(data.get('commit', '?'))[:10]}"


def render(data: dict[str, Any]) -> str:
    """The whole report: provenance, the overview, and the per-task accuracy and agreement tables."""
    settings = data.get("settings", {})
    machine = data.get("machine", {})
    prefix = settings.get("prefix", False)
    prompt = "; questions end in RULER's answer prefix" if prefix is True or prefix == [True] else ""
    head = (
        f"Model {_one(settings.get('model', '?'))}, greedy {_one(settings.get('max_new', '?'))} answer tokens{prompt}, "
        f"{measured_at(data)}{' (dirty)' if data.get('dirty') else ''}, "
        f"{data.get('date', '?')}, "
        f"{machine.get('cpu', '?')}, {machine.get('torch_threads', '?')} thread(s); "
        f"{data.get('rows', '?')} rows{' (run not complete)' if data.get('complete') is False else ''}."
    )
    parts = [head]
    chosen = defaults(data)
    if chosen:
        parts += ["", "The sparse policies' defaults (each policy's own read rule) against dense, over all tasks:"]
        parts += ["", chosen]
    parts += ["", "Over all tasks:", "", overview(data)]
    for metric in ("accuracy", "agree"):
        parts += ["", f"Per task, {METRICS[metric]}:", "", per_task(data, metric)]
    return "\n".join(parts) + "\n"
