"""Section templates (docs/notes/<section>.md): prose with the section's figures filled in from its data.

Block placeholders, each alone on a line: ``{{table NAME}}`` (a table of the data file),
``{{image FILE}}`` (a PNG next to the page). Inline placeholders:

- ``{{NAME[col=text; col=text].col}}``: one cell of table ``NAME``, the row picked by what its
  columns render as (keys or headers), e.g. ``{{main[policy=h2o; kept=50%].kl}}``; ``.col[i]`` is
  item ``i`` of a list cell;
- ``{{facts.KEY}}``, ``{{settings.KEY}}``, ``{{measured}}``, ``{{command}}``: the data file's fields;
  ``{{carried.measured}}``, ``{{carried.commit}}``: when and where the tables and facts a rerun kept
  (not rerun) were measured;
- ``{{A / B}}`` and ``{{A - B}}`` of two such values (a ratio, what one method saves over another);
- a ``:FORMAT`` suffix formats the number another way than its column, e.g. ``{{...kl:.3f}}``.

An unknown table, column or a selector that matches no row or several is an error naming the
placeholder, so a template never silently shows a stale figure.
"""

from __future__ import annotations

import re

from .tables import cell, column, find_row, render_table

_INLINE = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
_FORMAT = re.compile(r":([+,]?\.?\d*[dfeg%])$")
_CELL = re.compile(r"^(\w+)\[([^\]]*)\]\.(\w+)(?:\[(\d+)\])?$")


def _raw(expr: str, data: dict) -> tuple[object, str]:
    """The value ``expr`` names and its column format."""
    for field in ("facts", "settings"):
        if expr.startswith(field + "."):
            key, index = re.fullmatch(r"(\w+)(?:\[(\d+)\])?", expr[len(field) + 1 :]).groups()
            value = data[field][key]
            return (value[int(index)] if index is not None else value), "auto"
    if expr in ("measured", "command"):
        return data[expr], "text"
    if expr in ("carried.measured", "carried.commit"):
        return data["carried"][expr.split(".")[1]], "text"
    m = _CELL.match(expr)
    if not m:
        raise ValueError(f"template placeholder {{{{{expr}}}}}: expected TABLE[col=value; ...].col")
    table = data["tables"][m.group(1)]
    match = dict(part.split("=", 1) for part in (p.strip() for p in m.group(2).split(";")) if part)
    row = find_row(table, **{k.strip(): v.strip() for k, v in match.items()})
    col = column(table, m.group(3))
    if m.group(4) is not None:  # one item of a list cell (a value per context)
        return row[col["key"]][int(m.group(4))], col.get("fmt", "auto").removeprefix("list:")
    return row.get(col["key"]), col.get("fmt", "auto")


def value(expr: str, data: dict) -> str:
    """The text of one inline placeholder ``expr`` against the section's ``data``: a cell or fact, or the
    ratio ``A / B`` or difference ``A - B`` of two of them; ``:FORMAT`` at the end overrides the column's format."""
    m = _FORMAT.search(expr)
    expr, fmt = (expr[: m.start()], m.group(1)) if m else (expr, "")
    for op, fn in ((" / ", lambda a, b: a / b), (" - ", lambda a, b: a - b)):
        if op in expr:
            (a, _), (b, _) = (_raw(part.strip(), data) for part in expr.split(op, 1))
            return cell(fn(a, b), "{:" + (fmt or ".2f") + "}")
    raw, col_fmt = _raw(expr.strip(), data)
    return cell(raw, "{:" + fmt + "}" if fmt else col_fmt)


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
