"""3-D sweeps as clang -O2 -msimd128 vectorises them, distributed over a 3-D grid
(compiler/analysis/nests.py ``phase_nests``): the (x, y) nest's innermost body is clang's
vector loop over z (16 bytes a step) and its scalar remainder, so the x loop runs as two
phases of a 3-D grid, a block per (x, y) cell whose threads share the cell's vector steps,
then its remainder's elements, instead of a 2-D grid whose threads run both loops whole.
Data: tests/compiler/data/simdgrid3d.c (built .wasm beside it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32, V128
from tensorwasm.runtime.planning import launch_grid
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler import test_schedule as schedule
from tests.compiler.test_loop_kernels import assemble, plans_ptx
from tests.conftest import ROOT

DATA = (Path(__file__).parent / "data" / "simdgrid3d.wasm").read_bytes()
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
NESTS = ("sweep", "diff")
# (n, m, l): z rows of 21, 39, 17 and 45 floats for the sweep (vector steps and a
# remainder of 1 to 3), of 22, 40, 18 and 46 bytes for diff (a remainder of 2 to 14).
SHAPES = [(5, 7, 23), (4, 9, 41), (9, 6, 19), (12, 10, 47)]
# Rows whose remainder is empty (8 floats; 16 bytes), of one vector step and a float (5
# floats; 6 bytes, too short for diff's vector step), too short for a vector step (2
# floats): the result is still wasmtime's, launched or declined.
EDGES = [(6, 5, 10), (5, 4, 17), (3, 3, 7), (4, 5, 4)]


def _has_v128(blocks) -> bool:
    return any(r.type is V128 for b in blocks for op in b.ops for r in op.results)


@pytest.mark.parametrize("name", NESTS)
def test_the_vector_loop_and_its_remainder_are_phases_of_a_3d_grid(name):
    report = schedule.outer_reports(DATA)[name]
    plan = report.plan
    (level,) = plan.collapse  # y: the grid's second counter
    vector, remainder = plan.phases
    assert vector.loop.parent is level.loop and remainder.loop.parent is level.loop
    assert _has_v128(vector.grid_blocks) and not _has_v128(remainder.grid_blocks)
    # The phases' counts are the launched loop's view of the grid loops (its symbols).
    trips = dict(plan.inner_trips)
    assert trips[vector.counter] is vector.trip and trips[remainder.counter] is remainder.trip
    assert "distributed: 2 phase(s) of a 3-D grid" in report.reason
    assert plan.row_guarded  # in and out apart within a cell: the row guard


def test_a_load_before_the_inner_loop_keeps_the_2d_grid():
    """scaled's ``factor[x]``, loaded in the x body: each thread of a cell's block would
    reload it at every call, after the cell's vector phase may have stored there."""
    report = schedule.outer_reports(DATA)["scaled"]
    assert len(report.plan.collapse) == 1 and report.plan.phases == ()
    assert "3-D grid" not in report.reason


def test_the_suites_stencil3d_is_a_3d_grid_of_phases():
    module = translate_module(load((ROOT / "benchmarks/suite/build/stencil3d.simd.wasm").read_bytes()))
    (report,) = [
        r for r in analyze_module(module) if r.func.name == "kernel_stencil3d" and r.loop.offset == 0x2E3
    ]
    vector, remainder = report.plan.phases
    assert len(report.plan.collapse) == 1
    assert _has_v128(vector.grid_blocks) and not _has_v128(remainder.grid_blocks)


def address(instance: ReferenceInstance, which: int) -> int:
    return instance.call("addr", [(I32, which)]).values[0][1]


def _calls(shapes) -> list:
    reference = ReferenceInstance(DATA)
    a, b, p, q = (address(reference, n) for n in range(4))
    calls = [("init", [])]
    for shape in shapes:
        size = [(I32, s) for s in shape]
        calls.append(("sweep", [*size, (I32, b), (I32, a)]))
        calls.append(("sweep", [*size, (I32, a), (I32, b)]))  # back: reads what the last wrote
        calls.append(("diff", [*size, (I32, q), (I32, p)]))
        calls.append(
            ("scaled", [*size, (I32, b), (I32, a), (I32, b + 4 * shape[1] * shape[2])])
        )  # factor in out
    return calls


