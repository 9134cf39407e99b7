"""The device check's benchmark: every policy at 1.0 / 0.5 / 0.25 of full's peak, on a search of
~50K KV tokens with a random-weight model shaped like Llama-3-8B (32 layers, 8 KV heads x 128, bf16).

    python -m benchmarks.gpu_check --out gpu_check.json [--tests-xml tests.xml] [--dry-run]

(``scripts/gpu_check.sh`` runs the CUDA tests first, then this.) The search is synthetic and the
same for every policy: a root prompt, then expansions of a random large block (the root or a
forced block; jumping between branches, so evicted spans come back) into ``rows`` sampled
children, each expansion followed by a long teacher-forced block under its first child. Nothing
stops early, so the tree's token counts do not depend on what the model samples: full's peak
(the 1.0 budget) is sized first with the tiny model on the same device.

The forced blocks' log-probabilities (the runtime scores every forced token over the whole
vocabulary, in float32) are a transient of several hundred MB per block on top of the KV, the
same under every policy; ``peak_device_kv_bytes`` and ``pool_bytes`` give the KV alone.

Per run: peak ``torch.cuda.max_memory_allocated`` (and above the weights), the largest scratch a
forward allocated and the largest share of its bound (``arbor_runtime/scratch.py``; measured per
forward by ``benchmarks.memprof.CudaForwardMeter``, on the CPU path by torch's profiler), peak device KV tokens,
decode tokens/s (sampled tokens over the wall time of the expansions), restore GB/s (bytes over
the restore lane's busy time, from CUDA events) and the share of restore time hidden behind
compute (1 - compute's stalls on restore events / restore time). One JSON, one table.

``--dry-run``: the tiny model on the CPU and a ~1K-token search through the same code; the copy
lanes are the recording stand-ins (no CUDA), which also check that every restore was issued
before the forward that needed it and that nothing synchronized the host.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from arbor_runtime import KVBudgetExceeded, Runtime, SamplingParams
from arbor_runtime.attention import Kernel
from arbor_runtime.kv.streams import CudaStreams, RecordingStreams
from arbor_runtime.loading import tiny_random_config
from arbor_runtime.policies import build_policy
from arbor_runtime.scratch import ScratchModel, forward_scratch_bytes
from benchmarks.memprof import CudaForwardMeter, ForwardMeter
from benchmarks.random_model import llama8b_config, random_model

POLICIES = ("full", "h2o", "streaming", "thinkv", "arbor")
FRACTIONS = (1.0, 0.5, 0.25)


@dataclass(frozen=True, slots=True)
class Workload:
    """The synthetic search: stop adding nodes once the tree holds ``tokens`` KV tokens.

    Attributes:
        prompt_tokens / block_tokens: the root prompt, and each teacher-forced block.
        rows / new_tokens: children per expansion, tokens each (no early stop).
        max_depth: only the root and forced blocks shallower than this are expanded (bounds the
            longest path, so one path plus a new block fits a quarter of full's peak).
    """

    tokens: int
    prompt_tokens: int
    block_tokens: int
    rows: int
    new_tokens: int
    max_depth: int = 3
    seed: int = 0


DEVICE_WORKLOAD = Workload(tokens=50_000, prompt_tokens=2048, block_tokens=4096, rows=8, new_tokens=8)
DRY_WORKLOAD = Workload(tokens=700, prompt_tokens=40, block_tokens=32, rows=2, new_tokens=4)


def run_search(rt: Runtime, w: Workload, vocab: int, max_seconds: float = float("inf")) -> dict[str, float]:
    """Grow the workload's tree; returns tree tokens, decode tokens, expansion seconds, and whether
    it stopped after ``max_seconds`` (a truncated run is the same search, shorter).

    Raises :class:`KVBudgetExceeded` when the policy cannot fit a step (the caller records it).
    """
    rng = random.Random(w.seed)
    gen = torch.Generator().manual_seed(w.seed)
    params = SamplingParams(max_new_tokens=w.new_tokens, temperature=1.0, stop_at_eos=False, seed=w.seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    start_all = time.perf_counter()
    root = rt.new_tree_ids(ids(w.prompt_tokens))
    frontier, tokens, decode, seconds = [root], root.length, 0, 0.0  # frontier: root and forced blocks
    while tokens < w.tokens:
        if time.perf_counter() - start_all > max_seconds:
            return {"tree_tokens": tokens, "decode_tokens": decode, "expand_seconds": seconds, "truncated": True}
        node = rng.choice([n for n in frontier if n.depth < w.max_depth])  # large blocks: restores matter
        start = time.perf_counter()
        kids = rt.expand(node, w.rows, params)
        seconds += time.perf_counter() - start
        decode += sum(k.length for k in kids)
        forced = rt.append_ids(kids[0], ids(w.block_tokens))
        for kid in kids:
            rt.set_value(kid, round(rng.random(), 3))
        frontier.append(forced)
        tokens += sum(k.length for k in kids) + forced.length
    return {"tree_tokens": tokens, "decode_tokens": decode, "expand_seconds": seconds, "truncated": False}


def full_peak(loaded, w: Workload) -> int:
    """Peak device KV tokens of ``full`` without a budget on this workload (what 1.0 means)."""
    rt = Runtime(loaded, policy="full")
    run_search(rt, w, int(loaded.model.config.vocab_size))
    return rt.metrics.peak_device_tokens


def measure(
    loaded, w: Workload, policy: str, fraction: float, budget: int, dry_run: bool, max_seconds: float = float("inf")
) -> dict[str, Any]:
    """One policy at one budget: memory, speed, restores; an OOM is a result, not an error."""
    cuda = not dry_run
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    rt = Runtime(loaded, policy=build_policy(policy, budget_tokens=budget), seed=w.seed)
    device = rt.backend.device
    rt.store.host.streams = CudaStreams(device, timing=True) if cuda else RecordingStreams()
    log = _log_forwards(rt) if dry_run else None
    meter = CudaForwardMeter(rt.backend) if cuda else ForwardMeter(rt.backend)  # every forward's scratch
    start, oom, out = time.perf_counter(), None, {}
    try:
        with meter:
            out = run_search(rt, w, int(loaded.model.config.vocab_size), max_seconds)
    except KVBudgetExceeded as exc:
        oom = str(exc)
    seconds = time.perf_counter() - start
    m, host = rt.metrics, rt.store.host
    row: dict[str, Any] = {
        "policy": policy,
        "fraction": fraction,
        "budget_tokens": budget,
        "oom": oom,
        "seconds": seconds,
        "peak_device_kv_tokens": m.peak_device_tokens,
        "peak_device_kv_bytes": m.peak_device_bytes,
        "pool_bytes": m.pool_bytes,
        "peak_host_bytes": m.peak_host_bytes,
        "decode_tokens": m.decode_tokens,
        "decode_tokens_per_s": out["decode_tokens"] / out["expand_seconds"] if out.get("expand_seconds") else None,
        "rehydrations": m.rehydrations,
        "rehydrated_tokens": m.rehydrated_tokens,
        "evicted_tokens": m.evicted_tokens,
        "dropped_tokens": m.dropped_tokens,
        "recomputed_tokens": m.recomputed_tokens,
        "restore_bytes": host.bytes_to_device,
        "offload_bytes": host.bytes_to_host,
        "tree_tokens": out.get("tree_tokens"),
        "truncated": out.get("truncated", False),
    } | scratch_fields(meter, loaded.model, threads=0 if cuda else None)
    if cuda:
        overlap = rt.store.host.streams.overlap()
        row["peak_allocated_bytes"] = meter.max_allocated()
        row["peak_above_start_bytes"] = row["peak_allocated_bytes"] - base
        row["restore_gb_per_s"] = _rate(overlap["restore_bytes"], overlap["restore_seconds"])
        row["restore_seconds"] = overlap["restore_seconds"]  # the restore stream's busy time
        row["exposed_restore_seconds"] = overlap["exposed_seconds"]  # compute's stalls on restores
        row["hidden_share"] = None if overlap["restore_seconds"] == 0 else overlap["hidden_share"]
    else:
        row["peak_allocated_bytes"] = row["peak_above_start_bytes"] = None  # no CUDA allocator here
        row["restore_gb_per_s"] = _rate(host.bytes_to_device, host.restore_seconds)  # synchronous CPU copies
        row["hidden_share"] = None  # no concurrency without CUDA
        row |= _ordering(log)
    del rt
    return row


def scratch_fields(meter: ForwardMeter, model: torch.nn.Module, threads: int | None) -> dict[str, Any]:
    """The largest scratch a forward allocated, and the largest share of its bound
    (``arbor_runtime/scratch.py``; ``threads=0`` on CUDA: no CPU flash kernel tiles) any forward used."""
    m = ScratchModel.of(model)
    if not meter.records:
        return {"max_forward_scratch_bytes": None, "max_scratch_over_bound": None}
    ratios = [
        r.peak_bytes / forward_scratch_bytes(m, r.rows, r.q, r.own, r.logits, r.stats, threads=threads)
        for r in meter.records
    ]
    worst = max(r.peak_bytes for r in meter.records)
    return {"max_forward_scratch_bytes": worst, "max_scratch_over_bound": max(ratios)}


def _log_forwards(rt: Runtime) -> list[tuple]:
    """Log model forwards into the recording lanes' log (dry run)."""
    log = rt.store.host.streams.log
    forward = rt.backend.forward

    def logged(batch, *args, **kwargs):
        log.append(("forward",))
        try:
            return forward(batch, *args, **kwargs)
        finally:
            log.append(("forward_end",))

    rt.backend.forward = logged
    return log


def _ordering(log: list[tuple]) -> dict[str, int]:
    """From the recording log: restore batches, those issued inside a forward (should be none:
    the admission issues them before), compute waits on restore events, host synchronizes."""
    inside = batches = waits = syncs = 0
    in_forward = False
    for entry in log:
        if entry == ("forward",):
            in_forward = True
        elif entry == ("forward_end",):
            in_forward = False
        elif entry[0] == "restore":
            batches += 1
            inside += in_forward
        elif entry[:3] == ("wait", "compute", "restore"):
            waits += 1
        elif entry[0] == "synchronize":
            syncs += 1
    return {"restore_batches": batches, "restores_inside_forward": inside, "compute_waits": waits, "host_syncs": syncs}


def _rate(nbytes: float, seconds: float) -> float | None:
    return nbytes / seconds / 1e9 if seconds > 0 and nbytes > 0 else None


def junit_summary(path: str | None) -> dict[str, Any] | None:
    """Counts from a pytest ``--junitxml`` file (None when there is none)."""
    if not path or not Path(path).is_file():
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for s in suites
        for case in s.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return total | {"passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"], "failed": failed}


