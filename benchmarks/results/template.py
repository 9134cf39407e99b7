"""Section templates (docs/notes/<section>.md): prose with the section's figures filled in from its data.

Block placeholders, each alone on a line: ``{{table NAME}}`` (a table of the data file),
``{{image FILE}}`` (a PNG next to the page). Inline placeholders:

- ``{{NAME[col=text; col=text].col}}``: one cell of table ``NAME``, the row picked by what its
  columns render as (keys or headers), e.g. ``{{main[policy=h2o; kept=50%].kl}}``;
- ``{{facts.KEY}}``, ``{{measured}}``, ``{{command}}``: the data file's fields.

An unknown table, column or a selector that matches no row or several is an error naming the
placeholder, so a template never silently shows a stale figure.
"""

from __future__ import annotations

import re

from .tables import cell, column, find_row, render_table

_INLINE = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
_CELL = re.compile(r"^(\w+)\[([^\]]*)\]\.(\w+)$")


def value(expr: str, data: dict) -> str:
    """The text of one inline placeholder ``expr`` against the section's ``data``."""
    if expr.startswith("facts."):
        return cell(data["facts"][expr[len("facts.") :]])
    if expr in ("measured", "command"):
        return str(data[expr])
    m = _CELL.match(expr)
    if not m:
        raise ValueError(f"template placeholder {{{{{expr}}}}}: expected TABLE[col=value; ...].col")
    table = data["tables"][m.group(1)]
    match = dict(part.split("=", 1) for part in (p.strip() for p in m.group(2).split(";")) if part)
    row = find_row(table, **{k.strip(): v.strip() for k, v in match.items()})
    col = column(table, m.group(3))
    return cell(row.get(col["key"]), col.get("fmt", "auto"))


def render(template: str, data: dict) -> str:
    """``template`` with its block and inline placeholders filled from ``data``."""
    out = []
    for line in template.splitlines():
        block = re.fullmatch(r"\{\{(table|image) (\S+)\}\}", line.strip())
        if block and block.group(1) == "table":
            out.append(render_table(data["tables"][block.group(2)]).rstrip("\n"))
        elif block:
            out.append(f"![{data['title']}]({block.group(2)})")
        else:
            try:
                out.append(_INLINE.sub(lambda m: value(m.group(1), data), line))
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{data['section']}: {exc}") from exc
    return "\n".join(out)
