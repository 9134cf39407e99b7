"""First-answer-token fidelity of sparse read rules, fast: one dense prefill per item, then the
question's last token is decoded once per rule with that rule's selection at every layer.

This is the step that decides the first answer token in ``benchmarks.longctx`` (the context and
the question are prefilled dense; the question's last token is the first sparse decode step), run
outside the runtime on the plain transformers model, with the runtime's own indexes
(:class:`~arbor_runtime.sparse.tree.ChunkTree`, :class:`~arbor_runtime.sparse.pages.PageIndex`)
and the same selection: sinks, the window and the question block always read, then chunks by
the index's score until the read budget. Only the first token (no compounding over the answer);
``benchmarks.longctx.variants`` checks whole answers through the runtime.

    python -m benchmarks.sparse_probe SPEC OUT.jsonl
    python -m benchmarks.sparse_probe --table OUT.jsonl   # the markdown table of its rows

SPEC is JSON: ``{"items": [[task, length, [index, ...]], ...], "rules": [rule, ...], "prefix": bool, "seed": int,
"answer": int}`` (seed: the items' seed, 0 the suite's; answer: teacher-force dense's greedy answer, up to so many
tokens) with tasks of
``benchmarks.longctx.generator`` (``records_issue``: the issue's records question); a rule is
``lychee:s=0.1`` / ``quest:s=0.25,p=8`` with knobs s (read share), b (floor tokens), p (chunk or page
tokens), a (radius / range scale: 1 the bound, 0 the centroid / range middle), m (query window:
the last m queries of the question also rank chunks), d (layers read whole, "/" apart: d=7/9), o (this layer
alone reads sparse, every other whole: o=7 measures layer 7's own loss), and three other ways to spend a read, each
measured worse than the plain share at the same read (docs/data/longctx/README.md): t (also read
chunks, best first, until their estimated share of the head's attention mass reaches t; a chunk's
mass is estimated as size x exp(scale x score)), g=1 (one budget for all KV heads of a layer,
chunks taken by that estimated share from any head), e=1 (each unread chunk is attended as one
pseudo-key: its keys' mean, its values' mean, logit + log(size)). One JSON line per item x rule: first-token
agreement with dense, KL(dense || sparse), the share read, and the dense attention mass the
selection kept (mean over layers and heads).
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass, replace

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from arbor_runtime import load_model
from arbor_runtime.sparse import ChunkTree, PageIndex, TreeConfig
from arbor_runtime.sparse.chunking import BoundaryTable
from arbor_runtime.sparse.reads import read_budget

KNOBS = {
    "s": float, "b": int, "p": int, "a": float, "m": int, "t": float, "g": int, "e": int, "n": int, "k": str,
    "d": str, "o": int,
}  # fmt: skip
#: chunk scores a rule may ask for with ``k`` (see :func:`chunk_sketch`); ``index``: the index's own
SCORES = ("index", "mean", "max", "axis", "halves")
SINKS, WINDOW = 16, 64


@dataclass(slots=True)
class Rule:
    """One sparse read rule (see module docstring)."""

    name: str
    kind: str
    share: float = 0.5
    floor: int = 1
    chunk: int = 16
    radius: float = 1.0
    window: int = 0
    top_p: float = 0.0
    across: int = 0  # 1: the budget of all KV heads of a layer is shared, chunks taken by estimated mass
    estimate: int = 0  # 1: each unread chunk is attended as one key, its keys' mean, weighted by its size
    neighbours: int = 0  # n: a chunk's score is the best of its own and its n neighbours' on each side
    score: str = "index"  # k: how a chunk is scored (SCORES); not "index": float32 sketches of the keys
    dense: str = ""  # d: layers read whole, "/" apart ("7/9"), as the policies' dense_layers=[7, 9]
    only: int = -1  # o: >= 0, this layer alone reads sparse (every other whole): one layer's sensitivity

    def dense_at(self, layer: int) -> bool:
        """Whether ``layer`` reads whole under this rule (``d`` or ``o``)."""
        if self.only >= 0 and layer != self.only:
            return True
        return str(layer) in self.dense.split("/")

    @classmethod
    def parse(cls, name: str) -> Rule:
        kind, _, args = name.partition(":")
        if kind not in ("lychee", "quest", "dense"):
            raise ValueError(f"rule {name!r}: kind must be lychee, quest or dense")
        rule = cls(name, kind)
        fields = {"s": "share", "b": "floor", "p": "chunk", "a": "radius", "m": "window"} | {
            "t": "top_p", "g": "across", "e": "estimate", "n": "neighbours", "k": "score", "d": "dense", "o": "only",
        }  # fmt: skip
        for part in filter(None, args.split(",")):
            key, value = part.split("=")
            if key not in KNOBS:
                raise ValueError(f"rule {name!r}: unknown knob {key!r}; valid: {', '.join(KNOBS)}")
            setattr(rule, fields[key], KNOBS[key](value))
        if rule.score not in SCORES:
            raise ValueError(f"rule {name!r}: k={rule.score!r}; valid: {', '.join(SCORES)}")
        return rule


class Probe:
    """The attention function that records queries (prefill) and applies a selection (1-token decode)."""

    def __init__(self) -> None:
        self.select = None  # layer, q (1, Hq, 1, D), keys (1, H, T, D) -> (H, T) bool, or None: dense
        self.recent: dict[int, torch.Tensor] = {}  # layer -> (Hq, m, D) the last queries of the prefill
        self.keep = 0
        self.mass: list[float] = []
        self.read: list[float] = []  # per layer: the share of the context the selection read (mean over heads)
        self.chunks = None  # with an estimating rule: (chunk_of (n_ctx,), chunk sizes (C,)) of the context

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        layer = module.layer_idx
        if query.shape[2] > 1 or self.select is None:
            if self.keep and query.shape[2] > 1:
                self.recent[layer] = query[0, :, -self.keep :].detach().clone()
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        g = query.shape[1] // key.shape[1]
        chosen = self.select(layer, query, key)  # (H, T) bool, None: this layer reads whole
        if chosen is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        k = key[0].repeat_interleave(g, 0)  # (Hq, T, D)
        v = value[0].repeat_interleave(g, 0)
        s = torch.matmul(query[0], k.transpose(-1, -2)) * scaling  # (Hq, 1, T)
        dense = torch.softmax(s, -1)
        mask = chosen.repeat_interleave(g, 0).unsqueeze(1)
        self.mass.append(float((dense * mask).sum(-1).mean()))
        self.read.append(float(chosen.float().mean()))
        s = s.masked_fill(~mask, float("-inf"))
        if self.chunks is not None:  # unread chunks as pseudo-keys: mean key, mean value, + log(size)
            chunk_of, size = self.chunks
            n_ctx, c = int(chunk_of.numel()), int(size.numel())
            per = size.view(1, -1, 1)
            kc = torch.zeros(k.shape[0], c, k.shape[-1]).index_add_(1, chunk_of, k[:, :n_ctx].float()) / per
            vc = torch.zeros(v.shape[0], c, v.shape[-1]).index_add_(1, chunk_of, v[:, :n_ctx].float()) / per
            read = torch.zeros(k.shape[0], c).index_add_(1, chunk_of, mask[:, 0, :n_ctx].float()) > 0
            sc = torch.matmul(query[0].float(), kc.transpose(-1, -2)) * scaling + size.log().view(1, 1, -1)
            sc = sc.masked_fill(read.unsqueeze(1), float("-inf"))
            p = torch.softmax(torch.cat([s, sc], -1), -1)
            out = torch.matmul(p[..., : s.shape[-1]], v) + torch.matmul(p[..., s.shape[-1] :], vc)
            return out.unsqueeze(0).transpose(1, 2).contiguous().to(query.dtype), None
        p = torch.softmax(s, -1)
        out = torch.matmul(p, v)  # (Hq, 1, D)
        return out.unsqueeze(0).transpose(1, 2).contiguous(), None


def build_index(rule: Rule, keys: list[torch.Tensor], ends: torch.Tensor):
    """The rule's index over the context's keys (L x (H, T, D))."""
    t = int(ends.numel())

    def read(layer: int, tokens: torch.Tensor) -> torch.Tensor:
        return keys[layer][:, tokens]

    resident = torch.arange(t)
    if rule.kind == "quest":
        return PageIndex.build(rule.chunk, torch.float16, read, len(keys), resident, t, rule.radius)
    cfg = TreeConfig(min_len=max(1, rule.chunk // 2), max_len=rule.chunk, top_nodes=1 << 30, flat_chunks=1 << 30)
    return ChunkTree.build(cfg, read, len(keys), resident, ends)  # the chunks only: scanned flat


def chunk_sketch(kind: str, keys: list[torch.Tensor], starts: torch.Tensor):
    """layer, q (1, H, g, D) -> (1, H, C): every chunk's score under ``kind``, from float32 keys, the
    max over the g query heads of a KV head (as the index scores). Chunks are ``starts`` (C + 1,) over
    the context's keys (L x (H, T, D)).

    - ``mean``: q.c, c the chunk's mean key (the index's centroid score, unquantized);
    - ``max``: the chunk's best key, max_k q.k (the chunk oracle: what any sketch can reach);
    - ``axis``: q.c + max(q.u hi, q.u lo), u the first principal axis of the chunk's deviations k - c
      (3 power steps from the farthest key), hi / lo their largest / smallest projection on it: the
      chunk's best key exactly when its keys deviate from c along one direction (one outlier);
    - ``halves``: the best of the means of the chunk's two halves.
    """
    t = int(starts[-1])
    chunk_of = torch.searchsorted(starts, torch.arange(t), right=True) - 1
    n = int(starts.numel()) - 1
    if kind == "halves":
        mid = (starts[:-1] + starts[1:]) // 2
        chunk_of = 2 * chunk_of + (torch.arange(t) >= mid[chunk_of]).long()
        n *= 2
    count = torch.bincount(chunk_of, minlength=n).clamp(min=1).view(1, -1, 1).float()

    def means(k: torch.Tensor) -> torch.Tensor:
        return torch.zeros(k.shape[0], n, k.shape[-1]).index_add_(1, chunk_of, k) / count

    stats = []
    for k in keys:
        k = k[:, :t].float()
        c = means(k)  # (H, n, D)
        if kind == "axis":
            dev = k - c[:, chunk_of]  # (H, T, D)
            idx = chunk_of.expand(k.shape[0], -1)
            far = torch.zeros(k.shape[0], n).scatter_reduce_(1, idx, dev.norm(dim=-1), "amax")
            pick = dev.norm(dim=-1) >= far[:, chunk_of]  # the farthest key of each chunk (ties: their sum)
            u = torch.zeros_like(c).index_add_(1, chunk_of, dev * pick.unsqueeze(-1))
            for _ in range(3):
                u = torch.nn.functional.normalize(u, dim=-1)
                proj = (dev * u[:, chunk_of]).sum(-1, keepdim=True)
                u = torch.zeros_like(c).index_add_(1, chunk_of, dev * proj)
            u = torch.nn.functional.normalize(u, dim=-1)
            proj = (dev * u[:, chunk_of]).sum(-1)  # (H, T)
            hi = torch.full((k.shape[0], n), -torch.inf).scatter_reduce_(1, idx, proj, "amax")
            lo = torch.full((k.shape[0], n), torch.inf).scatter_reduce_(1, idx, proj, "amin")
            stats.append((c, u, hi, lo))
        elif kind == "max":
            stats.append((k,))
        else:
            stats.append((c,))

    def score(layer: int, q: torch.Tensor) -> torch.Tensor:
        st = stats[layer]
        if kind == "max":
            dots = torch.matmul(q[0], st[0].transpose(-1, -2)).amax(1)  # (H, T)
            out = torch.full((dots.shape[0], n), -torch.inf).scatter_reduce_(1, chunk_of.expand_as(dots), dots, "amax")
            return out.unsqueeze(0)
        dots = torch.matmul(q[0], st[0].transpose(-1, -2))  # (H, g, n)
        if kind == "axis":
            qu = torch.matmul(q[0], st[1].transpose(-1, -2))
            dots = dots + torch.maximum(qu * st[2].unsqueeze(1), qu * st[3].unsqueeze(1))
        out = dots.amax(1)  # (H, n)
        if kind == "halves":
            out = out.view(out.shape[0], -1, 2).amax(-1)
        return out.unsqueeze(0)

    return score


def scaled(index, scale: float):
    """A shallow copy of ``index`` scoring with ``scale`` (the statistics are shared)."""
    out = copy.copy(index)
    if isinstance(index, PageIndex):
        out.range_scale = scale
    else:
        out.config = replace(index.config, radius_scale=scale)
    return out


def selector(rule: Rule, index, n_ctx: int, n_total: int, probe: Probe, sketch=None):
    """layer, q, keys -> (H, n_total) bool: sinks, window, the question block, then top chunks to budget."""
    budget = read_budget(n_total, rule.floor, rule.share)
    starts = index.starts
    size = (starts[1:] - starts[:-1]).float()
    lo, hi = starts[:-1], starts[1:]
    forced = (lo < SINKS) | (hi > n_total - WINDOW)

    def select(layer: int, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
        if rule.dense_at(layer):
            return None
        h, g = key.shape[1], query.shape[1] // key.shape[1]
        q = query[0, :, 0].float().view(1, h, g, -1)  # (1, H, g, D)
        if rule.window and layer in probe.recent:
            past = probe.recent[layer].float()  # (Hq, m, D)
            q = torch.cat([q, past.reshape(h, g * past.shape[1], -1).unsqueeze(0)], dim=2)
        if sketch is not None:
            raw = sketch(layer, q)[0]  # (H, C)
        else:
            raw = (index.bounds(layer, q) if rule.kind == "quest" else index.leaf_bounds(layer, q))[0]  # (H, C)
        if rule.neighbours:  # a chunk next to a well-scored one scores as well: the two are read together
            width = 2 * rule.neighbours + 1
            raw = torch.nn.functional.max_pool1d(raw.unsqueeze(0), width, 1, rule.neighbours)[0]
        scores = raw.masked_fill(forced.view(1, -1), float("inf"))  # (H, C)
        order = scores.argsort(-1, descending=True)
        sz = size[order]
        before = sz.cumsum(-1) - sz
        room = budget - (n_total - n_ctx)  # the question block is read whole
        take_sorted = before < room
        free = ~forced[order]
        if rule.top_p > 0 or rule.across:  # each chunk's estimated share of its head's attention mass
            r = raw.gather(1, order)
            est = sz * torch.exp((r - r.amax(-1, keepdim=True)) * query.shape[-1] ** -0.5)
            est = est / est.sum(-1, keepdim=True)
        if rule.top_p > 0:  # also every chunk until the estimated mass read (forced ones first) reaches top_p
            take_sorted |= (est.cumsum(-1) - est) < rule.top_p
        if rule.across:  # the layer's budget over all heads: chunks by estimated mass share, any head
            pool = float(room * h - (sz * ~free).sum())
            flat = est.masked_fill(~free, float("inf")).reshape(-1)
            o2 = flat.argsort(descending=True)
            sz2 = (sz * free).reshape(-1)[o2]
            t2 = (sz2.cumsum(0) - sz2) < pool
            take_sorted = torch.zeros_like(t2).scatter_(0, o2, t2).view_as(take_sorted) | ~free
        take = torch.zeros_like(take_sorted).scatter_(1, order, take_sorted)  # (H, C)
        chunk_of = torch.searchsorted(starts, torch.arange(n_ctx), right=True) - 1
        chosen = torch.ones(h, key.shape[2], dtype=torch.bool)  # the question block and the own token too
        chosen[:, :n_ctx] = take[:, chunk_of]
        return chosen

    return select, budget


def run_item(loaded, probe: Probe, item, rules: list[Rule], out, max_answer: int = 0) -> None:
    """One item: every rule's first-token row; with ``max_answer``, teacher-forced over dense's answer too."""
    from benchmarks.longctx.generator import encode

    tok, model = loaded.tokenizer, loaded.model
    ctx, question = encode(tok, item.context, item.question)
    ids = torch.tensor([ctx + question])
    n_total = len(ctx) + len(question) - 1
    probe.select, probe.keep = None, max([r.window for r in rules] + [0])
    probe.recent = {}
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :-1], cache=cache, use_cache=True, logits_to_keep=1)
    keys = [layer.keys[0, :, : len(ctx)].contiguous() for layer in cache.layers]
    kv = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    ends = BoundaryTable(lambda t: tok.decode(t)).ends(ctx)

    def step_logprobs(select, feed: list[int], greedy_to: int = 0) -> tuple[list[torch.Tensor], list[int]]:
        """(V,) log-probs after each token of ``feed`` (the question's last token, then answer tokens),
        one decode step each, every step reading through ``select`` (None: dense). ``greedy_to``: after
        ``feed``, go on greedily until the answer is complete (as ``benchmarks.longctx`` ends it: its first
        sentence or line, or EOS) or ``greedy_to`` tokens; returns the log-probs and the tokens generated."""
        from benchmarks.longctx.run import answer_done

        c = DynamicCache(ddp_cache_data=[(k.clone(), v.clone()) for k, v in kv], config=model.config)
        probe.select, probe.mass, probe.read = select, [], []
        out, made, feed = [], [], list(feed)
        with torch.no_grad():
            j = 0
            while j < len(feed):
                pos = torch.tensor([[n_total + j]])
                logits = model(torch.tensor([[feed[j]]]), cache=c, position_ids=pos).logits[0, -1]
                out.append(torch.log_softmax(logits.float(), -1))
                j += 1
                if j == len(feed) and len(made) < greedy_to:
                    made.append(int(out[-1].argmax()))
                    done = made[-1] == tok.eos_token_id or answer_done(tok.decode(made, skip_special_tokens=True))
                    if not done and len(made) < greedy_to:
                        feed.append(made[-1])
        return out, made

    # dense's greedy answer (its log-probs at each step are the references), then each rule teacher-forced on it
    refs, answer_ids = step_logprobs(None, [int(ids[0, -1])], max_answer)
    feed = [int(ids[0, -1])] + answer_ids[:-1]
    ref = refs[0]
    indexes, sketches = {}, {}
    for rule in rules:
        key = (rule.kind == "quest", rule.chunk)
        if key not in indexes:
            indexes[key] = build_index(rule, keys, ends)
        sketch = None
        if rule.score != "index":
            if (key, rule.score) not in sketches:
                sketches[(key, rule.score)] = chunk_sketch(rule.score, keys, indexes[key].starts)
            sketch = sketches[(key, rule.score)]
        select, budget = selector(rule, scaled(indexes[key], rule.radius), len(ctx), n_total, probe, sketch)
        probe.chunks = None
        if rule.estimate:
            st = indexes[key].starts
            probe.chunks = (torch.searchsorted(st, torch.arange(len(ctx)), right=True) - 1, (st[1:] - st[:-1]).float())
        got, _ = step_logprobs(select, feed)
        logp = got[0]
        kls = [float((r.exp() * (r - g)).sum().clamp_min(0.0)) for r, g in zip(refs, got, strict=True)]
        hits = [bool(r.argmax() == g.argmax()) for r, g in zip(refs, got, strict=True)]
        row = {
            "task": item.task, "length": item.length, "index": item.index, "tokens": n_total, "rule": rule.name,
            "budget": budget, "read_share": min(budget, n_total) / n_total,
            "first_agree": hits[0], "dense_first": tok.decode([int(ref.argmax())]),
            "first": tok.decode([int(logp.argmax())]),
            "kl": kls[0],
            "mass": sum(probe.mass) / max(len(probe.mass), 1),
            "read": sum(probe.read) / max(len(probe.read), 1),
        }  # fmt: skip
        if answer_ids:  # teacher-forced over dense's whole answer: all steps agree = the same greedy answer
            row |= {
                "answer": tok.decode(answer_ids), "answer_tokens": len(answer_ids), "answer_agree": all(hits),
                "step_agree": sum(hits) / len(hits), "kl_steps": sum(kls) / len(kls), "kl_max": max(kls),
                "first_miss": hits.index(False) if not all(hits) else None,
            }  # fmt: skip
            if not all(hits):  # what each side wanted where they first parted (token, probability)
                j = hits.index(False)
                row["miss"] = [[tok.decode([int(x.argmax())]), float(x.max().exp())] for x in (refs[j], got[j])]
        shown = f"kl={row['kl']:.5f} mass={row['mass']:.3f} read={row['read']:.3f}"
        print(f"  {rule.name:34s} agree={row['first_agree']!s:5} {shown}", flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()


def table(rows: list[dict]) -> str:
    """A markdown table of probe rows, per (length, rule) in first-seen order: items, first-token
    agreement, KL of the first token (mean), the share read and the dense mass kept; with teacher-forced
    rows also whole-answer agreement (every step's argmax dense's) and the KL over the answer's steps."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["length"], r["rule"]), []).append(r)
    forced = any("answer_agree" in r for r in rows)
    head = ["length", "rule", "items", "first token agrees", "KL 1st mean", "read", "dense mass kept"]
    head += ["answer agrees", "KL over the answer"] if forced else []
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (length, rule), rs in groups.items():
        n = len(rs)
        cells = [f"{length:,}", f"`{rule}`", str(n), f"{sum(r['first_agree'] for r in rs)}/{n}"]
        read = sum(r["read"] if "read" in r else r["read_share"] for r in rs) / n  # older rows: the planned share
        cells += [f"{sum(r['kl'] for r in rs) / n:.4f}", f"{read:.2f}"]
        cells += [f"{sum(r['mass'] for r in rs) / n:.3f}"]
        if forced:
            done = [r for r in rs if "answer_agree" in r]
            cells += [f"{sum(r['answer_agree'] for r in done)}/{len(done)}"]
            cells += [f"{sum(r['kl_steps'] for r in done) / max(len(done), 1):.4f}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.longctx.generator import make_item
    from benchmarks.longctx.variants import issue_item

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--table":  # print the table of a rows file; no model
        print(table([json.loads(line) for line in open(argv[1]) if line.strip()]))
        return 0
    if len(argv) != 2:
        print("usage: python -m benchmarks.sparse_probe SPEC_JSON OUT.jsonl | --table OUT.jsonl", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    rules = [Rule.parse(r) for r in spec["rules"]]
    torch.set_num_threads(1)
    loaded = load_model("smollm2", device="cpu")
    probe = Probe()
    AttentionInterface.register("sparse_probe", probe)
    loaded.model.config._attn_implementation = "sparse_probe"
    with open(argv[1], "a") as out:
        for task, length, indexes in spec["items"]:
            for i in indexes:
                tok = loaded.tokenizer
                prefix = bool(spec.get("prefix", False))  # RULER's answer prefixes (bench_longctx.py --answer-prefix)
                seed = int(spec.get("seed", 0))  # the suite's is 0: another seed gives items it does not hold
                item = issue_item(tok) if task == "records_issue" else make_item(task, length, i, tok, seed, prefix)
                print(f"{item.task} {item.length} #{item.index}", flush=True)
                run_item(loaded, probe, item, rules, out, int(spec.get("answer", 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
