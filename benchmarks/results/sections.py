"""The results page's sections, in page order: each one a data file, a template and an optional hook.

To add a section: have the benchmark call :func:`benchmarks.results.data.write_section_data` with
the section's name, write ``docs/notes/<name>.md`` (prose with ``{{table main}}`` and inline
placeholders, :mod:`benchmarks.results.template`), and add a :class:`Section` to :data:`SECTIONS`.
A section that needs derived columns gives ``prepare``; one whose benchmark renders itself gives
``render`` (a ``"module:function"`` taking the data dict and returning markdown).
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .data import REPO, load_section
from .stats import format_rate
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


SECTIONS: tuple[Section, ...] = (
    Section("budgets"),
    Section("accuracy", prepare=with_intervals),
    Section("wide"),
    Section("concurrency"),
    Section("packing", optional=True),
    Section(
        "longctx",
        render="benchmarks.longctx.report:render",
        optional=True,
        file="ruler_summary.json",
        title="Long context: RULER-style suite on SmolLM2",
    ),
    Section("sparse"),
    Section("rehydrate"),
    Section("linear"),
    Section("kvp"),
    Section("e2e-game24"),
    Section("e2e-game24-full"),
    Section("e2e-gsm8k"),
    Section("e2e-gsm8k-full"),
    Section("replay"),
    Section("memory-steps"),
    Section("scaling"),
    Section("speed"),
    Section("controllers"),
)


def provenance(data: dict) -> str:
    """Where the section's numbers come from: date, commit (or that it was not recorded), machine, command."""
    measured = data.get("measured") or data.get("date", "(date not recorded)")
    if data.get("commit"):
        when = f"Measured {measured} at commit `{data['commit'][:12]}`"
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
            [f"table `{t}`" for t in c["tables"]] + (["the figures its prose quotes"] if c["facts"] else [])
        )
        if kept:  # only settings were carried over: nothing measured is older than the header says
            lines += ["", f"Kept from the measurement of {c['measured']} (`{c['commit']}`), not rerun: {kept}."]
    if data.get("stale"):
        lines += ["", f"**Not current:** {data['stale']}; `make results` reruns it."]
    if data.get("images") and data.get("source", "").startswith("migrated"):
        lines += ["", "Plots: the committed PNGs; their input traces are not in docs/data, so the page keeps them."]
    return "\n".join(lines)


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
    return section.prepare(data) if section.prepare else data


def render_section(section: Section, data: dict, notes: Path = NOTES) -> str:
    """``## title``, the provenance, then the body (the benchmark's own renderer or the template)."""
    if section.render:
        module, func = section.render.split(":")
        body = getattr(importlib.import_module(module), func)(data)
    else:
        body = render_template((notes / f"{section.name}.md").read_text(), data)
    return f"## {data['title']}\n\n{provenance(data)}\n\n{body.strip()}\n"
