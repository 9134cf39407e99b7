"""Scoring a fixed set of continuations of one node (SGLang's ``select``) on the tree's KV.

``Runtime.choose(node, choices)`` teacher-forces k candidate continuations in one batched forward:
k rows, right-padded to the longest choice, whose context is ``node``'s path (one context group
shared by every row, so the path is read once per layer). Padded positions come after a row's
real tokens, so causal attention never lets a real token see them; their KV is not stored
(``write_slots`` -1) and their logits are ignored. A choice's first token is scored by the node's
stored next-token logits, the others by the forward. Choices that are all one token long need no
forward at all.

Kept choices become forced children of ``node`` with their KV written during that same forward
(their slots admitted first: the pass asks the scheduler for them as a prefill does, by yielding a
:class:`~arbor_runtime.engine.scheduler.Request`), so a chosen step is a block like any other.
When the caller asks for "the best k" the kept rows are only known after scoring: a second,
smaller forward then prefills just those (as ``append`` would). A pass works through the runtime's
:class:`~arbor_runtime.engine.prefill.Prefiller` and its collaborators, never the runtime.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from arbor_runtime.engine.scheduler import Request
from arbor_runtime.kv import BlockKV
from arbor_runtime.tree import FORCED, Node

if TYPE_CHECKING:
    from arbor_runtime.engine.prefill import Prefiller

#: how choices are ranked and normalized
RANKINGS = ("sum", "mean")


@dataclass(slots=True)
class ChoiceScores:
    """What :meth:`Runtime.choose` found, one entry per choice in the order given.

    Attributes:
        choices / token_ids: the choices and their tokens.
        token_logprobs: per-token log-probabilities under the model (raw distribution).
        total / mean: their sum and mean per token.
        probs_sum / probs_mean: softmax of ``total`` / ``mean`` over the choices (each sums to 1).
        by: "sum" or "mean", what ``probs`` and ``order`` use.
        kept: the children made of kept choices, in ``keep`` order (best first for an int ``keep``).
        kept_index: the choice index of each kept child.
    """

    choices: list[str]
    token_ids: list[list[int]]
    token_logprobs: list[list[float]]
    by: str = "sum"
    kept: list[Node] = field(default_factory=list)
    kept_index: list[int] = field(default_factory=list)

    @property
    def total(self) -> list[float]:
        return [math.fsum(lp) for lp in self.token_logprobs]

    @property
    def mean(self) -> list[float]:
        return [t / len(lp) for t, lp in zip(self.total, self.token_logprobs, strict=True)]

    @property
    def probs_sum(self) -> list[float]:
        return _softmax(self.total)

    @property
    def probs_mean(self) -> list[float]:
        return _softmax(self.mean)

    @property
    def probs(self) -> list[float]:
        """The choice distribution under ``by``."""
        return self.probs_sum if self.by == "sum" else self.probs_mean

    @property
    def order(self) -> list[int]:
        """Choice indices best first under ``by`` (ties keep the given order)."""
        score = self.total if self.by == "sum" else self.mean
        return sorted(range(len(score)), key=lambda i: -score[i])

    def to_json(self) -> dict:
        """Plain dict for logs (kept children by node id)."""
        return {
            "choices": self.choices, "by": self.by, "total": self.total, "mean": self.mean,
            "probs_sum": self.probs_sum, "probs_mean": self.probs_mean, "kept": [n.id for n in self.kept],
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class ChoosePlan:
    """Validated input of one ``choose`` call: the tokens of each choice and what to keep."""

    choices: list[str]
    token_ids: list[list[int]]
    keep_given: tuple[int, ...]  # indices kept by the caller's list
    keep_best: int  # or: keep the best this many once scored
    by: str

    @classmethod
    def build(cls, tokenizer, node: Node, choices: Sequence[str], keep: int | Sequence[int], by: str) -> ChoosePlan:
        """Tokenize and check; ValueError with one line naming the bad value."""
        if isinstance(choices, str) or not choices:
            raise ValueError(f"choose needs a non-empty list of choices for {node!r}, got {choices!r}")
        choices = [str(c) for c in choices]
        if len(set(choices)) != len(choices):
            dup = next(c for c in choices if choices.count(c) > 1)
            raise ValueError(f"choose: choice {dup!r} is given twice (choices must be distinct)")
        ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in choices]
        for c, t in zip(choices, ids, strict=True):
            if not t:
                raise ValueError(f"choose: choice {c!r} tokenizes to nothing")
        if by not in RANKINGS:
            raise ValueError(f"choose: by={by!r} must be one of {', '.join(RANKINGS)}")
        given, best = _keep(keep, len(choices))
        return cls(choices, ids, given, best, by)


@dataclass(eq=False, slots=True)
class ChooseWork:
    """One batched forward of some choices under ``node`` (run by the engine's driver).

    ``rows`` are the choice indices forwarded; ``write`` those among them whose KV is stored as
    kept children. Returns (token log-probs per row, kept children in ``write`` order). Its
    collaborators are the prefiller's (store, memory manager, node table, runner, accounts, planner).
    """

    prefiller: Prefiller
    node: Node
    ids: list[list[int]]
    rows: list[int]
    write: list[int]
    texts: list[str]
    begun: bool = False

    def demand(self) -> tuple[Node, int]:
        """(path end, slots) this pass needs: the node's path and the kept choices' tokens."""
        return self.node, sum(len(self.ids[i]) for i in self.write)

    def check(self) -> None:
        """Its node is still live (NodeError when another operation released it)."""
        self.prefiller.table.check_live(self.node)

    def __call__(self) -> Generator[Request, int, tuple[dict[int, list[float]], list[Node]]]:
        self.check()
        return self._run()

    def _run(self) -> Generator[Request, int, tuple[dict[int, list[float]], list[Node]]]:
        pf, node = self.prefiller, self.node
        if not self.begun:
            pf.memory.begin([node], pf.accounts.work.account)
            self.begun = True
        prev = pf.store.get(node.id).next_logits.float()  # (V,)
        if all(len(self.ids[i]) == 1 for i in self.rows) and not self.write:
            logp = torch.log_softmax(prev, dim=-1)
            return {i: [float(logp[self.ids[i][0]])] for i in self.rows}, []
        # the path made whole (where the policy keeps it whole) and the kept choices' slots, or
        # wait / fail (the scheduler's answer; the executor recomputes what the path lacks)
        yield Request(node, sum(len(self.ids[i]) for i in self.write), "choose")
        extents = {i: pf.store.pool.alloc(len(self.ids[i])) for i in self.write}
        pf.accounts.note_peak()
        try:
            logits, batch = self._forward(extents)
        except BaseException:
            pf.runner.free_slots([e for ext in extents.values() for e in ext])
            raise
        pf.runner.take_attention(batch)
        scores, made = {}, {}
        for r, i in enumerate(self.rows):
            n = len(self.ids[i])
            dists = torch.cat([prev.unsqueeze(0), logits[r, : n - 1].float()])  # (n, V): predicts token j
            logp = torch.log_softmax(dists, dim=-1)
            scores[i] = logp.gather(-1, torch.tensor(self.ids[i]).view(-1, 1)).squeeze(-1).tolist()
            if i in extents:
                own = None if batch.own_mass is None else batch.own_mass[r, :n]
                heads = None if batch.own_head_mass is None else batch.own_head_mass[r, ..., :n]
                made[i] = self._child(i, extents[i], logp, scores[i], logits[r, n - 1], own, heads)
        kept = [made[i] for i in self.write]
        self._count(kept)
        if kept:
            pf.memory.after([node], kept, forced=True, running=pf.owners())
        pf.accounts.note_peak()
        return scores, kept

    def _forward(self, extents) -> tuple[torch.Tensor, object]:
        """(R, L, V) logits of the rows, right-padded to the longest; kept rows' KV written to their slots."""
        pf, node = self.prefiller, self.node
        width = max(len(self.ids[i]) for i in self.rows)
        ids = torch.zeros(len(self.rows), width, dtype=torch.long)
        write = torch.full((len(self.rows), width), -1, dtype=torch.long)
        for r, i in enumerate(self.rows):
            n = len(self.ids[i])
            ids[r, :n] = torch.tensor(self.ids[i])
            if i in extents:
                write[r, :n] = torch.cat([torch.arange(e.start, e.end) for e in extents[i]])
        context = [a.id for a in node.kv_path()]
        stats = pf.planner.records_statistics([(node, sum(len(self.ids[i]) for i in self.write))])
        batch = pf.runner.batch([context] * len(self.rows), width, write, stats=stats)
        positions = torch.arange(node.end_pos, node.end_pos + width).expand(len(self.rows), width)
        return pf.runner.forward(batch, ids, positions, 0), batch

    def _child(
        self, i: int, extents, logp: torch.Tensor, lps: list[float], last: torch.Tensor, own, heads=None
    ) -> Node:
        """A kept choice as a forced child block (its KV is already in its slots)."""
        pf, n = self.prefiller, len(self.ids[i])
        child = pf.new_node(self.node, self.ids[i], self.texts[i], FORCED, self.node.end_pos)
        child.logprobs = lps
        child.entropies = (-(logp.exp() * logp).sum(-1)).tolist()
        pf.store.put(child.id, BlockKV.from_extents(extents, child.start_pos, last.float().cpu().clone()))
        if own is not None:  # causal: a block's own queries see half of it on average
            pf.store.add_attention(child.id, torch.arange(n), own, n / 2)
        if heads is not None:
            pf.store.add_head_attention(child.id, torch.arange(n), heads)
        if pf.logits_hook is not None:
            pf.logits_hook(child, logp)
        pf.memory.node_end(child)
        return child

    def _count(self, kept: list[Node]) -> None:
        kept_tokens = sum(c.length for c in kept)
        scored = sum(len(self.ids[i]) for i in self.rows) - kept_tokens
        for m in self.prefiller.accounts.targets():
            m.prefill_tokens += kept_tokens
            m.scored_tokens += scored


def _keep(keep: int | Sequence[int], k: int) -> tuple[tuple[int, ...], int]:
    """(indices given, best count) from ``keep``; ValueError for anything else."""
    if isinstance(keep, bool):
        raise ValueError(f"choose: keep={keep!r} must be an int (keep the best n) or a list of choice indices")
    if isinstance(keep, int):
        if not 0 <= keep <= k:
            raise ValueError(f"choose: keep={keep} must be in 0..{k} (the number of choices)")
        return (), keep
    given = tuple(keep)
    if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < k for i in given):
        raise ValueError(f"choose: keep={list(given)!r} must hold choice indices in 0..{k - 1}")
    if len(set(given)) != len(given):
        raise ValueError(f"choose: keep={list(given)!r} names a choice twice")
    return given, 0


def _softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = math.fsum(exps)
    return [e / total for e in exps]
