"""Memory over search steps (ArborKV Figure 3 analog): resident device KV per step, per policy.

Every policy replays the same trace at the same budget in lockstep, so step i is the same
runtime call for all of them. ``full`` is drawn without a budget (bounded it would stop at its
OOM). Markers: branch switches (grey vertical lines, from the event log), rehydrations (dots on
the policy's line, from the store counters per step), OOM (a cross where a run stopped).
A dotted line in a policy's color shows its host-tier tokens (offloaded, not dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arbor_runtime.loading import LoadedModel
from benchmarks.replay import ReplayRun, replay_lockstep
from benchmarks.trace import Trace

COLORS = {"full": "#444444", "h2o": "#d95f02", "streaming": "#7570b3", "thinkv": "#e7298a", "arbor": "#1b9e77"}


def memory_series(run: ReplayRun) -> dict[str, Any]:
    """A replayed run's memory per step, with the steps where something happened.

    Returns:
        lists ``step``, ``resident_tokens``, ``peak_tokens``, ``host_tokens``; the steps with a
        branch switch (``branch_switch_steps``) or a rehydration (``rehydration_steps``);
        ``oom_step`` (None when the run finished) and the run's ``budget_tokens``.
    """
    steps = run.steps
    out: dict[str, Any] = {k: [s[k] for s in steps] for k in ("step", "resident_tokens", "peak_tokens", "host_tokens")}
    out["branch_switch_steps"] = _increments(steps, "branch_switch_events")
    out["rehydration_steps"] = _increments(steps, "rehydrations")
    out["oom_step"] = next((s["step"] for s in steps if s["oom"]), None)
    out["budget_tokens"] = run.budget_tokens
    return out


def memory_panels(
    loaded: LoadedModel, trace: Trace, policies: Sequence[str], budgets: Sequence[tuple[int, float | None]]
) -> list[dict[str, Any]]:
    """One panel per (budget_tokens, fraction): every policy's series at that budget.

    ``full`` (when listed) is the unbounded lockstep reference.
    """
    panels = []
    for budget, fraction in budgets:
        runs = [ReplayRun(p, budget, fraction) for p in policies if p != "full"]
        ref, *runs = replay_lockstep(loaded, trace, runs)
        series = {"full": memory_series(ref)} if "full" in policies else {}
        series |= {r.policy: memory_series(r) for r in runs}
        panels.append({"budget_tokens": budget, "fraction": fraction, "series": series})
    return panels


def plot_memory(panels: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> list[dict[str, Any]]:
    """Draw the panels side by side into a PNG at ``path``; returns the plotted panels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not panels:
        raise ValueError("plot_memory needs at least one panel")
    fig = Figure(figsize=(6.0 * len(panels) + 1.8, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels, strict=True):
        _draw_panel(ax, panel)
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: lines stay visible
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return list(panels)


def _draw_panel(ax, panel: dict[str, Any]) -> None:
    from matplotlib.ticker import MaxNLocator

    series = panel["series"]
    switches = next(iter(series.values()), {}).get("branch_switch_steps", [])
    for i, s in enumerate(switches):
        ax.axvline(s, color="0.85", lw=0.8, zorder=0, label="branch switch" if i == 0 else None)
    for i, (name, s) in enumerate(series.items()):
        label = "full (no budget)" if name == "full" else name
        lw = max(3.2 - 0.5 * i, 1.0)  # earlier lines wider: policies that coincide stay visible
        (line,) = ax.plot(
            s["step"], s["resident_tokens"], lw=lw, color=COLORS.get(name), label=label, drawstyle="steps-post"
        )
        color = line.get_color()
        if max(s["host_tokens"], default=0) > 0:
            ax.plot(s["step"], s["host_tokens"], lw=1.0, ls=":", color=color, drawstyle="steps-post")
        rehyd = [(x, s["resident_tokens"][x]) for x in s["rehydration_steps"]]
        if rehyd:
            ax.scatter(*zip(*rehyd, strict=True), s=14, color=color, zorder=3, marker="o")
        if s["oom_step"] is not None:
            ax.scatter([s["oom_step"]], [s["resident_tokens"][s["oom_step"]]], s=60, color=color, marker="x", zorder=4)
    if panel["budget_tokens"] is not None:
        ax.axhline(panel["budget_tokens"], color="black", ls="--", lw=1, label="budget")
    ax.scatter([], [], s=14, color="0.3", marker="o", label="rehydration")
    if any(max(s["host_tokens"], default=0) > 0 for s in series.values()):
        ax.plot([], [], lw=1.0, ls=":", color="0.3", label="host tier (offloaded)")
    frac = panel.get("fraction")
    ax.set_title(f"budget {panel['budget_tokens']} tokens" + (f" ({frac:g} of full peak)" if frac else ""))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("search step (runtime call)")
    ax.set_ylabel("resident device KV (tokens)")


def _increments(steps: Sequence[dict[str, Any]], key: str) -> list[int]:
    """Steps where the cumulative counter ``key`` went up."""
    out, prev = [], 0
    for s in steps:
        if s[key] > prev:
            out.append(s["step"])
        prev = s[key]
    return out