@pytest.mark.parametrize("device", DEVICES)
def test_3d_phases_match_wasmtime(device):
    schedule.run(device, _calls(SHAPES + EDGES), DATA)
    instance = schedule.run(device, _calls(SHAPES), DATA)
    for name, per_shape in (("sweep", 2), ("diff", 1)):
        lp = schedule.outer_loop(instance.offload.loops, name)
        assert len(lp.plan.phases) == schedule.phases_on(device, 2) and len(lp.plan.collapse) == 1
        assert (lp.stats.offloaded, lp.stats.declined) == (per_shape * len(SHAPES), {}), name


@pytest.mark.parametrize("device", DEVICES)
def test_a_sweep_onto_its_own_rows_declines(device):
    reference = ReferenceInstance(DATA)
    a = address(reference, 0)
    size = [(I32, 5), (I32, 7), (I32, 23)]
    instance = schedule.run(device, [("init", []), ("sweep", [*size, (I32, a), (I32, a + 4 * 5)])], DATA)
    lp = schedule.outer_loop(instance.offload.loops, "sweep")
    assert lp.stats.offloaded == 0 and lp.stats.declined


def test_a_block_per_cell_of_the_outer_two_counters():
    from tensorwasm.runtime.guards import Launch

    grid, block = launch_grid(Launch(10, {}, [], [], nest=(7,), rows=True))
    assert grid == (70, 1, 1) and block[1:] == (1, 1)
    # As many whole warps as the longest phase has grid iterations, up to a full block.
    assert launch_grid(Launch(10, {}, [], [], nest=(7,), rows=True, lanes=40))[1] == (64, 1, 1)
    assert (
        launch_grid(Launch(10, {}, [], [], rows=True, lanes=1000))[1][0]
        == launch_grid(Launch(10, {}, [], []))[1][0]
    )


def test_3d_phase_kernels_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    module, phased = schedule.phase_plans(DATA)
    plans = [plan for plan in phased if plan.collapse]
    assert sorted(p.func.name for p in plans) == sorted(NESTS)
    entries = schedule.phase_kernel_bodies(module, plans, ptxas, tmp_path)
    assert [body.count("barrier.sync") for body in entries] == [1, 1]  # between the two phases
    assert all("rem.u64" in body or "div.u64" in body for body in entries)  # the cell's (k, k2)


def test_the_row_guard_compares_footprints_per_cell():
    """Within a cell (x, y) two accesses keep their distance only when they move alike
    with y too: a store at ``64 y`` and a load at ``64 + 32 y`` meet at y = 2."""
    from tensorwasm.runtime.guards import Range, _meets_in_row

    store = Range(0, 16 + 64 * 4, 0, 1024, 16, nest_strides=(64,))
    load = Range(64, 64 + 16 + 32 * 4, 64, 1024, 16, nest_strides=(32,))
    assert _meets_in_row(store, load)
    apart = Range(64, 64 + 16 + 64 * 4, 64, 1024, 16, nest_strides=(64,))
    assert not _meets_in_row(store, apart)


def test_auto_launches_the_nest_of_3d_phases_on_the_host_as_its_2d_nest():
    """The host backend does not distribute (its threads run whole iterations): what a GPU
    runs as a 3-D grid of phases it runs as the 2-D nest, each cell's vector loop and
    remainder in order. ``auto`` does not keep it on wasmtime for its schedule (a sweep this
    small declines for its size alone, arrival by arrival), results exact."""
    reference = ReferenceInstance(DATA)
    a, b = address(reference, 0), address(reference, 1)
    sweep = ("sweep", [(I32, 9), (I32, 6), (I32, 19), (I32, b), (I32, a)])
    instance = schedule.run("cpu", [("init", []), *[sweep] * 4], DATA, mode="auto")  # memory equal too
    instance.close()
    lp = schedule.outer_loop(instance.offload.loops, "sweep")
    assert lp.plan.collapse and not lp.plan.phases
    assert lp.stats.arrivals == 4


def test_a_phase_kernel_takes_a_vector_made_before_its_loop(ptxas: str, tmp_path: Path) -> None:
    """scaled's row loop (2-D phases) reads ``splat(factor[x])``, made before it: the vector
    comes in as two i64 lanes, which the phase kernel puts back together."""
    module = translate_module(load(DATA))
    (plan,) = [r.plan for r in analyze_module(module) if r.func.name == "scaled" and r.loop.depth == 2]
    assert plan.phases and any(kind.startswith("v128 ") for _, _, kind, _ in plan.live_ins)
    ptx = plans_ptx(module, [plan], "sm_90")
    assemble(ptxas, ptx, "sm_90", tmp_path)
