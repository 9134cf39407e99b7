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
