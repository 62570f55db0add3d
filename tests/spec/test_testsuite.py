"""The official WebAssembly testsuite (core and SIMD), file by file, on the host backend and the GPU.

Every check of a claimed file must pass, none skipped; the files not claimed are listed,
with their reasons, in docs/semantics.md. Where this checkout has no testsuite (a user's
clone without the shared folder), the whole module is skipped with one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spec.harness import CLAIMED, NOT_CLAIMED, find_testsuite, run_file, spec_files
from tests.spec.table import DOC_PATH, cell, current_cells

TESTSUITE = find_testsuite()
if TESTSUITE is None:
    pytest.skip(
        "the official WebAssembly testsuite is not in this checkout "
        "(../shared/wasm-testsuite, or set TENSORWASM_WASM_TESTSUITE)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wast")


def test_every_file_is_claimed_or_has_a_reason() -> None:
    files = set(spec_files(TESTSUITE))
    assert set(CLAIMED) | set(NOT_CLAIMED) == files
    assert not set(CLAIMED) & set(NOT_CLAIMED)


def test_docs_table_lists_every_file() -> None:
    cells = current_cells(DOC_PATH.read_text())
    assert sorted(cells) == sorted(spec_files(TESTSUITE)), "run scripts/spec-table"
    for name, reason in NOT_CLAIMED.items():
        assert f"- `{name}`: {reason}" in DOC_PATH.read_text(), "run scripts/spec-table"


def _check(name: str, backend: str, workdir: Path):
    tally = run_file(name, backend, workdir, TESTSUITE)
    problems = tally.failures + tally.skips
    assert not problems, f"{len(problems)} of {name}.wast's checks on {backend}:\n" + "\n".join(problems[:40])
    return tally


@pytest.mark.parametrize("name", CLAIMED)
def test_host_backend(name: str, workdir: Path) -> None:
    tally = _check(name, "cpu", workdir)
    documented = current_cells(DOC_PATH.read_text()).get(name, {}).get("cpu")
    assert documented == cell(tally), (
        f"docs/semantics.md says {documented!r} for {name}: run scripts/spec-table"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("name", CLAIMED)
def test_gpu(name: str, workdir: Path) -> None:
    _check(name, "gpu", workdir)


# The files whose checks differ between targets: float results (NaN bits, min/max, which
# sm_75 emulates), conversions, integer edge cases, and recursion depth; SIMD's float lanes.
ACROSS_TARGETS = [
    name for name in CLAIMED
    if name.startswith(("f32", "f64", "float", "conversions", "i32", "i64", "int_", "call",
                        "simd_f32x4", "simd_f64x2", "simd_conversions", "simd_i32x4_trunc_sat"))
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["sm_80", "sm_75"])
@pytest.mark.parametrize("name", ACROSS_TARGETS)
def test_gpu_older_targets(name: str, arch: str, workdir: Path) -> None:
    """The same checks with the code made for an older architecture, run on this device."""
    _check(name, f"gpu-{arch}", workdir)
