"""Weights a CPU reads fast (issue 64): each weight format's decode speed and what it keeps of float32's
answers, side by side in one process.

``python -m benchmarks.weights speed``: SmolLM2-135M on one torch thread, every format of
:data:`FORMATS` loaded at once, then interleaved rounds (each round times every format once, so they share
the machine's conditions):

- *decode tok/s*: the runtime's greedy expansion of ``--tokens`` tokens at batch 1 below the Game of 24
  ToT prompt of row 900 (``full``, after a warm-up expansion); min / median / max over the rounds;
- *weight MB a token*: the bytes of the linear layers and the output layer, what a decode step reads;
- fidelity against float32, teacher-forced (through the quantized kernels a decode step reads, not the
  batches' bfloat16 copy) on float32's greedy continuations of ``--tokens`` tokens below
  four Game of 24 and four GSM8K prompts: *top-1 agreement* (the share of positions whose argmax is
  float32's) and the *mean KL(float32 || format)* of the next-token distributions.

``python -m benchmarks.weights answers NAME FP32_RUN OTHER_RUN``: two ``arbor-solve`` run dirs of one
search at two weight formats (every other setting equal), problem by problem: solved, gained / lost with
the two-sided sign test, same answer, into the section's ``answers`` table (row ``NAME``); its problems,
one row each (index; each format's answer, solved, seconds, decoded tokens and code version), go to
``docs/data/weights/answers-NAME.jsonl``
so every total can be recounted.

``python -m benchmarks.weights batch``: a quantized layer's kernel against its bfloat16 copy (what a call of
:data:`~arbor_runtime.weights.BATCH_ROWS` rows or more multiplies by), by rows, and each path's fidelity to
float32; printed only.

``speed`` and ``answers`` write ``docs/data/weights/results.json`` (``--section``), keeping the other's table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from arbor_cli.results import load_done
from benchmarks.results.data import DATA, columns_spec, load_section, write_section_data
from benchmarks.results.stats import format_rate, sign_test

#: (label, load_model's dtype, weights), float32 first: the reference of every fidelity column
FORMATS = (
    ("float32", None, "dense"),
    ("bfloat16", "bfloat16", "dense"),
    ("int8", None, "int8"),
    ("int4", None, "int4"),
)
SECTION = "weights"
TITLE = "Weights a CPU reads fast: decode speed and fidelity of each weight format (SmolLM2-135M, CPU)"


def prompts(data_dir: str | None) -> list[str]:
    """Four Game of 24 ToT prompts (rows 900-903) and four GSM8K few-shot prompts (test rows 0-3)."""
    from arbor_cli.build import build_task, compose_config

    where = [f"paths.data_dir={data_dir}"] if data_dir else []
    out = []
    for task, start in (("game24", 900), ("gsm8k", 0)):
        cfg = compose_config([f"task={task}", f"task.start={start}", f"task.end={start + 4}", *where])
        built = build_task(cfg)
        out += [built.prompt(p) for p in built.problems()]
    return out


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every linear layer's weights and the output layer: what a decode step reads of the model."""
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
        elif hasattr(module, "packed") or hasattr(module, "codes"):  # not the batches' bfloat16 copy
            total += sum(b.numel() * b.element_size() for n, b in module.named_buffers() if n != "batch_weight")
    return total


def decode_rate(loaded, prompt: str, tokens: int) -> float:
    """Tokens a second of one greedy expansion at batch 1 below ``prompt`` (after a warm-up one)."""
    from arbor_runtime import Runtime, SamplingParams

    params = SamplingParams(max_new_tokens=tokens, temperature=0.0, stop_at_eos=False)
    rt = Runtime(loaded, policy="full")
    root = rt.new_tree(prompt)
    rt.expand(root, 1, params)
    start = time.perf_counter()
    (kid,) = rt.expand(root, 1, params)
    return kid.length / (time.perf_counter() - start)


