"""Distribution of triangular nests as clang -O2 unrolls them (compiler/analysis/schedule.py,
compiler/distribute.py): PolyBench's syrk and syr2k, ``i { j <= i: C *= beta; k { j <= i:
C += ... } }``, run as phases of a 2-D grid (a block per row i, its threads over j, k inside
each thread), with clang's unrolled j loops (by four and by two) and their remainders:

- the unrolled loop's end, where its remainder starts, is computed from its polynomial by a
  phase that skips the unrolled loop (pinned);
- the remainder of the j loop inside k (one element, behind a test) is the work of one more
  thread, which runs every k with that element only, while the others skip its store.

Every C[i][j] still sees beta first, then k ascending: bit for bit wasmtime's result."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tensorwasm.compiler.outline import outline
from tensorwasm.compiler.prepare import kernel_may_trap
from tensorwasm.dialect.types import F64, I32
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler import test_schedule as schedule
from tests.compiler.test_schedule import launches

DATA = (Path(__file__).parent / "data" / "syrk.wasm").read_bytes()
# The host backend, the GPU path's data movement on the host (simulated device), the GPU.
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
N, M = 23, 17  # odd and even rows both: the remainder of j <= i runs on every other row
DISTRIBUTED = ("syrk", "syr2k", "syrk_ptr", "diag")


def f64(x: float) -> tuple:
    return (F64, struct.unpack("<Q", struct.pack("<d", x))[0])


def outer_reports() -> dict:
    """Function name -> the report of its outermost loop."""
    return schedule.outer_reports(DATA)


@pytest.mark.parametrize("name", ["syrk", "syr2k", "syrk_ptr"])
def test_polybench_shapes_become_three_phases_with_k_inside(name):
    report = outer_reports()[name]
    plan = report.plan
    scale, remainder, update = plan.phases
    # C *= beta, unrolled by four: its own loop is the grid, stepping by four with "!=" up to
    # i + 1 rounded down to a multiple of four (the bound moves with the row).
    assert scale.grid is scale.loop and scale.trip.step == 4 and plan.counter in scale.trip.bound.leaves()
    # ... then its remainder, from where the unrolled loop stopped: a pinned merge.
    assert remainder.grid is remainder.loop and plan.counter in remainder.trip.start.leaves()
    ends = {str(poly) for _, poly in plan.pinned}
    assert "4*floor((1 + k1) / 4)" in ends  # the unrolled loop's end
    assert "2*floor((1 + k1) / 2)" in ends  # the one inside k, where the rest's element is
    # C += ..., k outside j: the j loop (unrolled by two) interchanged out of the k loop, and
    # the remainder element is one more thread's.
    assert update.grid.parent is update.loop and update.rest and update.trip.step == 2
    assert not scale.rest and not remainder.rest
    assert "distributed: 3 phase(s)" in report.reason and "and its rest" in report.reason


def test_a_statement_after_the_row_is_the_rest_and_one_that_is_read_is_not_spread():
    reports = outer_reports()
    (phase,) = reports["diag"].plan.phases
    assert phase.rest and phase.grid.parent is phase.loop
    # diag_read's j loop reads C[i][i] at every k, which the statement after it writes: a
    # thread running ahead of the statement's would read it too early.
    assert reports["diag_read"].plan is not None and reports["diag_read"].plan.phases == ()


def run(device: str, calls: list) -> OffloadInstance:
    return schedule.run(device, calls, DATA)


def address(instance: ReferenceInstance, which: int) -> int:
    """The address of C (0) or A (1)."""
    return instance.call("addr", [(I32, which)]).values[0][1]


@pytest.mark.parametrize("device", DEVICES)
def test_distributed_syrk_and_syr2k_match_wasmtime(device):
    reference = ReferenceInstance(DATA)
    c, a = address(reference, 0), address(reference, 1)
    calls = [
        ("init", []),
        ("syrk", [f64(1.5), f64(1.2)]),
        ("syr2k", [f64(0.7), f64(1.1)]),
        ("syrk_ptr", [(I32, N), (I32, M), (I32, c), (I32, a), f64(0.5), f64(0.9)]),
        ("syrk_ptr", [(I32, N - 1), (I32, M), (I32, c), (I32, a), f64(0.25), f64(1.3)]),  # even row count
        ("diag", [f64(0.3)]),
        ("diag_read", [f64(0.6)]),
    ]
    instance = run(device, calls)
    for name in ("syrk", "syr2k", "diag", "diag_read"):
        assert launches(instance, name) == (1, {}), name
    assert launches(instance, "syrk_ptr") == (2, {})


@pytest.mark.parametrize("device", DEVICES)
def test_syrk_through_overlapping_pointers_declines(device):
    """a == c: the row's threads would read what others write; the guards refuse, and the
    loop runs on wasmtime."""
    reference = ReferenceInstance(DATA)
    c = address(reference, 0)
    instance = run(
        device, [("init", []), ("syrk_ptr", [(I32, N), (I32, M), (I32, c), (I32, c), f64(1.5), f64(1.2)])]
    )
    offloaded, declined = launches(instance, "syrk_ptr")
    assert offloaded == 0 and declined


def test_phase_kernels_cannot_trap():
    """A barrier waits for every thread of the block: nothing in a phase kernel traps (the
    pinned merges and the rest's count are computed without a division)."""
    module, plans = schedule.phase_plans(DATA)
    assert {p.func.name for p in plans} == set(DISTRIBUTED)
    for plan in plans:
        assert not kernel_may_trap(module, outline(module, plan).index), plan.func.name


def test_phase_kernels_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    module, plans = schedule.phase_plans(DATA)
    entries = schedule.phase_kernel_bodies(module, plans, ptxas, tmp_path)
    assert len(entries) == len(DISTRIBUTED)
    by_phases = sorted(body.count("barrier.sync") for body in entries)
    assert by_phases == [0, 2, 2, 2]  # diag: one phase; the others: a barrier between each two


def test_the_host_backend_runs_an_imperfect_nest_by_whole_rows():
    """Phases on the host would run each thread's whole k loop in turn (rows read down
    columns: gemm 2.5 s and syrk 1.2-1.5 s against wasmtime's 0.8 and 0.5 s on the CPU
    machine), so the host backend's plan is not distributed: its threads take whole rows,
    each row's body in Wasm order. A GPU's plan is; results exact on both."""
    calls = [("init", []), *[("syrk", [f64(1.5), f64(1.2)])] * 6]
    simulated = schedule.run("simulated", calls, DATA)
    simulated.close()
    assert schedule.outer_loop(simulated.offload.loops, "syrk").plan.phases
    host = schedule.run("cpu", calls, DATA, mode="auto")
    host.close()
    lp = schedule.outer_loop(host.offload.loops, "syrk")
    assert not lp.plan.phases and lp.stats.arrivals == 6
    always = schedule.run("cpu", calls, DATA)  # launched whole rows: results exact
    always.close()
    assert schedule.outer_loop(always.offload.loops, "syrk").stats.offloaded == 6
