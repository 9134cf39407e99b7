"""Game of 24 ToT BFS side by side with llama.cpp (issue 64): the search a user runs, problems an hour.

The search is the CLI's own (``experiment=table1_game24``: BFS keeping 5 states a level with 5 thoughts each,
legal proposals ranked by the model with ``choose``, values from the model's sure/likely/impossible
verdicts scored as choices): the same :class:`~arbor_runtime.controllers.bfs.BFSController`,
:class:`~arbor_runtime.tasks.game24.Game24Task` and ``llm_value`` verifier objects run over three model
servers, problem by problem, interleaved:

- *arbor*: this runtime under ``policy=full`` at its default weights (``Setup.runtime``: a fresh runtime a
  problem, as ``arbor-solve`` searches one);
- *llama.cpp, states*: llama.cpp on the same GGUF, one sequence, each node's KV saved
  (``llama_state_seq_get_data``) and loaded before each continuation scored under it: what a llama.cpp
  user branching by saved states writes;
- *llama.cpp, batched*: each prompt's KV kept in its own sequence, a call's continuations decoded in one
  batch of sequences that share the prompt's cells (``llama_memory_seq_cp``) and, once, the node's path
  below the prompt (tokens with every sequence's id): llama.cpp's parallel decoding.

Both llama.cpp ways serve the search through :class:`LlamaRuntime`, the part of ``Runtime`` the search
calls (``new_tree``, ``choose``, ``append``, ``release``, ``set_value``, ``nodes``); the token ids are the
runtime's tokenizer's, so every system reads the same tokens. Per problem: seconds, solved, answer.

    python -m benchmarks.peer_tot [--start 900] [--problems 6] [--threads 1] [--data-dir ../shared/data]
        [--out DIR] [--section]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arbor_runtime.choose import ChoiceScores, ChoosePlan
from arbor_runtime.tree import Node
from benchmarks.results.data import columns_spec

SECTION = "peer-tot"
TITLE = "Game of 24 ToT BFS side by side with llama.cpp on the same GGUF (SmolLM2-135M, CPU): problems an hour"
SYSTEMS = ("arbor", "llama.cpp states", "llama.cpp batched")
#: sequences of the batched way that hold a prompt (a tree's root); the rest are a call's scratch rows
ROOT_SEQS = 4


class LlamaSeqs:
    """A llama.cpp context with many sequences over one loaded GGUF (llama-cpp-python's C API).

    Args:
        gguf: the model file; threads: llama.cpp threads; n_ctx: KV cells over all sequences;
        n_seq: sequences; n_batch: tokens one decode call takes at most.
    """

    def __init__(self, gguf: str, threads: int, n_ctx: int = 8192, n_seq: int = 64, n_batch: int = 2048) -> None:
        import llama_cpp as lc
        from llama_cpp import Llama

        self.lc = lc
        self._llm = Llama(model_path=gguf, n_ctx=64, n_threads=threads, verbose=False)  # loads the model
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, min(512, n_batch), n_seq
        params.kv_unified, params.n_threads, params.n_threads_batch = True, threads, threads
        model = self._llm._model.model
        self.ctx = lc.llama_init_from_model(model, params)
        self.mem = lc.llama_get_memory(self.ctx)
        self.vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
        self.n_seq, self.n_batch = n_seq, n_batch
        self.batch = lc.llama_batch_init(n_batch, 0, n_seq)

    def decode(self, entries: Sequence[tuple[int, int, Sequence[int], bool]]) -> np.ndarray:
        """Decode (token, position, sequence ids, wants logits) entries in order (in calls of at most
        ``n_batch``); returns the logits of the entries that want them, (m, V) float32, in order."""
        out = []
        for lo in range(0, len(entries), self.n_batch):
            part = entries[lo : lo + self.n_batch]
            b = self.batch
            b.n_tokens = len(part)
            for i, (token, pos, seqs, logits) in enumerate(part):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, len(seqs), int(logits)
                for j, s in enumerate(seqs):
                    b.seq_id[i][j] = s
            if self.lc.llama_decode(self.ctx, b) != 0:
                raise RuntimeError(f"llama_decode failed on {len(part)} tokens")
            wanted = sum(1 for e in part if e[3])
            if wanted:
                rows = self.lc.llama_get_logits(self.ctx)
                out.append(np.ctypeslib.as_array(rows, shape=(wanted * self.vocab,)).reshape(wanted, self.vocab).copy())
        return np.concatenate(out) if out else np.zeros((0, self.vocab), dtype=np.float32)

    def seq_cp(self, src: int, dst: int) -> None:
        self.lc.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def seq_rm(self, seq: int) -> None:
        self.lc.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def save(self, seq: int) -> bytes:
        size = self.lc.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        n = self.lc.llama_state_seq_get_data(self.ctx, buf, size, seq)
        return bytes(buf[:n])

    def load(self, data: bytes, seq: int) -> None:
        self.seq_rm(seq)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if self.lc.llama_state_seq_set_data(self.ctx, buf, len(data), seq) == 0:
            raise RuntimeError(f"llama_state_seq_set_data failed for sequence {seq}")

    def clear(self) -> None:
        self.lc.llama_memory_clear(self.mem, True)


def token_logprobs(logits: np.ndarray, tokens: Sequence[int]) -> list[float]:
    """log p(tokens[i]) under logits row i: (m, V) rows, m tokens (float64 log-softmax)."""
    if not len(tokens):
        return []
    rows = torch.from_numpy(logits).double()
    return (rows[torch.arange(len(tokens)), torch.tensor(list(tokens))] - torch.logsumexp(rows, dim=-1)).tolist()


class LlamaRuntime:
    """What the CLI's ToT search calls of a ``Runtime`` (``new_tree``, ``choose``, ``append``, ``release``,
    ``set_value``, ``nodes``), served by llama.cpp one of two ways (``way``: "states" or "batched", see the
    module docstring). Sampling (``expand``) is not served: the search here proposes legal steps and
    values them as choices."""

    def __init__(self, seqs: LlamaSeqs, tokenizer, way: str) -> None:
        if way not in ("states", "batched"):
            raise ValueError(f"way={way!r}: valid: states, batched")
        self.seqs, self.tokenizer, self.way = seqs, tokenizer, way
        self.nodes: dict[int, Node] = {}
        self._next = 0
        self._last: dict[int, np.ndarray] = {}  # node id -> (V,) logits after its last token (roots; states: all)
        self._state: dict[int, bytes] = {}  # states: node id -> its sequence's KV
        self._root_seq: dict[int, int] = {}  # batched: root id -> its sequence
        self._pending: dict[int, tuple[bytes, np.ndarray]] = {}  # states: the last pass's KV kept for children
        seqs.clear()

    # ---- the Runtime surface ---------------------------------------------------------------
    def new_tree(self, prompt: str, seed: int | None = None, examples: tuple[int, int] | None = None) -> Node:
        ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        root = self._node(None, ids, prompt, "prompt")
        seq = 0
        if self.way == "batched":
            seq = next(s for s in range(ROOT_SEQS) if s not in self._root_seq.values())
            self._root_seq[root.id] = seq
        self.seqs.seq_rm(seq)
        (self._last[root.id],) = self.seqs.decode([(t, i, (seq,), i == len(ids) - 1) for i, t in enumerate(ids)])
        if self.way == "states":
            self._state[root.id] = self.seqs.save(0)
        return root

    def choose(
        self, node: Node, choices: Sequence[str], keep: int | Sequence[int] = 0, by: str = "sum"
    ) -> ChoiceScores:
        self._live(node)
        plan = ChoosePlan.build(self.tokenizer, node, choices, keep, by)
        logprobs = self._score(node, plan.token_ids, save=list(plan.keep_given))
        result = ChoiceScores(plan.choices, plan.token_ids, logprobs, plan.by)
        kept = list(plan.keep_given) if not plan.keep_best else result.order[: plan.keep_best]
        if plan.keep_best and self.way == "states":  # known only now: store just those (a second, smaller pass)
            self._score(node, [plan.token_ids[i] for i in kept], save=list(range(len(kept))), into=kept)
        result.kept = [self._child(node, plan, i, logprobs[i]) for i in kept]
        result.kept_index = kept
        return result

    def append(self, node: Node, text: str) -> Node:
        self._live(node)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"append text {text!r} tokenizes to nothing")
        (logprobs,) = self._score(node, [ids], save=[0])
        child = self._node(node, ids, text, "forced", logprobs)
        self._adopt(child, 0)
        return child

    def release(self, node: Node) -> None:
        self._live(node)
        for sub in list(node.subtree()):
            sub.released = True
            self._state.pop(sub.id, None)
            self._last.pop(sub.id, None)
            if sub.id in self._root_seq:
                self.seqs.seq_rm(self._root_seq.pop(sub.id))
        if node.parent is not None and node in node.parent.children:
            node.parent.children.remove(node)

    def set_value(self, node: Node, value: float) -> None:
        node.value = float(value)

    def expand(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("LlamaRuntime serves choices only (task.propose=legal, llm_value mode=choose)")

    expand_many = expand

    # ---- scoring ---------------------------------------------------------------------------
    def _score(
        self, node: Node, conts: list[list[int]], save: list[int], into: list[int] | None = None
    ) -> list[list[float]]:
        """Per continuation, its tokens' log-probs after ``node``'s path; the KV (states way) of those
        in ``save`` is kept for the child made of it (``into``: their choice indices)."""
        self._pending = {}
        if self.way == "states":
            out = []
            for j, ids in enumerate(conts):
                self.seqs.load(self._state[node.id], 0)
                rows = self.seqs.decode([(t, node.end_pos + i, (0,), True) for i, t in enumerate(ids)])
                out.append(token_logprobs(np.concatenate([self._last[node.id][None], rows[:-1]]), ids))
                if j in save:
                    self._pending[(into or save)[save.index(j)] if into else j] = (self.seqs.save(0), rows[-1])
            return out
        return self._score_batched(node, conts)

    def _score_batched(self, node: Node, conts: list[list[int]]) -> list[list[float]]:
        """One batch: the path below the root once, in cells every scratch sequence shares, then each
        continuation in its own sequence (in groups of the scratch sequences there are)."""
        path = node.path()
        root, suffix = path[0], [t for n in path[1:] for t in n.token_ids]
        room = self.seqs.n_seq - ROOT_SEQS
        out: list[list[float]] = []
        for lo in range(0, len(conts), room):
            group = conts[lo : lo + room]
            scratch = list(range(ROOT_SEQS, ROOT_SEQS + len(group)))
            for s in scratch:
                self.seqs.seq_cp(self._root_seq[root.id], s)
            base = root.length
            entries = [(t, base + i, scratch, i == len(suffix) - 1) for i, t in enumerate(suffix)]
            for s, ids in zip(scratch, group, strict=True):
                entries += [(t, node.end_pos + i, (s,), i < len(ids) - 1) for i, t in enumerate(ids)]
            rows = self.seqs.decode(entries)
            first, at = (rows[0], 1) if suffix else (self._last[root.id], 0)
            for ids in group:
                mine = np.concatenate([first[None], rows[at : at + len(ids) - 1]])
                out.append(token_logprobs(mine, ids))
                at += len(ids) - 1
            for s in scratch:
                self.seqs.seq_rm(s)
        return out

    # ---- nodes -----------------------------------------------------------------------------
    def _node(self, parent: Node | None, ids: list[int], text: str, kind: str, logprobs=()) -> Node:
        start = 0 if parent is None else parent.end_pos
        node = Node(self._next, parent, list(ids), text, kind, start, logprobs=list(logprobs), owner=self)
        node.tree_id = node.id if parent is None else parent.tree_id
        self._next += 1
        self.nodes[node.id] = node
        if parent is not None:
            parent.children.append(node)
        return node

    def _child(self, node: Node, plan: ChoosePlan, i: int, logprobs: list[float]) -> Node:
        child = self._node(node, plan.token_ids[i], plan.choices[i], "forced", logprobs)
        self._adopt(child, i)
        return child

    def _adopt(self, child: Node, key: int) -> None:
        """The KV (states way) a scoring pass kept for this child."""
        if self.way == "states":
            self._state[child.id], self._last[child.id] = self._pending[key]

    def _live(self, node: Node) -> None:
        if node.released or self.nodes.get(node.id) is not node:
            raise ValueError(f"node {node.id} is released or not this runtime's")


def solve_arbor(setup, problem) -> dict[str, Any]:
    """One problem as ``arbor-solve`` searches it: a fresh runtime, the configured controller."""
    rt = setup.runtime(problem)
    return _timed(setup.controller(rt), problem)


def solve_llama(setup, problem, runtime: LlamaRuntime) -> dict[str, Any]:
    return _timed(setup.controller(runtime), problem)


def _timed(controller, problem) -> dict[str, Any]:
    start = time.perf_counter()
    result = controller.solve(problem)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "solved": bool(result.solved), "answer": result.answer, "steps": result.steps}


def search_setup(data_dir: str | None, start: int, problems: int, loaded=None):
    """The CLI's Game of 24 ToT search (``experiment=table1_game24``, ``policy=full``) over rows
    ``start .. start + problems`` (``loaded``: a model loaded before, else the config's)."""
    from arbor_cli.build import build, compose_config

    over = ["experiment=table1_game24", "policy=full", f"task.start={start}", f"task.end={start + problems}"]
    return build(compose_config([*over, *([f"paths.data_dir={data_dir}"] if data_dir else [])]), loaded=loaded)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per-problem rows of every system, problems interleaved (each problem runs on every system in turn)."""
    from arbor_runtime.loading import smollm2_gguf_path

    torch.set_num_threads(args.threads)
    setup = search_setup(args.data_dir, args.start, args.problems)
    seqs = LlamaSeqs(str(smollm2_gguf_path()), args.threads)
    tokenizer = setup.loaded.tokenizer
    done = _done(args.out)
    rows = list(done.values())
    for problem in setup.problems:
        for system in SYSTEMS:
            if (problem.index, system) in done:
                continue
            if system == "arbor":
                row = solve_arbor(setup, problem)
            else:
                row = solve_llama(setup, problem, LlamaRuntime(seqs, tokenizer, system.split()[-1]))
            row = {"index": problem.index, "system": system, "threads": args.threads} | row
            rows.append(row)
            if args.out:
                with open(Path(args.out) / "rows.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
            print(f"{problem.index} {system:18} {row['seconds']:7.1f} s solved={row['solved']}", file=sys.stderr)
    return rows


def _done(out: str | None) -> dict[tuple[int, str], dict]:
    if not out:
        return {}
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return {(r["index"], r["system"]): r for r in rows}


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per system: problems, solved, seconds a problem (min / median / max), problems an hour (from the
    total), and its rate over the faster llama.cpp way's."""
    out = []
    for system in SYSTEMS:
        mine = [r for r in rows if r["system"] == system]
        if not mine:
            continue
        secs = [r["seconds"] for r in mine]
        out.append({"system": system, "problems": len(mine), "solved": sum(r["solved"] for r in mine),
                    "min_s": min(secs), "median_s": statistics.median(secs), "max_s": max(secs),
                    "per_hour": 3600 * len(mine) / sum(secs)})  # fmt: skip
    best = max((r["per_hour"] for r in out if r["system"] != "arbor"), default=None)
    for r in out:
        r["x_llama"] = r["per_hour"] / best if best else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peer_tot", description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=int, default=900)
    ap.add_argument("--problems", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default=None, help="folder of rows.jsonl (a rerun resumes it)")
    ap.add_argument("--section", action="store_true", help=f"write docs/data/{SECTION}/results.json")
    args = ap.parse_args(argv)
    from benchmarks.peer import llama_cpp_missing

    if llama_cpp_missing("benchmarks.peer_tot"):
        return 0
    started = time.perf_counter()
    rows = run(args)
    summary = table(rows)
    for r in summary:
        print(f"{r['system']:18} {r['problems']} problems, solved {r['solved']}, {r['median_s']:.1f} s median, "
              f"{r['per_hour']:.0f}/h, x{r['x_llama']:.2f}")  # fmt: skip
    if args.section:
        write_section(args, rows, summary, time.perf_counter() - started, argv)
    return 0


COLUMNS = columns_spec([
    ("system", "system", "text"),
    ("problems", "problems", "auto"),
    ("solved", "solved", "auto"),
    ("min_s", "s a problem min", "{:.1f}"),
    ("median_s", "median", "{:.1f}"),
    ("max_s", "max", "{:.1f}"),
    ("per_hour", "problems an hour", "{:.0f}"),
    ("x_llama", "x llama.cpp's faster way", "{:.2f}"),
])  # fmt: skip


def write_section(args: argparse.Namespace, rows: list[dict], summary: list[dict], wall: float, argv) -> None:
    """docs/data/peer-tot/results.json (the table) and rows.jsonl (every problem of every system)."""
    import llama_cpp

    from benchmarks.results.data import DATA, write_section_data

    command = "python -m benchmarks.peer_tot " + " ".join(argv if argv is not None else sys.argv[1:])
    settings = {"start": args.start, "problems": args.problems, "threads": args.threads,
                "llama_cpp_python": llama_cpp.__version__, "wall_minutes": round(wall / 60, 1)}  # fmt: skip
    path = write_section_data(SECTION, summary, command, settings, title=TITLE, columns=COLUMNS)
    ordered = sorted(rows, key=lambda r: (r["index"], SYSTEMS.index(r["system"])))
    (DATA / SECTION / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ordered))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
