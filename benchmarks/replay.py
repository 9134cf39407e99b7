"""Teacher-forced replay of a recorded search under any policy and budget, in lockstep with ``full``.

Every replayed run rebuilds the recorded tree in the recorded order on a fresh runtime: the root
from its recorded text (the ids must tokenize back the same), each child with
``append_ids(parent, child_ids)``, then the recorded releases and values. An ``expand`` of k
children becomes k appends, one block in flight at a time: in the recorded batch all k rows'
tokens were on the device together and the policy could act only before and after the batch;
in the replay it acts between children. Under ``full`` without a budget both peaks are the same
(the working tokens become the stored blocks); budgets are fractions of the replay's full peak
(:meth:`Trace.full_replay_peak`). An expand that served several parents also adds branch
switches in the replay (one per parent after the first).

An unbounded ``full`` reference runs in lockstep: after each append, each run's (T, V)
next-token log-probs are compared with the reference's at once, so only per-position
statistics are kept (a 49k vocabulary makes whole distributions expensive to hold).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, NamedTuple

import torch

from arbor_runtime import BudgetError, KVBudgetExceeded, Node, Runtime, build_policy
from arbor_runtime.loading import LoadedModel
from arbor_runtime.policies import POLICIES
from benchmarks.trace import ReplayOp, Trace

log = logging.getLogger(__name__)

#: budgets as fractions of the trace's full replay peak (ArborKV Table 1 style)
DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
DEFAULT_POLICIES = ("full", "h2o", "streaming", "thinkv", "arbor")
#: every memory policy, the random baseline first (the below-the-floor comparison, issue 44)
ALL_POLICIES = ("random", "h2o", "streaming", "snapkv", "thinkv", "kvp", "arbor")
OOM_ERRORS = (KVBudgetExceeded, BudgetError)


class BlockRef(NamedTuple):
    """The full reference's view of one appended block (computed once, shared by every run).

    logp: (T, V) log-probs predicting each token; probs: (T, V) their exp; top: (T,) argmax;
    tokens: (T,) the recorded ids; token_logp: (T,) their log-probs; recorded: the trace's log-probs.
    """

    logp: torch.Tensor
    probs: torch.Tensor
    top: torch.Tensor
    tokens: torch.Tensor
    token_logp: torch.Tensor
    recorded: list[float]

    @classmethod
    def of(cls, logp: torch.Tensor, token_ids: list[int], recorded: list[float]) -> BlockRef:
        tokens = torch.tensor(token_ids, device=logp.device)
        token_logp = logp.gather(-1, tokens.view(-1, 1)).squeeze(-1)
        return cls(logp, logp.exp(), logp.argmax(-1), tokens, token_logp, recorded)


@dataclass(slots=True)
class Fidelity:
    """Per-position agreement of a run's next-token distributions with the full reference, and of
    its log-probs of the recorded tokens with the recorded ones (``recorded_max_abs_diff``).

    ``max_abs_dlogp`` is the largest change of any log-prob (every position, whole vocabulary) and
    ``scale`` the largest |log-prob| of the reference it was measured against (rounding grows with it).
    """

    positions: int = 0
    top1_agree: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0
    dll_sum: float = 0.0
    recorded_max_abs_diff: float = 0.0
    max_abs_dlogp: float = 0.0
    scale: float = 0.0
    #: compared with the reference (False for the reference itself: only with the recording)
    compared: bool = False

    def add(self, ref: BlockRef, logp: torch.Tensor) -> None:
        """Score one block: ``logp`` (T, V) is this run's log-probs for the block's T positions."""
        self.compared = True
        self.positions += int(ref.tokens.numel())
        self.top1_agree += int((logp.argmax(-1) == ref.top).sum())
        kl = (ref.probs * (ref.logp - logp)).sum(-1).clamp_min(0.0)  # (T,) KL(full || run)
        self.kl_sum += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()))
        self.max_abs_dlogp = max(self.max_abs_dlogp, float((logp - ref.logp).abs().max()))
        self.scale = max(self.scale, float(ref.logp.abs().max()))
        mine = logp.gather(-1, ref.tokens.view(-1, 1)).squeeze(-1)  # (T,)
        self.dll_sum += float((mine - ref.token_logp).sum())
        self._recorded(ref, mine)

    def add_recorded(self, ref: BlockRef, logp: torch.Tensor) -> None:
        """Score one block against the recorded log-probs only (the full reference itself: comparing it
        with itself would say nothing); the reference columns stay None."""
        self.positions += int(ref.tokens.numel())
        self._recorded(ref, logp.gather(-1, ref.tokens.view(-1, 1)).squeeze(-1))

    def _recorded(self, ref: BlockRef, mine: torch.Tensor) -> None:
        if ref.recorded:
            diff = (mine.double().cpu() - torch.tensor(ref.recorded, dtype=torch.float64)).abs().max()
            self.recorded_max_abs_diff = max(self.recorded_max_abs_diff, float(diff))

    def to_dict(self) -> dict[str, Any]:
        n = max(self.positions, 1)
        seen = self.positions and self.compared
        return {
            "positions": self.positions,
            "top1_agreement": self.top1_agree / n if seen else None,
            "mean_kl": self.kl_sum / n if seen else None,
            "max_kl": self.kl_max if seen else None,
            "mean_dll": self.dll_sum / n if seen else None,
            "recorded_max_abs_diff": self.recorded_max_abs_diff,
            "max_abs_dlogp": self.max_abs_dlogp if self.compared else None,
        }


@dataclass(eq=False, slots=True)
class ReplayRun:
    """One policy at one budget, replaying a trace; collects fidelity, memory series and metrics.

    Attributes:
        policy: policy name (see ``arbor_runtime.policies.POLICIES``); policy_kwargs: its extra fields.
        budget_tokens: the budget (None = unbounded); fraction: the budget as a share of the full peak.
        nodes: recorded node id -> replayed node.
        seconds: wall time inside this run's runtime calls.
        error: the OOM message when the run ran out of budget (the run stops there).
        steps: memory after each runtime call (new_tree / append / release), JSON-friendly dicts.
        metrics: the runtime's final ``metrics.to_dict()``.
    """

    policy: str
    budget_tokens: int | None = None
    fraction: float | None = None
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    rt: Runtime | None = None
    nodes: dict[int, Node] = field(default_factory=dict)
    fidelity: Fidelity = field(default_factory=Fidelity)
    seconds: float = 0.0
    error: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    _logp: torch.Tensor | None = None

    @property
    def oom(self) -> bool:
        return self.error is not None

    def start(self, loaded: LoadedModel) -> None:
        name, fields = policy_variant(self.policy)
        policy = build_policy(name, budget_tokens=self.budget_tokens, **fields, **self.policy_kwargs)
        self.rt = Runtime(loaded, policy=policy)
        self.rt.logits_hook = self._hook

    def apply(self, op: ReplayOp, trace: Trace) -> torch.Tensor | None:
        """Carry out one replay op; returns the (T, V) log-probs of an appended block, else None.

        An OOM marks the run (``error``) and frees its runtime; later ops are skipped.
        """
        if self.rt is None:
            return None
        self._logp = None
        points, start = len(self.rt.metrics.trace), time.perf_counter()
        try:
            self._call(op, trace)
        except OOM_ERRORS as exc:
            self.seconds += time.perf_counter() - start
            self.error = str(exc)
            self._note_step(op, fresh=len(self.rt.metrics.trace) > points, oom=True)
            self.finish()
            return None
        self.seconds += time.perf_counter() - start
        if op.op != "set_value":
            self._note_step(op)
        return self._logp

    def finish(self) -> None:
        """Keep the final metrics and drop the runtime (its KV) for good."""
        if self.rt is not None:
            self.metrics = self.rt.metrics.to_dict()
            self.rt, self.nodes = None, {}

    def row(self) -> dict[str, Any]:
        """Flat JSON-friendly summary (the memory series is in ``steps``)."""
        m = self.metrics
        keys = (
            "peak_device_tokens", "peak_device_bytes", "peak_host_tokens", "peak_host_bytes", "rehydrations",
            "rehydrated_tokens", "evicted_tokens", "dropped_tokens", "recomputed_tokens", "prefill_tokens",
            "forward_calls", "model_seconds", "runtime_seconds", "branch_switch_events",
        )  # fmt: skip
        out = {"policy": self.policy, "budget_fraction": self.fraction, "budget_tokens": self.budget_tokens}
        out |= {"oom": self.oom, "error": self.error, "replayed_steps": len(self.steps)}
        out |= self.fidelity.to_dict()
        out |= {k: m.get(k) for k in keys}
        runtime = m.get("runtime_seconds") or 0.0
        out["overhead_fraction"] = (runtime - m.get("model_seconds", 0.0)) / runtime if runtime else None
        out["seconds"] = self.seconds
        return out

    # ---- internals -----------------------------------------------------------------------
    def _hook(self, node: Node, logp: torch.Tensor) -> None:
        self._logp = logp

    def _call(self, op: ReplayOp, trace: Trace) -> None:
        rt = self.rt
        if op.op == "new_tree":
            rec = trace.nodes[op.node]
            ids = rt.tokenizer(rec.text, add_special_tokens=True)["input_ids"]
            if ids != rec.token_ids:
                raise ValueError(
                    f"root {op.node}: re-tokenizing its recorded text gives {len(ids)} ids that differ "
                    f"from the {len(rec.token_ids)} recorded ones; the trace was made with another tokenizer"
                )
            examples = trace.oplog[op.source].get("examples")  # the few-shot span the search marked
            self.nodes[op.node] = rt.new_tree_ids(ids, rec.text, examples=None if examples is None else tuple(examples))
        elif op.op == "append":
            rec = trace.nodes[op.child]
            self.nodes[op.child] = rt.append_ids(self.nodes[op.node], rec.token_ids, rec.text)
        elif op.op == "release":
            rt.release(self.nodes[op.node])
        elif op.op == "compress":
            rt.compress(int(op.value))
        else:
            rt.set_value(self.nodes[op.node], op.value)

    def _note_step(self, op: ReplayOp, fresh: bool = True, oom: bool = False) -> None:
        """Memory after the call; an op refused before it started (``fresh`` False) shows the store."""
        rt, m = self.rt, self.rt.metrics
        if fresh:
            p = m.trace[-1]
            resident, peak, host = p.resident_tokens, p.peak_tokens, p.host_tokens
        else:
            resident = peak = rt.store.resident_tokens
            host = rt.store.host_tokens
        self.steps.append(
            {
                "step": len(self.steps),
                "source": op.source,
                "op": op.op,
                "resident_tokens": resident,
                "peak_tokens": peak,
                "host_tokens": host,
                "rehydrations": m.rehydrations,
                "evicted_tokens": m.evicted_tokens,
                "branch_switch_events": m.branch_switch_events,
                "oom": oom,
            }
        )


def replay_lockstep(loaded: LoadedModel, trace: Trace, runs: Sequence[ReplayRun]) -> list[ReplayRun]:
    """Replay ``trace`` under every run and an unbounded ``full`` reference, op by op.

    Returns:
        [reference, *runs]; each run's ``fidelity`` compares it with the reference on every
        recorded position, and ``fidelity.recorded_max_abs_diff`` with the recorded log-probs; the
        reference's compares it with the recorded log-probs only.
    """
    _check_model(loaded, trace)
    ref = ReplayRun("full")
    everyone = [ref, *runs]
    for run in everyone:
        run.start(loaded)
    for op in trace.replay_ops():
        ref_logp = ref.apply(op, trace)
        block = None
        if ref_logp is not None:
            rec = trace.nodes[op.child]
            block = BlockRef.of(ref_logp, rec.token_ids, rec.logprobs)
        if block is not None:  # the reference against the recording only: never against itself
            ref.fidelity.add_recorded(block, ref_logp)
        for run in runs:
            logp = run.apply(op, trace)
            if logp is not None and block is not None:
                run.fidelity.add(block, logp)
    for run in everyone:
        run.finish()
    return everyone


def replay_trace(
    loaded: LoadedModel, trace: Trace, policy: str = "full", budget_tokens: int | None = None, **policy_kwargs: Any
) -> ReplayRun:
    """Replay ``trace`` under one policy and budget; fidelity is measured against full (lockstep)."""
    run = ReplayRun(policy, budget_tokens, policy_kwargs=policy_kwargs)
    replay_lockstep(loaded, trace, [run])
    return run


def budgets_for(trace: Trace, fractions: Sequence[float]) -> dict[float, int]:
    """Budget tokens per fraction of the trace's full replay peak."""
    bad = [f for f in fractions if not 0 < f]
    if bad:
        raise ValueError(f"budget fractions {bad} must be > 0 (e.g. 0.1, 0.5, 0.9)")
    peak = trace.full_replay_peak()
    return {float(f): max(1, int(f * peak)) for f in fractions}


