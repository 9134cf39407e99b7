"""The runtime's own cost per decode step, apart from the model (issue 64): what a GPU step of 10-25 ms
must not be dominated by.

A tree of ``blocks`` forced blocks (a random tree: each new block under a random earlier one at most
``depth`` deep) is built in one runtime over the tiny random model, then ``rows`` of its leaves are expanded
together, greedy, ``tokens`` tokens each. Every decode step's engine time is split in two: the time inside
the model's forward (``ModelBackend.forward``: the layers and the tree attention's kernels, the GPU's part)
and the rest, the runtime's own cost: scheduling and planning the step, building its batch (the context
groups of every row's path), sampling, finishing rows, accounting. The table gives, per tree size, rows and
policy, the median own cost per step, split into the sampling pass (the draw and each row's log-prob and
entropy over the whole vocabulary: work in proportion to rows x vocabulary, one kernel on a GPU) and the
rest (the runtime's bookkeeping), the blocks a step reads (the distinct blocks on its rows' paths) and
the own cost per block read: a cost that grew with the tree rather than with what a step reads would show
there. ``arbor`` runs with a budget of twice the tree's tokens (its bookkeeping on every event, nothing
evicted); ``full`` with none.

    python -m benchmarks.step_overhead [--blocks 100,1000,10000] [--rows 1,8,64] [--section]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

import torch

from arbor_runtime import Runtime, SamplingParams, generation, load_model
from arbor_runtime.engine.core import Engine
from benchmarks.results.data import columns_spec, write_section_data

SECTION = "step-overhead"
TITLE = "The runtime's own cost per decode step, apart from the model, as the tree and the batch grow"
COLUMNS = columns_spec([
    ("policy", "policy", "text"),
    ("blocks", "blocks in the tree", "{:,}"),
    ("rows", "rows", "auto"),
    ("read", "blocks a step reads", "auto"),
    ("own_ms", "own ms a step (median)", "{:.3f}"),
    ("own_ms_max", "max", "{:.3f}"),
    ("sampling_ms", "of which sampling", "{:.3f}"),
    ("bookkeeping_ms", "the rest (median)", "{:.3f}"),
    ("model_ms", "model ms a step", "{:.3f}"),
    ("us_per_block", "own us per block read", "{:.1f}"),
    ("steps", "steps", "auto"),
])  # fmt: skip


class StepClock:
    """Times every engine step, every model forward inside it and every sampling pass (the draw and the
    per-token statistics over the vocabulary: ``generation.sample_into``), all wrapped inside ``with``.
    ``steps``: (seconds, model seconds, sampling seconds) per decode step."""

    def __init__(self, rt: Runtime) -> None:
        self.rt, self.steps, self.forwards, self.samplings = rt, [], [], []

    def __enter__(self) -> StepClock:
        step, forward, sample = Engine._step, self.rt.backend.forward, generation.sample_into
        clock = self

        def timed_step(engine, *args, **kwargs):
            before, sampled, start = len(clock.forwards), len(clock.samplings), time.perf_counter()
            out = step(engine, *args, **kwargs)
            if len(clock.forwards) > before:  # a decode step (steps that only planned are not counted)
                spent = time.perf_counter() - start
                clock.steps.append((spent, sum(clock.forwards[before:]), sum(clock.samplings[sampled:])))
            return out

        def timed_sample(*args, **kwargs):
            start = time.perf_counter()
            out = sample(*args, **kwargs)
            clock.samplings.append(time.perf_counter() - start)
            return out

        def timed_forward(*args, **kwargs):
            start = time.perf_counter()
            out = forward(*args, **kwargs)
            clock.forwards.append(time.perf_counter() - start)
            return out

        self._restore = (step, forward, sample)
        Engine._step, generation.sample_into = timed_step, timed_sample
        self.rt.backend.forward = timed_forward
        return self

    def __exit__(self, *exc: object) -> None:
        Engine._step, self.rt.backend.forward, generation.sample_into = self._restore


def build_tree(rt: Runtime, blocks: int, depth: int, block_tokens: int, rng: random.Random) -> list:
    """A random tree of ``blocks`` forced blocks of ``block_tokens`` tokens under one root; returns its leaves."""
    root = rt.new_tree_ids([rng.randrange(3, 1000) for _ in range(32)])
    nodes = [root]
    for _ in range(blocks - 1):
        parent = rng.choice([n for n in nodes[-200:] if n.depth < depth] or [root])
        nodes.append(rt.append_ids(parent, [rng.randrange(3, 1000) for _ in range(block_tokens)]))
    return [n for n in nodes if not n.children]


def measure(loaded, policy: str, blocks: int, rows: int, args: argparse.Namespace) -> dict[str, Any]:
    """One row of the table (see the module docstring)."""
    rng = random.Random(f"{blocks}-{rows}")
    rt = Runtime(loaded, policy="full")
    leaves = build_tree(rt, blocks, args.depth, args.block_tokens, rng)
    if policy == "arbor":  # the same tree in a runtime whose planner does its work: rebuilt, within a budget
        budget = 2 * (rt.store.resident_tokens + rows * (args.tokens + 8))
        rt = Runtime(loaded, policy="arbor", budget_tokens=budget)
        leaves = build_tree(rt, blocks, args.depth, args.block_tokens, random.Random(f"{blocks}-{rows}"))
    chosen = rng.sample(leaves, min(rows, len(leaves)))
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0.0, stop_at_eos=False)
    read = len({n.id for leaf in chosen for n in leaf.path()})
    with StepClock(rt) as clock:
        rt.expand_many([(leaf, 1) for leaf in chosen], params)
    own = [(total - model) * 1e3 for total, model, _ in clock.steps]
    model_ms = statistics.median(model * 1e3 for _, model, _ in clock.steps)
    sampling = [sampled * 1e3 for _, _, sampled in clock.steps]
    bookkeeping = [(total - model - sampled) * 1e3 for total, model, sampled in clock.steps]
    return {
        "policy": policy, "blocks": blocks, "rows": len(chosen), "read": read,
        "own_ms": statistics.median(own), "own_ms_max": max(own), "sampling_ms": statistics.median(sampling),
        "bookkeeping_ms": statistics.median(bookkeeping), "model_ms": model_ms,
        "us_per_block": statistics.median(own) * 1e3 / read, "steps": len(own),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.step_overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="100,1000,10000")
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--policies", default="full,arbor")
    ap.add_argument("--depth", type=int, default=12, help="deepest block of the random tree")
    ap.add_argument("--block-tokens", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16, help="tokens each row decodes")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--section", action="store_true", help=f"write docs/data/{SECTION}/results.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model("tiny-random", device="cpu")
    rows = []
    for policy in args.policies.split(","):
        for blocks in map(int, args.blocks.split(",")):
            for n in map(int, args.rows.split(",")):
                rows.append(measure(loaded, policy, blocks, n, args))
                r = rows[-1]
                print(f"{policy} {blocks} blocks {r['rows']} rows: own {r['own_ms']:.3f} ms a step (sampling "
                      f"{r['sampling_ms']:.3f}, the rest {r['bookkeeping_ms']:.3f}), model {r['model_ms']:.3f} ms, "
                      f"{r['read']} blocks read", file=sys.stderr)  # fmt: skip
    if args.section:
        command = "python -m benchmarks.step_overhead " + " ".join(argv if argv is not None else sys.argv[1:])
        settings = {k: getattr(args, k) for k in ("depth", "block_tokens", "tokens", "threads")}
        path = write_section_data(
            SECTION, rows, command, settings | {"model": "tiny-random"}, title=TITLE, columns=COLUMNS
        )
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
