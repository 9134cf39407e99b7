"""benchmarks/peer_tot.py (issue 64): the llama.cpp side of the ToT comparison scores what it should.

llama.cpp itself is an optional extra (not installed in CI): :class:`FakeSeqs` stands in for its context, a
causal "model" whose logits after a token are a fixed function of the sequence's tokens up to it, keeping
cells per sequence as llama.cpp's memory does (copied, removed, saved, loaded). Both ways of
:class:`~benchmarks.peer_tot.LlamaRuntime` must then give every continuation's log-probs exactly as the
path's tokens read directly: the batched way's shared cells, positions and groups of scratch sequences,
and the states way's saved KV, included.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import benchmarks.peer_tot as peer_tot
from benchmarks.peer_tot import LlamaRuntime, token_logprobs

VOCAB = 64


def logits_after(context: list[int]) -> np.ndarray:
    """The fake model's (V,) logits after ``context``."""
    g = torch.Generator().manual_seed(hash(tuple(context)) % (2**31))
    return (torch.randn(VOCAB, generator=g) * 3).numpy()


class FakeSeqs:
    """llama.cpp's context as the runtime uses it: cells per sequence, position -> token."""

    def __init__(self, n_seq: int = 6, n_batch: int = 7) -> None:
        self.n_seq, self.n_batch, self.cells, self.decoded = n_seq, n_batch, {}, 0

    def decode(self, entries):
        out = []
        for token, pos, seqs, wants in entries:
            contexts = set()
            for s in seqs:
                cells = self.cells.setdefault(s, {})
                assert sorted(cells) == list(range(pos)), f"sequence {s}: position {pos} after {sorted(cells)}"
                cells[pos] = token
                contexts.add(tuple(cells[p] for p in range(pos + 1)))
            assert len(contexts) == 1  # the sequences sharing a cell share what is before it
            self.decoded += 1
            if wants:
                out.append(logits_after(list(contexts.pop())))
        return np.stack(out) if out else np.zeros((0, VOCAB), dtype=np.float32)

    def seq_cp(self, src, dst):
        self.cells[dst] = dict(self.cells.get(src, {}))

    def seq_rm(self, seq):
        self.cells.pop(seq, None)

    def save(self, seq):
        return json.dumps(sorted(self.cells.get(seq, {}).items())).encode()

    def load(self, data, seq):
        self.cells[seq] = {p: t for p, t in json.loads(data)}

    def clear(self):
        self.cells = {}


class Tokens:
    """A tokenizer of words: word i of the text is token (len(word) * 7 + i) mod VOCAB."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [(len(w) * 7 + i) % VOCAB for i, w in enumerate(text.split(" ")) if w]}


def direct(path: list[int], cont: list[int]) -> list[float]:
    rows = np.stack([logits_after(path + cont[:i]) for i in range(len(cont))])
    return token_logprobs(rows, cont)


@pytest.mark.parametrize("way", ["states", "batched"])
def test_every_continuation_is_scored_as_its_path_reads_it(way):
    seqs = FakeSeqs()
    rt = LlamaRuntime(seqs, Tokens(), way)
    root = rt.new_tree("the prompt of a puzzle with some words")
    choices = ["a b c", "dd e", "fff", "g hh ii jj", "k", "ll mm"]  # more than the scratch sequences: groups
    scored = rt.choose(root, choices, keep=2)
    for ids, lps in zip(scored.token_ids, scored.token_logprobs, strict=True):
        assert lps == pytest.approx(direct(root.token_ids, ids), abs=1e-9)
    assert [k.text for k in scored.kept] == [choices[i] for i in scored.order[:2]]
    child = scored.kept[0]
    assert child.logprobs == scored.token_logprobs[scored.order[0]]
    forced = rt.append(child, "left two three")
    path = root.token_ids + child.token_ids
    assert forced.logprobs == pytest.approx(direct(path, forced.token_ids), abs=1e-9)
    deeper = rt.choose(forced, ["x y", "zz"], keep=[1])
    for ids, lps in zip(deeper.token_ids, deeper.token_logprobs, strict=True):
        assert lps == pytest.approx(direct(path + forced.token_ids, ids), abs=1e-9)
    assert [n.text for n in deeper.kept] == ["zz"] and deeper.kept[0].parent is forced


@pytest.mark.parametrize("way", ["states", "batched"])
def test_two_roots_and_a_release(way):
    seqs = FakeSeqs()
    rt = LlamaRuntime(seqs, Tokens(), way)
    task, value = rt.new_tree("a task prompt here"), rt.new_tree("the value prompt")
    (kid,) = rt.choose(task, ["one two", "three"], keep=1).kept
    scored = rt.choose(value, ["is it sure", "is it likely"])
    assert scored.token_logprobs[1] == pytest.approx(direct(value.token_ids, scored.token_ids[1]), abs=1e-9)
    rt.release(kid)
    assert kid.released and kid not in task.children
    with pytest.raises(ValueError, match="released"):
        rt.choose(kid, ["x"])
    again = rt.choose(task, ["one two"])
    assert again.token_logprobs[0] == pytest.approx(direct(task.token_ids, again.token_ids[0]), abs=1e-9)
    if way == "batched":  # a call leaves only the prompts' sequences behind
        assert set(seqs.cells) == {0, 1}


def test_the_batched_way_decodes_the_path_once_a_call():
    """The node's path below the prompt goes in once, in cells all the call's sequences share."""
    seqs = FakeSeqs(n_seq=16, n_batch=64)
    rt = LlamaRuntime(seqs, Tokens(), "batched")
    root = rt.new_tree("p q r s")
    (kid,) = rt.choose(root, ["aa bb cc dd ee"], keep=1).kept
    before = seqs.decoded
    rt.choose(kid, ["x y", "zz", "w"])
    assert seqs.decoded - before == kid.length + (2 + 1 + 1)


def test_the_table_rates_each_system_against_the_faster_llama_way():
    rows = [{"system": s, "seconds": t, "solved": ok} for s, t, ok in (
        ("arbor", 10.0, True), ("arbor", 20.0, False),
        ("llama.cpp states", 40.0, True), ("llama.cpp states", 60.0, False),
        ("llama.cpp batched", 30.0, True), ("llama.cpp batched", 30.0, True),
    )]  # fmt: skip
    table = {r["system"]: r for r in peer_tot.table(rows)}
    assert table["arbor"]["per_hour"] == 3600 * 2 / 30 and table["arbor"]["x_llama"] == 2.0
    assert table["llama.cpp batched"]["x_llama"] == 1.0 and table["llama.cpp states"]["solved"] == 1


def test_without_llama_cpp_it_says_how_to_install_and_measures_nothing(monkeypatch, capsys):
    import benchmarks.peer as peer

    monkeypatch.setattr(peer, "have_llama_cpp", lambda: False)
    assert peer_tot.main(["--problems", "1"]) == 0
    assert "pip install 'arbor-runtime[peer]'" in capsys.readouterr().err


def test_the_committed_table_is_recounted_from_its_rows():
    """docs/data/peer-tot: the table is what peer_tot.table makes of the committed per-problem rows."""
    from benchmarks.results.data import DATA

    folder = DATA / peer_tot.SECTION
    if not (folder / "results.json").is_file():
        return  # not measured yet in this checkout
    table = json.loads((folder / "results.json").read_text())["tables"]["main"]["rows"]
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    assert len({(r["index"], r["system"]) for r in rows}) == len(rows)
    assert peer_tot.table(rows) == table  # the same floats: JSON keeps every digit
