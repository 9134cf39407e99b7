"""The defaults show the product: game24 ranks legal steps, policy=arbor runs under an automatic budget."""

from __future__ import annotations

import json

from rich.console import Console

from arbor_cli.build import compose_config
from arbor_cli.run import run


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def test_game24_proposes_legal_steps_and_arbor_budget_is_auto_by_default():
    cfg = compose_config(["policy=arbor"])
    assert cfg.task.propose == "legal" and cfg.policy.budget_tokens == "auto"
    assert compose_config(["policy=h2o"]).policy.budget_tokens is None  # dropping policies: no default budget


def test_auto_budget_on_cpu_is_twice_the_longest_path_and_printed(tiny, data_dir, tmp_path, monkeypatch):
    import arbor_cli.build

    monkeypatch.setattr(arbor_cli.build, "load_model", lambda **kw: tiny)
    over = ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={tmp_path}", "policy=arbor"]
    over += ["task.start=900", "task.end=901", "verifier=game24_oracle", "controller.n_generate=3"]
    console = Console(record=True, width=100)
    assert run(compose_config(over), console=console) == 0
    text = console.export_text()
    prompt = int(text.split("(prompt ")[1].split(" ")[0])
    row = rows(tmp_path)[0]
    assert row["budget_tokens"] == 2 * (prompt + 24)  # game24: one thought = 24 tokens
    assert f"policy.budget_tokens=auto: {row['budget_tokens']:,} KV tokens" in text.splitlines()[0]
    assert row["peak_device_tokens"] <= row["budget_tokens"] and not row["oom"]


def test_budget_null_is_still_unbounded(tiny, data_dir, tmp_path, monkeypatch):
    import arbor_cli.build

    monkeypatch.setattr(arbor_cli.build, "load_model", lambda **kw: tiny)
    over = ["model=tiny-random", f"paths.data_dir={data_dir}", f"run_dir={tmp_path}", "policy=arbor"]
    over += ["task.start=900", "task.end=901", "verifier=game24_oracle", "policy.budget_tokens=null"]
    console = Console(record=True, width=100)
    assert run(compose_config(over), console=console) == 0
    assert rows(tmp_path)[0]["budget_tokens"] is None and "budget_tokens=auto" not in console.export_text()
