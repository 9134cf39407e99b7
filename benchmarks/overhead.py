"""What arbor costs next to full: wall-time ratios at shrinking budgets, and where the extra time goes.

For each problem (a search built like an ``arbor-solve`` run), ``full`` runs once with no budget
(the reference: its tree, its peak device KV, the floor: the largest operation it needed alone, its
whole path plus its slots, :func:`measured_floor`),
then, ``repeats`` times, one after the other in the same process: ``full`` again, then ``arbor`` with no
budget, at 1x, 0.5x and 0.25x of full's peak and at the floor. Interleaving the settings inside every
repeat puts them side by side in the same conditions (a busy machine slows all of them alike); each row
records its seconds and whether it rebuilt full's tree token for token.

The summary (:func:`ratios`) gives, per setting, the ratio of its time to ``full``'s over the same
problems in the same repeat (summed seconds), the median over repeats with its min and max, and how
many problems rebuilt full's tree. :func:`profile_buckets` runs one search under cProfile and sums the
time by where it is spent (the model, the tree attention, the statistics pass, the memory manager and
store, the policy's plans, the engine), C functions charged to the Python code that called them.

    python scripts/bench_overhead.py --repeats 3 --out bench/overhead/game24 experiment=table1_game24 task.end=904
"""

from __future__ import annotations

import cProfile
import math
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from arbor_runtime import Runtime
from benchmarks.budgets import SearchRun, floor_tokens, run_search

#: the settings every repeat runs, in this order: (label, policy, budget as a share of full's peak,
#: or "none" for no budget, or "floor")
SETTINGS: tuple[tuple[str, str, float | str], ...] = (
    ("full", "full", "none"),
    ("arbor none", "arbor", "none"),
    ("arbor 1x", "arbor", 1.0),
    ("arbor 0.5x", "arbor", 0.5),
    ("arbor 0.25x", "arbor", 0.25),
    ("arbor floor", "arbor", "floor"),
)


def budget_of(setting: float | str, peak: int, floor: int) -> int | None:
    """Tokens of a setting's budget (None: no budget)."""
    if setting == "none":
        return None
    if setting == "floor":
        return floor
    return max(1, math.ceil(float(setting) * peak))


def measured_floor(rt: Runtime, new_tokens: int) -> int:
    """Arbor's floor for the search ``rt`` ran: the largest operation it needed alone (its whole path
    plus its slots, ``metrics.floor_tokens``: a choose pass's kept choices together, which the
    tree alone does not tell), and at least the longest path extended plus one thought."""
    return max(int(rt.metrics.floor_tokens), floor_tokens(list(rt.all_nodes.values()), new_tokens))


def reference_run(loaded, make_controller, problem, new_tokens: int, seed: int) -> tuple[Runtime, int, int]:
    """``full`` without a budget on one problem: its runtime, its peak device KV and its floor
    (:func:`measured_floor`, never above the peak)."""
    ref_rt = Runtime(loaded, policy="full", seed=seed)
    make_controller(ref_rt).solve(problem, seed=seed)
    peak = int(ref_rt.metrics.peak_device_tokens)
    return ref_rt, peak, min(measured_floor(ref_rt, new_tokens), peak)


def problem_rows(loaded, make_controller, problem, new_tokens: int, seed: int, repeats: int) -> list[dict[str, Any]]:
    """Every setting ``repeats`` times on one problem (interleaved), one row per run."""
    ref_rt, peak, floor = reference_run(loaded, make_controller, problem, new_tokens, seed)
    ref = SearchRun(
        "full", None, {i: (list(n.token_ids), list(n.logprobs)) for i, n in ref_rt.all_nodes.items()},
        ref_rt.metrics.to_dict(), 0.0, None, None,
    )  # fmt: skip
    rows = []
    for rep in range(repeats):
        for label, policy, setting in SETTINGS:
            budget = budget_of(setting, peak, floor)
            run = run_search(loaded, make_controller, problem, policy, budget, seed)
            m = run.metrics
            rows.append({
                "problem": problem.index, "repeat": rep, "setting": label, "policy": policy, "budget": budget,
                "fraction": None if budget is None else round(budget / peak, 3), "full_peak": peak, "floor": floor,
                "seconds": run.seconds, "model_seconds": m.get("model_seconds"), "oom": run.oom is not None,
                "same_tree": run.compare(ref)["same_tree"], "rehydrations": m.get("rehydrations"),
                "rehydrated_tokens": m.get("rehydrated_tokens"), "peak_device_tokens": m.get("peak_device_tokens"),
            })  # fmt: skip
    return rows


def ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task and setting: time over full's on the same problems in the same repeat, median [min, max]
    over repeats, and the problems whose tree was full's (in every repeat)."""
    by: dict[tuple[str, str], dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    same: dict[tuple[str, str], dict[int, bool]] = defaultdict(dict)
    for r in rows:
        key = (str(r.get("task")), str(r["setting"]))
        by[key][int(r["repeat"])][int(r["problem"])] = float(r["seconds"])
        same[key][int(r["problem"])] = same[key].get(int(r["problem"]), True) and bool(r["same_tree"])
    out = []
    for (task, setting), reps in by.items():
        full = by[(task, "full")]
        per_rep = []
        for rep, seconds in sorted(reps.items()):
            problems = sorted(seconds.keys() & full.get(rep, {}).keys())
            if problems:
                per_rep.append(sum(seconds[p] for p in problems) / sum(full[rep][p] for p in problems))
        if not per_rep:
            continue
        out.append({
            "task": task, "setting": setting, "problems": len(same[(task, setting)]), "repeats": len(per_rep),
            "x_full": statistics.median(per_rep), "x_full_min": min(per_rep), "x_full_max": max(per_rep),
            "same_tree": sum(same[(task, setting)].values()),
        })  # fmt: skip
    order = [label for label, _, _ in SETTINGS]
    return sorted(out, key=lambda r: (r["task"], order.index(r["setting"]) if r["setting"] in order else 99))


# ---- where the time goes ----------------------------------------------------------------------------
#: (bucket, path fragments): a function's time goes to the first bucket one of whose fragments its file holds
BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "attention statistics",
        (
            "arbor_runtime/attention/tree.py:_collect",
            "arbor_runtime/attention/kernels.py:attention_mass",
            "arbor_runtime/runner.py:take_attention",
        ),
    ),
    ("tree attention", ("arbor_runtime/attention/",)),
    ("policy plans", ("arbor_runtime/policies/",)),
    ("memory manager, planner, store", ("arbor_runtime/memory.py", "arbor_runtime/plan", "arbor_runtime/kv/")),
    ("engine, scheduler, sampling", ("arbor_runtime/engine/", "arbor_runtime/generation.py", "arbor_runtime/sampling")),
    ("model (transformers, torch.nn)", ("transformers/", "torch/nn/")),
    ("runtime, search, verifier", ("arbor_runtime/", "controllers/", "verifiers/", "tasks/")),
)


def bucket_of(func: tuple[str, int, str]) -> str | None:
    """The bucket of a profiled function (file, line, name); None for C functions and the rest."""
    file, _, name = func
    where = f"{file}:{name}"
    for bucket, parts in BUCKETS:
        if any(p in where for p in parts):
            return bucket
    return None


def profile_buckets(fn: Callable[[], Any]) -> dict[str, float]:
    """CPU seconds of this process by bucket, one call of ``fn`` under cProfile: each function's own time
    to its bucket; a function outside every bucket (a C function, the standard library) charged to its
    callers' buckets, split as the profile records the calls from each caller. The clock is the
    process's CPU time, not the wall clock: another process on a busy machine does not move it."""
    prof = cProfile.Profile(time.process_time)
    prof.runcall(fn)
    stats = pstats.Stats(prof).stats  # func -> (cc, nc, tt, ct, callers)
    out: dict[str, float] = defaultdict(float)
    for func, (_, _, tt, _, callers) in stats.items():
        bucket = bucket_of(func)
        if bucket is not None:
            out[bucket] += tt
            continue
        placed = 0.0
        for caller, (_, _, ctt, _) in callers.items():
            mine = bucket_of(caller)
            if mine is not None:
                out[mine] += ctt
                placed += ctt
        out["other"] += max(tt - placed, 0.0)
    return dict(out)


