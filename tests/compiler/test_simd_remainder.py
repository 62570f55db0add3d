"""Vectorised inner loops whose scalar remainder runs zero times (tests/compiler/data/
remainder.c, clang-16 -O2 -msimd128): the remainder is entered through a join, past the
vector loop where it left elements and around it where the row is too short for it. Read
as tested at its top, it counts zero where the vector loop covered the row (not a rotated
loop's wrapped 2^32, which the guards refused), and the rows loop launches as one grid
with wasmtime's output at those sizes and at their neighbours."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.plan import LoopPlan
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32
from tensorwasm.runtime import guards
from tests.compiler.test_loop_kernels import assemble, plans_ptx
from tests.compiler.test_poly_loops import DEVICES, offloaded_at_depth, run_both
from tests.conftest import ROOT, wat

REMAINDER = (Path(__file__).parent / "data" / "remainder.wasm").read_bytes()
ARRAY_IN, ARRAY_OUT = 0x10000, 0x40000
ROWS = 7
# Each function's fill and its elements per vector step.
KINDS = {"rows8": ("fill8", 16), "rowsf": ("fillf", 4)}


def plan_of(func: str) -> LoopPlan:
    report = next(
        r for r in analyze_module(translate_module(load(REMAINDER)))
        if r.func.name == func and r.loop.depth == 1
    )  # fmt: skip
    assert report.verdict == "offload", report.reason
    return report.plan


@pytest.mark.parametrize("func", sorted(KINDS))
def test_the_vector_loop_and_its_remainder_read_as_tested_at_their_top(func: str) -> None:
    """Both inner loops are rotated (tested at their bottom) behind their entry tests; the
    remainder's are two ways through a join, which the analysis reads as alternatives."""
    plan = plan_of(func)
    assert [trip.top for _, trip in plan.inner_trips] == [True, True]


def _run(func: str, width: int, device: str, monkeypatch) -> tuple[object, list[dict]]:
    """``func`` over ROWS rows of ``width`` on wasmtime and offloaded on ``device``: the
    same memory; the inner loops' counts of each launch the guards passed."""
    launches: list[dict] = []
    check = guards.check

    def recording(plan, env, size, **kw):
        launch = check(plan, env, size, **kw)
        if plan.func.name == func:
            launches.append(dict(launch.inner or {}))
        return launch

    monkeypatch.setattr(guards, "check", recording)
    fill, _ = KINDS[func]
    calls = [(fill, [(I32, ROWS * width), (I32, ARRAY_IN), (I32, 13)]),
             (func, [(I32, ROWS), (I32, width), (I32, ARRAY_IN), (I32, ARRAY_OUT)])]  # fmt: skip
    offload = run_both(REMAINDER, calls, device)
    return offload, launches


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("func", "width"),
    [("rows8", 18), ("rows8", 34), ("rows8", 514), ("rowsf", 6), ("rowsf", 18), ("rowsf", 66)],
)
def test_rows_whose_remainder_runs_zero_times_launch(func: str, width: int, device: str, monkeypatch) -> None:
    """width - 2 a multiple of the vector width: the vector loop covers each row and the
    remainder is skipped. The rows loop launches, its remainder counted zero."""
    offload, launches = _run(func, width, device, monkeypatch)
    assert offloaded_at_depth(offload, func, 1) == 1
    (inner,) = launches
    plan = plan_of(func)
    (vector, _), (remainder, _) = plan.inner_trips
    by_loop = {c.ref.offset: n for c, n in inner.items()}
    assert by_loop[remainder.ref.offset] == 0
    assert by_loop[vector.ref.offset] == (width - 2) // KINDS[func][1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("func", "width"), [("rows8", 19), ("rows8", 35), ("rows8", 515), ("rowsf", 7), ("rowsf", 19)]
)
def test_rows_whose_remainder_runs_launch(func: str, width: int, device: str, monkeypatch) -> None:
    """The neighbouring sizes, where the remainder runs after the vector loop: counted as
    the elements the vector loop left."""
    offload, launches = _run(func, width, device, monkeypatch)
    assert offloaded_at_depth(offload, func, 1) == 1
    (inner,) = launches
    (vector, _), (remainder, _) = plan_of(func).inner_trips
    by_loop = {c.ref.offset: n for c, n in inner.items()}
    assert by_loop[remainder.ref.offset] == (width - 2) % KINDS[func][1]
    assert by_loop[vector.ref.offset] == (width - 2) // KINDS[func][1]


