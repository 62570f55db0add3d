"""The launch entry of a collapsed nest on the GPU (``compiler.lower.function``): the y and
z counters count the block's threads as x does (a block of several rows, as nvcc's
stencils launch: ``runtime.planning.launch_grid``), and the grid's counters are i32 (the
guards launch no level of more than 2**31 - 1 iterations), so that a thread's loop tests
are 32-bit compares and its addresses take no mask of the zero-extended counter. Where
the grid has a thread for every cell, a thread runs its cell without the loops. Results
stay wasmtime's on the GPU (the suite's stencils at sizes no block shape divides, with
grids that cover the nest and grids short of it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import AnalysisOptions, analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tests.compiler.test_loop_kernels import assemble, kernels, loop_kernels_ptx, plans_ptx
from tests.compiler.test_tile import run_program
from tests.conftest import ROOT

SUITE = ROOT / "benchmarks/suite/build"

# b[i][j] = a[i-1][j] + a[i+1][j] over the interior of an n x n grid: a 2-D grid.
SWEEP = """(module (memory (export "memory") 4)
  (func (export "sweep") (param $n i32) (param $a i32) (param $b i32)
    (local $i i32) (local $j i32) (local $row i32)
    (local.set $i (i32.const 1))
    (loop $rows
      (local.set $row (i32.mul (local.get $i) (local.get $n)))
      (local.set $j (i32.const 1))
      (loop $cols
        (f32.store (i32.add (local.get $b) (i32.shl (i32.add (local.get $row) (local.get $j)) (i32.const 2)))
          (f32.add
            (f32.load (i32.add (local.get $a)
              (i32.shl (i32.add (i32.sub (local.get $row) (local.get $n)) (local.get $j)) (i32.const 2))))
            (f32.load (i32.add (local.get $a)
              (i32.shl (i32.add (i32.add (local.get $row) (local.get $n)) (local.get $j)) (i32.const 2))))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br_if $cols (i32.lt_u (local.get $j) (i32.sub (local.get $n) (i32.const 1)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $rows (i32.lt_u (local.get $i) (i32.sub (local.get $n) (i32.const 1)))))))"""


def _nest_entry(ptx: str, dims: int) -> str:
    """The one kernel of ``ptx`` whose entry reads the ``dims``-th grid dimension."""
    last = "yz"[dims - 2]
    (body,) = [body for body in kernels(ptx).values() if f"%ctaid.{last}" in body]
    return body


def _stencil3d_ptx() -> str:
    module = translate_module(load((SUITE / "stencil3d.wasm").read_bytes()))
    plans = [
        r.plan
        for r in analyze_module(module, AnalysisOptions())
        if r.verdict == "offload" and r.plan.func.name == "kernel_stencil3d" and len(r.plan.collapse) == 2
    ]
    assert len(plans) == 1
    return plans_ptx(module, plans, "sm_90")


def test_a_2d_nest_counts_the_blocks_rows_of_threads(ptxas: str, tmp_path: Path) -> None:
    """y is ``ctaid.y * ntid.y + tid.y``, striding by ``nctaid.y * ntid.y``: a block of
    32 x 8 threads runs 8 rows (where y was the block's index alone, and each of its rows
    would have run the same cells)."""
    ptx = loop_kernels_ptx(SWEEP, "sm_90")
    assemble(ptxas, ptx, "sm_90", tmp_path)
    entry = _nest_entry(ptx, 2)
    for register in ("%ctaid.y", "%ntid.y", "%tid.y", "%nctaid.y"):
        assert register in entry, register


def test_the_suite_stencil3d_counts_threads_in_y_and_z(ptxas: str, tmp_path: Path) -> None:
    ptx = _stencil3d_ptx()
    assemble(ptxas, ptx, "sm_90", tmp_path)
    entry = _nest_entry(ptx, 3)
    for register in ("%tid.y", "%ntid.y", "%tid.z", "%ntid.z"):
        assert register in entry, register


@pytest.mark.parametrize("dims", [2, 3])
def test_a_nests_grid_counters_are_32_bit(dims: int) -> None:
    """The loop tests of the grid's counters are 32-bit compares (a 64-bit one is two SASS
    instructions, as is each 64-bit step), and no address masks the counter back to 32
    bits (``and.b64 ..., 4294967295``, or 17179869180 once scaled by 4): in the PTX of
    the 2-D sweep and of the suite's stencil3d, no 64-bit compare and no 64-bit ``and``."""
    entry = _nest_entry(loop_kernels_ptx(SWEEP, "sm_90") if dims == 2 else _stencil3d_ptx(), dims)
    compares = re.findall(r"setp\.\w+\.([su]\d+)\s", entry)
    assert compares.count("u32") >= dims, compares  # each level's test
    assert not [c for c in compares if c.endswith("64")], compares
    assert "and.b64" not in entry


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("program", "argv"),
    [
        ("stencil2d", ["77", "3"]),
        ("stencil2d", ["300", "2"]),
        ("stencil3d", ["41", "2"]),
        ("stencil3d", ["3", "1"]),
    ],
)
def test_the_suite_stencils_print_what_wasmtime_prints_on_the_gpu(
    program: str, argv: list[str], tmp_path
) -> None:
    """Sizes no block shape divides (interiors of 75, 298, 39 and 1 cells a row): threads
    of a block's last rows and columns fall outside the nest and run nothing. Each prints
    a checksum of the grid's bits."""
    path = SUITE / f"{program}.wasm"
    assert run_program(path, [program, *argv], tmp_path, "gpu") == run_program(
        path, [program, *argv], tmp_path, None
    )


@pytest.mark.gpu
@pytest.mark.parametrize(("program", "argv"), [("stencil2d", ["77", "3"]), ("stencil3d", ["41", "2"])])
@pytest.mark.parametrize("grid", ["whole", "short"])
def test_a_nest_runs_each_cell_once_whether_or_not_the_grid_covers_it(
    program: str, argv: list[str], grid: str, tmp_path, monkeypatch
) -> None:
    """The runtime launches a thread for every cell of a nest where the device's grid
    limits allow (``whole``): each thread then runs its own cell, or none, without the
    levels' loops. A grid short of the nest in every dimension (``short``: a third of the
    blocks, as where the limits cut it) takes the loops, each thread striding over
    several cells. Both print what wasmtime prints."""
    from tensorwasm.runtime import planning

    real = planning.launch_grid
    covered = []

    def launch_grid(launch, *args, **kwargs):
        shape, block = real(launch, *args, **kwargs)
        if launch.nest:
            if grid == "short":
                shape = tuple(max(1, g // 3) for g in shape)
            counts = (*reversed(launch.nest), launch.trip)  # x, y[, z]
            covered.append(all(g * t >= c for g, t, c in zip(shape, block, counts)))
        return shape, block

    monkeypatch.setattr(planning, "launch_grid", launch_grid)
    path = SUITE / f"{program}.wasm"
    assert run_program(path, [program, *argv], tmp_path, "gpu") == run_program(
        path, [program, *argv], tmp_path, None
    )
    assert covered and set(covered) == {grid == "whole"}, covered
