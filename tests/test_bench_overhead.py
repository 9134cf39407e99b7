"""bench_overhead.py (issue 46): time ratios to full interleaved per repeat, and the profile buckets."""

from __future__ import annotations

import json

import pytest

from arbor_runtime import Runtime, SamplingParams
from benchmarks.overhead import SETTINGS, bucket_of, overhead_main, profile_buckets, profile_rows, ratios


def rows(task: str, seconds: dict[str, list[list[float]]]) -> list[dict]:
    """setting -> per repeat, per problem seconds."""
    out = []
    for setting, reps in seconds.items():
        for rep, per_problem in enumerate(reps):
            for problem, s in enumerate(per_problem):
                out.append({"task": task, "setting": setting, "repeat": rep, "problem": problem, "seconds": s,
                            "same_tree": setting != "arbor 0.25x" or problem == 0})  # fmt: skip
    return out


def test_ratios_sum_each_repeat_over_the_same_problems_then_take_the_median():
    got = {r["setting"]: r for r in ratios(rows("t", {
        "full": [[1, 3], [2, 2], [1, 1]],
        "arbor none": [[1, 3], [2, 2], [1.1, 1.1]],  # 1.0, 1.0, 1.1
        "arbor 0.25x": [[2, 6], [3, 3], [4, 4]],  # 2.0, 1.5, 4.0
    }))}  # fmt: skip
    assert got["full"]["x_full"] == 1.0
    assert got["arbor none"]["x_full"] == 1.0 and got["arbor none"]["x_full_max"] == pytest.approx(1.1)
    assert (got["arbor 0.25x"]["x_full"], got["arbor 0.25x"]["x_full_min"], got["arbor 0.25x"]["x_full_max"]) == (
        2.0, 1.5, 4.0)  # fmt: skip
    assert got["arbor 0.25x"]["same_tree"] == 1 and got["arbor none"]["same_tree"] == 2


def test_profile_buckets_charge_c_functions_to_the_code_that_called_them(tiny, one_torch_thread):
    assert bucket_of(("/x/arbor_runtime/attention/tree.py", 1, "_collect")) == "attention statistics"
    assert bucket_of(("/x/site-packages/transformers/models/llama/modeling_llama.py", 1, "forward")).startswith("model")
    assert bucket_of(("~", 0, "<built-in method torch.matmul>")) is None
    rt = Runtime(tiny, policy="h2o")  # statistics on: every bucket of a search's step runs
    root = rt.new_tree("Input: 4 4 6 8\nSteps:\n")
    got = profile_buckets(lambda: rt.expand(root, 2, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)))
    assert got["model (transformers, torch.nn)"] > 0 and got["tree attention"] > 0
    assert got["attention statistics"] > 0 and got["engine, scheduler, sampling"] > 0


def test_the_script_runs_every_setting_interleaved_and_resumes(data_dir, tmp_path, capsys):
    args = ["--repeats", "1", "--threads", "1", "--out", str(tmp_path), "model=tiny-random",
            f"paths.data_dir={data_dir}", "task.start=0", "task.end=1", "controller.n_generate=2",
            "controller.breadth=2"]  # fmt: skip
    assert overhead_main(args) == 0
    lines = [json.loads(s) for s in (tmp_path / "overhead.jsonl").read_text().splitlines()]
    assert [r["setting"] for r in lines] == [label for label, _, _ in SETTINGS]
    by = {r["setting"]: r for r in lines}
    assert by["full"]["same_tree"] and by["arbor none"]["same_tree"] and by["arbor floor"]["same_tree"]
    assert by["arbor 0.5x"]["budget"] == -(-by["full"]["full_peak"] // 2) and not any(r["oom"] for r in lines)
    assert overhead_main(args) == 0  # resumed: the problem is done, nothing runs again
    assert len((tmp_path / "overhead.jsonl").read_text().splitlines()) == len(lines)


def test_the_profile_runs_full_and_arbor_without_a_budget_and_at_its_floor(data_dir, tmp_path):
    args = ["--profile", "--threads", "1", "--out", str(tmp_path), "model=tiny-random", f"paths.data_dir={data_dir}",
            "task.start=0", "task.end=1", "controller.n_generate=2", "controller.breadth=2"]  # fmt: skip
    assert overhead_main(args) == 0
    doc = json.loads((tmp_path / "profile.json").read_text())
    assert list(doc["seconds"]) == ["full", "arbor", "arbor floor"] and doc["floor"] > 0
    rows = profile_rows(doc)
    assert all(r["floor_s"] is not None for r in rows)
    model = next(r for r in rows if r["bucket"].startswith("model"))
    assert model["full_s"] > 0 and model["floor_s"] > 0
    doc["seconds"].pop("arbor floor")  # a profile from before the floor was profiled: its columns stay empty
    assert all(r["floor_s"] is None and r["floor_diff_s"] is None for r in profile_rows(doc))
