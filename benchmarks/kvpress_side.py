"""The kvpress side of ``scripts/bench_linear.py``; runs in kvpress's own virtualenv.

    /path/to/kvpress-venv/bin/python benchmarks/kvpress_side.py REQUEST.json RESPONSE.json

kvpress 0.5.5 pins transformers < 5.3, so it cannot live next to this project's transformers:
this file imports nothing from the project. It reads a request (model directory, token ids of
each context / question / reference continuation, presses, compression ratios) and follows
kvpress's pipeline: prefill the context under a press, which compresses each layer's cache right
after that layer's attention, then teacher-force question + continuation over the compressed
cache with the true position ids. Per step of the continuation it writes KL(full || compressed)
and whether the top-1 token agrees with the uncompressed model's.

One prefill per context serves every press and ratio: a fan-out press calls each press's own
``compress`` (kvpress's code) on the same layer inputs and keeps the results, while the model's
cache stays whole. That is exactly what separate prefills would give, because a press only
changes the cache after its layer has attended (the rest of the prefill never reads it); the
response's ``check`` compares one configuration with a real ``with press(model)`` prefill.

Two variants of every press:

- ``per_head``: the press as kvpress ships it; each layer and KV head keeps its own tokens.
- ``token``: the same press's scores averaged over KV heads and layers, one set of tokens kept in
  every layer and head: what a runtime that evicts whole tokens (this project's) can do with the
  same scores. The gap between the two is the price of whole-token eviction.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field

import torch

PRESSES = ("streaming", "observed_attention", "snapkv", "knorm")
VARIANTS = ("per_head", "token")


def build_press(name: str, ratio: float, options: dict):
    """A kvpress ScorerPress by short name at ``compression_ratio=ratio``."""
    import kvpress

    if name == "streaming":
        return kvpress.StreamingLLMPress(compression_ratio=ratio, **options)
    if name == "observed_attention":
        return kvpress.ObservedAttentionPress(compression_ratio=ratio)
    if name == "snapkv":
        return kvpress.SnapKVPress(compression_ratio=ratio, **options)
    if name == "knorm":
        return kvpress.KnormPress(compression_ratio=ratio)
    raise ValueError(f"unknown press {name!r}; valid: {', '.join(PRESSES)}")


def fan_out_press(presses: dict, record_kept: bool = False):
    """A kvpress BasePress that, in every layer, runs each of ``presses`` ((name, ratio) -> press)
    on the layer's inputs: ``per_head[key]`` gets that layer's compressed (keys, values),
    ``scores[key]`` its (B, N) scores averaged over KV heads; with ``record_kept``, ``kept[key]``
    gets that layer's ``kept_record`` (which tokens each KV head keeps). Returns keys/values unchanged."""
    from kvpress.presses.base_press import BasePress

    @dataclass
    class FanOutPress(BasePress):
        presses: dict = field(default_factory=dict)
        per_head: dict = field(default_factory=dict)
        scores: dict = field(default_factory=dict)
        kept: dict = field(default_factory=dict)

        def post_init_from_model(self, model) -> None:
            for press in self.presses.values():
                press.post_init_from_model(model)

        def compress(self, module, hidden_states, keys, values, attentions, kwargs):
            for key, press in self.presses.items():
                args = (module, hidden_states, keys, values, attentions, kwargs)
                self.per_head.setdefault(key, []).append(press.compress(*args))
                score = press.score(*args).float()  # (B, H_kv, N)
                self.scores.setdefault(key, []).append(score.mean(1))  # (B, N)
                if record_kept:
                    self.kept.setdefault(key, []).append(kept_record(score[0], keys.shape[2], key[1]))
            return keys, values

    return FanOutPress(presses=presses)


def kept_record(score: torch.Tensor, n: int, ratio: float) -> dict:
    """Which tokens one layer's KV heads keep, as ScorerPress.compress chooses them (its top
    ``int(n * (1 - ratio))`` scores per head), and how near that choice is to a tie.

    score: (H_kv, N). Returns {"mask": per head the kept tokens as a hex bitmask (bit i = token i),
    "cut": per head the last kept score, "margin": per head its gap to the first dropped score}.
    """
    n_kept = int(n * (1 - ratio))
    idx = score.topk(n_kept, dim=-1).indices  # (H_kv, n_kept)
    ordered = score.sort(dim=-1, descending=True).values
    margin = (ordered[:, n_kept - 1] - ordered[:, n_kept]).tolist()  # n_kept < n: main() refuses ratio 0
    masks = [format(sum(1 << int(i) for i in row), "x") for row in idx]
    return {"mask": masks, "cut": ordered[:, n_kept - 1].tolist(), "margin": margin}


def whole_tokens(layers: list, scores: list, ratio: float) -> list:
    """Keep the top ``int(N * (1 - ratio))`` tokens by score averaged over layers, in every layer.

    layers: per layer (keys, values) (B, H_kv, N, D); scores: per layer (B, N).
    """
    score = torch.stack(scores).mean(0)  # (B, N)
    n_kept = int(score.shape[-1] * (1 - ratio))  # as ScorerPress counts
    idx = score.topk(n_kept, dim=-1).indices.sort(-1).values  # (B, n_kept)
    out = []
    for keys, values in layers:
        gather = idx[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[-1])
        out.append((keys.gather(2, gather), values.gather(2, gather)))
    return out


