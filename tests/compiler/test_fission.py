"""Fission of sequential loops (compiler/analysis/fission.py, the split phases of
compiler/distribute.py, compiler/lower/phases.py's split entry): PolyBench's atax and bicg,
whose outer loop adds into a whole vector in every iteration, and a time loop over one
parallel loop, each launched once as phases that run in parallel over the whole loop.
Results bit for bit wasmtime's; a body whose phases would meet out of order stays
sequential, with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler import test_schedule as schedule
from tests.conftest import wat

DATA = (Path(__file__).parent / "data" / "fission.wasm").read_bytes()
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
A, X, Y, TMP, S, Q, P, R, V = range(9)  # fission.c's arrays, by addr's index


def reports() -> dict:
    return schedule.outer_reports(DATA)


def test_atax_splits_into_a_whole_phase_and_one_over_its_second_j_loop():
    report = reports()["atax"]
    plan = report.plan
    assert report.verdict == "offload" and plan.fission, report.reason
    first, second = plan.phases
    assert first.whole and not second.whole
    stores = {i for i, a in enumerate(plan.accesses) if a.store}
    assert first.stores | second.stores == stores and not first.stores & second.stores
    # tmp's stores (its zero and the j loop's) run whole; y's over the second j loop, which
    # the first phase skips and the second enters at its own iteration.
    assert second.grid.parent is plan.loop and second.grid.header in first.skip
    assert second.grid.header not in second.skip and len(second.skip) == 1
    assert "split into 2 parallel phase(s)" in report.reason


def test_bicg_splits_one_loop_by_its_stores():
    plan = reports()["bicg"].plan
    assert plan is not None and plan.fission
    whole, grid = plan.phases
    assert whole.whole and not whole.skip  # q's: its j loop runs whole, s's stores left out
    assert grid.grid is grid.loop and len(grid.stores) == 1  # s[j]: a thread per j, every i in order


def test_a_time_loop_over_one_parallel_loop_is_one_phase():
    plan = reports()["steps"].plan
    assert plan is not None and plan.fission and len(plan.phases) == 1 and not plan.phases[0].whole


def test_a_statement_reading_what_earlier_rows_wrote_does_not_split():
    """It steps instead (tests/compiler/test_stepped.py): tmp[i] on one thread, then y over j."""
    from tensorwasm.compiler.analysis.plan import AnalysisOptions

    module = translate_module(load(DATA))
    unstepped = {
        r.func.name: r for r in analyze_module(module, AnalysisOptions(stepped=False)) if r.loop.depth == 1
    }
    report = unstepped["carried"]
    assert report.verdict == "reject" and report.reason.startswith("sequential:"), report.reason
    assert "not split into parallel phases: store at" in report.reason and "out of order" in report.reason
    stepped = reports()["carried"].plan
    assert stepped.stepped and [p.whole for p in stepped.phases] == [True, False]


def test_the_host_backend_splits_too_and_not_when_told_not_to():
    from tensorwasm.compiler.analysis.plan import AnalysisOptions

    module = translate_module(load(DATA))
    host = [
        r
        for r in analyze_module(module, AnalysisOptions(distribute=False, stepped=False))
        if r.loop.depth == 1
    ]
    assert {r.func.name for r in host if r.plan is not None and r.plan.fission} == {"atax", "bicg", "steps"}
    unsplit = [r for r in analyze_module(module, AnalysisOptions(split=False)) if r.loop.depth == 1]
    assert not any(r.plan is not None and r.plan.stepped for r in unsplit)
    assert not any(r.plan is not None and r.plan.fission for r in unsplit)


def _addresses() -> list[int]:
    reference = ReferenceInstance(DATA)
    return [reference.call("addr", [(I32, n)]).values[0][1] for n in range(9)]


def _split_calls(at: list[int]) -> list[tuple[str, list]]:
    """init, then atax, bicg and the time loop on fission.c's arrays."""
    return [
        ("init", []),
        ("atax", [(I32, at[A]), (I32, at[X]), (I32, at[Y]), (I32, at[TMP])]),
        ("bicg", [(I32, at[A]), (I32, at[S]), (I32, at[Q]), (I32, at[P]), (I32, at[R])]),
        ("steps", [(I32, at[V]), (I32, at[X])]),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_split_loops_match_wasmtime(device):
    at = _addresses()
    calls = [
        *_split_calls(at),
        ("carried", [(I32, at[A]), (I32, at[Y]), (I32, at[TMP])]),
        _split_calls(at)[1],
    ]
    instance = schedule.run(device, calls, DATA)
    for name in ("atax", "bicg", "steps"):
        lp = schedule.outer_loop(instance.offload.loops, name)
        assert lp.plan.fission and lp.stats.offloaded == (2 if name == "atax" else 1), (
            name,
            lp.stats.declined,
        )


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_overlapping_arrays_decline_and_run_on_wasmtime(device):
    """y is tmp (the same base): apart by live-ins only, the guard finds their ranges meet."""
    at = _addresses()
    calls = [("init", []), ("atax", [(I32, at[A]), (I32, at[X]), (I32, at[Y]), (I32, at[Y])])]
    instance = schedule.run(device, calls, DATA)
    lp = schedule.outer_loop(instance.offload.loops, "atax")
    assert lp.stats.offloaded == 0 and lp.stats.declined, lp.stats.declined


def test_split_kernels_assemble_for_sm_90_with_a_grid_barrier_between_phases(
    ptxas: str, tmp_path: Path
) -> None:
    module = translate_module(load(DATA))
    plans = [
        r.plan
        for r in analyze_module(module)
        if r.plan is not None and r.plan.fission and not r.plan.stepped and r.loop.depth == 1
    ]
    assert {p.func.name for p in plans} == {"atax", "bicg", "steps"}
    bodies = schedule.phase_kernel_bodies(module, plans, ptxas, tmp_path)
    # atax and bicg wait once between their two phases, the time loop never; each wait
    # counts the block in with one atomic add and moves the generation on with another.
    assert sorted(body.count("atom.") for body in bodies) == [0, 2, 2]
    assert sorted(body.count("barrier.sync") for body in bodies) == [0, 2, 2]


def test_the_host_threads_share_each_phase_in_turn(monkeypatch):
    """Past the work a thread must have, the host runs a split loop phase by phase, each
    phase's threads (iterations of the loop, or of its grid loop) in ranges over its own
    threads: the same memory as wasmtime's."""
    from tensorwasm.runtime import host_device

    monkeypatch.setattr(host_device.HostLaunches, "THREAD_MIN_SECONDS", 1e-12)
    monkeypatch.setattr(host_device, "CPUS", 3)
    ran = []
    real = host_device.HostLaunches._run_phases
    monkeypatch.setattr(
        host_device.HostLaunches, "_run_phases", lambda *a: ran.append(a[1].plan.func.name) or real(*a)
    )
    instance = schedule.run("cpu", _split_calls(_addresses()), DATA)
    assert ran == ["atax", "bicg", "steps"]
    for name in ("atax", "bicg", "steps"):
        assert schedule.outer_loop(instance.offload.loops, name).stats.threads > 1, name


# atax on pointers with its row count a parameter (the oracle's split shape): ``t[i] = 0; j:
# t[i] += a[i][j] * x[j]; j: y[j] += a[i][j] * t[i]``, rows of 4 f32.
ATAX_N = """
(module
  (memory (export "memory") 1 1)
  (func (export "atax") (param $n i32) (param $m i32) (param $a i32) (param $x i32) (param $t i32)
        (param $y i32)
    (local $i i32) (local $j i32)
    (block $done (loop $rows
      (br_if $done (i32.ge_s (local.get $i) (local.get $n)))
      (f32.store (i32.add (local.get $t) (i32.shl (local.get $i) (i32.const 2))) (f32.const 0))
      (local.set $j (i32.const 0))
      (block $end (loop $sum
        (br_if $end (i32.ge_s (local.get $j) (local.get $m)))
        (f32.store (i32.add (local.get $t) (i32.shl (local.get $i) (i32.const 2)))
          (f32.add (f32.load (i32.add (local.get $t) (i32.shl (local.get $i) (i32.const 2))))
            (f32.mul (f32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $i) (i32.const 2))
                                                                          (local.get $j)) (i32.const 2))))
                     (f32.load (i32.add (local.get $x) (i32.shl (local.get $j) (i32.const 2)))))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $sum)))
      (local.set $j (i32.const 0))
      (block $end (loop $spread
        (br_if $end (i32.ge_s (local.get $j) (local.get $m)))
        (f32.store (i32.add (local.get $y) (i32.shl (local.get $j) (i32.const 2)))
          (f32.add (f32.load (i32.add (local.get $y) (i32.shl (local.get $j) (i32.const 2))))
            (f32.mul (f32.load (i32.add (local.get $a) (i32.shl (i32.add (i32.shl (local.get $i) (i32.const 2))
                                                                          (local.get $j)) (i32.const 2))))
                     (f32.load (i32.add (local.get $t) (i32.shl (local.get $i) (i32.const 2)))))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $spread)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rows)))))
""".strip()


@pytest.mark.parametrize("device", ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_one_row_whose_vector_overlaps_its_matrix_declines(device):
    """One row (n = 1) of atax with y two elements into a's row: y[j] is a[0][j + 2], which the
    thread of j + 2 reads while the thread of j writes it. The loop runs one iteration, but
    its phases still spread over j: the guard compares the ranges over the launch."""
    data = wat(ATAX_N)
    calls = [("atax", [(I32, v) for v in (1, 4, 64, 112, 128, 72)])]
    instance = schedule.run(device, calls, data)
    lp = schedule.outer_loop(instance.offload.loops, "atax")
    assert lp.plan.fission and lp.stats.offloaded == 0, lp.stats.declined
    assert any("overlap" in why for why in lp.stats.declined), lp.stats.declined
    apart = schedule.run(device, [("atax", [(I32, v) for v in (1, 4, 64, 112, 128, 256)])], data)
    assert schedule.outer_loop(apart.offload.loops, "atax").stats.offloaded == 1
