"""The steps of ``make results`` (scripts/results_all.sh): kept across interruptions, timed, reported.

A full rerun takes longer than one sitting on a 2-core machine, so every step records itself under
``OUT/steps/<name>.json``: when it began, at which runtime code, and, once it finished, its wall
seconds. Rerunning the same command skips the steps already done at the same runtime code and
resumes the one that was interrupted (its outputs are kept: the benchmarks that resume, arbor-solve's
run dirs and the long-context rows, pick up where they stopped); a step begun or done at other
runtime code starts over from empty outputs. The *runtime code* is the tracked tree of the packages
that decide what a benchmark measures (:data:`RUNTIME`), uncommitted changes to them included, so a
results-page or benchmark-script fix does not throw away hours of measurement while a change to the
runtime does.

    python -m benchmarks.results.steps done OUT NAME              # exit 0 (and say so) when done at this code
    python -m benchmarks.results.steps begin OUT NAME [DIR ...]   # DIRs emptied unless resuming this code
    python -m benchmarks.results.steps end OUT NAME SECONDS
    python -m benchmarks.results.steps report OUT SIZE NAME ...   # docs/data/make-results-SIZE/results.json
    python -m benchmarks.results.steps status OUT NAME ...        # where each step stands (make results-status)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
from pathlib import Path

from .data import RUNTIME, commit, runtime_code, write_section_data

__all__ = ["RUNTIME", "runtime_code"]  # re-exported: the steps' notion of the runtime lives in .data


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def record_path(out: Path, name: str) -> Path:
    return out / "steps" / f"{name}.json"


def load(out: Path, name: str) -> dict | None:
    path = record_path(out, name)
    return json.loads(path.read_text()) if path.is_file() else None


def _save(out: Path, record: dict) -> None:
    path = record_path(out, record["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def is_done(out: Path, name: str, code: str | None) -> dict | None:
    """The step's record when it finished at runtime code ``code`` (None: never)."""
    rec = load(out, name)
    ok = code is not None and rec is not None and rec.get("status") == "done" and rec.get("runtime") == code
    return rec if ok else None


def begin(out: Path, name: str, dirs: list[Path], code: str | None) -> bool:
    """Start (or resume) a step. Its ``dirs`` are emptied unless an attempt at this runtime code was
    interrupted (then they hold what it got to). Returns True when resuming."""
    rec = load(out, name)
    resuming = code is not None and rec is not None and rec.get("status") == "started" and rec.get("runtime") == code
    if not resuming:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        rec = {"name": name, "status": "started", "runtime": code, "commit": commit(), "started": _now()}
    rec["attempts"] = rec.get("attempts", 0) + 1
    rec["spans"] = [*rec.get("spans", []), [_now(), None]]  # this attempt's wall-clock span, closed at its end
    _save(out, rec)
    return resuming


def end(out: Path, name: str, seconds: float) -> dict:
    """Mark a step done; its seconds add up over the attempts (an interrupted attempt's time counts)."""
    rec = load(out, name)
    if rec is None or rec.get("status") != "started":
        raise SystemExit(f"steps: error: step {name!r} was not begun under {out}")
    rec |= {"status": "done", "seconds": rec.get("seconds_before", 0) + seconds, "finished": _now()}
    _close_span(rec, rec["finished"])
    _save(out, rec)
    return rec


def _close_span(rec: dict, when: str) -> None:
    """End the attempt's span (a record begun before spans were kept has none)."""
    if rec.get("spans") and rec["spans"][-1][1] is None:
        rec["spans"][-1][1] = when


def interrupted(out: Path, name: str, seconds: float) -> None:
    """An attempt that stopped (failed or killed): its seconds so far are kept for the total."""
    rec = load(out, name)
    if rec is not None and rec.get("status") == "started":
        rec["seconds_before"] = rec.get("seconds_before", 0) + seconds
        _close_span(rec, _now())
        _save(out, rec)


def wall_hours(records: list[dict]) -> float:
    """Hours of wall clock in which at least one of the steps ran: the union of their attempts' spans, so
    steps run side by side count once (a step without spans: the ``seconds`` up to its ``finished``)."""
    spans = []
    for rec in records:
        closed = [(dt.datetime.fromisoformat(a), dt.datetime.fromisoformat(b)) for a, b in rec.get("spans", []) if b]
        if not closed:
            end_at = dt.datetime.fromisoformat(rec["finished"])
            closed = [(end_at - dt.timedelta(seconds=rec["seconds"]), end_at)]
        spans += closed
    total, reach = 0.0, None
    for a, b in sorted(spans):
        if reach is None or a > reach:
            total, reach = total + (b - a).total_seconds(), b
        elif b > reach:
            total, reach = total + (b - reach).total_seconds(), b
    return round(total / 3600, 2)


