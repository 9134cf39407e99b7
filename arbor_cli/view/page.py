"""HTML pages of the viewer: self-contained files (data as embedded JSON, the script and style inline).

A page opens from disk with no server and no network: :func:`problem_page` inlines ``viewer.css``,
``viewer.js`` (plain SVG, no library) and the page data (:mod:`arbor_cli.view.data`) in a
``<script type="application/json" id="arbor-data">`` element, which :func:`embedded_data` reads back.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any

from arbor_cli.results import format_cell

DATA_ID = "arbor-data"
_DATA_RE = re.compile(rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', re.S)

#: the index table: (row key, header, cell format)
INDEX_COLUMNS = (
    ("index", "problem", "{}"), ("question", "question", "{}"), ("solved", "solved", "auto"),
    ("answer", "answer", "{}"), ("peak_device_tokens", "peak KV tokens", "auto"),
    ("peak_host_tokens", "peak host tokens", "auto"), ("rehydrations", "rehydrations", "auto"),
    ("seconds", "seconds", "{:.1f}"),
)  # fmt: skip


def problem_page(page: dict[str, Any]) -> str:
    """One problem's page (its tree, residency slider, memory chart) as a complete HTML document."""
    title = f"problem {page['index']}" + (f": {page['question']}" if page.get("question") else "")
    return _document(
        title,
        '<div id="app"></div>\n'
        f'<script type="application/json" id="{DATA_ID}">{_json(page)}</script>\n'
        f"<script>\n{_asset('viewer.js')}</script>",
    )


def index_page(pages: list[dict[str, Any]], run_dir: str) -> str:
    """The table of a run's problems, each linking to its page."""
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in INDEX_COLUMNS)
    body = []
    for page in pages:
        row = page["row"]
        cells = []
        for key, _, fmt in INDEX_COLUMNS:
            value = row.get(key)
            text = html.escape(format_cell(value, fmt) if value is not None else "-")
            if key == "index":
                text = f'<a href="{page["index"]}.html">{text}</a>'
            cls = ' class="yes"' if key == "solved" and value else (' class="no"' if key == "solved" else "")
            cells.append(f"<td{cls}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    solved = sum(bool(p["row"].get("solved")) for p in pages)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    summary = f"<p>{solved}/{len(pages)} solved · run dir <code>{html.escape(run_dir)}</code></p>"
    return _document("ArborKV run", f'<div class="index"><h1>ArborKV run</h1>{summary}{table}</div>')


def embedded_data(text: str) -> dict[str, Any]:
    """The page data embedded in a page written by :func:`problem_page`."""
    match = _DATA_RE.search(text)
    if match is None:
        raise ValueError(f"no <script id={DATA_ID!r}> element in the page")
    return json.loads(match.group(1))


def _document(title: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n{_asset('viewer.css')}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


def _json(data: Any) -> str:
    """JSON safe inside a <script> element: every "<" escaped, so no "</script>" or "<!--" ends it."""
    return json.dumps(data, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def _asset(name: str) -> str:
    return resources.files("arbor_cli.view").joinpath(name).read_text(encoding="utf-8")
