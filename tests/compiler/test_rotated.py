"""Wavefront tasks that carry a load to the next task (compiler/analysis/fission.py's
``_task_reloads``, compiler/distribute.py's ``_enter_at``): clang compiles PolyBench's
seidel-2d with its row loop carrying the row's first element, loaded, to the next row. Each
task loads it again from the previous task's address, which isl then orders like any other
access: ``seidel``'s rows run as a wavefront in steps ``w = 2t + i``, results bit for bit
wasmtime's. Where a task writes the address after loading it (``clobber``, Wasm written so
by hand), the next task must see the value carried, not memory's: no wavefront. PolyBench's nussinov carries a value it stored (``table[i][j]``,
the next cell's ``table[i][j - 1]``): on every path through a cell the last store there,
nothing after it that may write there, so the next task loads it again too; where the row
stores over it (``stored.wat``'s ``overwrite``), no wavefront."""

from __future__ import annotations

from pathlib import Path

import pytest
import wasmtime

from tensorwasm.compiler.analysis import fission
from tensorwasm.dialect.types import I32
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler import test_schedule as schedule

HERE = Path(__file__).parent / "data"
DATA = (HERE / "rotated.wasm").read_bytes()
CLOBBER = bytes(wasmtime.wat2wasm((HERE / "clobber.wat").read_text()))


def _addr(which: int) -> int:
    return ReferenceInstance(DATA).call("addr", [(I32, which)]).values[0][1]


def _calls(steps: int) -> list[tuple[str, list]]:
    return [("init", []), ("seidel", [(I32, steps), (I32, _addr(0))])]


def test_seidel_rows_run_as_a_wavefront_reloading_the_carried_element():
    report = schedule.outer_reports(DATA)["seidel"]
    plan = report.plan
    assert report.verdict == "offload" and plan.wave == ((2, 0),), report.reason
    (phase,) = plan.phases
    ((arg, index),) = plan.task_reloads
    assert arg.owner is phase.grid.header
    reload = plan.accesses[index]
    # The previous row's address: the load the back edge passes, one task earlier.
    (back,) = [a for a in plan.accesses[:index] if a.op is reload.op]
    assert back.address - reload.address == back.address.split(phase.counter)[1]
    # The row's first element, loaded before the row's inner loop: that load is dead in
    # the kernel, the only access outside the task loop.
    outside = [a for a in plan.accesses if a.op.block not in phase.grid_blocks]
    assert [a.store for a in outside] == [False]


def test_a_task_writing_what_it_carries_is_no_wavefront():
    report = schedule.outer_reports(CLOBBER)["clobber"]
    assert report.verdict == "reject"
    assert "may write what the load at" in report.reason and "carries to the next task" in report.reason
    assert schedule.outer_reports(CLOBBER)["seidel"].verdict == "offload"


@pytest.mark.parametrize("steps", [1, 4])
@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_seidel_as_a_wavefront_matches_wasmtime(device, steps):
    instance = schedule.run(device, _calls(steps) * 2, DATA)
    lp = schedule.outer_loop(instance.offload.loops, "seidel")
    assert lp.plan.wave and lp.stats.offloaded == 2, lp.stats.declined


CLOBBER_CALLS = [("clobber", [(I32, 3), (I32, 1024)])]  # (zeros: the added 1 shows in the next row)


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_without_the_check_the_clobbered_element_differs(device, monkeypatch):
    """The check has teeth: let the wavefront take ``clobber`` and the next row reloads the
    written element, unlike wasmtime; with the check, wasmtime runs it and they agree."""
    monkeypatch.setenv("TENSORWASM_CACHE", "off")  # (a cached plan would outlive the patch)
    instance = schedule.run(device, CLOBBER_CALLS, CLOBBER)
    assert not [lp for lp in instance.offload.loops if lp.plan.func.name == "clobber" and lp.plan.wave]
    monkeypatch.setattr(fission, "_carried_apart", lambda body, reloads: None)
    assert schedule.outer_reports(CLOBBER)["clobber"].plan.wave
    with pytest.raises(AssertionError):
        schedule.run(device, CLOBBER_CALLS, CLOBBER)


def test_nussinov_reloads_the_cell_it_stored_and_the_one_it_loaded():
    report = schedule.outer_reports(DATA)["nussinov"]
    plan = report.plan
    assert report.verdict == "offload" and plan.wave, report.reason
    (phase,) = plan.phases
    kinds = sorted(plan.accesses[index].op.name for _, index in plan.task_reloads)
    assert kinds == ["mem.load", "mem.store"]
    assert all(arg.owner is phase.grid.header for arg, _ in plan.task_reloads)
    stored = next(plan.accesses[i] for _, i in plan.task_reloads if plan.accesses[i].op.name == "mem.store")
    # The previous cell of the row: the store's own address one task earlier.
    (own,) = {a.address for a in plan.accesses if a.op is stored.op and a.store}
    assert own - stored.address == own.split(phase.counter)[1]


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_nussinov_as_a_wavefront_matches_wasmtime(device):
    calls = [("bases", []), ("nussinov", [])]
    instance = schedule.run(device, calls * 2, DATA)
    lp = schedule.outer_loop(instance.offload.loops, "nussinov")
    assert lp.plan.wave and lp.stats.offloaded == 2, lp.stats.declined


STORED = bytes(wasmtime.wat2wasm((HERE / "stored.wat").read_text()))
STORED_CALLS = [
    ("fill", [(I32, 1024)]),
    ("carry", [(I32, 3), (I32, 1024)]),
    ("fill", [(I32, 1024)]),
    ("overwrite", [(I32, 3), (I32, 1024)]),
]


def test_a_value_stored_last_is_reloaded_and_one_stored_over_is_not():
    reports = schedule.outer_reports(STORED)
    plan = reports["carry"].plan
    assert plan is not None and plan.wave == ((2, 0),), reports["carry"].reason
    ((_, index),) = plan.task_reloads
    assert plan.accesses[index].op.name == "mem.store"
    assert reports["overwrite"].verdict == "reject", reports["overwrite"].reason


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_without_the_last_store_proof_the_overwritten_value_differs(device, monkeypatch):
    """The proof has teeth: let ``overwrite``'s carried value count as the last one stored
    and the next row reloads the value stored over it, unlike wasmtime."""
    from tensorwasm.compiler.analysis import accesses

    monkeypatch.setenv("TENSORWASM_CACHE", "off")
    instance = schedule.run(device, STORED_CALLS, STORED)
    assert schedule.outer_loop(instance.offload.loops, "carry").plan.wave
    monkeypatch.setattr(accesses, "_last_stored", lambda values, loop, address, back: True)
    assert schedule.outer_reports(STORED)["overwrite"].plan.wave
    with pytest.raises(AssertionError):
        schedule.run(device, STORED_CALLS, STORED)
