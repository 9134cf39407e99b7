"""PNGs next to the results page drawn from docs/data alone (matplotlib; `make results-plots`).

``make results-page`` does not redraw them (a bare python3 has no matplotlib, and PNG bytes vary with
the matplotlib version); the page shows the committed files. Plots whose input is not in docs/data
stay as the committed PNGs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .stats import wilson


def _figure(width: float = 6.4, height: float = 3.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def sparse_speedup(data: dict, path: Path) -> None:
    """Decode tokens/s over dense's, per context length, for each sparse method (docs/data/sparse)."""
    fig = _figure()
    ax = fig.add_subplot()
    rows = data["tables"]["main"]["rows"]
    for method, color in (("lychee", "#1b9e77"), ("quest", "#7570b3")):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["context"])
        ax.plot([r["context"] for r in mine], [r["x_dense"] for r in mine], "o-", color=color, label=method)
    ax.axhline(1.0, color="#444444", lw=0.8, ls=":", label="dense")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context tokens (SmolLM2 to 8K, random SmolLM2-shaped model above)")
    ax.set_ylabel("decode tok/s / dense")
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})


def accuracy_intervals(data: dict, path: Path) -> None:
    """Solve rate with its 95% Wilson interval per policy and budget, ToT BFS with legal steps."""
    rows = [r for r in data["tables"]["main"]["rows"] if r["mode"].startswith("ToT BFS, legal")]
    fig = _figure(6.4, 0.4 * len(rows) + 1.0)
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        lo, hi = wilson(r["solved"], r["problems"])
        rate = r["solved"] / r["problems"]
        ax.errorbar([rate], [i], xerr=[[rate - lo], [hi - rate]], fmt="o", color="#1b9e77", capsize=3)
    labels = ["oracle (upper bound)" if "oracle" in r["verifier"] else f"{r['policy']} {r['budget']}" for r in rows]
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"solved (95% Wilson interval), n={rows[0]['problems']} puzzles")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})


def memory_steps(data: dict, path: Path) -> None:
    """Resident device KV per search step for each run of docs/data/memory-steps, with each budget as
    a line, the budgeted runs' host tier dashed, and their branch switches (ticks at the foot) and
    rehydrations (triangles on the curve) marked (the ArborKV paper's Figure 3)."""
    fig = _figure(7.2, 4.0)
    ax = fig.add_subplot()
    steps = data["tables"]["steps"]["rows"]
    colors = ("#444444", "#d95f02", "#1b9e77", "#7570b3")
    for run, color in zip(data["tables"]["main"]["rows"], colors, strict=False):
        mine = [s for s in steps if s["policy"] == run["policy"]]
        x = [s["step"] for s in mine]
        ax.plot(x, [s["device"] for s in mine], color=color, lw=1.6, label=f"{run['policy']}: device")
        if run["budget"] == "none":
            continue
        ax.plot(x, [s["host"] for s in mine], color=color, lw=1.0, ls="--", label=f"{run['policy']}: host tier")
        ax.axhline(run["budget"], color=color, lw=0.8, ls=":", label=f"budget {run['budget']} tokens")
        back = [s for s in mine if s["rehydrations"]]
        ax.plot([s["step"] for s in back], [s["device"] for s in back], "^", color=color, ms=5, label="rehydration")
        switch = [s["step"] for s in mine if s["switches"]]
        ax.plot(switch, [0] * len(switch), "|", color=color, ms=10, label="branch switch")
    ax.set_xlabel("search step (one expansion each)")
    ax.set_ylabel("KV tokens")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False, fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})


def kvp_train(data: dict, path: Path) -> None:
    """KVP training (docs/data/kvp): each loss's training curve, then the held-out retained-mass AUC of
    its weights at every eval against the baselines' (dotted, from the main table)."""
    points = data["tables"]["curve"]["rows"]
    losses = list(dict.fromkeys(p["loss"] for p in points))
    fig = _figure(4.0 * (len(losses) + 1), 3.6)
    colors = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a")
    auc = fig.add_subplot(1, len(losses) + 1, len(losses) + 1)
    for i, (loss, color) in enumerate(zip(losses, colors, strict=False)):
        ax = fig.add_subplot(1, len(losses) + 1, i + 1)
        curve = [p for p in points if p["loss"] == loss and p.get("train_loss") is not None]
        ax.plot([p["step"] for p in curve], [p["train_loss"] for p in curve], color=color)
        ax.set_title(f"training loss: {loss}")
        ax.set_xlabel("step (one sequence, all heads)")
        evals = [p for p in points if p["loss"] == loss and p.get("kvp_head_auc") is not None]
        x = [p["step"] for p in evals]
        auc.plot(x, [p["kvp_head_auc"] for p in evals], "o-", color=color, ms=3, label=f"kvp {loss} (head)")
        auc.plot(x, [p["kvp_token_auc"] for p in evals], "o--", color=color, ms=3, label=f"kvp {loss} (token)")
    base = data["tables"]["main"]["rows"][0]
    for key, color in (("oracle_head", "#444444"), ("knorm_head", "#66a61e"), ("streaming_head", "#a6761d"),
                       ("recency_head", "#999999")):  # fmt: skip
        auc.axhline(base[key], color=color, lw=0.9, ls=":", label=key.replace("_", " (") + ")")
    auc.set_title("held-out retained-mass AUC")
    auc.set_xlabel("step")
    auc.set_ylabel("future attention kept, mean over 10..90%")
    auc.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})


