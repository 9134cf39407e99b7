"""The public runtime: search trees whose KV is kept once per thought block.

Controllers call ``new_tree``, ``expand``/``expand_many``, ``append``, ``set_value`` and
``release``, from one thread or from many (one search per thread, several trees in one runtime).
Each call is a unit of work for the :class:`~arbor_runtime.engine.core.Engine`, which runs every
expansion in flight as one serving loop: the scheduler plans as many rows as fit over the memory
planner (schedule) and the executor carries the plan out, the backend runs one step for all of them
with attention that reads every block in place (run), rows sample their next token or finish, and
waiting rows take the place of finished ones (postprocess). New blocks go to the store; the memory
manager turns each operation into policy events.

The runtime builds the collaborators and hands each what it uses: the planner owns the memory
config (read off the policy once, :class:`~arbor_runtime.planner.MemoryConfig`); the engine gets
its collaborators, not the runtime.
"""

from __future__ import annotations

import copy
import logging
from collections import ChainMap
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch

from arbor_runtime import validation
from arbor_runtime.accounts import Accounts
from arbor_runtime.attention.support import check_policy
from arbor_runtime.backend import ModelBackend
from arbor_runtime.choose import ChoiceScores, ChoosePlan, ChooseWork
from arbor_runtime.engine.core import Engine
from arbor_runtime.engine.prefill import Prefiller
from arbor_runtime.engine.scheduler import PAGE, Scheduler
from arbor_runtime.engine.work import Account, ExpandJob, Work
from arbor_runtime.errors import BudgetError, KVBudgetExceeded, NodeError
from arbor_runtime.grammar import GrammarCompiler
from arbor_runtime.kv import KVStore
from arbor_runtime.kv.host import default_host_tokens
from arbor_runtime.loading import LoadedModel
from arbor_runtime.memory import MemoryManager
from arbor_runtime.metrics import RuntimeMetrics, TracePoint
from arbor_runtime.nodes import NodeTable, RuntimeOwner
from arbor_runtime.planner import MemoryConfig, MemoryPlanner
from arbor_runtime.policies import Policy, build_policy
from arbor_runtime.prefix import PrefixIndex, SharedRootJob
from arbor_runtime.runner import Runner
from arbor_runtime.sampling import SamplingParams
from arbor_runtime.tree import FORCED, PROMPT, Node

log = logging.getLogger(__name__)


__all__ = ["Runtime", "RuntimeOwner"]


