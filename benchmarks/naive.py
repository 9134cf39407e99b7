"""Naive Tree-of-Thought: the search API served as the reference ToT code serves it.

The reference code (princeton-nlp/tree-of-thought-llm) sends every node's whole prompt to the
model for each generation: ``n`` samples of a node are one request, nothing is kept between
requests. :class:`NaiveRuntime` offers the calls controllers and verifiers make (``new_tree``,
``expand_many``, ``append``, ``choose``, ``set_value``, ``release``) on top of ``transformers``' ``generate``
doing exactly that, so the same controller code runs either way and the end-to-end speed of the
two can be compared on the same problems.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from arbor_runtime import Node, SamplingParams
from arbor_runtime.choose import ChoiceScores, ChoosePlan
from arbor_runtime.loading import LoadedModel
from arbor_runtime.metrics import RuntimeMetrics
from arbor_runtime.tree import FORCED, GENERATED, PROMPT


class NaiveRuntime:
    """The runtime's search API, every call a fresh ``generate`` / forward over the whole path."""

    def __init__(self, loaded: LoadedModel, seed: int = 0) -> None:
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.device = next(self.model.parameters()).device
        self.metrics = RuntimeMetrics()
        self.nodes: dict[int, Node] = {}
        self.all_nodes: dict[int, Node] = {}
        self.seed = seed
        self._next_id = 0

    def new_tree(self, prompt: str, seed: int | None = None, examples: tuple[int, int] | None = None) -> Node:
        """A root of ``prompt`` (``examples`` is accepted and unused: naive ToT keeps no KV to manage)."""
        ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        if seed is not None:
            torch.manual_seed(seed)
        return self._node(None, ids, prompt, PROMPT)

    def expand(self, node: Node, n: int = 1, sampling: SamplingParams | None = None) -> list[Node]:
        return self.expand_many([(node, n)], sampling)[0]

    @torch.inference_mode()
    def expand_many(
        self,
        requests: Sequence[tuple[Node, int]],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ):
        """One ``generate`` call per requested node, its ``n`` samples together; the path re-sent.
        ``sampling``: one set of parameters for all requests, or one per request."""
        if sampling is None or isinstance(sampling, SamplingParams):
            sampling = [sampling or SamplingParams()] * len(requests)
        if any(p.constrained for p in sampling):
            raise ValueError("naive ToT runtime: regex / grammar sampling is not supported (use task.propose=sample)")
        return [self._generate(node, n, p) for (node, n), p in zip(requests, sampling, strict=True)]

    @torch.inference_mode()
    def append(self, node: Node, text: str) -> Node:
        """A forced block, scored by one forward over the whole path."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        path = self.path_token_ids(node) + ids
        start = time.perf_counter()
        logits = self.model(input_ids=torch.tensor([path], device=self.device), logits_to_keep=len(ids) + 1).logits
        self._count(time.perf_counter() - start, prefill=len(path))
        logp = torch.log_softmax(logits[0, :-1].float(), dim=-1)
        child = self._node(node, ids, text, FORCED)
        child.logprobs = logp.gather(-1, torch.tensor(ids, device=self.device).view(-1, 1)).squeeze(-1).tolist()
        return child

    @torch.inference_mode()
    def choose(
        self, node: Node, choices: Sequence[str], keep: int | Sequence[int] = 0, by: str = "sum"
    ) -> ChoiceScores:
        """Score each choice by its own forward over the whole path plus the choice (as a naive
        client scoring options one request each would); kept choices become forced children."""
        plan = ChoosePlan.build(self.tokenizer, node, choices, keep, by)
        scores = [self._score(node, ids) for ids in plan.token_ids]
        result = ChoiceScores(plan.choices, plan.token_ids, scores, plan.by)
        index = list(plan.keep_given) or result.order[: plan.keep_best]
        result.kept, result.kept_index = [self._forced(node, plan, i, scores[i]) for i in index], index
        return result

    def _score(self, node: Node, ids: list[int]) -> list[float]:
        """Log-probabilities of ``ids`` after ``node``'s path: one forward over path + ids."""
        path = self.path_token_ids(node) + ids
        start = time.perf_counter()
        logits = self.model(input_ids=torch.tensor([path], device=self.device), logits_to_keep=len(ids) + 1).logits
        self._count(time.perf_counter() - start, prefill=len(path))
        logp = torch.log_softmax(logits[0, :-1].float(), dim=-1)
        return logp.gather(-1, torch.tensor(ids, device=self.device).view(-1, 1)).squeeze(-1).tolist()

    def _forced(self, node: Node, plan: ChoosePlan, i: int, logprobs: list[float]) -> Node:
        child = self._node(node, plan.token_ids[i], plan.choices[i], FORCED)
        child.logprobs = list(logprobs)
        return child

    def set_value(self, node: Node, value: float) -> None:
        node.value = float(value)

    def release(self, node: Node) -> None:
        for sub in list(node.subtree()):
            sub.released = True
            self.nodes.pop(sub.id, None)
        if node.parent is not None and node in node.parent.children:
            node.parent.children.remove(node)

    def path_token_ids(self, node: Node) -> list[int]:
        return [t for n in node.path() for t in n.token_ids]

    # ---- internals -----------------------------------------------------------------------
    def _generate(self, node: Node, n: int, params: SamplingParams) -> list[Node]:
        path = self.path_token_ids(node)
        ids = torch.tensor([path], device=self.device)
        kwargs = {"do_sample": False} if params.greedy else {"do_sample": True, "temperature": params.temperature}
        if not params.greedy:
            kwargs |= {"top_p": params.top_p, "top_k": params.top_k or None}
        if params.stop:
            kwargs |= {"stop_strings": list(params.stop), "tokenizer": self.tokenizer}
        start = time.perf_counter()
        out = self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=n,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=self.tokenizer.eos_token_id,
            **kwargs,
        )
        logits = torch.stack(out.logits, dim=1).float()  # (n, steps, V) raw logits
        kids = []
        for row in range(n):
            new = out.sequences[row, len(path) :].tolist()
            new = _until_end(new, self.tokenizer.eos_token_id if params.stop_at_eos else None)
            kid = self._node(node, new, self.tokenizer.decode(new), GENERATED)
            logp = torch.log_softmax(logits[row, : len(new)], dim=-1)
            kid.logprobs = logp.gather(-1, torch.tensor(new, device=self.device).view(-1, 1)).squeeze(-1).tolist()
            kids.append(kid)
        self._count(time.perf_counter() - start, prefill=len(path) * n, decode=sum(k.length for k in kids))
        return kids

    def _node(self, parent: Node | None, ids: list[int], text: str, kind: str) -> Node:
        start = 0 if parent is None else parent.end_pos
        node = Node(id=self._next_id, parent=parent, token_ids=list(ids), text=text, kind=kind, start_pos=start)
        node.tree_id = node.id if parent is None else parent.tree_id
        self._next_id += 1
        self.nodes[node.id] = self.all_nodes[node.id] = node
        if parent is not None:
            parent.children.append(node)
        self.metrics.nodes_created += 1
        return node

    def _count(self, seconds: float, prefill: int, decode: int = 0) -> None:
        m = self.metrics
        m.forward_calls += 1
        m.model_seconds += seconds
        m.prefill_tokens += prefill
        m.decode_tokens += decode


def _until_end(tokens: list[int], eos: int | None) -> list[int]:
    """A returned sequence without the padding ``generate`` adds after a row stops (the pad is EOS)."""
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
        while len(tokens) > 1 and tokens[-1] == eos and tokens[-2] == eos:
            tokens.pop()
    return tokens or [eos if eos is not None else 0]