#: a search's shape (:func:`shape_of`): the setting keys a widening changes, each with the reference's value
SHAPE_KEYS = (("controller.breadth", 5), ("controller.n_generate", 5), ("verifier.lookahead", 0),
              ("verifier.trial_values", "model"))  # fmt: skip


def shape_of(setting: str) -> tuple:
    """``controller.breadth=20 controller.n_generate=5`` -> (20, 5, 0, "model"): breadth, thoughts per
    state, value-prompt lookahead and its trial values; a key the setting leaves out is the reference's
    (:data:`SHAPE_KEYS`)."""
    parts = dict(kv.split("=", 1) for kv in setting.split())
    return tuple(type(default)(parts.get(key, default)) for key, default in SHAPE_KEYS)


def _breadth(setting: str) -> str:
    """``controller.breadth=20 controller.n_generate=5`` -> ``b20 x5`` (the reference's empty setting: b5 x5);
    a lookahead names its depth (``b5 x5 k1``) and exact trial values (``b5 x5 k1 exact``)."""
    breadth, thoughts, lookahead, trials = shape_of(setting)
    label = f"b{breadth} x{thoughts}"
    if lookahead:
        label += f" k{lookahead}" + ("" if trials == "model" else f" {trials}")
    return label


#: fixed_memory_scaling's widenings: (label, colour, marker) by what a search widens against the reference
WIDENINGS = {
    "breadth": ("arbor, wider breadth", "#1b9e77", "o-"),
    "thoughts": ("arbor, more thoughts per state", "#7570b3", "D--"),
    "lookahead": ("arbor, lookahead in the value prompt (model's trial values)", "#d95f02", "^-"),
    "lookahead exact": ("arbor, lookahead in the value prompt (exact trial values)", "#e7298a", "v--"),
}


#: the longctx methods the oracle plot draws: suite policy -> (label, colour, marker)
CURVES = {
    "oracle_topk": ("oracle_topk (exact top-k keys)", "#444444", "s-"),
    "lychee": ("lychee", "#1b9e77", "o-"),
    "quest": ("quest", "#7570b3", "^-"),
}


def oracle_curves(data: dict, path: Path) -> None:
    """Against the read share, per context length (columns): answer agreement with dense (95% interval; on
    a few items it has more answers to count than accuracy retained, which counts dense's correct ones only)
    and decode tok/s over dense's, for the exact top-k oracle and each index at the same
    read, over all tasks of the long-context suite (docs/data/longctx-oracle). The gap oracle -> index is
    what the index loses, dense -> oracle what reading that share loses."""
    rows = [r for r in data["summary"] if r["task"] == "all" and r["policy"] in CURVES and r.get("share")]
    lengths = sorted({r["length"] for r in rows})
    fig = _figure(3.4 * len(lengths), 5.2)
    axes = fig.subplots(2, len(lengths), squeeze=False, sharex=True)
    for col, length in enumerate(lengths):
        top, bottom = axes[0][col], axes[1][col]
        for policy, (label, color, fmt) in CURVES.items():
            mine = [r for r in rows if r["policy"] == policy and r["length"] == length]
            mine.sort(key=lambda r: r["share"])
            if not mine:
                continue
            x = [100 * r["share"] for r in mine]
            y = [r["agree"] for r in mine]
            below = [r["agree"] - r["agree_ci"][0] for r in mine]
            above = [r["agree_ci"][1] - r["agree"] for r in mine]
            top.errorbar(x, y, yerr=[below, above], fmt=fmt, color=color, capsize=3, label=label)
            bottom.plot(x, [r["x_dense"] for r in mine], fmt, color=color, label=label)
        n = max((r["items"] for r in rows if r["length"] == length), default=0)
        top.set_title(f"{length:,} tokens, {n} items", fontsize=9)
        top.set_ylim(0, 1.05)
        for ax in (top, bottom):
            ax.axhline(1.0, color="#999999", lw=0.8, ls=":")
        bottom.set_xlabel("read share of the context (%)")
    axes[0][0].set_ylabel("agreement with dense (95% CI)")
    axes[1][0].set_ylabel("decode tok/s / dense")
    axes[0][0].legend(frameon=False, fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})


