"""arbor_cli.provenance: every results row names the code that searched it."""

from __future__ import annotations

import re
import subprocess

import arbor_cli.provenance as provenance


def test_a_checkout_names_its_commit_and_whether_it_was_dirty():
    provenance.code_version.cache_clear()
    code = provenance.code_version()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=provenance._ROOT, capture_output=True, text=True)
    if head.returncode != 0:  # a copy without git history: the installed distribution's version instead
        assert code.startswith("arbor-runtime ")
        return
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", code) and code.startswith(head.stdout.strip())


def test_outside_a_checkout_the_package_version_is_the_code(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "_ROOT", tmp_path)  # no .git here: as an installed wheel sees it
    provenance.code_version.cache_clear()
    try:
        assert re.fullmatch(r"arbor-runtime (\d+\.\d+\.\d+\S*|unknown)", provenance.code_version())
    finally:
        provenance.code_version.cache_clear()


def test_a_tree_with_uncommitted_changes_is_marked_dirty(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.py").write_text("x = 1\n")
    git("add", "f.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(provenance, "_ROOT", tmp_path)
    provenance.code_version.cache_clear()
    try:
        clean = provenance.code_version()
        (tmp_path / "f.py").write_text("x = 2\n")
        provenance.code_version.cache_clear()
        assert re.fullmatch(r"[0-9a-f]{40}", clean) and provenance.code_version() == clean + "+dirty"
    finally:
        provenance.code_version.cache_clear()


def test_what_measuring_writes_does_not_make_the_code_dirty(tmp_path):
    """A benchmark that writes docs/data/<section> (or the page rewriting README's table) leaves the
    code clean for the next section's record; a change to code still counts, staged or not."""
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "docs" / "data" / "wide").mkdir(parents=True)
    files = {"f.py": "x = 1\n", "README.md": "table\n", "docs/data/wide/results.json": "{}\n", "docs/results.md": "p\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    clean = provenance.checkout_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", clean)
    for name in ("README.md", "docs/data/wide/results.json", "docs/results.md"):
        (tmp_path / name).write_text("measured\n")
    git("add", "docs/results.md")
    assert provenance.checkout_commit(tmp_path) == clean
    (tmp_path / "f.py").write_text("x = 2\n")
    git("add", "f.py")
    assert provenance.checkout_commit(tmp_path) == clean + "+dirty"
    assert provenance.checkout_commit(tmp_path / "docs") is None  # not the root of a checkout
