"""``arbor-view RUN_DIR``: a self-contained HTML viewer of a run's search trees, KV residency and events.

Writes ``RUN_DIR/view/index.html`` (a table of the problems) and ``RUN_DIR/view/<index>.html`` per
problem; ``arbor-solve ... view=true`` does the same at the end of a run. Pages open from disk
(no server, no network).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from arbor_cli.results import RESULTS_FILE
from arbor_cli.view.data import run_pages
from arbor_cli.view.page import embedded_data, index_page, problem_page

__all__ = ["VIEW_DIR", "embedded_data", "main", "write_views"]

VIEW_DIR = "view"
log = logging.getLogger(__name__)


def write_views(run_dir: Path) -> Path:
    """Write the viewer pages of ``run_dir``; returns the path of its ``view/index.html``."""
    run_dir = Path(run_dir)
    out = run_dir / VIEW_DIR
    out.mkdir(parents=True, exist_ok=True)
    pages = run_pages(run_dir)
    for page in pages:
        (out / f"{page['index']}.html").write_text(problem_page(page), encoding="utf-8")
    index = out / "index.html"
    index.write_text(index_page(pages, str(run_dir)), encoding="utf-8")
    log.debug("wrote %d problem pages to %s", len(pages), out)
    return index


def main(argv: list[str] | None = None) -> int:
    """The ``arbor-view`` console script; returns the exit code (2: not a run dir)."""
    parser = argparse.ArgumentParser(prog="arbor-view", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run dir of arbor-solve (holds results.jsonl)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="arbor-view: warning: %(message)s", level=logging.WARNING)
    if not (args.run_dir / RESULTS_FILE).is_file():
        print(f"arbor-view: error: {args.run_dir} is not a run dir: it has no {RESULTS_FILE}", file=sys.stderr)
        return 2
    print(write_views(args.run_dir))
    return 0