def report(out: Path, size: str, names: list[str], code: str | None, data_root: Path | None = None) -> Path:
    """docs/data/make-results-SIZE/results.json: each step's wall seconds and where it ran, and the total.

    Every step must be done at the same runtime code: the total is then the wall time of one
    rerun of everything at that code (summed over sittings when it was interrupted), one step after
    another; ``wall_hours`` the clock time the steps took, less where sittings ran steps side by side."""
    rows, records = [], []
    for name in names:
        rec = is_done(out, name, code)
        if rec is None:
            raise SystemExit(f"steps: error: step {name!r} is not done at runtime code {code} under {out}")
        records.append(rec)
        rows.append({
            "step": name, "minutes": round(rec["seconds"] / 60, 1), "attempts": rec.get("attempts", 1),
            "commit": (rec.get("commit") or "")[:12], "finished": rec["finished"],
        })  # fmt: skip
    total = sum(r["minutes"] for r in rows)
    facts = {"total_minutes": round(total, 1), "total_hours": round(total / 60, 2), "steps": len(rows)}
    facts["sittings"] = max(r["attempts"] for r in rows) if rows else 0
    facts["wall_hours"] = wall_hours(records)  # less than total_hours where steps ran side by side
    return write_section_data(
        f"make-results-{size}", rows, f"bash scripts/results_all.sh {size} (what `make results SIZE={size}` runs)",
        {"size": size, "runtime_code": code},
        title=f"How long `make results SIZE={size}` takes", facts=facts, root=data_root,
    )  # fmt: skip


def status(out: Path, names: list[str], code: str | None) -> list[str]:
    """One line per step of a run (where it stands at runtime code ``code``), then what is done and left."""
    lines, done, left = [], 0.0, []
    for name in names:
        rec = load(out, name)
        ok = rec is not None and rec.get("runtime") == code and rec.get("status") == "done"
        if rec is None:
            state = "not begun"
        elif rec.get("runtime") != code:
            state = f"{rec.get('status')} at other runtime code {rec.get('runtime')}: starts over"
        elif rec.get("status") == "done":
            state = f"done in {rec['seconds'] / 60:.1f} min, finished {rec['finished']}"
            done += rec["seconds"] / 60
        else:
            state = f"begun {rec['started']}, not finished (running, or interrupted: resumes)"
        if not ok:
            left.append(name)
        lines.append(f"{name:32} {state}")
    lines.append(
        f"runtime code {code}: {len(names) - len(left)} of {len(names)} steps done ({done:.0f} min)"
        + (f"; left: {' '.join(left)}" if left else "; every step done: a sitting without ONLY writes the total")
    )
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd in ("done", "begin", "end", "interrupted", "report", "status"):
        p = sub.add_parser(cmd)
        p.add_argument("out", type=Path, help="the run's output folder (results_all.sh's OUT)")
        if cmd == "status":
            p.add_argument("names", nargs="+", help="the steps of the run, in order")
        elif cmd == "report":
            p.add_argument("size", choices=("quick", "full"))
            p.add_argument("names", nargs="+", help="the steps of the run, in order")
            p.add_argument("--data-root", type=Path, default=None, help="docs/data by default")
        else:
            p.add_argument("name")
        if cmd == "begin":
            p.add_argument("dirs", nargs="*", type=Path, help="the step's outputs (emptied on a fresh start)")
        if cmd in ("end", "interrupted"):
            p.add_argument("seconds", type=float)
    args = ap.parse_args(argv)
    code = runtime_code()
    if args.cmd == "done":
        rec = is_done(args.out, args.name, code)
        if rec is None:
            sys.exit(1)
        print(f"== {args.name}: done {rec['finished']} at runtime code {code} in {rec['seconds']:.0f} s; kept")
    elif args.cmd == "begin":
        if begin(args.out, args.name, args.dirs, code):
            print(f"== {args.name}: resuming the attempt begun {load(args.out, args.name)['started']}")
    elif args.cmd == "end":
        end(args.out, args.name, args.seconds)
    elif args.cmd == "interrupted":
        interrupted(args.out, args.name, args.seconds)
    elif args.cmd == "status":
        print("\n".join(status(args.out, args.names, code)))
    else:
        print(f"wrote {report(args.out, args.size, args.names, code, args.data_root)}")


if __name__ == "__main__":
    main()
