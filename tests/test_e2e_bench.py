"""benchmarks/e2e.py (the Table 1 analog): a reference run and a sweep's run dirs read back into one row
per policy and budget; on hand-made run dirs in arbor-solve's formats, no model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from arbor_cli.results import read_jsonl
from benchmarks.e2e import main, row_codes, sweep_runs, table, tree_paths


def run_dir(path: Path, rows: list[dict], trees: dict[int, list[tuple[int, int | None, str]]]) -> Path:
    """A run dir: ``results.jsonl`` and ``trees/<index>.json`` (nodes as (id, parent, text))."""
    (path / "trees").mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for index, nodes in trees.items():
        records = [{"id": i, "parent": p, "text": t} for i, p, t in nodes]
        (path / "trees" / f"{index}.json").write_text(json.dumps({"nodes": records}))
    return path


def job(sweep: Path, name: str, overrides: list[str], rows: list[dict], trees) -> Path:
    path = run_dir(sweep / name, rows, trees)
    (path / ".hydra").mkdir()
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    return path


def row(index: int, answer: str, solved: bool, peak: int, seconds: float, **extra) -> dict:
    return {"index": index, "answer": answer, "solved": solved, "peak_device_bytes": peak, "seconds": seconds} | extra


FULL_TREES = {
    0: [(1, None, "q"), (2, 1, "a"), (3, 1, "b"), (4, 2, "c")],
    1: [(1, None, "q"), (2, 1, "x")],
}


def test_rows_compare_each_run_with_full_on_the_same_problems(tmp_path):
    full = run_dir(tmp_path / "full", [row(0, "24", True, 1000, 2.0), row(1, "7", False, 3000, 4.0)], FULL_TREES)
    sweep = tmp_path / "sweep"
    # arbor at 0.5x: the same trees and answers, more time, rehydrations
    same = [row(0, "24", True, 500, 3.0, rehydrations=2, pool_bytes=2**20),
            row(1, "7", False, 1500, 5.0, rehydrations=4, pool_bytes=3 * 2**20)]  # fmt: skip
    job(sweep, "0", ["policy=arbor", "policy.budget_ratio=0.5"], same, FULL_TREES)
    # h2o at 0.25x: problem 0 takes another branch below "a" (3 of full's 4 nodes), problem 1 runs out of memory
    other = {0: [(1, None, "q"), (2, 1, "a"), (3, 1, "b"), (5, 2, "d")], 1: [(1, None, "q")]}
    # (full answered "7" there; an out-of-memory run never agrees, even with a full that gave no answer)
    bad = [row(0, "23", False, 250, 1.0), row(1, None, False, 750, 0.5, oom=True)]
    job(sweep, "1", ["policy=h2o", "policy.budget_ratio=0.25", "controller.breadth=5"], bad, other)
    rows = table("game24", full, [sweep])
    assert [(r["policy"], r["budget"], r["setting"]) for r in rows] == [
        ("full", "none", ""),
        ("arbor", "0.5x full peak", ""),
        ("h2o", "0.25x full peak", "controller.breadth=5"),
    ]
    ref, arbor, h2o = rows
    assert ref["agree_n"] == 2 and ref["nodes_as_full"] == 1.0 and ref["x_full_kv"] == 1.0
    assert arbor["agree_n"] == 2 and arbor["nodes_as_full"] == 1.0 and arbor["solved_n"] == 1
    assert arbor["x_full_kv"] == 0.5 and arbor["rehydrations"] == 3.0 and arbor["oom_n"] == 0
    assert arbor["p50_s"] == 3.0 and arbor["p95_s"] == 5.0
    assert arbor["pool_mb"] == 2.0  # the mean pool the runtime allocated, in MB
    assert arbor["solved_per_h"] == 1 / (8.0 / 3600)  # one solved in 3 + 5 seconds of search
    assert ref["vs_full"] == "" and ref["sign_p"] is None  # the reference is not tested against itself
    assert arbor["vs_full"] == "+0 / -0 (p 1)" and h2o["vs_full"] == "+0 / -1 (p 1)"
    assert h2o["agree_n"] == 0 and h2o["oom_n"] == 1 and h2o["solved_n"] == 0
    assert h2o["nodes_as_full"] == (3 / 4 + 1 / 2) / 2  # per problem, then the mean
    assert h2o["solved"].startswith("0/2") and "[" in h2o["solved"]  # a rate with its interval
    no_answer = run_dir(tmp_path / "none", [row(0, None, False, 1000, 2.0)], {0: FULL_TREES[0]})
    oom = job(tmp_path / "sweep2", "0", ["policy=arbor", "policy.budget_ratio=0.25"],
              [row(0, None, False, 0, 0.0, oom=True)], {})  # fmt: skip
    assert table("x", no_answer, [oom.parent])[1]["agree_n"] == 0


def test_tree_paths_name_nodes_by_their_path_texts(tmp_path):
    full = run_dir(tmp_path / "r", [], FULL_TREES)
    assert tree_paths(full, 0) == {("q",), ("q", "a"), ("q", "b"), ("q", "a", "c")}
    assert tree_paths(full, 7) == set()  # no tree saved: nothing in common


def test_sweep_jobs_name_policy_ratio_and_search_shape(tmp_path):
    job(tmp_path, "0", ["policy=kvp", "policy.budget_ratio=0.35", "seed=3"], [row(0, "1", False, 1, 1.0)], {})
    [(policy, ratio, other, path)] = sweep_runs(tmp_path)
    assert (policy, ratio, other, path.name) == ("kvp", 0.35, "", "0")  # seed is not a search-shape key


def test_a_setting_the_runs_share_but_the_reference_lacks_still_names_the_rows(tmp_path):
    """Two lookahead-1 runs that differ by their trial values, against a reference without lookahead: the
    rows name both keys (in SETTING_KEYS order), not only the one the two runs differ by."""
    full = job(tmp_path, "full", ["policy=full", "controller.breadth=5"], [row(0, "24", True, 9, 1.0)], FULL_TREES)
    runs = []
    for trials in ("model", "exact"):
        over = ["policy=arbor", "controller.breadth=5", f"verifier.trial_values={trials}", "verifier.lookahead=1"]
        runs.append(job(tmp_path, f"la-{trials}", over, [row(0, "24", True, 5, 2.0)], FULL_TREES))
    rows = table("x", full, runs)
    assert [r["setting"] for r in rows] == [
        "", "verifier.lookahead=1 verifier.trial_values=model", "verifier.lookahead=1 verifier.trial_values=exact"
    ]


def test_section_data_is_written_with_the_command(tmp_path, monkeypatch):
    import benchmarks.results.data as data

    monkeypatch.setattr(data, "DATA", tmp_path / "docs-data")
    full = run_dir(tmp_path / "full", [row(0, "24", True, 1000, 2.0)], FULL_TREES)
    job(tmp_path / "sweep", "0", ["policy=arbor", "policy.budget_ratio=0.5"], [row(0, "24", True, 500, 3.0)], {})
    argv = ["game24", str(full), str(tmp_path / "sweep"), "--section", "e2e-test", "--command", "bash x.sh"]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "docs-data" / "e2e-test" / "results.json").read_text())
    assert doc["command"] == "bash x.sh" and len(doc["tables"]["main"]["rows"]) == 2
    assert [c["key"] for c in doc["tables"]["main"]["columns"]][:4] == ["search", "policy", "setting", "budget"]
    assert "problem_rows" not in doc["tables"]["main"]["rows"][1]  # the problems go to rows.jsonl, beside it
    per = read_jsonl(tmp_path / "docs-data" / "e2e-test" / "rows.jsonl")
    assert [(r["policy"], r["budget"], r["index"], r["solved"], r["agree"]) for r in per] == [
        ("full", "none", 0, True, True),
        ("arbor", "0.5x full peak", 0, True, True),
    ]
    assert per[1]["seconds"] == 3.0 and per[1]["peak_device_bytes"] == 500 and per[0]["nodes_as_full"] == 1.0


def test_the_section_is_measured_by_the_code_of_its_rows_not_the_writing_checkout(tmp_path, monkeypatch):
    """Rows searched by one code: that is the section's commit. Rows of several codes, or rows written
    before rows named their code: each code with its count, the commit that of most rows."""
    import benchmarks.results.data as data

    monkeypatch.setattr(data, "DATA", tmp_path / "docs-data")
    a, b = "a" * 40, "b" * 40 + "+dirty"

    def section(name: str, full_codes: list, sweep_codes: list) -> dict:
        full = run_dir(tmp_path / name / "full", [row(i, "24", True, 9, 1.0, code=c) for i, c in enumerate(full_codes)],
                       FULL_TREES)  # fmt: skip
        rows = [row(i, "24", True, 5, 1.0, code=c) for i, c in enumerate(sweep_codes)]
        job(tmp_path / name / "sweep", "0", ["policy=arbor", "policy.budget_ratio=0.5"], rows, {})
        assert main([name, str(full), str(tmp_path / name / "sweep"), "--section", name, "--command", "x"]) == 0
        return json.loads((tmp_path / "docs-data" / name / "results.json").read_text())

    one = section("one", [a, a], [a, a])
    assert one["commit"] == a and "row_codes" not in one
    mixed = section("mixed", [None, None], [b, a])
    assert mixed["row_codes"] == {"not recorded": 2, b: 1, a: 1} and mixed["commit"] == b
    none = section("none", [None], [None])
    assert none["commit"] is None and none["row_codes"] == {"not recorded": 2}


def test_script_splits_the_policies_over_parallel_sweeps(tmp_path, data_dir):
    """scripts/bench_e2e.sh through the console script on the tiny model: JOBS=2 runs the policies as two
    sweeps side by side (sweep-1: h2o, sweep-2: arbor), each job a run dir the table reads."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    args = ["model=tiny-random", "task=gsm8k", "task.start=0", "task.end=1", "task.max_thought_tokens=4",
            "controller=best_first", "controller.n_generate=2", "controller.max_expansions=2"]  # fmt: skip
    env = os.environ | {"BIN": str(Path(sys.executable).parent), "POLICIES": "h2o,arbor", "RATIOS": "0.5",
                        "SECTION": "0", "JOBS": "2"}  # fmt: skip
    script = [str(repo / "scripts/bench_e2e.sh"), "gsm8k", str(tmp_path / "out"), str(data_dir), *args]
    done = subprocess.run(["bash", *script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    sweeps = sorted(p.name for p in (tmp_path / "out" / "gsm8k").glob("sweep*"))
    assert sweeps == ["sweep-1", "sweep-2"]
    out = tmp_path / "out" / "gsm8k"
    rows = table("gsm8k", out / "full", [out / s for s in sweeps])
    assert sorted(r["policy"] for r in rows) == ["arbor", "full", "h2o"]
    assert sorted(policy for policy, _, _, _ in sweep_runs(out / "sweep-1")) == ["h2o"]
    assert all(r["problems"] == 1 and r["budget"] == ("none" if r["policy"] == "full" else "0.5x full peak")
               for r in rows)  # fmt: skip
    codes = row_codes([out / "full"] + [d for s in sweeps for *_, d in sweep_runs(out / s)])
    assert len(codes) == 1 and re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", next(iter(codes)))  # the checkout's commit
    assert sum(codes.values()) == 3  # every row of the reference and both sweeps names it


def test_config_l_sweeps_breadth_at_full_peak(tmp_path, data_dir):
    """experiment=configl_game24 through the script (tiny model, one puzzle): the reference at breadth 1
    with 1 thought per state, then (SWEEP, the sweep only) full and arbor at 1.0x its peak over two groups
    of settings (breadth 1 and 2 with 1 thought; breadth 1 with 2 thoughts: a grid without its corner)
    split over JOBS=2 sweeps a group each, every row naming its setting by what varies over both."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    args = ["model=tiny-random", "experiment=configl_game24", "task.start=900", "task.end=901",
            "controller.breadth=1", "controller.n_generate=1"]  # fmt: skip
    env = os.environ | {"BIN": str(Path(sys.executable).parent), "POLICIES": "full,arbor", "RATIOS": "1.0",
                        "SECTION": "0", "JOBS": "2",
                        "SWEEP": "controller.breadth=1,2 controller.n_generate=1;controller.n_generate=2"}  # fmt: skip
    script = [str(repo / "scripts/bench_e2e.sh"), "configl", str(tmp_path / "out"), str(data_dir), *args]
    done = subprocess.run(["bash", *script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "out" / "configl"
    for sweep, thoughts in (("sweep-1", {"1"}), ("sweep-2", {"2"})):  # one group per sweep, both policies
        runs = sweep_runs(out / sweep, {"controller.n_generate"})
        assert sorted(p for p, _, _, _ in runs) == sorted(["arbor", "full"] * (2 if thoughts == {"1"} else 1))
        assert {o.split("=")[-1] for _, _, o, _ in runs} == thoughts
    rows = table("configl", out / "full", [out / "sweep-1", out / "sweep-2"])
    got = sorted((r["policy"], r["budget"], r["setting"]) for r in rows)
    grid = ["controller.breadth=1 controller.n_generate=1", "controller.breadth=2 controller.n_generate=1",
            "controller.breadth=1 controller.n_generate=2"]  # fmt: skip
    assert got == sorted([("full", "none", "")] + [(p, "1x full peak", g) for p in ("full", "arbor") for g in grid])


def test_script_refuses_a_bad_jobs_value_before_any_search(tmp_path):
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    env = os.environ | {"JOBS": "two", "BIN": str(tmp_path / "no-bin")}  # no arbor-solve there: nothing may run
    done = subprocess.run(["bash", str(repo / "scripts/bench_e2e.sh"), "x", str(tmp_path), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "bench_e2e.sh: error: JOBS=two: expected a whole number >= 1 (sweeps side by side)"
    ]


def test_scaling_script_merges_the_reference_halves_and_widens_inside_their_peak(tmp_path, data_dir):
    """scripts/bench_scaling.sh on the tiny model (puzzles 900-901, breadths 1 / 2 / 3 / 4, 1 thought, 2 for
    the widened one): the reference's halves run side by side and merge into one run dir, then arbor at the
    wider breadths, full at breadth 3, arbor with 2 thoughts per state (halves merged) and arbor at breadth 4
    (halves merged) run inside each puzzle's peak; a rerun resumes every step (nothing runs twice)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = os.environ | {"BIN": str(Path(sys.executable).parent), "START": "900", "END": "902", "REF": "1",
                        "WIDE": "2", "WIDER": "3", "WIDEST": "4", "THOUGHTS": "1", "MORE": "2",
                        "SECTION": "0"}  # fmt: skip
    script = ["bash", str(repo / "scripts/bench_scaling.sh"), str(tmp_path / "out"), str(data_dir), "model=tiny-random"]
    for _ in range(2):
        done = subprocess.run(script, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "out"
    assert [r["index"] for r in read_jsonl(out / "full" / "results.jsonl")] == [900, 901]  # merged once
    runs = ("sweep-1", "sweep-2", "sweep-3", "thoughts", "widest")
    rows = table("scaling", out / "full", [out / s for s in runs])
    got = sorted((r["policy"], r["setting"], r["problems"]) for r in rows)
    assert got == [("arbor", "controller.breadth=1 controller.n_generate=2", 2),
                   ("arbor", "controller.breadth=2 controller.n_generate=1", 2),
                   ("arbor", "controller.breadth=3 controller.n_generate=1", 2),
                   ("arbor", "controller.breadth=4 controller.n_generate=1", 2),
                   ("full", "", 2), ("full", "controller.breadth=3 controller.n_generate=1", 2)]  # fmt: skip
    assert all(len(read_jsonl(d / "results.jsonl")) == 2 for s in runs for *_, d in sweep_runs(out / s))


def test_scaling_script_with_lookahead_runs_the_reference_and_each_lookahead_only(tmp_path, data_dir):
    """LOOKAHEAD="1 2" TRIALS="model exact" on the tiny model: the reference, then arbor at the reference's
    breadth with verifier.lookahead 1 and 2, each with the model's and the exact trial values, inside its
    peak, each as merged halves; no breadth or thoughts widening runs; a bad LOOKAHEAD or TRIALS is refused
    in one line before anything runs."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = os.environ | {"BIN": str(Path(sys.executable).parent), "START": "900", "END": "902", "REF": "1",
                        "THOUGHTS": "1", "SECTION": "0"}  # fmt: skip
    script = ["bash", str(repo / "scripts/bench_scaling.sh"), str(tmp_path / "out"), str(data_dir), "model=tiny-random"]
    bad = subprocess.run(script, cwd=repo, env=env | {"LOOKAHEAD": "1 two"}, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "LOOKAHEAD=1 two" in bad.stderr
    assert not (tmp_path / "out").exists()
    bad = subprocess.run(script, cwd=repo, env=env | {"LOOKAHEAD": "1", "TRIALS": "tool"}, capture_output=True,
                         text=True)  # fmt: skip
    assert bad.returncode == 2 and "TRIALS=tool: valid: model, exact" in bad.stderr
    lookahead = {"LOOKAHEAD": "1 2", "TRIALS": "model exact"}
    done = subprocess.run(script, cwd=repo, env=env | lookahead, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "out"
    runs = ["lookahead-1", "lookahead-1-exact", "lookahead-2", "lookahead-2-exact"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(
        ["full", "full-2", *runs, *(f"{r}-2" for r in runs)]
    )
    rows = table("lookahead", out / "full", [out / r for r in runs])
    got = sorted((r["policy"], r["setting"], r["problems"]) for r in rows)
    assert got == [("arbor", f"verifier.lookahead={k} verifier.trial_values={t}", 2)
                   for k in (1, 2) for t in ("exact", "model")] + [("full", "", 2)]  # fmt: skip
