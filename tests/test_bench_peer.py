"""benchmarks/peer.py (issue 64): skips cleanly without llama-cpp-python, and its table reads the samples right."""

from __future__ import annotations

import benchmarks.peer as peer


def test_without_llama_cpp_it_says_how_to_install_and_measures_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(peer, "have_llama_cpp", lambda: False)
    monkeypatch.setattr(peer, "write_section_data", lambda *a, **k: (_ for _ in ()).throw(AssertionError("wrote")))
    assert peer.main(["--rounds", "1", "--section"]) == 0
    assert "pip install 'arbor-runtime[peer]'" in capsys.readouterr().err


def test_the_table_compares_each_system_with_llama_cpp_in_its_round():
    samples = {
        ("decode", 1, "llama.cpp"): [40.0, 50.0, 60.0],
        ("decode", 1, "arbor (int4)"): [20.0, 25.0, 30.0],
        ("tree", 1, "llama.cpp"): [10.0, 12.0, 14.0],
        ("tree", 1, "arbor (int4)"): [5.0, 6.0, 7.0],
    }
    rows = {(r["workload"], r["system"]): r for r in peer.table(samples)}
    assert rows["decode", "arbor (int4)"]["x_llama"] == 0.5  # a rate: median over median
    assert rows["tree", "arbor (int4)"]["x_llama"] == 2.0  # a time: llama.cpp's over ours
    assert rows["decode", "llama.cpp"]["x_llama"] == 1.0 and rows["tree", "arbor (int4)"]["unit"] == "s"
    assert (rows["decode", "llama.cpp"]["min"], rows["decode", "llama.cpp"]["max"]) == (40.0, 60.0)


def test_the_tot_workload_is_compared_with_llama_cpps_faster_way():
    samples = {
        ("tot", 1, "llama.cpp"): [60.0, 70.0],
        ("tot", 1, "llama.cpp states"): [100.0, 120.0],
        ("tot", 1, "arbor (int4)"): [25.0, 30.0],
    }
    rows = {r["system"]: r for r in peer.table(samples)}
    assert rows["arbor (int4)"]["x_llama"] == 65.0 / 27.5 and rows["arbor (int4)"]["unit"] == "s"
    assert rows["llama.cpp states"]["x_llama"] == 65.0 / 110.0 and rows["llama.cpp"]["x_llama"] == 1.0
