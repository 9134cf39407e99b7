"""The KVP training curve: loss per step and held-out retained-mass AUC per evaluation."""

from __future__ import annotations

from pathlib import Path

from research.kvp.train import TrainResult


def _smooth(xs: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x - (xs[i - window] if i >= window else 0.0)
        out.append(acc / min(i + 1, window))
    return out


def plot_training(result: TrainResult, final: dict[str, float], path: Path, loss: str) -> Path:
    """Two panels: the training loss (moving average over 25 steps), and the held-out AUC of the
    scorer per evaluation with the heuristics and the oracle as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(range(1, len(result.losses) + 1), _smooth(result.losses, 25))
    left.set(xlabel="step (one sequence, all heads)", ylabel=f"{loss} loss", title="training loss")
    steps = [s for s, _ in result.evals]
    for level, style in (("head", "-"), ("token", "--")):
        right.plot(steps, [m[f"kvp/{level}_auc"] for _, m in result.evals], style, marker="o", label=f"kvp ({level})")
    names = sorted({k.split("/")[0] for k in final} - {"kvp"})
    for i, name in enumerate(names):
        right.axhline(final[f"{name}/head_auc"], color=f"C{i + 2}", linestyle=":", label=f"{name} (head)")
    right.set(
        xlabel="step", ylabel="retained future attention, mean over budgets 10..90%", title="held-out retained-mass AUC"
    )
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