class Side:
    """The model and the protocol: compress a context, then teacher-force question + continuation."""

    def __init__(self, model_dir: str) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.disable_progress_bar()
        # eager attention: ObservedAttentionPress needs the attention weights; one kernel for every run
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
        self.model.eval()

    @torch.inference_mode()
    def prefill(self, context: list[int], press=None):
        """Prefill the context (under ``press``); returns the cache."""
        from transformers import DynamicCache

        cache = DynamicCache()
        if press is None:
            self.model.model(input_ids=torch.tensor([context]), past_key_values=cache)
        else:
            with press(self.model):
                self.model.model(input_ids=torch.tensor([context]), past_key_values=cache)
        return cache

    @torch.inference_mode()
    def continue_from(self, layers: list, item: dict) -> torch.Tensor:
        """(T, V) log-probs predicting each continuation token over a cache of per-layer (keys, values)."""
        from transformers import DynamicCache

        cache = DynamicCache()
        for i, (keys, values) in enumerate(layers):
            cache.update(keys, values, i)
        q, cont, n = item["question_ids"], item["continuation_ids"], len(item["context_ids"])
        ids = torch.tensor([q + cont])
        positions = torch.arange(n, n + ids.shape[1]).unsqueeze(0)  # true positions, whatever was pruned
        logits = self.model(input_ids=ids, past_key_values=cache, position_ids=positions).logits[0]
        return torch.log_softmax(logits[len(q) - 1 : len(q) - 1 + len(cont)].float(), dim=-1)


def layers_of(cache) -> list:
    return [(layer.keys, layer.values) for layer in cache.layers]


def compare(ref: torch.Tensor, logp: torch.Tensor) -> tuple[list[float], list[bool]]:
    """Per step KL(ref || logp) and top-1 agreement. ref, logp: (T, V) log-probs."""
    kl = (ref.exp() * (ref - logp)).sum(-1).clamp_min(0.0)
    return [float(x) for x in kl], [bool(x) for x in (ref.argmax(-1) == logp.argmax(-1))]


def run_item(side: Side, item: dict, request: dict, check: tuple | None) -> dict:
    """Every press x ratio x variant on one context (one prefill for all), plus the checks."""
    options = request.get("options", {})
    presses = {
        (name, ratio): build_press(name, ratio, options.get(name, {}))
        for name in request.get("presses", PRESSES)
        for ratio in request["compression_ratios"]
    }
    fan = fan_out_press(presses, record_kept=bool(request.get("kept")))
    start = time.perf_counter()
    full = layers_of(side.prefill(item["context_ids"], fan))
    prefill_seconds = time.perf_counter() - start
    ref = side.continue_from(full, item)
    cont = torch.tensor(item["continuation_ids"])
    info = {"prefill_seconds": prefill_seconds, "context_tokens": len(item["context_ids"])}
    if "reference" in item:  # the project's full model on the same ids: the same weights?
        mine = ref.gather(-1, cont.view(-1, 1)).squeeze(-1)
        info["max_abs_token_logp_diff"] = float((mine - torch.tensor(item["reference"]["token_logp"])).abs().max())
        info["top1_agreement"] = float((ref.argmax(-1) == torch.tensor(item["reference"]["top1"])).float().mean())
    runs = []
    for name, ratio in presses:
        for variant in request.get("variants", VARIANTS):
            start = time.perf_counter()
            if variant == "per_head":
                layers = fan.per_head[(name, ratio)]
            else:
                layers = whole_tokens(full, fan.scores[(name, ratio)], ratio)
            logp = side.continue_from(layers, item)
            kl, top1 = compare(ref, logp)
            row = {"press": name, "variant": variant, "compression_ratio": ratio, "kept_tokens": layers[0][0].shape[2]}
            if variant == "per_head" and fan.kept:
                row["kept"] = fan.kept[(name, ratio)]  # per layer: each KV head's kept tokens
            runs.append(row | {"kl": kl, "top1": top1, "seconds": time.perf_counter() - start})
            print(f"{item['name']} {name} {variant} {ratio}: mean KL {sum(kl) / len(kl):.4f}", file=sys.stderr)
    if check is not None:  # the fan-out equals a real prefill under the press
        name, ratio = check
        real = side.continue_from(layers_of(side.prefill(item["context_ids"], presses[(name, ratio)])), item)
        fanned = side.continue_from(fan.per_head[(name, ratio)], item)
        info["fan_out_check"] = {"press": name, "compression_ratio": ratio, "max_abs_logp_diff": _diff(real, fanned)}
    return {"name": item["name"], "check": info, "runs": runs}


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def versions() -> dict:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("kvpress", "transformers", "torch")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("request")
    ap.add_argument("response")
    args = ap.parse_args()
    with open(args.request) as fh:
        request = json.load(fh)
    for ratio in request["compression_ratios"]:
        if math.isnan(ratio) or not 0.0 < ratio < 1.0:
            raise SystemExit(f"kvpress_side: compression ratio {ratio} must be in (0, 1)")
    for name in request.get("presses", PRESSES):
        if name not in PRESSES:
            raise SystemExit(f"kvpress_side: unknown press {name!r}; valid: {', '.join(PRESSES)}")
    torch.set_num_threads(int(request.get("threads", 2)))
    side = Side(request["model_dir"])
    check = tuple(request["check"]) if request.get("check") else None
    items = [run_item(side, item, request, check if i == 0 else None) for i, item in enumerate(request["items"])]
    with open(args.response, "w") as fh:
        json.dump({"versions": versions(), "items": items}, fh)


if __name__ == "__main__":
    main()