class Runtime:
    """Tree-structured generation over one model with per-block KV reuse.

    Args:
        loaded: model and tokenizer from :func:`arbor_runtime.load_model`.
        policy: a policy name (``"full"``, ``"arbor"``, ...) or a built :class:`Policy`.
        budget_tokens: cap on device KV tokens (used when ``policy`` is a name); the device pool
            holds exactly this many token slots, shared by every tree of the runtime.
            Evicted KV a policy offloads goes to a host tier of at most the policy's
            ``host_budget_tokens``, or by default of ``kv.host.HOST_SHARE`` (half) of the host
            memory available when the runtime starts; what does not fit is dropped and recomputed
            when the search returns to it.
        seed: default seed of each tree's sampling streams (``new_tree(seed=...)`` overrides it).
        fast_kernel: use the fused (out, lse) attention op when torch has one (False: the matmul
            reference, for tests).
        share_prefixes: a new tree's prompt attaches below the longest prefix another live tree
            already stores, and only its suffix is prefilled; the prefix's KV is stored once for
            all of them (``arbor_runtime.prefix``). False: every tree stores its whole prompt (for
            comparisons). Off under sparse decode attention (its per-block indexes are not cut).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        policy: str | Policy = "full",
        budget_tokens: int | None = None,
        seed: int = 0,
        fast_kernel: bool = True,
        share_prefixes: bool = True,
    ) -> None:
        if not isinstance(share_prefixes, bool):
            raise ValueError(f"share_prefixes={share_prefixes!r} must be true or false")
        seed = validation.seed(seed, "Runtime seed")
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        #: token ids a block may hold: 0 <= id < vocab_size (checked before any work)
        self.vocab_size = validation.vocab_size(self.model)
        #: positions the model was built for: no block reaches past them (None: the model states none)
        self.max_positions = validation.max_positions(self.model)
        self.policy = build_policy(policy, budget_tokens=budget_tokens)
        bind_policy(self.policy, self.model)
        self.backend = ModelBackend(self.model, fast_kernel=fast_kernel)
        check_policy(self.policy, self.backend.attention)  # sparse decode reads plain attention only
        config = MemoryConfig.of(self.policy)
        host_cap = config.host_budget_tokens
        if host_cap is None:  # the policy sets no cap: a share of the host memory available now
            host_cap = default_host_tokens(self.backend.shape)
        self.store = KVStore(self.backend.shape, config.kv_budget_tokens, host_cap)
        self.metrics = RuntimeMetrics()
        #: every node made here: live and all tables, ids, the owner stamp, tree seeds
        self.table = NodeTable(self.store, seed)
        #: live nodes by id / every node made here, released ones too (the table's, in creation order)
        self.nodes, self.all_nodes = self.table.live, self.table.all
        #: stamped on every node made here; calls refuse nodes that carry another (NodeError)
        self.owner: RuntimeOwner = self.table.owner
        #: public operations in completion order (JSON-friendly), for trace recording and replay
        self.oplog: list[dict] = []
        #: called with (trace point, account or None) after every operation (the viewer's residency recorder)
        self.step_hooks: list[Callable[[TracePoint, Account | None], None]] = []
        #: shared prefix blocks and the internal twins of the roots that read them
        self.prefixes = PrefixIndex(self.table, self.store, self.policy)
        self._assemble(config, share_prefixes)
        self._eos_ids = validation.eos_ids(loaded)
        #: matchers for sampling under a regex or grammar (its tokenizer view is built on first use)
        self.grammar = GrammarCompiler(self.tokenizer, int(self.model.config.vocab_size))

    def _assemble(self, config: MemoryConfig, share_prefixes: bool) -> None:
        """The deciding and executing side, each part given what it uses: planner (``config``),
        memory manager, accounts, runner, sparse decode attention, scheduler, prefiller, engine."""
        #: what fits the budget: the pure arithmetic every decision reads (it owns the memory config)
        self.planner = MemoryPlanner(self.store, self.policy, config)
        self.store.head_stats = self.planner.head_statistics()
        # the memory manager sees every stored block: a shared root's block as its twin, the prefixes too
        self.memory = MemoryManager(self.store, self.policy, ChainMap(self.prefixes.nodes, self.nodes), self.planner)
        #: where counts go (the runtime's metrics, each thread's account), and each work's trace point
        self.accounts = Accounts(self.metrics, self.store, self.memory, self.backend, self.step_hooks)
        #: batches, forwards, attention records and slot frees of prefill-style forwards
        self.runner = Runner(self.store, self.backend, self.planner, self.accounts)
        decode = getattr(self.tokenizer, "decode", None)
        self.backend.sparse = self.policy.sparse_attention(self.store, self.block_token_ids, decode)
        #: whether new trees attach below stored prefixes (see ``share_prefixes``)
        self.share_prefixes = share_prefixes and self.backend.sparse is None
        #: decides what runs, waits or gives way (rows, admissions, the searches' turns)
        self.scheduler = Scheduler(self.planner)
        #: prefills (prompts, forced blocks) and recomputes of dropped blocks
        self.prefiller = Prefiller(
            self.store, self.memory, self.table, self.runner, self.accounts, self.planner, self.scheduler.owners,
            self.tokenizer.decode,
        )  # fmt: skip
        self.engine = self._engine()

    def __deepcopy__(self, memo: dict) -> Runtime:
        """A copy of the whole state (trees, KV, metrics) with its own engine and locks; nothing may
        be in flight. Pass the model and tokenizer in ``memo`` to share them (benchmarks fork a
        prefilled runtime this way)."""
        if self.engine.busy:
            raise RuntimeError("Runtime: cannot copy while work is in flight")
        shared = {"grammar"}  # a compile cache
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            if name != "engine":
                setattr(clone, name, value if name in shared else copy.deepcopy(value, memo))
        clone.engine = memo[id(self.engine)] = clone._engine()  # a fresh one over the copied collaborators
        return clone

    def _engine(self) -> Engine:
        """The engine over this runtime's collaborators (it logs expansions to ``oplog``)."""
        return Engine(
            scheduler=self.scheduler,
            memory=self.memory,
            store=self.store,
            backend=self.backend,
            table=self.table,
            accounts=self.accounts,
            runner=self.runner,
            prefiller=self.prefiller,
            metrics=self.metrics,
            oplog=self.oplog,
        )

    # ---- public API ----------------------------------------------------------------------
    @property
    def budget_tokens(self) -> int | None:
        """The KV budget in device tokens (None: none); the planner's config holds it."""
        return self.planner.config.budget_tokens

    @property
    def events(self):
        """The :class:`~arbor_runtime.events.EventLog` of this runtime (every tree)."""
        return self.memory.events

    @property
    def seed(self) -> int:
        """The default seed of each tree's sampling streams."""
        return self.table.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.table.seed = validation.seed(value, "Runtime seed")

    @property
    def _next_id(self) -> int:
        return self.table.next

    @property
    def logits_hook(self) -> Callable[[Node, torch.Tensor], None] | None:
        """Called with (node, (T, V) log-probs) for every forced block; used by trace replay."""
        return self.prefiller.logits_hook

    @logits_hook.setter
    def logits_hook(self, hook: Callable[[Node, torch.Tensor], None] | None) -> None:
        self.prefiller.logits_hook = hook

    def new_tree(self, prompt: str, seed: int | None = None, examples: tuple[int, int] | None = None) -> Node:
        """Start a tree whose root block is ``prompt`` (prefilled once).

        ``seed`` seeds the tree's sampling streams (default: the runtime's seed); calls with an
        explicit ``SamplingParams.seed`` use that instead. ``examples``: the character span
        [start, end) of ``prompt`` that holds few-shot examples (a task's ``examples_span``): below a
        tree-aware policy's floor they are token-extracted first, the rest of the prompt stays.
        """
        ids = self.tokenizer(validation.text(prompt, "new_tree: prompt"), add_special_tokens=True)["input_ids"]
        return self.new_tree_ids(ids, prompt, seed, validation.examples_tokens(self.tokenizer, prompt, ids, examples))

    def new_tree_ids(
        self,
        ids: Sequence[int],
        text: str | None = None,
        seed: int | None = None,
        examples: tuple[int, int] | None = None,
    ) -> Node:
        """Start a tree whose root block is exactly these token ids (trace replay uses this).

        With ``share_prefixes`` the prompt attaches below the longest prefix of it that a live tree
        already stores (see ``arbor_runtime.prefix``): only the rest is prefilled, and the root's
        own block holds only that rest; the node itself still has the whole prompt and no parent.

        A prompt larger than the budget is prefilled in chunks under policies that may evict from
        the active path or that degrade below their floor (``arbor``), when the budget can keep some
        of it beside a row's first page (at least ``PAGE + 1`` = 9 tokens); under ``full`` it is
        refused up front. ``examples``: the token span [start, end) of few-shot examples (``Node.examples``).
        """
        seed = self.seed if seed is None else validation.seed(seed, "new_tree seed")
        ids = self._token_ids(ids, "new_tree_ids")
        if not ids:
            raise ValueError("prompt is empty: a root block needs at least one token")
        examples = validation.token_span(examples, len(ids), "examples")
        validation.positions(0, len(ids), self.max_positions, "new_tree: the prompt")
        if self.planner.refuses_prompt(len(ids)):
            raise BudgetError(
                f"budget_tokens={self.budget_tokens} is smaller than the root prompt ({len(ids)} tokens): "
                "the active path could never fit; raise the budget"
            )
        if self.planner.keeps_none_of_prompt(len(ids), PAGE):
            raise BudgetError(
                f"budget_tokens={self.budget_tokens} is smaller than the root prompt ({len(ids)} tokens) and "
                f"could keep none of it beside a decoding row's first page ({PAGE} slots); valid: at least {PAGE + 1}"
            )
        text = self.tokenizer.decode(ids) if text is None else text
        if self.share_prefixes:
            job = SharedRootJob(self, ids, text, seed, examples=examples)
        else:
            job = self.prefiller.job(None, ids, text, PROMPT, seed=seed, examples=examples)
        node = self.engine.submit(Work("new_tree", self.accounts.current(), run=job))
        op = {"op": "new_tree", "node": node.id, "ids": list(ids)}
        self.log_op(op if examples is None else op | {"examples": list(examples)})
        return node

    def expand(self, node: Node, n: int = 1, sampling: SamplingParams | None = None) -> list[Node]:
        """Sample ``n`` child thoughts of ``node`` (batched); returns the children.

        A child ends at ``sampling.max_new_tokens``, a stop string or EOS, and always where the model's
        positions end (``stop_reason="length"``); a node whose path already fills them, or ``n`` above
        ``validation.MAX_ROWS``, is refused (ValueError) before anything runs.
        """
        return self.expand_many([(node, n)], sampling)[0]

    def expand_many(
        self,
        requests: Sequence[tuple[Node, int]],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[list[Node]]:
        """Sample children for several nodes (any depths), batched as the budget allows.

        Rows that do not fit the budget together wait and join as others finish; each row samples
        from its own stream, so the children are the same however the rows were batched (and
        whatever other trees the runtime was serving at the same time).

        Args:
            requests: (node, n) pairs.
            sampling: one ``SamplingParams`` for every request, or one per request (e.g. a regex
                per node); None: the defaults.
        Returns:
            one list of children per request, in request order.
        Raises:
            KVBudgetExceeded: a single row (its path plus its new tokens) cannot fit.
            ValueError: a request or a regex / grammar that is not valid; more than
                ``validation.MAX_ROWS`` children in all; a node whose path fills the model's positions.
        """
        validation.check_requests(requests, self.table.check_live, self.max_positions)
        stops = validation.stop_checkers(
            requests, sampling, self.tokenizer, self._eos_ids, self.grammar, self.max_positions
        )
        job = ExpandJob("expand", self.accounts.current(), requests=list(requests), stops=stops)
        job.grammar = self.grammar
        return self.engine.submit(job)

    def choose(
        self, node: Node, choices: Sequence[str], keep: int | Sequence[int] = 0, by: str = "sum"
    ) -> ChoiceScores:
        """Score ``choices`` as continuations of ``node``: one batched forward that reads the path once.

        Each choice is teacher-forced (tokenized as ``append`` would); its first token is scored by
        ``node``'s stored next-token distribution, the rest by the forward. ``keep`` makes chosen
        continuations children of ``node`` (forced blocks with their KV stored, like ``append``):
        an int keeps the best ``keep`` by ``by``, a sequence keeps those indices.

        Args:
            by: what ranks the choices and ``probs`` normalizes: "sum" (total log-prob) or
                "mean" (per token); both distributions are reported.
        Returns:
            :class:`~arbor_runtime.choose.ChoiceScores` (log-probs, distributions, order, kept nodes).
        Raises:
            ValueError: no choices, a duplicate or empty choice, a bad ``keep`` / ``by``, a released node.
            KVBudgetExceeded: the path plus one kept choice cannot fit (or, under a policy that keeps
                everything resident, the path plus all kept choices).
        """
        self.table.check_live(node)
        plan = ChoosePlan.build(self.tokenizer, node, choices, keep, by)
        for choice, ids in zip(plan.choices, plan.token_ids, strict=True):
            self._token_ids(ids, f"choose: choice {choice!r}")
            validation.positions(node.end_pos, len(ids), self.max_positions, f"choose: choice {choice!r}")
        every = list(range(len(plan.choices)))
        logprobs, kept = self._choose_pass(node, plan, every, list(plan.keep_given))
        result = ChoiceScores(plan.choices, plan.token_ids, [logprobs[i] for i in every], plan.by)
        result.kept, result.kept_index = kept, list(plan.keep_given)
        if plan.keep_best:  # known only now: prefill just those (a second, smaller forward)
            best = result.order[: plan.keep_best]
            result.kept, result.kept_index = self._choose_pass(node, plan, best, best)[1], best
        for child in result.kept:
            self.log_op({"op": "append", "node": node.id, "child": child.id, "ids": child.token_ids})
        return result

    def _choose_pass(self, node: Node, plan: ChoosePlan, rows: list[int], write: list[int]):
        """Forward choices ``rows`` under ``node``, storing those in ``write`` as children.

        When the kept choices do not fit the budget together, the rows are scored without storing
        anything, then each kept choice is stored by a pass of its own (the path and that choice's
        tokens must fit; the policy may move earlier ones off the device): the same split a
        scheduler makes for an expansion, never an OOM while one choice fits.
        """
        try:
            work = ChooseWork(self.prefiller, node, plan.token_ids, rows, write, plan.choices)
            return self.engine.submit(Work("choose", self.accounts.current(), run=work))
        except KVBudgetExceeded:
            if len(write) <= 1:
                raise
        logprobs, _ = self._choose_pass(node, plan, rows, [])
        return logprobs, [self._choose_pass(node, plan, [i], [i])[1][0] for i in write]

    def append(self, node: Node, text: str) -> Node:
        """Add a teacher-forced child block holding ``text``; its ``logprobs`` score the text."""
        self.table.check_live(node)
        ids = self.tokenizer(validation.text(text, "append: text"), add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"append text {text!r} tokenizes to nothing")
        return self.append_ids(node, ids, text)

    def append_ids(self, node: Node, ids: Sequence[int], text: str | None = None) -> Node:
        """Add a teacher-forced child block of exactly these token ids (trace replay uses this)."""
        self.table.check_live(node)
        ids = self._token_ids(ids, "append_ids")
        if not ids:
            raise ValueError("append_ids needs at least one token id")
        validation.positions(node.end_pos, len(ids), self.max_positions, f"append to {node!r}")
        text = self.tokenizer.decode(ids) if text is None else text
        job = self.prefiller.job(node, ids, text, FORCED)
        child = self.engine.submit(Work("append", self.accounts.current(), run=job))
        self.log_op({"op": "append", "node": node.id, "child": child.id, "ids": ids})
        return child

    def set_value(self, node: Node, value: float) -> None:
        """Record the search value a verifier gave ``node`` (MSVE reads it): a finite number."""
        self.table.check_live(node)
        node.value = validation.finite_value(value, node)
        self.log_op({"op": "set_value", "node": node.id, "value": node.value})

    def release(self, node: Node) -> None:
        """Drop ``node``'s subtree and its KV from every tier; the node stays readable.

        Releasing a root frees exactly that tree's blocks, and the shared prefix blocks no other
        tree reads; other trees are untouched. A node of
        another runtime, or one already released, is refused (NodeError) and nothing changes.
        """
        self.table.check_live(node)
        self.engine.submit(Work("release", self.accounts.current(), run=lambda: self._release(node)))
        self.log_op({"op": "release", "node": node.id})

    def account(self, account: Account | None = None) -> AbstractContextManager[Account]:
        """Count this thread's calls in their own :class:`Account` (metrics, events) while inside.

        With several searches in one runtime, each search thread opens one: its ``metrics`` then hold
        that search's token counts, time, peaks and store movements, as ``rt.metrics`` does for the
        whole runtime.
        """
        return self.accounts.account(account)

    def compress(self, target_tokens: int) -> int:
        """Ask the policy, now, to bring resident block KV down to ``target_tokens`` (one MemoryThreshold).

        The one-shot compression of a context that prefill-time methods (SnapKV, kvpress presses)
        do: prefill whole, then keep ``target_tokens``. Which tokens stay is the policy's plan, as
        for any memory event; a policy that never frees memory (``full``) keeps everything, and
        ``arbor`` keeps the active path whole. Returns the resident block tokens afterwards.
        """
        if isinstance(target_tokens, bool) or not isinstance(target_tokens, int) or target_tokens < 0:
            raise ValueError(f"compress target_tokens={target_tokens!r} must be a non-negative number of tokens")
        self.engine.submit(Work("compress", self.accounts.current(), run=lambda: self.memory.compress(target_tokens)))
        self.log_op({"op": "compress", "target": target_tokens})
        return self.store.resident_tokens

    def path_token_ids(self, node: Node) -> list[int]:
        """Token ids from the root to ``node`` inclusive (the flattened text's ids); released nodes too."""
        self.table.check(node)
        return [t for n in node.path() for t in n.token_ids]

    def block_token_ids(self, block_id: int) -> list[int]:
        """A stored block's token ids (what a sparse index cuts chunks from; a shared root's suffix)."""
        return self.memory.nodes[block_id].token_ids

    def next_token_logprobs(self, node: Node) -> torch.Tensor:
        """(V,) log-probabilities of the token after ``node``'s path (a live node: its KV holds them)."""
        self.table.check_live(node)
        return torch.log_softmax(self.store.get(node.id).next_logits, dim=-1)

    def residency(self, node: Node) -> dict[str, int]:
        """Where ``node``'s block lives: tokens on device, on host, dropped (all of a released node's).

        A root whose prompt shares a stored prefix counts its own block, the prompt's suffix.
        """
        self.table.check(node)
        if node.id not in self.store:
            return {"device": 0, "host": 0, "dropped": node.length}
        blk = self.store.get(node.id)
        n_host = self.store.host_count(node.id)
        return {"device": blk.kept_tokens, "host": n_host, "dropped": blk.length - blk.kept_tokens - n_host}

    def device_kv_bytes(self) -> int:
        """Bytes of every device KV tensor the runtime holds (the pool: blocks and rows in flight)."""
        return self.store.pool.nbytes

    # ---- for the engine (driver thread only) ---------------------------------------------
    def tree_seed(self, node: Node) -> int:
        """The seed of ``node``'s tree's sampling streams."""
        return self.table.tree_seed(node)

    def log_op(self, entry: dict) -> None:
        self.oplog.append(entry)

    # ---- internals ----------------------------------------------------------------------
    def _release(self, node: Node) -> None:
        self.table.check_live(node)  # again in the driver: another thread may have released it meanwhile
        doomed = {sub.id for sub in node.subtree()}
        why = NodeError(f"node {node.id} was released (by another thread) while an expansion below it was in flight")
        self.engine.cancel_below(doomed, why)  # their callers hear NodeError; other searches go on
        gone = self.table.forget_subtree(node, self.accounts.targets())
        if node.parent is None:  # prefixes no other tree reads go too
            gone += self.prefixes.release(node)
        self.memory.forget(gone)

    def _token_ids(self, ids: Sequence[int], where: str) -> list[int]:
        """``ids`` as ints in this model's vocabulary; TokenIdError naming the first bad one."""
        return validation.token_ids(ids, where, self.vocab_size)


def bind_policy(policy: Policy, model: torch.nn.Module) -> None:
    """Hand ``policy`` what it reads of the model, once, before any work.

    Two optional hooks, each declared by the policies that need it: ``vocab_size`` (arbor
    normalizes entropies by the config's vocabulary) and ``bind(model)`` (kvp, and arbor's kvp
    token scorer, load their weights by the model's fingerprint). The one place the runtime asks a
    policy what it has; a no-op ``Policy.bind`` in policies/base.py would make it a single call.
    """
    if hasattr(policy, "vocab_size"):
        policy.vocab_size = int(model.config.vocab_size)
    bind = getattr(policy, "bind", None)
    if bind is not None:
        bind(model)
