from arbor_runtime.policies import LycheePolicy, QuestPolicy
from benchmarks.longctx.run import attach

def make(name, n, rt):
    kind, _, arg = name.partition(":")
    cls = LycheePolicy if kind == "lychee" else QuestPolicy
    kw = {}
    for part in filter(None, arg.split(",")):
        k, v = part.split("=")
        kw[{"b": "token_budget", "s": "token_share", "d": "dense_layers", "w": "window_tokens", "k": "sink_tokens"}[k]] = float(v) if k == "s" else int(v)
    pol = cls(**kw)
    sa = attach(rt, pol)
    return pol, sa
