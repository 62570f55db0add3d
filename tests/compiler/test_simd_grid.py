"""Row sweeps as clang -O2 -msimd128 vectorises them, distributed over a 2-D grid
(compiler/analysis/schedule.py): the row body holds two loops, clang's vector loop (16 bytes
a step) and its scalar remainder, so the row loop runs as two phases, a block per row whose
threads share the row's vector steps, then its remainder's elements.

Two things kept these nests at one thread per row: the row offset ``i * m`` (a counter times
a size, not affine for isl) made every pair of the row's accesses "not modelled", though
within one row it is the same value for both; and the blur's ``s / 9`` counted as a division
that may trap. Data: tests/compiler/data/simdgrid.c (built .wasm beside it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32, V128
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler import test_schedule as schedule
from tests.conftest import ROOT

DATA = (Path(__file__).parent / "data" / "simdgrid.wasm").read_bytes()
# The host backend, the GPU path's data movement on the host (simulated device), the GPU.
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
DISTRIBUTED = ("sweep", "blur")
# (rows, columns): rows of 21, 39, 42 and 57 elements (vector steps and a remainder of 1 to
# 3 floats, 5 to 10 bytes), a single inner row.
SHAPES = [(17, 23), (12, 41), (3, 44), (40, 59)]
# Rows whose remainder is empty (36 floats) or too short for a vector step (5 and 3
# elements; 5 bytes): the guards count the skipped loop as if it ran, and decline (the
# result is still wasmtime's).
EDGES = [(9, 38), (6, 7), (30, 5)]


def outer_reports() -> dict:
    """Function name -> the report of its outermost loop."""
    return schedule.outer_reports(DATA)


def _has_v128(blocks) -> bool:
    return any(r.type is V128 for b in blocks for op in b.ops for r in op.results)


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_vector_loop_and_its_remainder_are_two_phases_of_a_2d_grid(name):
    report = outer_reports()[name]
    plan = report.plan
    vector, remainder = plan.phases
    # Each phase's own loop is its grid (both parallel), no rest, nothing pinned: the
    # remainder starts where the row's vector part ends, a value computed before the rows.
    assert vector.grid is vector.loop and remainder.grid is remainder.loop
    assert not vector.rest and not remainder.rest and plan.pinned == ()
    assert _has_v128(vector.grid_blocks) and not _has_v128(remainder.grid_blocks)
    assert vector.loop.offset < remainder.loop.offset
    assert "distributed: 2 phase(s) of a 2-D grid" in report.reason
    # The row's accesses meet only through the sizes and base pointers: the row guard.
    assert plan.row_guarded


# The row loops of the SIMD builds of the examples and of the suite (function, offset).
BUILT_SWEEPS = [
    ("examples/wasi/build/stencil.O2.simd.wasm", "main", 0x3D2),
    ("examples/wasi/build/blur.O2.simd.wasm", "main", 0x419),
    ("benchmarks/suite/build/stencil2d.simd.wasm", "kernel_stencil2d", 0x274),
    ("benchmarks/suite/build/stencil3d.simd.wasm", "kernel_stencil3d", 0x305),
]


@pytest.mark.parametrize(("path", "func", "offset"), BUILT_SWEEPS)
def test_the_built_sweeps_rows_are_distributed(path, func, offset):
    reports = analyze_module(translate_module(load((ROOT / path).read_bytes())))
    (report,) = [r for r in reports if r.func.name == func and r.loop.offset == offset]
    vector, remainder = report.plan.phases
    assert _has_v128(vector.grid_blocks) and not _has_v128(remainder.grid_blocks)


def test_a_division_that_may_trap_keeps_a_thread_per_row():
    plan = outer_reports()["blur_by"].plan
    assert plan is not None and plan.phases == ()


def address(instance: ReferenceInstance, which: int) -> int:
    """The address of A (0), B (1), P (2) or Q (3)."""
    return instance.call("addr", [(I32, which)]).values[0][1]


def launches(instance: OffloadInstance, func: str) -> tuple[int, dict, int]:
    """The row loop's launches, its declines by reason, and the phases it launched with."""
    lp = schedule.outer_loop(instance.offload.loops, func)
    return lp.stats.offloaded, lp.stats.declined, len(lp.plan.phases)


def run(device: str, calls: list) -> OffloadInstance:
    return schedule.run(device, calls, DATA)


@pytest.mark.parametrize("device", DEVICES)
def test_distributed_sweeps_match_wasmtime(device):
    reference = ReferenceInstance(DATA)
    a, b, p, q = (address(reference, n) for n in range(4))
    calls = [("init", [])]
    for n, m in SHAPES + EDGES:
        calls.append(("sweep", [(I32, n), (I32, m), (I32, b), (I32, a)]))
        calls.append(("sweep", [(I32, n), (I32, m), (I32, a), (I32, b)]))  # back: reads what the last wrote
        calls.append(("blur", [(I32, n), (I32, m), (I32, q), (I32, p)]))
        calls.append(("blur_by", [(I32, n), (I32, m), (I32, 7), (I32, p), (I32, q)]))
    run(device, calls)
    instance = run(device, [c for c in calls if c[0] == "init" or (c[1][0][1], c[1][1][1]) in SHAPES])
    assert launches(instance, "sweep") == (2 * len(SHAPES), {}, schedule.phases_on(device, 2))
    assert launches(instance, "blur") == (len(SHAPES), {}, schedule.phases_on(device, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_a_sweep_onto_its_own_rows_declines(device):
    """out one row past in: a row's threads would read what others of it write; the row
    guard refuses, and the sweep runs on wasmtime (same result)."""
    reference = ReferenceInstance(DATA)
    a = address(reference, 0)
    n, m = 17, 23
    shifted = a + 4 * 5  # within the row: out[i*m + j] is in[i*m + j + 5]
    instance = run(device, [("init", []), ("sweep", [(I32, n), (I32, m), (I32, a), (I32, shifted)])])
    offloaded, declined, _ = launches(instance, "sweep")
    assert offloaded == 0 and declined


def test_a_zero_divisor_traps_as_in_wasmtime():
    reference = ReferenceInstance(DATA)
    p, q = address(reference, 2), address(reference, 3)
    offload = OffloadInstance(DATA, device="cpu")
    args = [(I32, 9), (I32, 38), (I32, 0), (I32, q), (I32, p)]
    assert offload.call("blur_by", args) == reference.call("blur_by", args)


def test_phase_kernels_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    module, plans = schedule.phase_plans(DATA)
    assert sorted(p.func.name for p in plans) == sorted(DISTRIBUTED)
    entries = schedule.phase_kernel_bodies(module, plans, ptxas, tmp_path)
    assert [body.count("barrier.sync") for body in entries] == [1, 1]  # between the two phases
