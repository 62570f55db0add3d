"""Loops split at a pivot (compiler/analysis/fission.py's ``_Parts.pivot``, compiler/lower/
phases.py's stepped entry): PolyBench's floyd-warshall, whose ``i`` loop's tasks meet only at
row ``k`` (every row reads it, only its own task writes it), runs each iteration of ``k`` as
three phases: the rows below ``k`` over the grid, row ``k`` on one thread, the rows above it
over the grid. isl must prove that every pair of tasks that meet has one at the pivot;
results bit for bit wasmtime's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis import fission
from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler import test_schedule as schedule

DATA = (Path(__file__).parent / "data" / "pivot.wasm").read_bytes()


def _calls(func: str) -> list[tuple[str, list]]:
    reference = ReferenceInstance(DATA)
    base = reference.call("addr", [(I32, 1 if func == "two" else 0)]).values[0][1]
    extra = [(I32, reference.call("counts", []).values[0][1])] if func == "rows" else []
    return [("init", []), (func, [(I32, base), *extra])]


def test_floyd_warshall_runs_its_rows_below_at_and_above_k_in_turn():
    report = schedule.outer_reports(DATA)["floyd"]
    plan = report.plan
    assert report.verdict == "offload" and plan.stepped and plan.fission and not plan.wave, report.reason
    # Rows split at k; each row's cells (clang's j loop unrolled by two: a cell is two
    # columns) split at column k's cell, k / 2: row i's cells read its column k.
    assert [(p.pivot, p.side, p.inner_pivot, p.inner_side) for p in plan.phases] == [
        ((1, 0, 1), side, (1, 0, 2), cut) for side in (-1, 0, 1) for cut in (-1, 0, 1)
    ]
    (grid,) = {p.grid for p in plan.phases}
    (cells,) = {p.inner.loop for p in plan.phases}
    assert grid.parent is plan.loop and cells.parent is grid
    assert all(not p.whole and p.stores == plan.phases[0].stores for p in plan.phases)
    assert plan.phases[0].stores == {i for i, a in enumerate(plan.accesses) if a.store}
    # The cell at row k, column k is the serial work.
    assert plan.serial_work
    assert "(t < 1*k, cells of" in report.reason and "u = (1*k) / 2)" in report.reason


def test_tasks_meeting_at_two_rows_have_no_pivot():
    report = schedule.outer_reports(DATA)["two"]
    assert report.verdict == "reject", report.reason
    assert "no child loop runs in parallel within an iteration" in report.reason


def test_a_pivot_is_only_taken_where_every_meeting_pair_holds_it(monkeypatch):
    """Checked on isl's pairs: ``two``'s rows meet at rows k and k + 1, none of floyd's
    pairs is left to the guards."""
    calls = []
    real = fission._Parts.pivot

    def spy(self, stores, child):
        found = real(self, stores, child)
        calls.append((self.body.plan.func.name, found and found[:2]))
        return found

    monkeypatch.setattr(fission._Parts, "pivot", spy)
    analyze_module(translate_module(load(DATA)))
    assert ("floyd", ((1, 0, 1), frozenset())) in calls
    assert ("two", None) in calls


def test_cells_out_of_wasm_order_are_refused():
    """The cells' check: floyd's parts with the column pivot moved off column k's cell would
    run a row's cell at once with the cell it reads (its column k), and are refused."""
    cells = fission._out_of_order((1, 0, 1), (1, 0, 2))
    moved = fission._out_of_order((1, 0, 1), (1, -2, 1))  # column k - 2
    import islpy as isl

    # k = 2, row 3: cell 1 (holding column k, written) and cell 2 (reading it), one part
    # when split at cell 0.
    pair = isl.Set("{ [2, 3, 1, 3, 2] }")
    assert pair.intersect(isl.Set(cells)).is_empty()
    assert not pair.intersect(isl.Set(moved)).is_empty()


def test_a_row_with_a_statement_outside_its_inner_loop_is_one_task():
    report = schedule.outer_reports(DATA)["rows"]
    plan = report.plan
    assert report.verdict == "offload" and plan.stepped, report.reason
    assert [(p.pivot, p.side, p.inner) for p in plan.phases] == [((1, 0, 1), s, None) for s in (-1, 0, 1)]


@pytest.mark.parametrize("func", ["floyd", "rows"])
@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_floyd_warshall_split_at_k_matches_wasmtime(device, func):
    instance = schedule.run(device, _calls(func) * 2, DATA)
    lp = schedule.outer_loop(instance.offload.loops, func)
    assert lp.plan.stepped and lp.stats.offloaded == 2, lp.stats.declined


def test_split_kernels_assemble_for_sm_90_with_a_barrier_per_part(ptxas: str, tmp_path: Path) -> None:
    module = translate_module(load(DATA))
    plans = [r.plan for r in analyze_module(module) if r.plan is not None and r.plan.stepped]
    assert [p.func.name for p in plans] == ["floyd", "rows"]
    body, _ = schedule.phase_kernel_bodies(module, plans, ptxas, tmp_path)
    # A grid barrier after each of the nine parts (two atomics each), its fences at the
    # device's scope (the threads that meet there are all the GPU's).
    assert body.count("atom.") == 18
    assert "fence.sc.gpu" in body and "fence.sc.sys" not in body
