"""Per method, agreement with dense, accuracy retained and first-token KL over the items of one or more
suite rows files, leaving out named items (issue 49: the items a change was found on, so what is left
is held out from its choice).

    python -m benchmarks.longctx.held_out \
        --rows docs/data/longctx-layer7/rows.jsonl,docs/data/longctx-rerank/rows.jsonl \
        --exclude niah_single_number:10,niah_single_number:11,niah_multikey:12

Items are (task, length, index); a method's row of an item counts once (the first file's), dense's is the
reference. Prints a markdown table: all items, then without the excluded ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict


def by_item(paths: list[str]) -> dict[tuple, dict[str, dict]]:
    """(task, length, index) -> method -> row, the first row of each from ``paths`` in order."""
    items: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    items[(r["task"], r["length"], r["index"])].setdefault(r["method"], r)
    return items


def table(items: dict[tuple, dict[str, dict]], methods: list[str], exclude: set[tuple[str, int]]) -> list[dict]:
    """One dict per method that every kept item has: n, agreement, retained (kept / dense correct), KL."""
    out = []
    for method in methods:
        rows = [(v["dense"], v[method]) for k, v in items.items() if method in v and "dense" in v]
        rows = [(d, r) for d, r in rows if (d["task"], d["index"]) not in exclude]
        if not rows:
            continue
        correct = [(d, r) for d, r in rows if d["correct"]]
        out.append({
            "method": method, "n": len(rows), "agreement": statistics.mean(r["agree"] for _, r in rows),
            "kept": sum(bool(r["correct"]) for _, r in correct), "dense_correct": len(correct),
            "kl_first": statistics.mean(r["kl_first"] for _, r in rows),
        })  # fmt: skip
    return out


def markdown(lines: list[dict], title: str) -> str:
    head = f"{title}\n\n| method | items | agreement | retained | KL 1st |\n|---|---|---|---|---|"
    body = [
        f"| `{x['method']}` | {x['n']} | {x['agreement']:.3f} | {x['kept']}/{x['dense_correct']} "
        f"| {x['kl_first']:.4f} |"
        for x in lines
    ]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", required=True, help="comma-separated rows files of the suite")
    ap.add_argument("--exclude", default="", help="task:index,... to leave out")
    args = ap.parse_args(argv)
    try:
        exclude = {(t, int(i)) for t, _, i in (p.partition(":") for p in args.exclude.split(",") if p)}
    except ValueError:
        ap.error(f"--exclude {args.exclude!r}: items are task:index")
    items = by_item(args.rows.split(","))
    methods = list(dict.fromkeys(m for v in items.values() for m in v if m != "dense"))
    print(markdown(table(items, methods, set()), "All items"))
    print()
    print(markdown(table(items, methods, exclude), f"Without {', '.join(f'{t}:{i}' for t, i in sorted(exclude))}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
