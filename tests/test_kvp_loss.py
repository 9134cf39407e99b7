"""benchmarks/kvp_loss.py (issue 66: which KVP weights ship): the pairing, the decision rule, the refusals,
and the committed section recounted from its per-context rows."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks import kvp_loss
from benchmarks.results.stats import mean_interval

REPO = Path(__file__).resolve().parents[1]
SECTION = REPO / "docs" / "data" / "kvp-loss"
TINY = REPO / "arbor_runtime" / "policies" / "weights" / "kvp-tiny-random.safetensors"


def bench(protocol: str, kl: dict[tuple[str, str], list[float]]) -> dict:
    """A bench_kvp.py output: context i's run NAME at 50% kept has mean KL ``kl[NAME][i]``."""
    n = len(next(iter(kl.values())))
    return {
        "protocol": protocol,
        "steps": 2,
        "per_context": [
            {
                "name": f"gsm8k:{i + 5}:{i}",
                "context_tokens": 700 + i,
                "runs": [{"policy": "oracle", "compression_ratio": 0.5, "retained": 0.9}]
                + [
                    {
                        "policy": f"{loss}@{g}",
                        "compression_ratio": 0.5,
                        "kl": [v[i], v[i]],
                        "top1": [True, False],
                        "retained": 0.8,
                    }
                    for (loss, g), v in kl.items()
                ],  # fmt: skip
            }
            for i in range(n)
        ],
    }


def test_a_candidate_lower_on_every_context_is_lower_beyond_the_interval_and_ships():
    inc = [0.10, 0.20, 0.30, 0.40]
    lower = [x - 0.05 + 0.001 * i for i, x in enumerate(inc)]
    runs = {("listnet", "token"): inc, ("budgets", "token"): lower, ("listnet", "head"): inc, ("budgets", "head"): inc}
    out = kvp_loss.build([bench("compress", runs)], {"listnet": TINY, "budgets": TINY}, "listnet", "budgets")
    token, head = sorted(out["paired"], key=lambda r: r["granularity"], reverse=True)
    assert token["granularity"] == "token" and token["verdict"] == "lower" and token["lower"] == "4 / 4"
    assert token["diff_hi"] < 0 and token["candidate_kl"] == pytest.approx(statistics.fmean(lower))
    assert head["verdict"] == "no difference" and head["lower_n"] == 0  # identical KL: no interval excludes 0
    facts = out["facts"]
    assert (facts["lower"], facts["higher"], facts["no_difference"], facts["cells"]) == (1, 0, 1, 2)
    assert facts["ships"] == "budgets"  # AUC equal (the same file) and lower in more cells than higher
    assert len(out["rows"]) == 4 * 4 and {r["top1"] for r in out["rows"]} == {0.5}


def test_the_incumbent_stays_when_the_candidate_is_higher_as_often_as_lower_or_its_auc_is_below():
    inc = [0.10, 0.20, 0.30, 0.40]
    down = [x - 0.05 for x in inc]
    up = [x + 0.05 for x in inc]
    runs = {("listnet", "token"): inc, ("budgets", "token"): down, ("listnet", "head"): inc, ("budgets", "head"): up}
    out = kvp_loss.build([bench("budget", runs)], {"listnet": TINY, "budgets": TINY}, "listnet", "budgets")
    assert (out["facts"]["lower"], out["facts"]["higher"], out["facts"]["ships"]) == (1, 1, "listnet")
    aucs = {"listnet": {"head_auc": 0.95}, "budgets": {"head_auc": 0.94}}
    lower_only = [r | {"verdict": "lower"} for r in out["paired"]]
    assert kvp_loss.decide(aucs, lower_only, "listnet", "budgets")["ships"] == "listnet"  # AUC below: stays


def test_missing_runs_and_bad_arguments_are_refused_in_one_line(tmp_path, capsys):
    runs = {("listnet", "token"): [0.1, 0.2], ("budgets", "token"): [0.1, 0.2]}  # no @head runs
    with pytest.raises(ValueError, match=r"no run named listnet@head, budgets@head"):
        kvp_loss.build([bench("compress", runs)], {"listnet": TINY, "budgets": TINY}, "listnet", "budgets")
    path = tmp_path / "b.json"
    path.write_text(
        json.dumps(bench("compress", runs | {("listnet", "head"): [0.1, 0.2], ("budgets", "head"): [0.1, 0.2]}))
    )
    with pytest.raises(SystemExit) as err:
        kvp_loss.main([str(path), "--weights", f"listnet={TINY}", "--incumbent", "listnet"])
    assert err.value.code == 2 and "--candidate" in capsys.readouterr().err  # no default: name what is weighed
    pair = ["--incumbent", "listnet", "--candidate", "budgets"]
    with pytest.raises(SystemExit) as err:
        kvp_loss.main([str(path), "--weights", f"listnet={TINY}", *pair])
    assert err.value.code == 2 and "--weights budgets=PATH is missing" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        kvp_loss.main([str(path), "--weights", f"listnet={TINY}", "--weights", "budgets=/nope.safetensors", *pair])
    assert err.value.code == 2 and "must be NAME=PATH of an existing weights file" in capsys.readouterr().err


def test_the_committed_section_recounts_from_its_rows_and_its_decision_holds():
    data = json.loads((SECTION / "results.json").read_text())
    rows = [json.loads(x) for x in (SECTION / "rows.jsonl").read_text().splitlines()]
    facts = data["facts"]
    table = data["tables"]["main"]["rows"]
    for row in table:

        def kl(loss, row=row):
            return {r["context"]: r["mean_kl"] for r in rows if (r["protocol"], r["granularity"], r["loss"]) ==
                    (row["protocol"], row["granularity"], loss) and r["kept"] == row["kept_share"]}  # fmt: skip

        inc, cand = kl(facts["incumbent"]), kl(facts["candidate"])
        diffs = [cand[c] - inc[c] for c in sorted(inc)]
        _, lo, hi = mean_interval(diffs)
        assert len(diffs) == row["contexts"] and sum(d < 0 for d in diffs) == row["lower_n"]
        assert row["verdict"] == kvp_loss.verdict(lo, hi)
        assert row["incumbent_kl"] == pytest.approx(statistics.fmean(inc.values()))
    verdicts = [r["verdict"] for r in table]
    assert (facts["lower"], facts["higher"]) == (verdicts.count("lower"), verdicts.count("higher"))
    auc = {r["loss"]: r["head_auc"] for r in data["tables"]["auc"]["rows"]}
    wins = auc[facts["candidate"]] >= auc[facts["incumbent"]] and facts["lower"] > facts["higher"]
    assert facts["ships"] == (facts["candidate"] if wins else facts["incumbent"])
