"""Bodies of the benchmark scripts (``scripts/record_trace.py`` and friends): argv in, exit code out."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from arbor_cli.build import USER_ERRORS, build, compose_config
from arbor_cli.provenance import code_version
from arbor_cli.report import fit_table
from arbor_cli.results import Column, write_csv, write_jsonl
from arbor_runtime import build_policy, load_model
from arbor_runtime.loading import LoadedModel
from arbor_runtime.policies import POLICIES
from arbor_runtime.weights import FORMATS
from benchmarks.plots import memory_panels, plot_memory
from benchmarks.replay import (
    DEFAULT_FRACTIONS,
    DEFAULT_POLICIES,
    budgets_for,
    compare_policies,
    policy_variant,
    trace_fields,
)  # fmt: skip
from benchmarks.report import replay_table, speed_table
from benchmarks.speed import speed_compare
from benchmarks.trace import Trace, load_trace, record_trace

log = logging.getLogger(__name__)
#: the table ``record_trace.py`` prints, one row per recorded problem
RECORD_COLUMNS = (
    Column("problem", "problem", label=True),
    Column("nodes", "nodes", "{:,}"),
    Column("tokens", "tokens", "{:,}"),
    Column("expansions", "expansions", "{:,}", rank=1),
    Column("recorded_peak", "recorded peak", "{:,}", rank=1),
    Column("replay_peak", "replay peak", "{:,}"),
    Column("solved", "solved", rank=2),
    Column("file", "file", label=True),
)


# ---- record ---------------------------------------------------------------------------------
def record_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """``record_trace.py``: run ``full`` searches from arbor-solve's config, one trace file per problem."""
    ap = argparse.ArgumentParser(
        prog="record_trace.py",
        description="Record full searches as JSON traces. Overrides are arbor-solve's (task=, controller=, model=...).",
    )
    ap.add_argument("--out", default="traces", help="folder for <task>-<index>.json files")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny-random task.end=901")
    args = ap.parse_args(argv)
    console = console or make_console()
    try:
        set_threads(args.threads)
        paths = record_from_config(args.overrides, Path(args.out), console)
    except USER_ERRORS as exc:
        print(f"record_trace.py: error: {exc}", file=sys.stderr)
        return 2
    console.print(f"wrote {len(paths)} trace(s) to {args.out}")
    return 0


def record_from_config(overrides: Sequence[str], out_dir: Path, console: Console) -> list[Path]:
    """Compose arbor-solve's config with ``overrides`` and record every problem of the slice.

    Built like an ``arbor-solve`` run (same task, verifier, controller, model options and seeds);
    only the policy is fixed: traces are recorded under ``full`` without a budget.
    """
    if any(o.split("=", 1)[0].lstrip("+").startswith("policy") for o in overrides):
        log.warning("record_trace.py ignores policy overrides: traces are always recorded under full, no budget")
    setup = build(compose_config(overrides))
    cfg, task = setup.cfg, setup.task
    controller_cfg = {k: v for k, v in cfg.controller.items() if k != "_target_"}
    paths, rows = [], []
    for problem in setup.problems:

        def search(rt, problem=problem):
            return setup.controller(rt).solve(problem)

        meta = {"task": task.name, "index": problem.index, "question": problem.question}
        meta |= {"controller": str(cfg.controller._target_).rsplit(".", 1)[-1], "controller_cfg": controller_cfg}
        trace = record_trace(setup.loaded, search, seed=setup.seed(problem), meta=meta)
        paths.append(trace.save(out_dir / f"{task.name}-{problem.index}.json"))
        rows.append(
            {"problem": problem.index, "nodes": len(trace.nodes), "tokens": trace.total_tokens,
             "expansions": len(trace.expansions), "recorded_peak": trace.metrics["peak_device_tokens"],
             "replay_peak": trace.full_replay_peak(), "solved": trace.meta.get("solved"), "file": str(paths[-1])}
        )  # fmt: skip
    title = f"recorded traces · {task.name} · {cfg.model.spec}"
    console.print(fit_table(rows, RECORD_COLUMNS, title, console.width))
    return paths


# ---- replay ---------------------------------------------------------------------------------
def replay_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """``replay_trace.py``: every policy at every budget fraction on each trace; table + JSONL + CSV."""
    ap = _trace_parser("replay_trace.py", "Replay recorded traces under each policy and budget (teacher-forced).")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated policy names")
    ap.add_argument("--fractions", default=",".join(map(str, DEFAULT_FRACTIONS)), help="budgets as shares of full peak")
    ap.add_argument("--out", default="results/replay", help="folder for replay.jsonl and replay.csv")
    ap.add_argument(
        "--resume", action="store_true", help="keep the traces already in <out>/replay.jsonl and replay only the rest"
    )
    ap.add_argument(
        "--together", action="store_true", help="every policy in one lockstep group (full's reference replayed once)"
    )
    args = ap.parse_args(argv)
    console = console or make_console()
    out = Path(args.out)
    try:
        set_threads(args.threads)
        policies, fractions = policy_names(args.policies), parse_floats(args.fractions, "--fractions")
        traces = [load_trace(p) for p in args.traces]
        rows = replayed_rows(out / "replay.jsonl") if args.resume else []
        done = {r["trace"] for r in rows}
        for path, trace in zip(args.traces, traces, strict=True):
            if str(path) in done:
                continue
            loaded = _model_for(trace, args)
            done_group = lambda p: log.info("replayed %s", p)  # noqa: E731
            runs = compare_policies(loaded, trace, policies, fractions, on_group=done_group, together=args.together)
            fields = trace_fields(trace) | {"trace": str(path), "code": code_version()}
            mine = [fields | r.row() | {"steps": r.steps} for r in runs]
            console.print(replay_table(mine, title=f"replay fidelity · {path}", width=console.width))
            rows += mine
            write_jsonl(out / "replay.jsonl", rows)  # each trace as it is done: an interrupted run resumes
    except USER_ERRORS as exc:
        print(f"replay_trace.py: error: {exc}", file=sys.stderr)
        return 2
    write_jsonl(out / "replay.jsonl", rows)
    write_csv(out / "replay.csv", rows)
    console.print(f"wrote {out / 'replay.jsonl'} and {out / 'replay.csv'}")
    return 0


