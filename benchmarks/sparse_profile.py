"""Where a sparse decode step's time goes (issue 24 item 4): a random-weight model of SmolLM2's shape,
a synthetic context, greedy decode under dense and the sparse policies, CPU seconds of this thread
split by part.

    python -m benchmarks.sparse_profile --context 8192 --decode 16 --out OUT.jsonl

Parts (ms per decode step, summed over the 30 layers): ``layout`` (the step's layout, once per step),
``retrieve`` (index scoring and top-k, per block), ``select`` (the rest of the selection: forced
chunks, sort, budget cut), ``gather`` (K/V of the chosen chunks from the pool), ``attend`` (scores,
softmax, output, merge; the rest of ``SparseStep.attend``), ``own`` (the rows' own tokens; with
``fast`` they are in ``attend``), ``layers`` (all attention layers: ``TreeBatch.attend``), ``step``
(the whole forward: MLPs, norms, logits too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager

import torch

from arbor_runtime import Runtime
from arbor_runtime.attention.tree import TreeBatch
from arbor_runtime.sparse import attend as attend_mod
from arbor_runtime.sparse import pages, step, tree
from benchmarks.longctx.run import sparse_policy
from benchmarks.random_model import random_model, smollm2_shape_config
from benchmarks.sparse import attach, greedy, synthetic_prefill


@contextmanager
def timed(owner, name: str, spent: dict[str, float], key: str):
    """``owner.name`` wrapped: its CPU seconds (this thread) added to ``spent[key]``."""
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return real(*args, **kwargs)
        finally:
            spent[key] += time.thread_time() - start

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, real)


def profile(rt: Runtime, root, policy, tokens: int, fast: bool = True, native: bool | None = None) -> dict[str, float]:
    """ms per decode step of each part (module docstring) over ``tokens`` greedy steps; ``fast``:
    the flat selection and the one-softmax attention (``SparseAttention.fast``), else the path before;
    ``native``: the CPU kernels (native.py) score the chunks and read the chosen K/V (``gather`` is then
    in ``attend``); False: the torch path, as ``ARBOR_NATIVE=0``; None: as the environment says."""
    if native is not None:  # read at the first step (and by each flat scan)
        os.environ["ARBOR_NATIVE"] = "1" if native else "0"
    sparse = attach(rt, policy)
    if sparse is not None:
        sparse.fast = fast
    rt.release(rt.expand(root, 1, greedy(2))[0])  # warm-up: builds the index
    spent: dict[str, float] = defaultdict(float)
    calls = rt.backend.forward_calls
    patches = [
        (attend_mod.SparseAttention, "prepare", "layout"),
        (tree.ChunkTree, "retrieve", "retrieve"),
        (pages.PageIndex, "retrieve", "retrieve"),
        (tree.ChunkTree, "scores", "retrieve"),
        (pages.PageIndex, "scores", "retrieve"),
        (step.SparseStep, "_select", "select+retrieve"),
        (step, "gather_heads", "gather"),
        (step.SparseStep, "attend", "sparse"),
        (step.SparseStep, "attend_all", "sparse"),
        (TreeBatch, "_attend_own", "own"),
        (TreeBatch, "attend", "layers"),
        (type(rt.backend), "forward", "step"),
    ]
    with ExitStack() as stack:
        for owner, name, key in patches:
            stack.enter_context(timed(owner, name, spent, key))
        rt.release(rt.expand(root, 1, greedy(tokens))[0])
    steps = rt.backend.forward_calls - calls
    attach(rt, None)
    ms = {k: 1000 * v / steps for k, v in spent.items()}
    out = {"steps": steps, "step": ms["step"], "layers": ms["layers"], "own": ms.get("own", 0.0)}
    if policy is not None:
        out |= {
            "layout": ms["layout"],
            "retrieve": ms["retrieve"],
            "select": ms["select+retrieve"] - ms["retrieve"],
            "gather": ms.get("gather", 0.0),
            "attend": ms["sparse"] - ms["select+retrieve"] - ms.get("gather", 0.0),
        }
    out["tok_s"] = 1000 / out["step"]
    return out


def method_policy(method: str):
    """``lychee:chunk_score=axis+max_chunk_tokens=4`` -> the policy's constructor with those knobs (the
    long-context suite's parser, :func:`benchmarks.longctx.run.sparse_policy`); ValueError naming a bad
    method or knob."""
    made = sparse_policy(method)
    if made is None or method.partition(":")[0] not in ("lychee", "quest"):
        raise ValueError(f"{method!r}; valid: lychee or quest, optionally with ':knob=value+...'")
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--shares", default="0.1,0.5", help="read shares (token_share, floor 1) to profile")
    ap.add_argument(
        "--methods", default="lychee,quest", help="lychee / quest, knobs: 'lychee:chunk_score=axis+max_chunk_tokens=4'"
    )
    ap.add_argument("--fast-only", action="store_true", help="profile the fast step only (the runtime's)")
    ap.add_argument("--native", action="store_true", help="the fast step with and without the CPU kernels (native.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="", help="a label for the rows (e.g. the code version)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (a shared CPU: compare within one)")
    args = ap.parse_args(argv)
    try:  # before the model is built
        made = {method: method_policy(method) for method in args.methods.split(",")}
    except ValueError as err:
        ap.error(f"--methods: {err}")
    torch.set_num_threads(1)
    loaded = random_model(smollm2_shape_config(args.context + args.decode + 16), "cpu", torch.float32)
    rt = Runtime(loaded, policy="full")
    with synthetic_prefill(rt):
        root = rt.new_tree_ids(list(range(args.context)))
    cases = [("dense", None, 1.0, True, None)]
    for method, policy in made.items():
        for share in map(float, args.shares.split(",")):
            for fast in (True,) if args.fast_only else (False, True):
                for native in (False, True) if fast and args.native else (None,):
                    made_policy = policy(token_budget=1, token_share=share, dense_below=0)
                    cases.append((method, made_policy, share, fast, native))
    with open(args.out, "a") as out:
        for (method, policy, share, fast, native), rnd in ((c, i) for i in range(args.rounds) for c in cases):
            row = {"label": args.label, "round": rnd, "context": args.context, "method": method, "share": share}
            row |= {"fast": fast, "native": native} | profile(rt, root, policy, args.decode, fast, native)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