# ---- script ---------------------------------------------------------------------------------
def overhead_main(argv: Sequence[str] | None = None) -> int:
    """``bench_overhead.py``: the ratio table (and with ``--profile``, the profile table) of one search config."""
    import argparse
    import sys
    from pathlib import Path

    import torch
    from rich.console import Console

    from arbor_cli.build import USER_ERRORS, build, compose_config
    from arbor_cli.provenance import code_version
    from arbor_cli.results import write_jsonl
    from benchmarks.cli import replayed_rows

    ap = argparse.ArgumentParser(prog="bench_overhead.py", description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="times every setting runs on each problem (interleaved)")
    ap.add_argument(
        "--profile", action="store_true", help="instead: profile full, and arbor without a budget and at its floor"
    )
    ap.add_argument("--out", default="bench/overhead", help="folder for overhead.jsonl (or profile.json)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("overrides", nargs="*", help="arbor-solve overrides (experiment=, task.end=, ...)")
    args = ap.parse_args(argv)
    console, out = Console(width=200), Path(args.out)
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        setup = build(compose_config(args.overrides))
        task, new_tokens = setup.task.name, setup.task.max_thought_tokens
        if args.profile:
            return _profile(setup, out, console)
        rows = replayed_rows(out / "overhead.jsonl")  # resumes: problems already measured are kept
        done = {r["problem"] for r in rows}
        for problem in setup.problems:
            if problem.index in done:
                continue
            mine = problem_rows(setup.loaded, setup.controller, problem, new_tokens, setup.seed(problem), args.repeats)
            rows += [{"task": task, "code": code_version()} | r for r in mine]
            write_jsonl(out / "overhead.jsonl", rows)
            console.print(_ratio_table(ratios(rows), f"arbor / full time · {task} (problems so far)"))
    except USER_ERRORS as exc:
        print(f"bench_overhead.py: error: {exc}", file=sys.stderr)
        return 2
    console.print(_ratio_table(ratios(rows), f"arbor / full time · {task}"))
    console.print(f"wrote {out / 'overhead.jsonl'}")
    return 0


def _profile(setup, out, console) -> int:
    """Profile the first problem's search under full, under arbor without a budget and under arbor at
    its floor (:func:`measured_floor` of full's run), once each after a warm run."""
    import json

    problem = setup.problems[0]
    seed, found = setup.seed(problem), {}
    _, _, floor = reference_run(setup.loaded, setup.controller, problem, setup.task.max_thought_tokens, seed)  # warm
    for label, policy, budget in PROFILED:
        budget = floor if budget == "floor" else None
        run = lambda policy=policy, budget=budget: run_search(  # noqa: E731
            setup.loaded, setup.controller, problem, policy, budget, seed
        )
        if label != "full":
            run()  # warm: the first search of a process (and of a setting) pays one-time costs
        found[label] = profile_buckets(run)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"task": setup.task.name, "problem": problem.index, "floor": floor, "seconds": found}
    (out / "profile.json").write_text(json.dumps(doc, indent=1) + "\n")
    from rich.table import Table

    table = Table(title=f"where the time goes · {setup.task.name} #{problem.index} (cProfile, seconds)")
    for col in ("bucket", *found, *(f"{k} - full" for k in found if k != "full")):
        table.add_column(col, justify="right")
    for bucket in sorted(set().union(*found.values())):
        f = found["full"].get(bucket, 0.0)
        seconds = [found[k].get(bucket, 0.0) for k in found]
        table.add_row(bucket, *(f"{x:.2f}" for x in seconds), *(f"{x - f:+.2f}" for x in seconds[1:]))
    console.print(table)
    return 0


