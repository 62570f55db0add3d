from __future__ import annotations

from pathlib import Path

import pytest
import wasmtime

ROOT = Path(__file__).resolve().parents[1]
CORPUS = sorted((ROOT / "examples").glob("**/build/*.wasm"))


def wat(text: str) -> bytes:
    return bytes(wasmtime.wat2wasm(text))


@pytest.fixture
def corpus() -> list[Path]:
    assert CORPUS, "the example corpus is missing: run scripts/build-examples"
    return CORPUS
