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
    accuracy, accuracy retained (correct on the items dense answers correctly) and agreement with
    dense with their 95% Wilson intervals, prefix agreement, first-token agreement, mean KL of the
    first answer token, median decode tokens/s and its median ratio to dense's on the same items, and
    the share of the context the decode read, and an index's recall of the exact top-k oracle's keys
    at the question's step (summaries from before a figure was recorded leave it empty)."""
    summary = data["summary"]
    tasks = _ordered(s["task"] for s in summary)
    task = "all" if "all" in tasks else tasks[0]
    lines = [
        "| length | method | n | accuracy [95% CI] | accuracy retained [95% CI] | agree with dense [95% CI] "
        "| prefix agree | 1st-token agree | KL 1st | tok/s | x dense tok/s | read | recall of oracle |",
        "|---:|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        if s["task"] != task:
            continue
        lines.append(
            f"| {s['length']:,} | {s['method']} | {s['items']} | {_ci(s, 'accuracy')} | {_retained(s)} | "
            f"{_ci(s, 'agree')} | {_num(s.get('prefix_agree'), '{:.2f}')} | {s['first_agree']:.2f} | "
            f"{s['kl_first']:.3f} | {_num(s['decode_tok_s'], '{:.1f}')} | {_num(s.get('x_dense'), '{:.2f}')} | "
            f"{_num(s.get('read_fraction'), '{:.2f}')} | {_num(s.get('recall_oracle'), '{:.2f}')} |"
        )
    return "\n".join(lines)


def _retained(entry: dict[str, Any]) -> str:
    """Accuracy retained with its interval and how many items dense answered correctly, or empty."""
    if entry.get("retained") is None:
        return ""
    return f"{_ci(entry, 'retained')} (of {entry['dense_correct']})"


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
SPARSE = ("lychee", "quest", "oracle_topk", "oracle_chunks")
#: a row that read at least this share of the context is dense: its agreement with dense is dense
#: against itself, never a fidelity result (issue 49), whatever its share label says
DENSE_READ = 0.99


def _overall(summary: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    """(length, method) -> the entry over all tasks ("all"; the task itself when there is one)."""
    tasks = _ordered(s["task"] for s in summary)
    task = "all" if "all" in tasks else tasks[0]
    return {(s["length"], s["method"]): s for s in summary if s["task"] == task}


def read_everything(entry: dict[str, Any]) -> bool:
    """Whether a row read (nearly) the whole context: :data:`DENSE_READ` of it or more."""
    read = entry.get("read_fraction")
    return read is not None and read >= DENSE_READ


def _both(entry: dict[str, Any]) -> str:
    """One setting's fidelity and speed together: accuracy retained, agreement with dense, speed vs dense."""
    parts = []
    if entry.get("retained") is not None:
        parts.append(f"accuracy retained {_ci(entry, 'retained')} of dense's {entry['dense_correct']} correct")
    parts.append(f"agreement with dense {_ci(entry, 'agree')}")
    if entry.get("x_dense") is not None:
        parts.append(f"{entry['x_dense']:.2f}x dense's tok/s")
    return ", ".join(parts)


def defaults(data: dict[str, Any]) -> str:
    """Per length and sparse policy: what its default read rule read and, when that was the whole
    context (:func:`read_everything`), that it was dense there: its agreement with dense is no fidelity
    result and is not quoted; otherwise its accuracy retained, agreement with dense (95% intervals)
    and speed next to dense's. Then each measured read share with both numbers of that one setting,
    and which shares kept :data:`KEEPS` of dense's answers and of its correct answers (or that none
    did). Empty without default rows."""
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
            speed, dense_speed = _num(d["decode_tok_s"], "{:.1f}") or "?", _num(dense["decode_tok_s"], "{:.1f}") or "?"
            read = _num(d.get("read_fraction"), "{:.0%}") or "?"
            if read_everything(d):
                head = (
                    f"- {length:,} tokens, **{policy}**: its default read rule read {read} of the context, so here "
                    f"it is dense (its answers are dense's: no fidelity result); {speed} tok/s (dense {dense_speed})."
                )
            else:
                head = (
                    f"- {length:,} tokens, **{policy}** at its defaults read {read} of the context: {_both(d)} "
                    f"(n = {d['items']}); {speed} tok/s (dense {dense_speed})."
                )
            measured = "; ".join(f"{x:.0%}: {_both(s)}" for x, s in shares)
            tail = f" Measured read shares: {measured}." if shares else ""
            lines.append(head + tail + " " + _kept(shares))
    return "\n".join(lines)


def _kept(shares: list[tuple[float, dict[str, Any]]]) -> str:
    """Which measured read shares kept :data:`KEEPS` of dense's answers, and of its correct answers."""
    if not shares:
        return "No read share measured."
    agree = [f"{x:.0%}" for x, s in shares if s["agree"] >= KEEPS]
    text = f"Agreement >= {KEEPS:.0%}: {', '.join(agree) or 'none'}"
    if all(s.get("retained") is not None for _, s in shares):
        retained = [f"{x:.0%}" for x, s in shares if s["retained"] >= KEEPS]
        text += f"; accuracy retained >= {KEEPS:.0%}: {', '.join(retained) or 'none'}"
    return text + "."


INTRO = (
    "The sparse policies' defaults (each policy's own read rule) and measured read shares against dense, over "
    "all tasks; accuracy retained is the share of the items dense answers correctly that the policy answers "
    "correctly too, agreement counts every item (those dense gets wrong too):"
)


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
        parts += ["", INTRO, "", chosen]
    parts += ["", "Over all tasks:", "", overview(data)]
    for metric in ("accuracy", "agree"):
        parts += ["", f"Per task, {METRICS[metric]}:", "", per_task(data, metric)]
    return "\n".join(parts) + "\n"