#: what ``--profile`` runs: (label, policy, budget: None or "floor")
PROFILED: tuple[tuple[str, str, str | None], ...] = (
    ("full", "full", None),
    ("arbor", "arbor", None),
    ("arbor floor", "arbor", "floor"),
)


def _ratio_table(rows, title: str):
    from rich.table import Table

    table = Table(title=title)
    for col in ("setting", "problems", "repeats", "x full (median)", "min", "max", "same tree"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["setting"], str(r["problems"]), str(r["repeats"]), f"{r['x_full']:.2f}", f"{r['x_full_min']:.2f}",
            f"{r['x_full_max']:.2f}", f"{r['same_tree']}/{r['problems']}",
        )  # fmt: skip
    return table


# ---- the results section ----------------------------------------------------------------------------
RATIO_COLUMNS = (
    ("task", "task", "text"), ("setting", "setting", "text"), ("problems", "problems", "auto"),
    ("repeats", "repeats", "auto"), ("x_full", "x full's time (median over repeats)", "{:.2f}"),
    ("x_full_min", "min", "{:.2f}"), ("x_full_max", "max", "{:.2f}"), ("same_tree", "full's tree", "auto"),
)  # fmt: skip
PROFILE_COLUMNS = (
    ("task", "task", "text"), ("bucket", "where", "text"), ("full_s", "full s", "{:.2f}"),
    ("arbor_s", "arbor s (no budget)", "{:.2f}"), ("diff_s", "arbor - full s", "{:+.2f}"),
    ("floor_s", "arbor s (at its floor)", "{:.2f}"), ("floor_diff_s", "arbor at floor - full s", "{:+.2f}"),
)  # fmt: skip


def profile_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A profile.json (:func:`_profile`) as table rows, the largest difference without a budget first
    (the floor columns None in a profile made before they were measured)."""
    full, arbor = doc["seconds"]["full"], doc["seconds"]["arbor"]
    floor = doc["seconds"].get("arbor floor")
    rows = []
    for b in set(full) | set(arbor) | set(floor or {}):
        f = full.get(b, 0.0)
        at_floor = None if floor is None else floor.get(b, 0.0)
        rows.append({
            "task": doc["task"], "bucket": b, "full_s": f, "arbor_s": arbor.get(b, 0.0),
            "diff_s": arbor.get(b, 0.0) - f, "floor_s": at_floor,
            "floor_diff_s": None if at_floor is None else at_floor - f,
        })  # fmt: skip
    return sorted(rows, key=lambda r: -abs(r["diff_s"]))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.overhead DIR ... --section overhead``: the ratio table from every
    DIR/overhead.jsonl and the profile table from every DIR/profile.json."""
    import argparse
    import json
    from pathlib import Path

    from benchmarks.cli import replayed_rows
    from benchmarks.results.data import columns_spec, write_section_data

    ap = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", type=Path, nargs="+", help="bench_overhead.py output folders")
    ap.add_argument("--section", default=None, help="write docs/data/<section>/results.json (else print only)")
    ap.add_argument("--command", default="", help="the commands that made the folders (recorded)")
    args = ap.parse_args(argv)
    rows = [r for d in args.dirs for r in replayed_rows(d / "overhead.jsonl")]
    profiles = [json.loads((d / "profile.json").read_text()) for d in args.dirs if (d / "profile.json").is_file()]
    table, prof = ratios(rows), [r for doc in profiles for r in profile_rows(doc)]
    for r in table:
        print(r)
    if args.section:
        codes = sorted({str(r.get("code")) for r in rows if r.get("code")})
        extra = {"commit": codes[0]} if len(codes) == 1 else {}
        tables = {"profile": {"columns": columns_spec(PROFILE_COLUMNS), "rows": prof}}
        title = "What arbor costs next to full: time ratios and where the time goes"
        path = write_section_data(
            args.section, table, args.command, title=title, columns=columns_spec(RATIO_COLUMNS), tables=tables, **extra
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
