"""The page's summary: one table of where each method wins and loses, from the claims sections declare.

A section declares what its summary line compares (:class:`Claim`: which column, better higher or
lower, how a row names its method and setting, and against what); :func:`summary` renders every claim
the same way, so the summary changes when the data does and says no more than the data's intervals.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from string import Formatter
from typing import Any

from .stats import mean_interval, sign_test, wilson

Pairs = tuple[tuple[str, Any], ...]  # (column, value) pairs a row matches


@dataclass(frozen=True, slots=True)
class Claim:
    """What one section's summary compares; every name is a column of ``table``'s rows.

    Rows group by ``place`` (where: a task, a search) and, within it, ``at`` (the setting: a budget, a
    share), both format strings over a row. A method wins at a setting where its ``metric`` is better
    (``higher``, or lower) beyond the 95% intervals than every other method there, or than the row
    matching ``reference`` in its place, or than the constant ``baseline``; it loses where it is worse.
    With ``verdict`` the metric already holds the data's own paired judgement (better / worse / tie).
    Intervals, from the data: ``n`` (the metric counts successes in that many: Wilson), ``paired``
    (problems only this row solved, only the reference solved: exact sign test), ``interval`` (a
    ``[low, high]`` column), ``samples`` (per-unit values: Student t), ``spread`` (a fact: how far one
    run moves, as a ratio); with none of them any difference counts. ``oom`` counts problems out of
    memory: all ``n`` of them is a loss, never a win. ``below`` keeps only rows whose column is a number
    under the value (a read share under 0.99: a row that read the whole context is dense against dense, so
    it is never judged, whatever its label says).

    ``also`` says what else the row measured at the same setting, so a finding never stands alone (issue
    49: a speed states the fidelity of its setting, and a fidelity its speed): format strings over the
    row, the first whose columns all hold a value is appended to the setting the summary names (none
    that do: nothing is appended).
    """

    wins: str  # what a win says, e.g. "keeps full's answer most often"
    loses: str
    metric: str
    table: str = "main"  # a table under "tables", else a top-level list of rows ("summary")
    method: str = "policy"
    place: str = ""
    at: str = ""
    higher: bool = True
    reference: Pairs = ()
    baseline: float | None = None
    verdict: bool = False
    n: str | None = None
    paired: tuple[str, str] | None = None
    interval: str | None = None
    samples: str | None = None
    spread: str | None = None
    oom: str | None = None
    only: Pairs = ()  # rows kept: those matching every pair
    skip: Pairs = ()  # rows left out: those matching any pair
    below: tuple[tuple[str, float], ...] = ()  # rows kept: those whose column is a number below the value
    also: tuple[str, ...] = ()  # the row's companion figures at the same setting, first that formats

    def columns(self) -> set[str]:
        """Every column the claim reads (a row without one of them is left out)."""
        fields = {f for text in (self.place, self.at) for _, f, _, _ in Formatter().parse(text) if f}
        named = (self.metric, self.method, self.n, self.interval, self.samples, self.oom, *(self.paired or ()))
        pairs = self.reference + self.only + self.skip + self.below
        return fields | {c for c in named if c} | {k for k, _ in pairs}

    def companion(self, row: dict) -> str | None:
        """The first of ``also`` whose columns all hold a value in ``row``, formatted; else None."""
        for fmt in self.also:
            names = {re.split(r"[.\[]", f)[0] for _, f, _, _ in Formatter().parse(fmt) if f}
            if all(row.get(name) is not None for name in names):
                return fmt.format(**row)
        return None


Finding = tuple[str, str | None, str, str]  # (method, "wins" | "loses" | "oom" | None, place, setting)


def findings(claim: Claim, section: dict) -> list[Finding]:
    """Each judged row of one section as (method, outcome, place, setting); a tie's outcome is None."""
    out: list[Finding] = []
    spread = _spread(claim, section)
    for place, group in _grouped(_rows(claim, section), claim.place).items():
        if claim.verdict:
            words = {"better": "wins", "worse": "loses"}
            out += [(r[claim.method], words.get(r[claim.metric]), place, _label(claim.at, r)) for r in group]
        elif claim.reference or claim.baseline is not None:
            out += _against_reference(claim, group, place, spread)
        else:
            for at, pool in _grouped(group, claim.at).items():
                out += _against_others(claim, pool, place, at, spread)
    return out


