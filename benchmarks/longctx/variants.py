"""Sparse read variants on a few long-context items: one dense prefill per item, each variant decodes
from a fork of it (issue 24's search for defaults that keep the answer).

    python -m benchmarks.longctx.variants SPEC OUT.jsonl

SPEC is JSON: ``{"items": [[task, length, [index, ...]], ...], "variants": [name, ...]}``; task
``records_issue`` is the issue's records question as rebuilt for docs/data/longctx/ (240 records,
question on record 39, seed "issue24"), other tasks are the generator's. A variant is
``lychee:b=1024,s=0.5``, ``quest:b=1024,d=2`` or ``oracle_topk:b=1024,s=0.5`` (the exact top-k bound;
b = token_budget, s = token_share, d = dense_layers, w = window_tokens, k = sink_tokens, a = bound_scale,
p = page_tokens / lychee's max_chunk_tokens).
One JSON line per item x variant is appended to OUT: the answer, agreement with dense (answer and
first token), the first answer token's KL to dense, tokens/s and the share of the context read.
"""

from __future__ import annotations

import json
import random
import re
import sys

import torch

from arbor_runtime import Runtime, load_model
from arbor_runtime.policies import SPARSE_POLICIES
from benchmarks.longctx.generator import TASKS, Item, encode, make_item, normalise
from benchmarks.longctx.run import answer, answer_text, first_logprobs, fork, leading_space
from benchmarks.sparse import attach

MAX_NEW = 8
KNOBS = {
    "b": "token_budget",
    "s": "token_share",
    "d": "dense_layers",
    "w": "window_tokens",
    "k": "sink_tokens",
    "a": "bound_scale",
    "p": "page_tokens",  # quest; lychee: max_chunk_tokens
}


def issue_item(tokenizer) -> Item:
    """The records question of docs/data/longctx/records_example_variants.jsonl (5,423 tokens)."""
    context, _, _ = TASKS["records"](random.Random("issue24"), 240)
    sector, count = re.search(r"sector (\d+) holds (\d+)", context.split("\n")[39]).groups()
    question = f"How many crates does the warehouse in sector {sector} hold in record 39? Answer:"
    ctx, q = encode(tokenizer, context, question)
    return Item("records_issue", 0, 0, 0, context, question, (count,), len(ctx) + len(q))


def variant_policy(name: str):
    """``lychee:b=1024,s=0.5`` -> LycheePolicy(token_budget=1024, token_share=0.5)."""
    kind, _, args = name.partition(":")
    if kind not in SPARSE_POLICIES:
        raise ValueError(f"variant {name!r}: the method must be one of {', '.join(SPARSE_POLICIES)}")
    settings = {}
    for part in filter(None, args.split(",")):
        key, value = part.split("=")
        if key not in KNOBS:
            raise ValueError(f"variant {name!r}: unknown knob {key!r}; valid: {', '.join(KNOBS)}")
        settings[KNOBS[key]] = float(value) if key in ("s", "a") else int(value)
    if kind == "lychee" and "page_tokens" in settings:
        size = settings.pop("page_tokens")
        settings |= {"max_chunk_tokens": size, "min_chunk_tokens": max(1, size // 2)}
    if kind == "oracle_topk" and "page_tokens" in settings:  # one key per chunk: nothing to size
        raise ValueError(f"variant {name!r}: oracle_topk reads single keys, it has no knob p; valid: b, s, d, w, k")
    return SPARSE_POLICIES[kind](**({"dense_below": 0} | settings))  # the read as given, at any length


def run_item(loaded, item: Item, variants: list[str], out) -> None:
    tok = loaded.tokenizer
    ctx, question = encode(tok, item.context, item.question)
    base = Runtime(loaded, "full")
    root0 = base.new_tree_ids(ctx)
    rt, root = fork(base, root0)
    dense = answer(rt, root, question, MAX_NEW)
    prefix = dense.ids[: leading_space(tok, dense.ids)]
    ref = first_logprobs(rt, dense, prefix)
    dense_text = answer_text(tok, dense.ids)
    print(f"{item.task} {item.length} #{item.index} n={len(ctx)} dense={dense_text!r} gold={item.answers}", flush=True)
    for name in variants:
        rt, root = fork(base, root0)
        sparse = attach(rt, variant_policy(name))
        ans = answer(rt, root, question, MAX_NEW)
        logp = first_logprobs(rt, ans, prefix)
        text = answer_text(tok, ans.ids)
        row = {
            "task": item.task, "length": item.length, "index": item.index, "tokens": len(ctx), "variant": name,
            "dense": dense_text, "answer": text, "gold": list(item.answers),
            "agree": normalise(text) == normalise(dense_text), "correct": item.correct(text),
            "dense_correct": item.correct(dense_text), "first_agree": bool(ref.argmax() == logp.argmax()),
            "kl": float((ref.exp() * (ref - logp)).sum().clamp_min(0.0)),
            "tok_s": len(ans.ids) / ans.seconds, "dense_tok_s": len(dense.ids) / dense.seconds,
            "read_fraction": sparse.stats.read_fraction if sparse else None,
        }  # fmt: skip
        print(f"   {name:28s} {text!r:14} agree={row['agree']} kl={row['kl']:.4f}", flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m benchmarks.longctx.variants SPEC_JSON OUT.jsonl", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    for name in spec["variants"]:
        variant_policy(name)  # bad names fail before the model loads
    torch.set_num_threads(1)
    loaded = load_model("smollm2", device="cpu")
    with open(argv[1], "a") as out:
        for task, length, indexes in spec["items"]:
            for i in indexes:
                item = (
                    issue_item(loaded.tokenizer)
                    if task == "records_issue"
                    else make_item(task, length, i, loaded.tokenizer)
                )
                run_item(loaded, item, spec["variants"], out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
