"""Tables in the docs/data format: columns (key, header, cell format) and rows of plain values.

A cell format is ``"auto"`` (as :func:`arbor_cli.results.format_cell`'s: integers with separators,
other numbers to 4 significant digits; repeated here so the page builds with a bare ``python3``,
without the package's dependencies), a format string such as ``"{:.2f}"`` or ``"{:.1f}%"``,
``"list:FMT"`` for a list of numbers (one per context: ``a / b / c``), or ``"text"`` (the value as
it is). ``None`` renders as ``-``.
"""

from __future__ import annotations

import re
from typing import Any


def _auto(value: int | float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return f"{int(value):,}"
    return f"{value:.4g}"


def cell(value: Any, fmt: str = "auto") -> str:
    """One value as table text under the column format ``fmt``."""
    if value is None:
        return "-"
    if fmt == "text" or isinstance(value, str):
        return str(value)
    if isinstance(value, list):  # fmt "list:{:.3f}": one value per context, joined
        item = fmt.removeprefix("list:")
        return " / ".join(cell(v, item) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if fmt == "auto":
        return _auto(value)
    return fmt.format(value)


def render_table(table: dict) -> str:
    """A docs/data table (``{"columns": [...], "rows": [...]}``) as GitHub markdown."""
    cols = table["columns"]
    lines = ["| " + " | ".join(c["header"].replace("|", "\\|") for c in cols) + " |"]
    lines.append("|" + "|".join("---:" if c.get("numeric") else "---" for c in cols) + "|")
    for row in table["rows"]:
        cells = (cell(row.get(c["key"]), c.get("fmt", "auto")).replace("|", "\\|") for c in cols)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def find_row(table: dict, **match: str) -> dict:
    """The one row whose columns (by key or header) render as ``match`` says; an error names what was asked."""
    keys = {c["header"]: c for c in table["columns"]} | {c["key"]: c for c in table["columns"]}
    found = []
    for row in table["rows"]:
        ok = True
        for name, want in match.items():
            col = keys.get(name)
            if col is None:
                raise KeyError(f"no column {name!r}; columns: {', '.join(c['key'] for c in table['columns'])}")
            if cell(row.get(col["key"]), col.get("fmt", "auto")) != want:
                ok = False
                break
        if ok:
            found.append(row)
    if len(found) != 1:
        raise KeyError(f"{len(found)} rows match {match}")
    return found[0]


def column(table: dict, name: str) -> dict:
    """The column named ``name`` (key or header)."""
    for c in table["columns"]:
        if name in (c["key"], c["header"]):
            return c
    raise KeyError(f"no column {name!r}; columns: {', '.join(c['key'] for c in table['columns'])}")


# --- reading a markdown table back (the one-off migration of the hand-assembled page) -----------------

_NUMBER = re.compile(r"^(-?[\d,]*\.?\d+(?:e[+-]?\d+)?)(%|×|x| MB| s)?$")


def slug(header: str) -> str:
    """A row key for a column header: ``"peak KV tok"`` -> ``"peak_kv_tok"``."""
    text = header.lower().replace("×", "x").replace("%", "pct").replace("δ", "d").replace("|", "")
    key = re.sub(r"[^a-z0-9]+", "_", text).strip("_")
    return key or "col"


def _candidates(text: str) -> list[str]:
    m = _NUMBER.match(text)
    suffix = (m.group(2) or "") if m else ""
    number = m.group(1) if m else ""
    decimals = len(number.split(".")[1]) if "." in number and "e" not in number else 0
    out = ["auto"] if not suffix else []
    out += [f"{{:,.{decimals}f}}{suffix}", f"{{:.{decimals}f}}{suffix}"]
    return out


def _value(text: str) -> Any:
    m = _NUMBER.match(text)
    if not m:
        return None
    raw = m.group(1).replace(",", "")
    return int(raw) if re.fullmatch(r"-?\d+", raw) else float(raw)


def parse_markdown_table(lines: list[str]) -> dict:
    """A markdown table (header, rule, rows) as a docs/data table whose rendering gives back every cell.

    Per column the first format (``auto``, then fixed decimals with the column's unit suffix) that
    reproduces every numeric-looking cell wins; a cell no format reproduces stays text.
    """

    def split(line: str) -> list[str]:
        return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]

    headers = split(lines[0])
    aligns = split(lines[1])
    body = [split(line) for line in lines[2:]]
    keys, columns = [], []
    for i, header in enumerate(headers):
        key = slug(header)
        if key == "after" and keys and keys[-1].endswith("_before"):  # "x before | after" pairs
            key = keys[-1][: -len("_before")] + "_after"
        base, n = key, 2
        while key in keys:
            key, n = f"{base}_{n}", n + 1
        keys.append(key)
        texts = [row[i] for row in body if row[i] != "-"]
        fmt = "text"
        for cand in dict.fromkeys(c for t in texts for c in _candidates(t)):
            hits = [t for t in texts if _value(t) is not None]
            if hits and all(cell(_value(t), cand) == t for t in hits if _NUMBER.match(t)):
                fmt = cand
                break
        columns.append({"key": key, "header": header, "fmt": fmt, "numeric": aligns[i].endswith(":")})
    rows = []
    for row in body:
        out = {}
        for col, text in zip(columns, row, strict=True):
            if text == "-":
                out[col["key"]] = None
                continue
            value = _value(text) if col["fmt"] != "text" else None
            out[col["key"]] = value if value is not None and cell(value, col["fmt"]) == text else text
        rows.append(out)
    return {"columns": columns, "rows": rows}