@pytest.mark.parametrize(
    ("func", "width"), [("rows8", 3), ("rows8", 10), ("rowsf", 3), ("rowsf", 4), ("rowsf", 5)]
)
def test_rows_too_short_for_the_vector_loop_stay_exact(func: str, width: int, monkeypatch) -> None:
    """The vector loop skipped, the remainder alone from the first interior point: the
    output is wasmtime's whether the rows launch or the guards decline."""
    _run(func, width, "cpu", monkeypatch)


# The shape by hand: rows of w bytes, each finished by a rotated loop from x to w entered
# through a join, from 0 where the row is shorter than 4 and from w & -4 otherwise past a
# test that skips it where that is w already (SKIP); rows of no byte skipped first.
SKIP = "(br_if $next (i32.eq (local.get $x) (local.get $w)))"
JOINED = """(module (memory (export "memory") 1)
  (func (export "rows") (param $h i32) (param $w i32) (param $base i32) (local $y i32) (local $x i32)
    (loop $rows
      (block $next
        (br_if $next (i32.le_s (local.get $w) (i32.const 0)))
        (block $join
          (block $short
            (br_if $short (i32.lt_u (local.get $w) (i32.const 4)))
            (local.set $x (i32.and (local.get $w) (i32.const -4)))
            SKIP
            (br $join))
          (local.set $x (i32.const 0)))
        (loop $rest
          (i32.store8 (i32.add (local.get $base) (i32.add (i32.mul (local.get $y) (local.get $w))
            (local.get $x))) (i32.add (local.get $x) (local.get $y)))
          (local.set $x (i32.add (local.get $x) (i32.const 1)))
          (br_if $rest (i32.ne (local.get $x) (local.get $w)))))
      (local.set $y (i32.add (local.get $y) (i32.const 1)))
      (br_if $rows (i32.ne (local.get $y) (local.get $h))))))
"""


def _joined_plan(data: bytes) -> LoopPlan:
    report = next(r for r in analyze_module(translate_module(load(data))) if r.loop.depth == 1)
    assert report.verdict == "offload", report.reason
    return report.plan


@pytest.mark.parametrize("device", DEVICES)
def test_a_loop_entered_through_a_join_is_read_at_its_top_where_the_ways_prove_it(device: str) -> None:
    """With the skipping test, the loop is entered exactly where ``x != w`` (its exit test
    one step before its start): counted ``w - x``, and the rows launch as one grid with
    wasmtime's bytes. For a row of 8 bytes the count is zero, not a wrapped 2^32: the
    guards decline only as the grid is empty (the collapsed loop runs no iteration)."""
    data = wat(JOINED.replace("SKIP", SKIP))
    ((_, trip),) = _joined_plan(data).inner_trips
    assert trip.top, trip
    for width in (3, 13, 8):
        offload = run_both(data, [("rows", [(I32, 5), (I32, width), (I32, 0x1000)])], device)
        (rows,) = [lp for lp in offload.offload.loops if lp.plan.loop.depth == 1]
        if width == 8:
            assert rows.stats.declined == {"a collapsed inner loop runs no iteration": 1}
        else:
            assert rows.stats.offloaded == 1, rows.stats.declined


def test_a_loop_entered_through_a_join_stays_rotated_where_the_ways_do_not_prove_it() -> None:
    """Without it, a row of a multiple of 4 bytes enters the loop at ``x == w`` (Wasm runs
    it until it wraps): the ways hold where ``x != w`` does not, so the loop keeps its
    rotated count (at least one), which the guards refuse there."""
    ((_, trip),) = _joined_plan(wat(JOINED.replace("SKIP", ""))).inner_trips
    assert not trip.top, trip


def test_the_rows_kernels_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    """The rows loops with their vector loop and remainder as phases (each counted at its
    top), and those of the blur example and of stencil3d, as PTX that ptxas takes."""
    for data, wanted in (
        (REMAINDER, {("rows8", 1), ("rowsf", 1)}),
        ((ROOT / "examples/wasi/build/blur.O2.simd.wasm").read_bytes(), {("main", 2)}),
        ((ROOT / "benchmarks/suite/build/stencil3d.simd.wasm").read_bytes(), {("kernel_stencil3d", 2)}),
    ):
        module = translate_module(load(data))
        plans = [
            r.plan for r in analyze_module(module)
            if r.verdict == "offload" and (r.func.name, r.loop.depth) in wanted
            and any(t.top for _, t in r.plan.inner_trips)
        ]  # fmt: skip
        assert len(plans) == len(wanted)
        assemble(ptxas, plans_ptx(module, plans, "sm_90"), "sm_90", tmp_path)