def plan(policies: list[str], fractions: list[float]) -> list[tuple[str, float]]:
    """Run order: the most telling runs first (a deadline cuts the tail): full at 1.0, arbor,
    the tree-blind policies, then full below its peak (an OOM, the only question is when)."""
    runs = [(p, f) for f in fractions for p in policies if not (p == "full" and f < 1.0)]
    runs.sort(key=lambda r: (r[0] != "full", r[0] != "arbor", -r[1]))
    return runs + [(p, f) for f in fractions for p in policies if p == "full" and f < 1.0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny model on the CPU, same code paths, no CUDA")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--tests-xml", default=None, help="pytest --junitxml of the CUDA tests, summarized in the JSON")
    ap.add_argument("--tokens", type=int, default=None, help="KV tokens of the search (default 50000, dry 700)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--fractions", default=",".join(map(str, FRACTIONS)))
    ap.add_argument("--deadline-s", type=float, default=400.0, help="stop (truncate, then skip runs) at this time")
    ap.add_argument("--run-cap-s", type=float, default=90.0, help="a run stops adding nodes after this long")
    args = ap.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU, or pass --dry-run for the CPU path", file=sys.stderr)
        return 2
    if args.dry_run:  # the tiny model gains nothing from threads; on a busy CPU they cost 10x
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    w = DRY_WORKLOAD if args.dry_run else DEVICE_WORKLOAD
    if args.tokens:
        w = replace(w, tokens=args.tokens)
    device, dtype = ("cpu", torch.float32) if args.dry_run else ("cuda", torch.bfloat16)
    sizing = random_model(tiny_random_config(max_position_embeddings=131072), device, torch.float32)
    peak = full_peak(sizing, w)
    loaded = sizing if args.dry_run else random_model(llama8b_config(), device, dtype)
    del sizing
    setup_s = time.perf_counter() - t0
    rows = []
    for policy, fraction in plan(args.policies.split(","), [float(f) for f in args.fractions.split(",")]):
        budget = max(1, int(fraction * peak))
        cap = min(args.run_cap_s, args.deadline_s - (time.perf_counter() - t0))
        if cap < 5:
            rows.append({"policy": policy, "fraction": fraction, "budget_tokens": budget, "skipped": "deadline"})
            continue
        rows.append(measure(loaded, w, policy, fraction, budget, args.dry_run, cap))
    cfg = loaded.model.config
    report = {
        "dry_run": args.dry_run,
        "device": torch.cuda.get_device_name() if not args.dry_run else f"cpu ({platform.machine()})",
        "torch": torch.__version__,
        "kernel": Kernel(torch.device(device)).name(dtype, cfg.head_dim),
        "model": {
            "layers": cfg.num_hidden_layers,
            "kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "dtype": str(dtype).removeprefix("torch."),
            "parameters": sum(p.numel() for p in loaded.model.parameters()),
        },
        "workload": asdict(w),
        "full_peak_tokens": peak,
        "notes": [
            "peak_allocated_bytes includes the weights; peak_above_start_bytes does not",
            "both include the forced blocks' full-vocabulary float32 log-probs, the same under every policy",
            "max_scratch_over_bound: the largest share of arbor_runtime/scratch.py's bound a forward allocated",
            "hidden_share = 1 - compute stalls on restore events / restore stream busy time (CUDA events)",
        ],
        "tests": junit_summary(args.tests_xml),
        "setup_seconds": setup_s,
        "seconds": time.perf_counter() - t0,
        "runs": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print_table(report)
    print(f"wrote {out}")
    return 0


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m = report["model"]
    title = (
        f"{report['device']}: {m['layers']} layers, {m['kv_heads']}x{m['head_dim']} KV heads, {m['dtype']}, "
        f"kernel {report['kernel']}; full peak {report['full_peak_tokens']} KV tokens"
    )
    table = Table(title=title)
    cols = ("policy", "budget", "result", "peak alloc GiB", "above start GiB", "peak KV tok", "decode tok/s")
    for col in (*cols, "restore GB/s", "hidden", "rehydrated tok", "s"):
        table.add_column(col, justify="right")
    for r in report["runs"]:
        if "skipped" in r:
            table.add_row(r["policy"], f"{r['fraction']:.2f}", "skipped", *[""] * 8)
            continue
        table.add_row(
            r["policy"],
            f"{r['fraction']:.2f} ({r['budget_tokens']})",
            "OOM" if r["oom"] else ("cut" if r["truncated"] else "ok"),
            _fmt(r["peak_allocated_bytes"], 2**30, "{:.2f}"),
            _fmt(r["peak_above_start_bytes"], 2**30, "{:.2f}"),
            str(r["peak_device_kv_tokens"]),
            _fmt(r["decode_tokens_per_s"], 1, "{:.1f}"),
            _fmt(r["restore_gb_per_s"], 1, "{:.2f}"),
            _fmt(r["hidden_share"], 0.01, "{:.0f}%"),
            str(r["rehydrated_tokens"]),
            f"{r['seconds']:.1f}",
        )
    Console(width=160).print(table)
    if report["tests"] is not None:
        t = report["tests"]
        print(f"CUDA tests: {t['passed']} passed, {t['failures'] + t['errors']} failed, {t['skipped']} skipped")


def _fmt(value: float | None, unit: float, fmt: str) -> str:
    return "-" if value is None else fmt.format(value / unit)


if __name__ == "__main__":
    raise SystemExit(main())
