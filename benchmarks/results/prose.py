"""The figures of the project's hand-written prose, sentence by sentence (issue 63).

The results page and README's results block are generated from ``docs/data`` (:mod:`.page`), and so are the
figures of a section template's placeholders (``{{main[...].col}}``). Everything else a person types: README
outside its generated block, ``docs/*.md`` (not the generated results page), the section templates'
``docs/notes/*.md`` and the ``docs/data/*/README.md`` beside each data set. :func:`figure_sentences` cuts
those into sentences (a table row counts as one) and lists each one's figures: the numerals left once code,
links, HTML comments and placeholders are taken out. ``tests/test_doc_figures.py`` holds every such sentence
to the ledger of ``tests/doc_figures.py``: either a check that recomputes its figures from ``docs/data``, or
the reason its figures are not measurements (a default, a row range, an issue number). A sentence nobody
classified, or whose figures the data does not give, fails.

``python -m benchmarks.results.prose [FILE ...]`` prints the figure sentences not in the ledger yet, each as a
ledger line to complete (a ``why``, or a ``check`` written in ``tests/doc_figures.py``).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the ledger: one line per figure sentence, its check or why its figures are no measurement
LEDGER = REPO / "docs" / "figures.jsonl"
#: README's generated block (between these two markers)
GENERATED = re.compile(r"<!-- results:begin.*?<!-- results:end -->", re.S)
FENCED = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE = re.compile(r"`[^`\n]*`")
PLACEHOLDER = re.compile(r"\{\{.*?\}\}", re.S)
LINK_TARGET = re.compile(r"\]\([^)]*\)")
IMAGE = re.compile(r"!\[[^\]]*\]")
URL = re.compile(r"https?://\S+")
#: a numeral: digits (thousands commas, decimals, an exponent), a sign, a percent or an "x" (a ratio), or a
#: length such as 8K; not glued to a word before it (SmolLM2, Q4_1, H100) nor to letters after it (135M, 8B);
#: both ends of a range (789-867)
NUMERAL = re.compile(
    r"(?:(?<![\w.\-/#])|(?<=\d-)|(?<=\d–))"  # not glued to a word, except a range's second end (900-903)
    r"[-+−]?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?(?:%|x|K\b)?(?![A-Za-z_\d]|\.\w)"
)
#: a sentence ends at . ; or : followed by space and a capital, a parenthesis or a list mark
SENTENCE_END = re.compile(r"(?<=[.;:!?])\s+(?=[A-Z(*\[-])")


@dataclass(frozen=True, slots=True)
class FigureSentence:
    """One sentence (or table row) of a file with figures in it."""

    file: str  # relative to the repository
    text: str  # the sentence as written, whitespace collapsed (code and links kept, for reading)
    figures: tuple[str, ...]  # its numerals, in order, as written (placeholders' and code's left out)


def scoped_files(repo: Path = REPO) -> list[Path]:
    """The hand-written prose whose figures are checked."""
    docs = repo / "docs"
    files = [repo / "README.md", *sorted(p for p in docs.glob("*.md") if p.name != "results.md")]
    return files + sorted((docs / "notes").glob("*.md")) + sorted((docs / "data").glob("**/README.md"))


def figure_sentences(path: Path, repo: Path = REPO) -> list[FigureSentence]:
    """The sentences and table rows of ``path`` that hold a figure."""
    text = GENERATED.sub("", path.read_text(encoding="utf-8"))
    text = COMMENT.sub("", FENCED.sub("", text))
    found = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip("\n").splitlines()
        if lines and all(line.startswith(("    ", "\t")) for line in lines if line.strip()):
            if not re.match(r"\s*([-*+]|\d+\.)\s", lines[0]):  # an indented code block, not a nested list
                continue
        lines = [line.strip() for line in lines]
        if lines and all(line.startswith("|") for line in lines):  # a table: each row on its own
            parts = [line for line in lines if not re.fullmatch(r"\s*\|[\s:|-]*\|?\s*", line)]
        else:
            parts = [p for item in _items(lines) for p in SENTENCE_END.split(item)]
        for part in parts:
            written = " ".join(part.split())
            figures = tuple(NUMERAL.findall(_prose(written)))
            if figures:
                found.append(FigureSentence(str(path.relative_to(repo)), written, figures))
    return found


def _items(lines: list[str]) -> list[str]:
    """A block's lines joined into list items and paragraphs (a list mark or a heading starts a new one)."""
    items: list[str] = []
    for line in lines:
        if not items or re.match(r"\s*([-*+]|\d+\.|#+)\s", line):
            items.append(line)
        else:
            items[-1] += " " + line
    return items


def _prose(sentence: str) -> str:
    """``sentence`` without what is not prose: code, placeholders, link targets, images and URLs."""
    for pattern in (PLACEHOLDER, CODE, LINK_TARGET, IMAGE, URL):
        sentence = pattern.sub(" ", sentence)
    return sentence


def _snippet(sentence: FigureSentence, path: Path) -> str:
    """The shortest start of ``sentence`` (whole words, at least 24 characters) no other sentence of its file has."""
    others = [s.text for s in figure_sentences(path) if s.text != sentence.text]
    words = sentence.text.split(" ")
    for end in range(1, len(words) + 1):
        start = " ".join(words[:end])
        if len(start) >= 24 and not any(t.startswith(start) for t in others):
            return start
    return sentence.text


def main(argv: list[str]) -> int:
    """Print, as ledger lines to complete, the figure sentences of the scoped files (or of ``argv``) that no
    line of ``docs/figures.jsonl`` covers."""
    ledger = [json.loads(line) for line in LEDGER.read_text().splitlines() if line.strip()]
    files = [REPO / a for a in argv] or scoped_files()
    missing = 0
    for path in files:
        entries = [e for e in ledger if e["file"] == str(path.relative_to(REPO))]
        for sentence in figure_sentences(path):
            if not any(sentence.text.startswith(e["snippet"]) for e in entries):
                missing += 1
                line = {"file": sentence.file, "snippet": _snippet(sentence, path), "figures": list(sentence.figures)}
                print(f"# {sentence.text}\n{json.dumps(line | {'why': 'TODO, or a check'}, ensure_ascii=False)}\n")
    print(f"{missing} figure sentences not in the ledger", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
