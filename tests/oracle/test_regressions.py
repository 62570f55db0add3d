"""Replay every failure the oracle ever saved (``tests/regressions/*.wat`` + ``.json``).

Each file pair is a shrunk case from ``tensorwasm fuzz`` (or a test run); it must pass on
the host backend, with its loops offloaded from wasmtime (to the host backend and to the
device simulated in host memory) and, where a GPU is present, on the GPU and offloaded to
it, forever after its bug is fixed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.oracle.case import Case
from tensorwasm.oracle.compare import run_case

REGRESSIONS = Path(__file__).resolve().parents[1] / "regressions"
CASES = sorted(REGRESSIONS.glob("*.json"))


BACKENDS = [
    "cpu", "offload-cpu", "offload-sim",
    pytest.param("gpu", marks=pytest.mark.gpu), pytest.param("offload-gpu", marks=pytest.mark.gpu),
]  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_regression(path: Path, backend: str) -> None:
    case = Case.load(path)
    outcome = run_case(case, backend)
    assert not outcome.failed, f"{path.name}: {outcome.mismatch}"
    assert outcome.passed + outcome.skipped == len(case.calls)


def test_every_regression_has_its_module() -> None:
    for path in CASES:
        assert path.with_suffix(".wat").exists(), f"{path.name} has no .wat next to it"