def compare_policies(
    loaded: LoadedModel,
    trace: Trace,
    policies: Sequence[str] = DEFAULT_POLICIES,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    policy_kwargs: dict[str, dict[str, Any]] | None = None,
    on_group: Callable[[str], None] | None = None,
    together: bool = False,
) -> list[ReplayRun]:
    """Every policy at every budget fraction; one lockstep group (all budgets + full) per policy, or,
    ``together``, one group for every policy (the reference replayed once; every run's KV held at once).

    Returns:
        the unbounded full reference (from the first group), then one run per (policy, fraction).
    """
    budgets = budgets_for(trace, fractions)
    out: list[ReplayRun] = []
    groups = [list(policies)] if together else [[name] for name in policies]
    for names in groups:
        runs = [
            ReplayRun(name, b, f, dict((policy_kwargs or {}).get(name, {})))
            for name in names
            for f, b in budgets.items()
        ]
        ref, *done = replay_lockstep(loaded, trace, runs)
        if not out:
            ref.fraction = 1.0
            out.append(ref)
        out += done
        if on_group is not None:
            on_group(",".join(names))
    return out


def policy_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """A policy name with fields set, ``NAME[:FIELD=VALUE...]`` (``arbor:msve=off``,
    ``arbor:topology=false:pins=sinks+parent``), as the name and its fields, each value read as the
    field's default is typed: a switch by its words (true/false, on/off, ...), a number, a list of
    ``+``-joined items (``pins=`` is the empty list), else text. ValueError naming what is wrong."""
    name, *settings = spec.split(":")
    if name not in POLICIES:
        raise ValueError(f"policy {spec!r}: unknown {name!r}; valid: {', '.join(sorted(POLICIES))}")
    defaults = {f.name: f.default for f in dataclass_fields(POLICIES[name]) if f.init}
    out: dict[str, Any] = {}
    for setting in settings:
        key, eq, text = setting.partition("=")
        if not eq or key not in defaults or key == "budget_tokens":
            valid = ", ".join(sorted(k for k in defaults if k != "budget_tokens"))
            raise ValueError(f"policy {spec!r}: {setting!r} is not FIELD=VALUE of {name}; fields: {valid}")
        out[key] = _typed(text, defaults[key], f"policy {spec!r}: {key}")
    return name, out


