"""Distribution of PolyBench's correlation nest (compiler/analysis/schedule.py,
compiler/distribute.py): ``i { corr[i][i] = 1; j > i { corr[i][j] = 0; k { corr[i][j] +=
... } corr[j][i] = corr[i][j] } }``. The statement before the j loop, outside every inner
loop, is a phase of its own run by one thread of the row; the j loop is the grid of the
next phase, each thread running its whole k loop in order, and storing the transposed
element (j, i), which no other (i', j') writes. Results bit for bit wasmtime's.

A statement outside the inner loops that one of them reads in the same row (``late``) is
not moved ahead of it: that row stays in one thread."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tensorwasm.compiler.outline import outline
from tensorwasm.compiler.prepare import kernel_may_trap
from tensorwasm.dialect.types import F64
from tests.compiler import test_schedule as schedule
from tests.compiler.test_schedule import launches

DATA = (Path(__file__).parent / "data" / "corr.wasm").read_bytes()
# The host backend, the GPU path's data movement on the host (simulated device), the GPU.
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
DISTRIBUTED = ("correlation", "corr_all")


def f64(x: float) -> tuple:
    return (F64, struct.unpack("<Q", struct.pack("<d", x))[0])


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_the_statement_is_a_phase_of_its_own_before_the_j_grid(name):
    report = schedule.outer_reports(DATA)[name]
    plan = report.plan
    statements, row = plan.phases
    assert statements.statements and statements.loop is plan.loop
    # Only the blocks outside the j loop, where corr[i][i] is stored.
    assert statements.blocks and not statements.blocks & row.blocks
    # The j loop is its own grid (k inside each thread); it starts at i + 1.
    assert not row.statements and row.grid is row.loop and row.grid.parent is plan.loop
    assert plan.counter in row.trip.start.leaves() and not row.rest
    assert "distributed: 2 phase(s) of a 2-D grid over the statements outside them" in report.reason


def test_a_statement_an_inner_loop_reads_is_not_moved_ahead():
    report = schedule.outer_reports(DATA)["late"]
    assert report.plan is not None and report.plan.phases == ()


@pytest.mark.parametrize("device", DEVICES)
def test_distributed_correlation_matches_wasmtime(device):
    calls = [
        ("init", []),
        ("correlation", []),
        ("init", []),
        ("corr_all", [f64(0.75)]),  # the last row's j loop is empty; its statement runs
        ("late", [f64(2.5)]),
    ]
    instance = schedule.run(device, calls, DATA)
    for name in (*DISTRIBUTED, "late"):
        assert launches(instance, name) == (1, {}), name
    for name in DISTRIBUTED:  # launched as phases: a block per row, its threads over j
        assert len(schedule.outer_loop(instance.offload.loops, name).plan.phases) == schedule.phases_on(device, 2), name


def test_phase_kernels_cannot_trap():
    module, plans = schedule.phase_plans(DATA)
    assert {p.func.name for p in plans} == set(DISTRIBUTED)
    for plan in plans:
        assert not kernel_may_trap(module, outline(module, plan).index), plan.func.name


def test_phase_kernels_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    module, plans = schedule.phase_plans(DATA)
    entries = schedule.phase_kernel_bodies(module, plans, ptxas, tmp_path)
    assert len(entries) == len(DISTRIBUTED)
    assert [body.count("barrier.sync") for body in entries] == [1, 1]  # between the two phases
