"""The example WASI programs built with -msimd128 (clang's vectoriser then emits SIMD128:
stride-16 loops, v128 accumulators, a scalar remainder loop after each) run offloaded with
output identical to wasmtime's, and launch at least the loops their scalar builds launch."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.runtime.test_run import PROGRAMS, plain_wasmtime, tensorwasm_run


def _launched(proc) -> tuple[int, int]:
    """(loops of ``main`` launched at least once, launches in all) from a run's JSON report."""
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    mains = [row for row in report["loops"] if row["func"] == "main"]
    return sum(1 for row in mains if row.get("offloaded")), sum(row.get("offloaded", 0) for row in mains)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_simd_build_output_is_identical_and_its_loops_launch(name: str, device: str, tmp_path) -> None:
    simd = ROOT / f"examples/wasi/build/{name}.O2.simd.wasm"
    status, expected = plain_wasmtime(simd, PROGRAMS[name], tmp_path)
    assert (status, expected) == plain_wasmtime(
        ROOT / f"examples/wasi/build/{name}.O2.wasm", PROGRAMS[name], tmp_path
    )
    proc = tensorwasm_run(simd, PROGRAMS[name], device)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout == expected
    loops, launches = _launched(proc)
    scalar_loops, _ = _launched(
        tensorwasm_run(ROOT / f"examples/wasi/build/{name}.O2.wasm", PROGRAMS[name], device)
    )
    print(f"{name}: SIMD build launched {loops} loops of main ({launches} launches), scalar {scalar_loops}")
    if name == "histogram":
        assert loops == 0
    else:
        # (reduce's sums run as one loop of three vector reductions, i64x2.add and
        # i32x4.min_s/max_s; the loop filling its array steps a vector of indices, a v128
        # induction variable computed in the kernel.)
        assert loops >= scalar_loops > 0
