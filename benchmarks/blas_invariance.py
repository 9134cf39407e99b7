"""Does a row's matrix product depend on its batch? And what does MKL's strict mode cost? (docs/usage.md)

For SmolLM2-135M's decode-step shapes (30 layers of q/k/v/o and MLP projections, then the
49,152-token vocabulary projection), one thread: each batch size's largest difference of row 0 from
row 0 computed alone, and the step's best time of ``--repeats``, under MKL's default and under
``MKL_CBWR=AVX2,STRICT``. MKL reads ``MKL_CBWR`` at its first call, so each mode runs in its own
process, in turn.

    python -m benchmarks.blas_invariance [--rows 1,2,4,8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

STRICT = "AVX2,STRICT"
#: (in, out) of one SmolLM2-135M layer's projections: q, k, v, o, gate, up, down
LAYER = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
LAYERS, VOCAB = 30, 49152


def measure(rows: list[int], repeats: int) -> dict[str, dict[int, float]]:
    """In this process: {"diff": rows -> max |row 0 - row 0 alone|, "ms": rows -> best step ms}."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    weights = [torch.randn(n, k) for k, n in LAYER]
    head = torch.randn(VOCAB, 576)
    x = {k: torch.randn(max(rows), k) for k in (576, 1536)}
    alone = torch.nn.functional.linear(x[576][:1], head)
    diff, ms = {}, {}
    for m in rows:
        diff[m] = (torch.nn.functional.linear(x[576][:m], head)[:1] - alone).abs().max().item()
        for (k, _), w in zip(LAYER, weights, strict=True):
            ref = torch.nn.functional.linear(x[k][:1], w)
            diff[m] = max(diff[m], (torch.nn.functional.linear(x[k][:m], w)[:1] - ref).abs().max().item())
        best = float("inf")
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            for _ in range(LAYERS):
                for (k, _), w in zip(LAYER, weights, strict=True):
                    torch.nn.functional.linear(x[k][:m], w)
            torch.nn.functional.linear(x[576][:m], head)
            best = min(best, time.perf_counter() - start)
        ms[m] = 1e3 * best
    return {"diff": diff, "ms": ms}


def _child(mode: str, rows: list[int], repeats: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MKL_CBWR", None)
    if mode != "default":
        env["MKL_CBWR"] = mode
    args = [sys.executable, "-m", "benchmarks.blas_invariance", "--child", "--rows", ",".join(map(str, rows))]
    out = subprocess.run([*args, "--repeats", str(repeats)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8", help="batch sizes (rows per step)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="default and strict alternate this many times")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    if args.child:
        print(json.dumps(measure(rows, args.repeats)))
        return
    results: dict[str, list[dict]] = {"default": [], STRICT: []}
    for _ in range(args.rounds):
        for mode in results:
            results[mode].append(_child(mode, rows, args.repeats))
    print(f"strict = MKL_CBWR={STRICT}; one thread; best of {args.repeats} x {args.rounds} rounds")
    print("| rows | max diff, default | max diff, strict | step ms, default | step ms, strict | strict / default |")
    print("|---:|---:|---:|---:|---:|---:|")
    for m in rows:
        d = [max(r["diff"][str(m)] for r in results[mode]) for mode in results]
        t = [min(r["ms"][str(m)] for r in results[mode]) for mode in results]
        print(f"| {m} | {d[0]:.2e} | {d[1]:.2e} | {t[0]:.1f} | {t[1]:.1f} | {t[1] / t[0]:.2f}x |")


if __name__ == "__main__":
    main()