def replayed_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an earlier replay.jsonl (none when it does not exist); a torn last line is dropped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: a torn line dropped (replayed again)", path)
    return rows


# ---- plot -----------------------------------------------------------------------------------
def plot_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """``plot_memory.py``: resident device KV per step for each policy at one or more budgets (PNG)."""
    ap = _trace_parser("plot_memory.py", "Plot resident device KV over search steps (Figure 3 analog).")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated policy names")
    ap.add_argument("--fractions", default="0.5", help="budgets as shares of the full replay peak, one panel each")
    ap.add_argument("--budget-tokens", default=None, help="absolute budgets instead of --fractions (comma-separated)")
    ap.add_argument("--out", default="results/memory.png", help="PNG path; the series go next to it as .json")
    args = ap.parse_args(argv)
    console = console or make_console()
    try:
        set_threads(args.threads)
        if len(args.traces) != 1:
            raise ValueError(f"plot_memory.py takes one trace, got {len(args.traces)}")
        trace = load_trace(args.traces[0])
        policies = policy_names(args.policies)
        if args.budget_tokens:
            budgets = [(int(b), None) for b in parse_floats(args.budget_tokens, "--budget-tokens")]
        else:
            budgets = [(b, f) for f, b in budgets_for(trace, parse_floats(args.fractions, "--fractions")).items()]
        panels = memory_panels(_model_for(trace, args), trace, policies, budgets)
    except USER_ERRORS as exc:
        print(f"plot_memory.py: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    name = f"{trace.meta['task']} #{trace.meta['index']}" if "index" in trace.meta else Path(args.traces[0]).stem
    title = f"resident device KV per step · {name} · {trace.model}"
    plot_memory(panels, out, title=title)
    out.with_suffix(".json").write_text(json.dumps({"trace": args.traces[0], "panels": panels}) + "\n")
    console.print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


# ---- speed ----------------------------------------------------------------------------------
def speed_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """``bench_speed.py``: the trace's tree built by the runtime, naively and with a prefix cache."""
    ap = _trace_parser("bench_speed.py", "Build each trace's tree three ways and time them (medians).")
    ap.add_argument("--repeats", type=int, default=5, help="timed builds per method (median reported)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed builds per method first")
    ap.add_argument("--out", default="results/speed.json", help="JSON with one summary per trace")
    args = ap.parse_args(argv)
    console = console or make_console()
    try:
        set_threads(args.threads)
        out = []
        for path in args.traces:
            trace = load_trace(path)
            summary = speed_compare(_model_for(trace, args), trace, repeats=args.repeats, warmup=args.warmup)
            summary = {"trace": str(path), **trace_fields(trace), "threads": torch.get_num_threads(), **summary}
            console.print(speed_table(summary, title=f"speed vs naive ToT · {path}", width=console.width))
            out.append(summary)
    except USER_ERRORS as exc:
        print(f"bench_speed.py: error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


# ---- helpers --------------------------------------------------------------------------------
def _trace_parser(prog: str, description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("traces", nargs="+", help="trace files from record_trace.py")
    ap.add_argument("--model", default=None, help="model spec (default: the one each trace was recorded with)")
    ap.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="torch dtype name (default: float32 on CPU)")
    ap.add_argument(
        "--weights",
        default=None,
        choices=FORMATS,
        help="weight format (default: the one each trace was recorded with; dense for a trace that does not say)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return ap


_MODELS: dict[tuple, LoadedModel] = {}


def make_console() -> Console:
    """The terminal's console; a wide one when output goes to a file or pipe (tables stay readable)."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _model_for(trace: Trace, args: argparse.Namespace) -> LoadedModel:
    """The model a trace replays on: its own spec and weight format unless the command names others."""
    weights = args.weights or trace.meta.get("weights", "dense")
    key = (args.model or trace.model, args.device, args.dtype, weights)
    if key not in _MODELS:
        _MODELS[key] = load_model(key[0], device=args.device, dtype=args.dtype, weights=weights)
    return _MODELS[key]


def policy_names(text: str) -> list[str]:
    """Comma-separated policies, each a name or a variant ``NAME:FIELD=VALUE...`` (checked now: the
    fields exist, their values build the policy)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p.split(":")[0] not in POLICIES]
    if bad or not names:
        raise ValueError(f"--policies {text!r}: unknown {bad}; valid: {', '.join(sorted(POLICIES))}")
    for spec in names:
        name, fields = policy_variant(spec)
        try:
            build_policy(name, **fields)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"--policies {spec!r}: {exc}") from None
    return names


def parse_floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r} must be comma-separated numbers, e.g. 0.1,0.5") from None
    if not values:
        raise ValueError(f"{flag} is empty")
    return values


def set_threads(n: int | None) -> None:
    if n is not None:
        if n < 1:
            raise ValueError(f"--threads={n} must be >= 1")
        torch.set_num_threads(n)
