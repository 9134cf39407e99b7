"""Every figure in a hand-written sentence is checked against that sentence (issue 63).

README outside its generated block, ``docs/*.md``, the section templates of ``docs/notes`` and the
``docs/data`` READMEs are cut into sentences (:mod:`benchmarks.results.prose`); each sentence that holds a
figure must be in the ledger ``docs/figures.jsonl``: either with a check of ``tests/doc_figures.py`` that
recomputes its figures from ``docs/data`` (and asserts what the sentence says of them), or with its figures
as written and why they are no measurement. A sentence added or edited with a figure nobody classified fails,
a measured figure the data does not give fails, and a ledger line that matches no sentence fails (stale).
``python -m benchmarks.results.prose`` lists the sentences the ledger lacks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_figures import CHECKS, REPO, ledger

from benchmarks.results.prose import figure_sentences, scoped_files

LEDGER = ledger()
SENTENCES = [s for path in scoped_files() for s in figure_sentences(path)]


def entries_of(sentence) -> list[dict]:
    return [e for e in LEDGER if e["file"] == sentence.file and sentence.text.startswith(e["snippet"])]


def test_every_figure_sentence_is_in_the_ledger_once():
    missing = [f"{s.file}: {s.text[:100]}" for s in SENTENCES if len(entries_of(s)) != 1]
    assert not missing, (
        "figure sentences not in docs/figures.jsonl (python -m benchmarks.results.prose):\n" + "\n".join(missing)
    )


def test_every_ledger_line_matches_one_sentence():
    stale = [e for e in LEDGER if sum(s.file == e["file"] and s.text.startswith(e["snippet"]) for s in SENTENCES) != 1]
    assert not stale, f"ledger lines that match no sentence (or several): {stale[:5]}"


@pytest.mark.parametrize("entry", [e for e in LEDGER if "check" in e], ids=lambda e: e["check"])
def test_a_measured_sentence_states_what_the_data_gives(entry):
    (sentence,) = [s for s in SENTENCES if s.file == entry["file"] and s.text.startswith(entry["snippet"])]
    assert sentence.figures == CHECKS[entry["check"]](), sentence.text


def test_a_sentence_that_is_no_measurement_keeps_its_figures_and_says_why():
    for entry in (e for e in LEDGER if "check" not in e):
        (sentence,) = [s for s in SENTENCES if s.file == entry["file"] and s.text.startswith(entry["snippet"])]
        assert tuple(entry["figures"]) == sentence.figures, (entry["file"], sentence.text)
        assert entry["why"].strip(), entry


def test_every_check_is_used():
    assert {e["check"] for e in LEDGER if "check" in e} == set(CHECKS)


def test_a_false_sentence_fails(tmp_path):
    """The checks are real: README's results paragraph and the scaling template with a figure added, and the
    seed-1 sentence with 60 of 69 for 68, are each caught."""
    import benchmarks.results.prose as prose

    readme = (REPO / "README.md").read_text()
    false_readme = readme.replace(
        "It runs every puzzle at every budget,", "It runs every puzzle at every budget (10 solved),"
    )
    note = (REPO / "docs" / "notes" / "e2e-scaling-game24.md").read_text()
    false_note = note.replace("Breadth 20 solves the most puzzles", "Breadth 20 solves 70 puzzles, the most")
    seed1 = (REPO / "docs" / "data" / "longctx-seed1" / "README.md").read_text()
    false_seed1 = seed1.replace("keeps 68 of dense's 69", "keeps 60 of dense's 69")
    assert false_readme != readme and false_note != note and false_seed1 != seed1
    for rel, text in (("README.md", false_readme), ("docs/notes/e2e-scaling-game24.md", false_note)):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        found = prose.figure_sentences(path, tmp_path)
        assert any(not entries_of(s) for s in found), rel  # an unclassified figure sentence
    path = tmp_path / "docs" / "data" / "longctx-seed1" / "README.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(false_seed1)
    (sentence,) = [s for s in prose.figure_sentences(path, tmp_path) if "shipped default keeps" in s.text]
    (entry,) = entries_of(sentence)
    assert sentence.figures != CHECKS[entry["check"]]()


def test_the_lister_finds_nothing_missing(capsys):
    import benchmarks.results.prose as prose

    assert prose.main([]) == 0
    assert re.search(r"^0 figure sentences not in the ledger", capsys.readouterr().err, re.M)


def test_the_scope_is_the_hand_written_prose():
    files = {str(p.relative_to(REPO)) for p in scoped_files()}
    assert "README.md" in files and "docs/policies.md" in files and "docs/notes/e2e-scaling-game24.md" in files
    assert "docs/data/longctx-seed1/README.md" in files and "docs/results.md" not in files
    assert Path(REPO / "docs" / "figures.jsonl").is_file()
