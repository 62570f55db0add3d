from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import wasmtime

ROOT = Path(__file__).resolve().parents[1]
# Tests compile into a cache of their own, never the user's (nor one left by another run).
os.environ["TENSORWASM_CACHE_DIR"] = tempfile.mkdtemp(prefix="tensorwasm-test-cache-")
CORPUS = sorted((ROOT / "examples").glob("**/build/*.wasm"))


def wat(text: str) -> bytes:
    return bytes(wasmtime.wat2wasm(text))


@pytest.fixture
def corpus() -> list[Path]:
    assert CORPUS, "the example corpus is missing: run scripts/build-examples"
    return CORPUS


@pytest.fixture(scope="session")
def ptxas() -> str:
    """ptxas, to check that generated PTX assembles (the test extras ship it)."""
    from tensorwasm.compiler.target import find_ptxas

    path = find_ptxas()
    assert path, "ptxas not found: install the test extras (nvidia-cuda-nvcc) or the CUDA toolkit"
    return path
