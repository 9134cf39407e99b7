"""Which layers' sparse reads change an answer: at the step where a sparse method's greedy answer first
parts from dense's, the log-probability margin of dense's token over the sparse one, with single layers
read whole or alone read sparse (issue 49: on SmolLM2 at 8K, layer 7 drops a copied number's last digit).

Through the runtime's own decode: one dense prefill per item, then per case a fork whose decode reads
through lychee (its defaults, or ``--policy`` knobs) with ``dense_layers`` set to the case's layers, forced
along dense's answer up to the parting step (``benchmarks.longctx.run.force``).

    python -m benchmarks.longctx.layer_ablation --items niah_single_number:11,niah_multikey:12 \
        --layers 7 --out OUT.jsonl

One JSON line per item and case: ``case`` is ``sparse`` (every layer sparse), ``dense`` (every layer
whole), ``whole:L`` (layer L alone whole) or ``alone:L`` (layer L alone sparse); ``margin`` is
log p(dense's token) - log p(the sparse answer's token) there (> 0: dense's token wins that pair).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from benchmarks.longctx.generator import TASKS

#: the knobs of lychee's default read, spelled out (the rows record them; calibrate.py reads with them too)
DEFAULT_KNOBS = {"token_share": 0.15}


def parse_items(text: str) -> list[tuple[str, int]]:
    """``task:index,...`` -> [(task, index)]; ValueError names a bad one."""
    items = []
    for part in filter(None, text.split(",")):
        task, _, index = part.partition(":")
        if task not in TASKS or not index.isdigit():
            raise ValueError(f"{part!r} is not task:index with a task of {', '.join(TASKS)}")
        items.append((task, int(index)))
    return items


def cases(layers: list[int], n_layers: int) -> list[tuple[str, list[int]]]:
    """(name, layers read whole) of each case: every layer sparse, every layer whole, then per layer
    of ``layers`` that layer alone whole and that layer alone sparse."""
    every = list(range(n_layers))
    out = [("sparse", []), ("dense", every)]
    for layer in layers:
        out += [(f"whole:{layer}", [layer]), (f"alone:{layer}", [x for x in every if x != layer])]
    return out


def run_item(
    loaded,
    task: str,
    index: int,
    layers: list[int] | None,
    knobs: dict,
    length: int,
    seed: int,
    echo: bool = True,
    lost_only: bool = False,
) -> list[dict]:
    """The rows of one item (module docstring), each printed as it comes unless ``echo`` is off; none when
    the sparse answer is dense's, or with ``lost_only`` unless dense answers correctly and sparse does not."""
    from arbor_runtime import Runtime
    from arbor_runtime.policies import LycheePolicy
    from benchmarks.longctx.generator import encode, make_item
    from benchmarks.longctx.run import answer, answer_text, force, fork
    from benchmarks.sparse import attach

    tok = loaded.tokenizer
    item = make_item(task, length, index, tok, seed, prefix=True)
    ctx, question = encode(tok, item.context, item.question)
    base = Runtime(loaded, "full")
    root = base.new_tree_ids(ctx)
    dense = answer(*fork(base, root), question, 24).ids
    rt, node = fork(base, root)
    attach(rt, LycheePolicy(**({"dense_layers": 0} | knobs)))  # every layer sparse (not the model's "auto")
    sparse = answer(rt, node, question, 24).ids
    part = next((i for i, (a, b) in enumerate(zip(dense, sparse, strict=False)) if a != b), None)
    if part is None:  # the same answer, or one runs on past the other's end: no token pair to compare
        return []
    if lost_only and not (item.correct(answer_text(tok, dense)) and not item.correct(answer_text(tok, sparse))):
        return []
    good, bad = dense[part], sparse[part]
    n_layers = loaded.model.config.num_hidden_layers
    rows = []
    for name, whole in cases(list(range(n_layers)) if layers is None else layers, n_layers):
        rt, node = fork(base, root)
        attach(rt, LycheePolicy(**(knobs | {"dense_layers": whole})))
        node = force(rt, rt.append_ids(node, list(question[:-1])), list(question[-1:]) + list(dense[:part]))
        logp = rt.next_token_logprobs(node).float()
        rows.append({
            "task": task, "index": index, "length": length, "seed": seed, "case": name, "part": part,
            "dense_token": tok.decode([good]), "sparse_token": tok.decode([bad]),
            "margin": float(logp[good] - logp[bad]), "policy": knobs,
        })  # fmt: skip
        if echo:
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", required=True, help="task:index,... (the suite's items at --length and --seed)")
    ap.add_argument("--layers", default="all", help="layers to ablate, '/' apart (7/9), or all")
    ap.add_argument("--length", type=int, default=8160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        items = parse_items(args.items)
        layers = None if args.layers == "all" else [int(x) for x in args.layers.split("/")]
    except ValueError as err:
        ap.error(str(err))
    from arbor_runtime import load_model

    torch.set_num_threads(1)
    loaded = load_model("smollm2", device="cpu")
    knobs = dict(DEFAULT_KNOBS)
    with open(args.out, "a") as out:
        for task, index in items:
            for row in run_item(loaded, task, index, layers, knobs, args.length, args.seed):
                out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