def _typed(text: str, default: Any, where: str) -> Any:
    """``text`` read as ``default`` is typed (see :func:`policy_variant`)."""
    if isinstance(default, bool):
        from arbor_cli.switches import parse_switch

        return parse_switch(text, where)
    if isinstance(default, tuple | list):
        return [item for item in text.split("+") if item]
    if isinstance(default, int | float) or (default is None and _is_number(text)):
        try:
            return int(text) if text.lstrip("-").isdigit() else float(text)
        except ValueError:
            raise ValueError(f"{where}={text!r} is not a number") from None
    return None if text in ("null", "none", "None") else text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def trace_fields(trace: Trace) -> dict[str, Any]:
    """Columns that name the trace in result rows."""
    meta = trace.meta
    return {
        "model": trace.model,
        "task": meta.get("task"),
        "problem": meta.get("index"),
        "controller": meta.get("controller"),
        "full_replay_peak": trace.full_replay_peak(),
        "recorded_peak": trace.metrics.get("peak_device_tokens"),
    }


def _check_model(loaded: LoadedModel, trace: Trace) -> None:
    if loaded.spec != trace.model:
        log.warning(
            "replaying a trace recorded on %r with model %r: recorded log-probs will differ", trace.model, loaded.spec
        )
    recorded = trace.meta.get("weights")
    if recorded is not None and recorded != loaded.weights:
        log.warning(
            "replaying a trace recorded with weights=%s at weights=%s: recorded log-probs will differ",
            recorded,
            loaded.weights,
        )