def _rows(claim: Claim, section: dict) -> list[dict]:
    """The claim's rows: those holding every column it reads and a number to compare (or a verdict)."""
    tables = section.get("tables") or {}
    rows = tables[claim.table]["rows"] if claim.table in tables else section.get(claim.table) or []
    need = claim.columns()
    return [
        r for r in rows
        if need <= r.keys() and all(r[k] == v for k, v in claim.only) and not any(r[k] == v for k, v in claim.skip)
        and all(isinstance(r[k], (int, float)) and r[k] < v for k, v in claim.below)
        and (claim.verdict or isinstance(r[claim.metric], (int, float)))
    ]  # fmt: skip


def _label(fmt: str, row: dict) -> str:
    """A place or setting as the summary names it; Hydra overrides without their group
    (``controller.breadth=10`` -> ``breadth=10``)."""
    return re.sub(r"\b[a-z_]+\.(?=[a-z_]+=)", "", fmt.format(**row)).strip()


def _grouped(rows: list[dict], fmt: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        out[_label(fmt, r)].append(r)
    return out


def _spread(claim: Claim, section: dict) -> float:
    """How far one run moves (a ratio, 1.0 when the claim names none or the data has no number)."""
    value = (section.get("facts") or {}).get(claim.spread) if claim.spread else None
    return float(value) if isinstance(value, (int, float)) else 1.0


def _interval(claim: Claim, row: dict, spread: float) -> tuple[float, float]:
    """The metric's 95% interval for one row, from whatever the data carries."""
    value = row[claim.metric]
    if claim.n:
        return wilson(value, row[claim.n])
    if claim.interval:
        low, high = row[claim.interval]
        return low, high
    if claim.samples:
        return mean_interval(row[claim.samples])[1:]
    return (value / spread, value * spread) if value >= 0 else (value * spread, value / spread)


def _better(claim: Claim, a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether interval ``a`` lies wholly on the better side of ``b``."""
    return a[0] > b[1] if claim.higher else a[1] < b[0]


def _out_of_memory(claim: Claim, row: dict) -> bool:
    return bool(claim.oom and claim.n and row[claim.oom] == row[claim.n] > 0)


def _against_reference(claim: Claim, group: list[dict], place: str, spread: float) -> list[Finding]:
    """Each row of a place against the reference row at its setting (else the place's only one), or the
    baseline; a row with neither says nothing."""
    refs = [r for r in group if claim.reference and all(r[k] == v for k, v in claim.reference)]
    by_at = {_label(claim.at, r): r for r in reversed(refs)}  # the first reference row at each setting
    out: list[Finding] = []
    for r in (r for r in group if not any(r is ref for ref in refs)):
        at = _label(claim.at, r)
        ref = by_at.get(at) or (refs[0] if len(refs) == 1 else None)
        if ref is not None or claim.baseline is not None:
            out.append((r[claim.method], _versus(claim, r, ref, spread), place, at))
    return out


def _versus(claim: Claim, row: dict, ref: dict | None, spread: float) -> str | None:
    """One row against its reference row (None: the baseline): by the paired sign test when the data
    holds the pairs, else by the intervals."""
    if _out_of_memory(claim, row):
        return "oom"
    if claim.paired and ref is not None:
        gained, lost = row[claim.paired[0]], row[claim.paired[1]]
        return None if sign_test(gained, lost) >= 0.05 else ("wins" if gained > lost else "loses")
    base = (claim.baseline, claim.baseline) if ref is None else _interval(claim, ref, spread)
    mine = _interval(claim, row, spread)
    return "wins" if _better(claim, mine, base) else "loses" if _better(claim, base, mine) else None


def _against_others(claim: Claim, pool: list[dict], place: str, at: str, spread: float) -> list[Finding]:
    """At one setting: a method better than every other beyond the intervals wins, one worse than every
    other loses (so a tie names nobody); one out of memory on every problem loses."""
    if len(pool) < 2:
        return []
    spans = [_interval(claim, r, spread) for r in pool]
    out: list[Finding] = []
    for i, r in enumerate(pool):
        others = spans[:i] + spans[i + 1 :]
        if _out_of_memory(claim, r):
            kind = "oom"
        elif all(_better(claim, spans[i], o) for o in others):
            kind = "wins"
        elif all(_better(claim, o, spans[i]) for o in others):
            kind = "loses"
        else:
            kind = None
        out.append((r[claim.method], kind, place, at))
    return out


Verdict = tuple[str, str, str, str, str, str]  # (method, "wins" | "loses", section, what, place, setting)
Settings = dict[tuple[str, str], list[str]]  # (section, place) -> every setting measured there


def judged(data: dict[str, dict], claims: dict[str, tuple[Claim, ...]]) -> list[tuple]:
    """Every claim's findings, ties included: (method, outcome, section, what it says, place, setting); a
    section is named by its title up to the first colon, parenthesis or comma."""
    out = []
    for name, section in data.items():
        title = _title(name, section)
        for claim in claims.get(name, ()):
            says = {"wins": claim.wins, "loses": claim.loses, "oom": "out of memory on every problem"}
            out += [
                (method, kind, title, says.get(kind, ""), place, at)
                for method, kind, place, at in findings(claim, section)
            ]
    return out


def _title(name: str, section: dict) -> str:
    """A section as the summary names it: its title up to the first colon, parenthesis or comma."""
    return re.split(r"[:(,]", section.get("title") or name)[0].strip()


Notes = dict[tuple[str, str, str, str], str]  # (method, section, place, setting) -> what else it measured


def companions(data: dict[str, dict], claims: dict[str, tuple[Claim, ...]]) -> Notes:
    """Each judged row's companion figures (:meth:`Claim.companion`), by method, section, place and setting."""
    out: Notes = {}
    for name, section in data.items():
        for claim in claims.get(name, ()):
            for r in _rows(claim, section) if claim.also else ():
                text = claim.companion(r)
                if text:
                    out[r[claim.method], _title(name, section), _label(claim.place, r), _label(claim.at, r)] = text
    return out


def verdicts(found: list[tuple]) -> list[Verdict]:
    """The wins and losses among ``found`` (:func:`judged`), settled per method, section, place and setting:
    out of memory is a loss that excludes a win; a win and a loss there from different claims cancel."""
    kinds: dict[tuple, set[str]] = defaultdict(set)
    for method, kind, title, _, place, at in found:
        kinds[method, title, place, at].add(kind)
    out = []
    for method, kind, title, what, place, at in found:
        seen = kinds[method, title, place, at]
        if kind == "oom":
            out.append((method, "loses", title, what, place, at))
        elif kind and "oom" not in seen and not {"wins", "loses"} <= seen:
            out.append((method, kind, title, what, place, at))
    return out


def _number(label: str) -> float | None:
    """A setting's leading number (``0.5x`` -> 0.5, ``2,048`` -> 2048), or None."""
    m = re.match(r"\d[\d,]*(\.\d+)?", label)
    return float(m.group().replace(",", "")) if m else None


def _named(ats: list[str], measured: list[str]) -> list[str]:
    """Settings as a cell lists them, in numeric order where every one measured there has a number, with
    three or more neighbours among those measured as one range (``0.1x-0.5x``); a setting the data calls
    ``none`` (no budget) is not named."""
    ats = [a for a in dict.fromkeys(ats) if a not in ("", "none")]
    measured = [a for a in dict.fromkeys(measured) if a not in ("", "none")]
    if any(_number(a) is None for a in measured):
        return ats
    order = sorted(measured, key=_number)
    runs: list[list[str]] = []
    for a in sorted(ats, key=_number):
        if runs and order.index(runs[-1][-1]) == order.index(a) - 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    return [x for run in runs for x in ([f"{run[0]}-{run[-1]}"] if len(run) >= 3 else run)]


def _where(title: str, at_by_place: dict[str, list[str]], measured: Settings, said: dict | None = None) -> str:
    """``at 0.1x-0.5x on game24 and at 0.5x on gsm8k``: places with the same settings share them. A
    setting with a companion (``said``: (section, place, setting) -> text) is named alone, its
    companion after it in parentheses: ``at 8,192 (reads 12.5%; ...)``."""
    said = said or {}
    by_settings: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for place, ats in at_by_place.items():
        notes = {at: said[title, place, at] for at in ats if (title, place, at) in said}
        if notes:  # every setting its own figures: no range
            order = sorted(dict.fromkeys(ats), key=lambda a: (_number(a) is None, _number(a) or 0, a))
            named = [f"{a} ({notes[a]})" if a in notes else a for a in order if a not in ("", "none")]
        else:
            named = _named(ats, measured[title, place])
        by_settings[tuple(named)].append(place)
    parts = []
    for ats, places in by_settings.items():
        at = f"at {', '.join(ats)}" if ats else ""
        on = f"on {', '.join(p for p in places if p)}" if any(places) else ""
        parts.append(f"{at} {on}".strip())
    return " and ".join(p for p in parts if p)


def cell(found: list[Verdict], measured: Settings, notes: Notes | None = None) -> str:
    """One sentence: each finding, where it holds and in which section, or ``-`` when there is none; a
    setting with a companion in ``notes`` (:func:`companions`) carries it."""
    where: dict[str, dict[str, dict[str, list[str]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    said: dict[tuple[str, str, str], str] = {}
    for method, _, title, what, place, at in found:
        where[what][title][place].append(at)
        if (method, title, place, at) in (notes or {}):
            said[title, place, at] = notes[method, title, place, at]
    parts = [
        what + " " + " and ".join(f"{_where(title, at, measured, said)} ({title})".lstrip() for title, at in by.items())
        for what, by in where.items()
    ]
    text = "; ".join(parts)
    return f"{text[0].upper()}{text[1:]}." if text else "-"


def table(data: dict[str, dict], claims: dict[str, tuple[Claim, ...]]) -> str:
    """``| method | where it wins | where it loses |``, one row per method a claim names, in page order."""
    found = judged(data, claims)
    measured: Settings = defaultdict(list)
    for _, _, title, _, place, at in found:
        measured[title, place].append(at)
    settled = verdicts(found)
    notes = companions(data, claims)
    lines = ["| method | where it wins | where it loses |", "|---|---|---|"]
    for method in dict.fromkeys(v[0] for v in settled):
        wins, loses = ([v for v in settled if v[0] == method and v[1] == kind] for kind in ("wins", "loses"))
        cells = (method, cell(wins, measured, notes), cell(loses, measured, notes))
        lines.append("| " + " | ".join(t.replace("|", "\\|") for t in cells) + " |")
    return "\n".join(lines)


def stale(data: dict[str, dict]) -> str | None:
    """Which sections are not current, from their data's own ``stale`` field."""
    old = [d["title"].split(" (")[0] for d in data.values() if d.get("stale")]
    if not old:
        return None
    return "**Not yet re-measured** (their data says why; `make results` reruns them): " + "; ".join(old) + "."


INTRO = (
    "Generated from docs/data by the claim each section declares (`benchmarks/results/sections.py`); a win or "
    "loss lies beyond the data's 95% interval, a tie names nobody."
)


def summary(data: dict[str, dict], claims: dict[str, tuple[Claim, ...]]) -> str:
    """The ``## Summary`` section: the wins-and-losses table, then which sections are stale."""
    old = stale(data)
    return f"## Summary\n\n{INTRO}\n\n{table(data, claims)}\n" + (f"\n{old}\n" if old else "")
