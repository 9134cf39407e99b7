"""Scratch: many sparse variants per prefilled item (one dense prefill per item)."""
import json, sys, time, random
from dataclasses import replace
import torch
torch.set_num_threads(1)
sys.path.insert(0, "/work/wt-sparse24")
from arbor_runtime import load_model, Runtime
from arbor_runtime.policies import LycheePolicy, QuestPolicy
from benchmarks.longctx.generator import make_item, encode, normalise, TASKS, Item
from benchmarks.longctx.run import fork, answer, attach, first_logprobs, leading_space, answer_text
import variants
MAXNEW = 8

def records_example(tok):
    # the shape: 240 one-line records, question on record 39
    rng = random.Random("issue24")
    ctx, q, a = TASKS["records"](rng, 240)
    lines = ctx.split("\n")
    rec = lines[39]
    import re
    sector, count = re.search(r"sector (\d+) holds (\d+)", rec).groups()
    q = f"How many crates does the warehouse in sector {sector} hold in record 39? Answer:"
    c, qq = encode(tok, ctx, q)
    return Item("records_issue", 0, 0, 0, ctx, q, (count,), len(c) + len(qq))

def main():
    spec = json.loads(sys.argv[1])
    out = open(sys.argv[2], "a")
    loaded = load_model("smollm2", device="cpu")
    tok = loaded.tokenizer
    items = []
    for task, length, idxs in spec["items"]:
        for i in idxs:
            items.append(records_example(tok) if task == "records_issue" else make_item(task, length, i, tok))
    for item in items:
        ctx, question = encode(tok, item.context, item.question)
        t0 = time.perf_counter()
        base = Runtime(loaded, "full"); root0 = base.new_tree_ids(ctx)
        pre = time.perf_counter() - t0
        rt, root = fork(base, root0)
        dense = answer(rt, root, question, MAXNEW)
        prefix = dense.ids[: leading_space(tok, dense.ids)]
        ref = first_logprobs(rt, dense, prefix)
        dtext = answer_text(tok, dense.ids)
        del rt
        print(f"{item.task} {item.length} #{item.index} n={len(ctx)} prefill {pre:.1f}s dense={dtext!r} gold={item.answers} dense_dec={len(dense.ids)/dense.seconds:.1f}tok/s", flush=True)
        for name in spec["variants"]:
            rt, root = fork(base, root0)
            pol, sa = variants.make(name, len(ctx), rt)
            ans = answer(rt, root, question, MAXNEW)
            logp = first_logprobs(rt, ans, prefix)
            text = answer_text(tok, ans.ids)
            kl = float((ref.exp() * (ref - logp)).sum().clamp_min(0.0))
            row = dict(task=item.task, length=item.length, index=item.index, tokens=len(ctx), variant=name,
                       dense=dtext, answer=text, gold=list(item.answers), agree=normalise(text) == normalise(dtext),
                       correct=item.correct(text), dense_correct=item.correct(dtext),
                       first_agree=bool(ref.argmax() == logp.argmax()), kl=kl,
                       tok_s=len(ans.ids) / ans.seconds, dense_tok_s=len(dense.ids) / dense.seconds,
                       read_fraction=sa.stats.read_fraction if sa else None)
            print(f"   {name:28s} {text!r:14} agree={row['agree']} first={row['first_agree']} kl={kl:.4f} tok/s={row['tok_s']:.1f} read={row['read_fraction']}", flush=True)
            out.write(json.dumps(row) + "\n"); out.flush()
            del rt
main()