@torch.inference_mode()
def continuation_logprobs(model, tokenizer, prompt: str, continuation: list[int]) -> torch.Tensor:
    """(T, V) float32 log-probs of each continuation position, teacher-forced in one forward."""
    ids = tokenizer(prompt)["input_ids"] + continuation
    logits = model(torch.tensor([ids])).logits[0, -len(continuation) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


def teacher_forced(loaded, texts: list[str], continuations: list[list[int]], kernels: bool = True) -> list:
    """Each prompt's continuation log-probs; ``kernels``: through the quantized kernels a decode step reads
    (a teacher-forced forward has many rows: without this it would multiply by the batches' bfloat16 copy)."""
    from arbor_runtime.weights import kernels_only

    with kernels_only(loaded.model) if kernels else contextlib.nullcontext():
        return [
            continuation_logprobs(loaded.model, loaded.tokenizer, t, c)
            for t, c in zip(texts, continuations, strict=True)
        ]


def batch(args: argparse.Namespace) -> None:
    """Prints the time of a quantized layer's kernel and of its bfloat16 copy by rows a call (interleaved
    rounds, median), per layer shape of SmolLM2-135M int4, and the fidelity to float32 of each path,
    teacher-forced on float32's greedy continuations below the eight prompts."""
    from arbor_runtime import Runtime, SamplingParams, load_model
    from arbor_runtime.weights import QuantizedLinear, kernels_only

    torch.set_num_threads(args.threads)
    fp32, int4 = load_model("smollm2", device="cpu"), load_model("smollm2", device="cpu", weights="int4")
    layers = {}
    for m in int4.model.modules():
        if isinstance(m, QuantizedLinear) and m.batch_weight is not None:
            layers.setdefault((type(m).__name__, m.out_features, m.in_features), m)
    if not layers:
        print("this machine keeps no bfloat16 copy (keeps_batch_copy): nothing to compare", file=sys.stderr)
        return
    rows_list = [int(r) for r in args.rows.split(",")]
    times: dict[tuple, list[float]] = {}
    for _ in range(args.rounds):
        for key, m in layers.items():
            for r in rows_list:
                x = torch.randn(r, m.in_features, dtype=torch.bfloat16)
                for path in ("kernel", "copy"):
                    with kernels_only(m) if path == "kernel" else contextlib.nullcontext():
                        m(x)
                        start = time.perf_counter()
                        for _ in range(3):
                            m(x)
                        times.setdefault((*key, r, path), []).append((time.perf_counter() - start) / 3 * 1e3)
    print("layer | out x in | rows | kernel ms | copy ms | kernel / copy")
    for key in layers:
        for r in rows_list:
            k, c = (statistics.median(times[(*key, r, p)]) for p in ("kernel", "copy"))
            print(f"{key[0]} | {key[1]} x {key[2]} | {r} | {k:.3f} | {c:.3f} | {k / c:.2f}")
    texts = prompts(args.data_dir)
    greedy = SamplingParams(max_new_tokens=args.tokens, temperature=0.0, stop_at_eos=False)
    reference = Runtime(fp32, policy="full")
    continuations = [reference.expand(reference.new_tree(t), 1, greedy)[0].token_ids for t in texts]
    ref = teacher_forced(fp32, texts, continuations)
    for path, kernels in (("int4 kernels (decode)", True), ("int4 bfloat16 copy (batches)", False)):
        agree, kl = fidelity(ref, teacher_forced(int4, texts, continuations, kernels=kernels))
        print(f"{path}: top-1 agreement with float32 {agree:.3f}, mean KL(float32 || it) {kl:.4f}")


def fidelity(reference: list[torch.Tensor], other: list[torch.Tensor]) -> tuple[float, float]:
    """(top-1 agreement, mean KL(reference || other)) over every position of every prompt."""
    ref, oth = torch.cat(reference), torch.cat(other)
    agree = float((ref.argmax(-1) == oth.argmax(-1)).float().mean())
    kl = float((ref.exp() * (ref - oth)).sum(-1).mean())
    return agree, kl


def speed(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The main table: one row per format (see the module docstring)."""
    from arbor_runtime import Runtime, SamplingParams, load_model

    torch.set_num_threads(args.threads)
    texts = prompts(args.data_dir)
    models = {label: load_model("smollm2", device="cpu", dtype=dtype, weights=w) for label, dtype, w in FORMATS}
    greedy = SamplingParams(max_new_tokens=args.tokens, temperature=0.0, stop_at_eos=False)
    reference = Runtime(models["float32"], policy="full")
    continuations = [reference.expand(reference.new_tree(t), 1, greedy)[0].token_ids for t in texts]
    logprobs = {label: teacher_forced(m, texts, continuations) for label, m in models.items()}
    rates: dict[str, list[float]] = {label: [] for label in models}
    for round_ in range(args.rounds):
        for label, loaded in models.items():
            rates[label].append(decode_rate(loaded, texts[0], args.tokens))
        print(f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()), file=sys.stderr)
    base = statistics.median(rates["float32"])
    rows = []
    for label, loaded in models.items():
        agree, kl = fidelity(logprobs["float32"], logprobs[label])
        rows.append(
            {
                "weights": label, "weight_mb": weight_bytes(loaded.model) / 2**20,
                "tok_s_min": min(rates[label]), "tok_s": statistics.median(rates[label]),
                "tok_s_max": max(rates[label]), "x_float32": statistics.median(rates[label]) / base,
                "top_1": agree, "kl": kl,
            }
        )  # fmt: skip
    return rows


SPEED_COLUMNS = columns_spec([
    ("weights", "weights", "text"),
    ("weight_mb", "weight MB a token", "{:.0f}"),
    ("tok_s_min", "decode tok/s min", "{:.1f}"),
    ("tok_s", "median", "{:.1f}"),
    ("tok_s_max", "max", "{:.1f}"),
    ("x_float32", "x float32", "{:.2f}"),
    ("top_1", "top-1 agreement with float32", "{:.3f}"),
    ("kl", "mean KL(float32 || weights)", "{:.4f}"),
])  # fmt: skip
ANSWER_COLUMNS = columns_spec([
    ("search", "search", "text"),
    ("weights", "weights", "text"),
    ("problems", "n", "auto"),
    ("solved_ref", "float32 solved [95% CI]", "text", True),
    ("solved", "solved [95% CI]", "text", True),
    ("vs_ref", "gained / lost vs float32 (sign test p)", "text", True),
    ("same_answer", "same answer as float32 [95% CI]", "text", True),
    ("x_seconds", "x float32's seconds (median per problem)", "{:.2f}"),
])  # fmt: skip


def problem_rows(reference: Path, other: Path) -> list[dict[str, Any]]:
    """The problems two run dirs share, one row each: index, each format's answer, solved, seconds, decoded
    tokens and code version."""
    ref, oth = load_done(reference), load_done(other)
    return [
        {"index": i, "weights": oth[i].get("weights", "dense"), "answer_ref": ref[i].get("answer"),
         "answer": oth[i].get("answer"), "solved_ref": bool(ref[i]["solved"]), "solved": bool(oth[i]["solved"]),
         "seconds_ref": ref[i].get("seconds"), "seconds": oth[i].get("seconds"), "oom": bool(oth[i].get("oom")),
         "decode_tokens_ref": ref[i].get("decode_tokens"), "decode_tokens": oth[i].get("decode_tokens"),
         "code_ref": ref[i].get("code"), "code": oth[i].get("code")}
        for i in sorted(ref.keys() & oth.keys())
    ]  # fmt: skip


def answers(name: str, reference: Path, other: Path) -> dict[str, Any]:
    """One row of the answers table: ``other``'s run dir against ``reference``'s, problem by problem."""
    return answers_row(name, problem_rows(reference, other), f"{reference} and {other}")


def answers_row(name: str, rows: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """The answers table's row of :func:`problem_rows`' ``rows`` (every total recounts from them)."""
    if not rows:
        raise SystemExit(f"{where} share no problem")
    solved_ref = sum(r["solved_ref"] for r in rows)
    solved = sum(r["solved"] for r in rows)
    gained = sum(r["solved"] and not r["solved_ref"] for r in rows)
    lost = sum(r["solved_ref"] and not r["solved"] for r in rows)
    same = sum(r["answer"] == r["answer_ref"] and not r["oom"] for r in rows)
    ratios = [float(r["seconds"]) / float(r["seconds_ref"]) for r in rows if float(r["seconds_ref"] or 0)]
    n = len(rows)
    return {
        "search": name, "weights": ",".join(sorted({str(r["weights"]) for r in rows})), "problems": n,
        "solved_ref": format_rate(solved_ref, n), "solved": format_rate(solved, n), "solved_n": solved,
        "solved_ref_n": solved_ref, "gained_n": gained, "lost_n": lost,
        "vs_ref": f"+{gained} / -{lost} (p {sign_test(gained, lost):.2g})",
        "same_answer": format_rate(same, n), "same_answer_n": same, "x_seconds": statistics.median(ratios),
    }  # fmt: skip


def answers_longctx(name: str, reference: Path, other: Path, method: str = "dense") -> dict[str, Any]:
    """One row of the answers table from two long-context suites' rows files (``benchmarks.longctx``): the
    ``method`` rows of the items both hold, correct answers and the same answer."""

    def rows(path: Path) -> dict[tuple, dict]:
        found = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return {(r["task"], r["length"], r["index"], r.get("seed", 0)): r for r in found if r["method"] == method}

    ref, oth = rows(reference), rows(other)
    shared = sorted(ref.keys() & oth.keys())
    if not shared:
        raise SystemExit(f"{reference} and {other} share no {method} item")
    correct_ref = sum(bool(ref[k]["correct"]) for k in shared)
    correct = sum(bool(oth[k]["correct"]) for k in shared)
    gained = sum(bool(oth[k]["correct"]) and not ref[k]["correct"] for k in shared)
    lost = sum(not oth[k]["correct"] and bool(ref[k]["correct"]) for k in shared)
    same = sum(oth[k]["answer"] == ref[k]["answer"] for k in shared)
    n = len(shared)
    return {
        "search": name, "weights": ",".join(sorted({str(oth[k].get("weights", "dense")) for k in shared})),
        "problems": n, "solved_ref": format_rate(correct_ref, n), "solved": format_rate(correct, n),
        "solved_n": correct, "solved_ref_n": correct_ref, "gained_n": gained, "lost_n": lost,
        "vs_ref": f"+{gained} / -{lost} (p {sign_test(gained, lost):.2g})", "same_answer": format_rate(same, n),
        "same_answer_n": same, "x_seconds": None,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.weights", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    sp = sub.add_parser("speed", help="decode speed and fidelity of every format")
    sp.add_argument("--rounds", type=int, default=5)
    sp.add_argument("--tokens", type=int, default=64)
    sp.add_argument("--threads", type=int, default=1)
    sp.add_argument("--data-dir", default=None, help="the data folder (GSM8K prompts); null: the hub's")
    bp = sub.add_parser("batch", help="a quantized layer's kernel against its bfloat16 copy, by rows (printed)")
    bp.add_argument("--rows", default="1,4,8,16,64,256,540")
    bp.add_argument("--rounds", type=int, default=3)
    bp.add_argument("--tokens", type=int, default=64)
    bp.add_argument("--threads", type=int, default=1)
    bp.add_argument("--data-dir", default=None, help="the data folder (GSM8K prompts); null: the hub's")
    ap_answers = sub.add_parser("answers", help="two run dirs of one search at two weight formats")
    ap_answers.add_argument("name")
    ap_answers.add_argument("reference", type=Path)
    ap_answers.add_argument("other", type=Path)
    ap_answers.add_argument("--longctx", action="store_true", help="two long-context rows files, their dense rows")
    for p in (sp, ap_answers):
        p.add_argument("--section", action="store_true", help=f"write docs/data/{SECTION}/results.json")
        p.add_argument("--command", default="", help="the command that made this table (recorded)")
    args = ap.parse_args(argv)
    if args.what == "batch":
        batch(args)
        return 0
    old = load_section(SECTION) if (DATA / SECTION / "results.json").is_file() else {"tables": {}, "settings": {}}
    carried = pairs = None
    if args.what == "speed":
        rows = speed(args)
        tables = {k: v for k, v in old["tables"].items() if k != "main"}
        settings = old.get("settings", {}) | {"rounds": args.rounds, "tokens": args.tokens, "threads": args.threads}
        command = args.command or "python -m benchmarks.weights " + " ".join(argv or sys.argv[1:])
        columns = SPEED_COLUMNS
    else:
        pairs = None if args.longctx else problem_rows(args.reference, args.other)
        where = f"{args.reference} and {args.other}"
        row = (
            answers_longctx(args.name, args.reference, args.other)
            if pairs is None
            else answers_row(args.name, pairs, where)
        )
        kept = [r for r in old["tables"].get("answers", {}).get("rows", []) if r["search"] != args.name]
        tables = {k: v for k, v in old["tables"].items() if k not in ("main", "answers")}
        tables["answers"] = {"columns": ANSWER_COLUMNS, "rows": [*kept, row]}
        rows, columns, settings = old["tables"].get("main", {}).get("rows", []), SPEED_COLUMNS, old.get("settings", {})
        command = old.get("command", "") + (f"; {args.command}" if args.command else "")
        if rows and "measured" in old:  # the speed table is kept, not rerun: the page says when it was measured
            carried = old.get("carried") or {
                "measured": old["measured"],
                "commit": old["commit"],
                "tables": ["main"],
                "facts": [],
            }
    print(json.dumps(rows if args.what == "speed" else tables["answers"]["rows"], indent=1, default=str))
    if args.section:
        path = write_section_data(
            SECTION, rows, command, settings, title=TITLE, columns=columns, tables=tables, carried=carried
        )
        print(f"wrote {path}", file=sys.stderr)
        if args.what == "answers" and pairs is not None:
            per_problem = DATA / SECTION / f"answers-{args.name}.jsonl"
            per_problem.write_text("".join(json.dumps(r) + "\n" for r in pairs))
            print(f"wrote {per_problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
