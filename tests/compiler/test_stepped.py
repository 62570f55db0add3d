"""Stepped loops (compiler/analysis/fission.py's split_stepped, compiler/lower/phases.py's
stepped entry): a sequential loop whose body mixes serial work with child loops that run in
parallel within one iteration, PolyBench's gramschmidt, launched once: its iterations in
order, each running its phases in turn (one on one thread, the others over their loops),
the whole grid waiting after each. Results bit for bit wasmtime's; a loop whose grid phase
reads a value another phase made stays sequential, with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler import test_schedule as schedule

DATA = (Path(__file__).parent / "data" / "stepped.wasm").read_bytes()
A, Q, R = range(3)  # stepped.c's arrays, by addr's index


def _calls(at: list[int], a: int | None = None) -> list[tuple[str, list]]:
    return [("init", []), ("gramschmidt", [(I32, at[A] if a is None else a), (I32, at[R]), (I32, at[Q])])]


def _addresses() -> list[int]:
    reference = ReferenceInstance(DATA)
    return [reference.call("addr", [(I32, n)]).values[0][1] for n in range(3)]


def test_gramschmidt_steps_through_a_serial_phase_and_three_grid_phases():
    report = schedule.outer_reports(DATA)["gramschmidt"]
    plan = report.plan
    assert report.verdict == "offload" and plan.stepped and plan.fission, report.reason
    alone, column, sums, updates = plan.phases
    assert alone.whole and not any(p.whole for p in (column, sums, updates))
    # The norm's loop runs on the one thread (it skips only the grid phases' loops), which
    # also stores R[k][k]; each grid phase skips the other two child loops.
    assert column.grid.header in alone.skip and sums.grid.header in alone.skip and len(alone.skip) == 2
    assert len(alone.stores) == 1 and len(column.skip) == 2
    # The j loop split between its two i loops: the sums over j (each skipping the update's
    # loop), then the updates over (j, i) cells (skipping the sum's loop).
    assert sums.grid is updates.grid and sums.inner is None and updates.inner is not None
    assert updates.inner.loop.header in sums.skip and len(sums.skip) == len(updates.skip) == 3
    (summed,) = set(updates.skip) - set(sums.skip)
    assert summed not in updates.inner.blocks and updates.inner.loop.header not in updates.skip
    stores = {i for i, a in enumerate(plan.accesses) if a.store}
    assert alone.stores | column.stores | sums.stores | updates.stores == stores
    assert plan.serial_work and sum(ops for ops, _ in plan.serial_work) < sum(ops for ops, _ in plan.work)
    assert "stepped: each iteration runs 4 phase(s) in turn: one thread: stores at" in report.reason
    assert f"(cells of +0x{updates.inner.loop.offset:x})" in report.reason


@pytest.mark.parametrize("name", ["held", "chained"])
def test_a_column_loop_whose_split_would_be_wrong_stays_one_phase(name):
    """``held``'s update multiplies by the sum's value (a value of the sum's loop read after
    it); ``chained``'s cells would race for ``T[j]``, which every ``i`` writes (isl): the
    ``j`` loop's two ``i`` loops stay one phase over ``j``."""
    report = schedule.outer_reports(DATA)[name]
    plan = report.plan
    assert report.verdict == "offload" and plan.stepped, report.reason
    assert len(plan.phases) == 3 and not any(p.inner is not None for p in plan.phases), report.reason


def test_a_grid_phase_reading_another_phase_s_value_stays_sequential():
    report = schedule.outer_reports(DATA)["unstepped"]
    assert report.verdict == "reject", report.reason
    assert "not stepped: a value of the loop at" in report.reason and "is read after it" in report.reason


def test_the_host_backend_does_not_step():
    module = translate_module(load(DATA))
    host = analyze_module(module, AnalysisOptions(distribute=False, stepped=False))
    assert not any(r.plan is not None and r.plan.stepped for r in host)


@pytest.mark.parametrize("name", ["gramschmidt", "held", "chained"])
@pytest.mark.parametrize("device", ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_stepped_gramschmidt_matches_wasmtime(device, name):
    """gramschmidt (its column loop split into sums and cells of updates) and the two
    variants that stay one phase, twice each: memory and results as wasmtime leaves them."""
    at = _addresses()
    calls = [("init", []), (name, [(I32, at[A]), (I32, at[R]), (I32, at[Q])])]
    instance = schedule.run(device, calls * 2, DATA)
    loops = [lp for lp in instance.offload.loops if lp.plan.func.name == name]
    if device == "cpu":  # the host backend launches the child loops instead
        assert not any(lp.plan.stepped for lp in loops) and any(lp.stats.offloaded for lp in loops)
        return
    lp = schedule.outer_loop(loops, name)
    assert lp.plan.stepped and lp.stats.offloaded == 2, lp.stats.declined


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_overlapping_arrays_decline_and_run_on_wasmtime(device):
    """R passed as A: apart by live-ins only, the guard finds their ranges meet."""
    at = _addresses()
    instance = schedule.run(device, _calls(at, a=at[R]), DATA)
    lp = schedule.outer_loop(instance.offload.loops, "gramschmidt")
    assert lp.stats.offloaded == 0 and any("overlap" in why for why in lp.stats.declined), lp.stats.declined


def test_stepped_kernels_assemble_for_sm_90_with_a_grid_barrier_after_each_phase(
    ptxas: str, tmp_path: Path
) -> None:
    module = translate_module(load(DATA))
    plans = [r.plan for r in analyze_module(module) if r.plan is not None and r.plan.stepped]
    assert [p.func.name for p in plans] == ["gramschmidt", "held", "chained"]
    bodies = schedule.phase_kernel_bodies(module, plans, ptxas, tmp_path)
    # gramschmidt's four barriers in the loop (the variants' three), each counting its block
    # in with one atomic add and moving the generation on with another; the one-thread phase
    # behind a test of the thread's index.
    assert sorted(body.count("barrier.sync") for body in bodies) == [6, 6, 8]
    assert sorted(body.count("atom.") for body in bodies) == [6, 6, 8]