def widening_of(shape: tuple, ref: tuple) -> str | None:
    """Which of :data:`WIDENINGS` a search of ``shape`` is against the reference's ``ref``: the one key it
    raises with the others alike (lookahead: at either trial values); None for anything else."""
    breadth, thoughts, lookahead, trials = shape
    if lookahead > ref[2] and (breadth, thoughts) == ref[:2]:
        return "lookahead" if trials == "model" else f"lookahead {trials}"
    if shape[2:] != ref[2:]:
        return None
    if breadth > ref[0] and thoughts == ref[1]:
        return "breadth"
    return "thoughts" if thoughts > ref[1] and breadth == ref[0] else None


def fixed_memory_scaling(data: dict, path: Path) -> None:
    """Solved (95% Wilson interval) against the mean seconds a puzzle took, every search run inside
    full's breadth-5 peak device KV (docs/data/e2e-scaling-game24): full's reference search, and each
    arbor widening (wider breadth; more thoughts per state; lookahead in the value prompt, at the model's or the
    exact trial values: :func:`widening_of`) as a curve that starts at the reference, in
    order of time; a search that ran out of memory on every puzzle is a cross at zero."""
    rows = data["tables"]["main"]["rows"]
    ref = next(r for r in rows if r["ratio"] is None)
    fig = _figure(6.4, 3.8)
    ax = fig.add_subplot()

    def point(r: dict) -> tuple[float, float, float, float]:  # x, y, y - low, high - y
        y = r["solved_n"] / r["problems"]
        lo, hi = wilson(r["solved_n"], r["problems"])
        return r["mean_s"], y, y - lo, hi - y

    def draw(runs: list[dict], fmt: str, color: str, label: str, alternate: bool = False, left: bool = False) -> None:
        x, y, below, above = zip(*(point(r) for r in runs), strict=True)
        ax.errorbar(x, y, yerr=[below, above], fmt=fmt, color=color, capsize=3, label=label)
        for i, (r, xi, yi) in enumerate(zip(runs, x, y, strict=True)):
            if r is not ref:  # ``alternate``: labels above / below the curve in turn, so close points stay readable;
                # ``left``: labels to the left, above (a curve whose points sit next to another curve's)
                up = alternate and i % 2 == 1
                ax.annotate(_breadth(r["setting"]), (xi, yi), textcoords="offset points",
                            xytext=(-78, 8) if left else (6, 6) if up else (6, -14), fontsize=8)  # fmt: skip

    ref_shape = shape_of(ref["setting"])
    arbor = [r for r in rows if r["policy"] == "arbor" and r["oom_n"] < r["problems"]]
    for widening, (label, color, fmt) in WIDENINGS.items():
        mine = [r for r in arbor if widening_of(shape_of(r["setting"]), ref_shape) == widening]
        if mine:
            draw([ref, *sorted(mine, key=lambda r: r["mean_s"])], fmt, color, label, alternate=widening == "breadth",
                 left=widening == "lookahead exact")  # fmt: skip
    draw([ref], "s", "#444444", f"full {_breadth(ref['setting'])} (reference, its peak is the budget)")
    ax.annotate(_breadth(ref["setting"]), (ref["mean_s"], ref["solved_n"] / ref["problems"]),
                textcoords="offset points", xytext=(6, -10), fontsize=8)  # fmt: skip
    for r in rows:
        if r["oom_n"] == r["problems"]:
            ax.plot([r["mean_s"]], [0], "x", color="#444444", ms=8, clip_on=False)
            ax.annotate(f"{r['policy']} {_breadth(r['setting'])}: out of memory", (r["mean_s"], 0),
                        textcoords="offset points", xytext=(6, 4), fontsize=8)  # fmt: skip
    ax.set_ylim(0, 1)
    ax.set_xlim(0, 1.2 * max(r["mean_s"] for r in rows))
    ax.set_xlabel("mean seconds per puzzle (1 CPU thread)")
    ax.set_ylabel(f"solved, n={rows[0]['problems']} puzzles (95% CI)")
    where = data.get("settings", {}).get("rows", "")
    ax.set_title(f"Game of 24 rows {where}: every search inside each puzzle's full breadth-5 KV peak", fontsize=9)
    ax.legend(frameon=False, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})


#: file next to the page -> (section whose data it draws, drawing function)
PLOTS: dict[str, tuple[str, Callable[[dict, Path], None]]] = {
    "sparse-speedup.png": ("sparse", sparse_speedup),
    "longctx-oracle-curves.png": ("longctx-oracle", oracle_curves),
    "accuracy-intervals.png": ("accuracy", accuracy_intervals),
    "memory-steps.png": ("memory-steps", memory_steps),
    "kvp-train.png": ("kvp", kvp_train),
    "fixed-memory-scaling.png": ("e2e-scaling-game24", fixed_memory_scaling),
    "lookahead-game24.png": ("e2e-lookahead-game24", fixed_memory_scaling),
}


def draw_all(data: dict[str, dict], folder: Path) -> list[Path]:
    """Every plot whose section has data, into ``folder``; returns the paths written."""
    out = []
    for name, (section, draw) in PLOTS.items():
        if section in data:
            draw(data[section], folder / name)
            out.append(folder / name)
    return out
