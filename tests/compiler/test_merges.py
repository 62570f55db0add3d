"""Loops that start from a merge of values chosen by a loop-invariant test: the scalar
remainder after a vectorised loop (1, or where the vector loop stopped), trmm's loop with a
peeled step (``i`` or ``i + 1``), a ``select`` of two starts. The merge is one polynomial
where isl proves it equal to each incoming value under that edge's tests, and the loops
around it are accepted and run offloaded exactly as on wasmtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.isl import equal_where
from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.plan import LoopPlan
from tensorwasm.compiler.analysis.poly import Poly, Symbol
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import F64, I32
from tests.compiler.test_loop_kernels import assemble, plans_ptx
from tests.compiler.test_poly_loops import DEVICES, offloaded_at_depth, run_both
from tests.conftest import wat

# tests/compiler/data/merges.c, built with -msimd128 as its header says.
MERGES = (Path(__file__).parent / "data" / "merges.wasm").read_bytes()
M, N = 37, 24  # trmm's sizes, as merges.c defines them
ARRAY_A, ARRAY_B = 0x10000, 0x40000


def i32s(*values: int) -> list:
    return [(I32, v) for v in values]


def plan_of(data: bytes, func: str, depth: int = 1) -> LoopPlan:
    report = next(r for r in analyze_module(translate_module(load(data))) if r.func.name == func
                  and r.loop.depth == depth)  # fmt: skip
    assert report.verdict == "offload", report.reason
    return report.plan


X = Symbol("value", object(), "x")
PX = Poly.symbol(X)


def floor(poly: Poly, d: int) -> Poly:
    return Poly.symbol(Symbol.floor(poly, d))


def test_the_vector_loops_end_is_1_where_the_row_is_too_short() -> None:
    """``((x & -4) | 1) == 1`` wherever ``x <u 4`` (wrapped: any integer congruent to x),
    not where ``x <u 5`` (x = 4), nor where ``x <s 4`` (x = -1 gives -3)."""
    end = floor(PX, 4).scale(4) + Poly.const(1)
    one = Poly.const(1)
    assert equal_where([("ult", PX, Poly.const(4), 32)], one, end, 32)
    assert not equal_where([("ult", PX, Poly.const(5), 32)], one, end, 32)
    assert not equal_where([("slt", PX, Poly.const(4), 32)], one, end, 32)
    assert equal_where([("slt", PX, Poly.const(4), 32), ("sge", PX, Poly.const(0), 32)], one, end, 32)


def test_a_peeled_step_is_a_quasi_affine_start() -> None:
    """``t = (1 - x) & 1``: ``x + t`` is ``x`` where ``t == 0`` and ``x + 1`` where ``t != 0``,
    modulo 2^32; a mask of two bits is not such a selector (``t`` may be 2 or 3)."""
    inner = Poly.const(1) - PX
    t = inner - floor(inner, 2).scale(2)
    start = PX + t
    zero = [("eq", t, Poly.const(0), 32)]
    nonzero = [("ne", t, Poly.const(0), 32)]
    assert equal_where(zero, PX, start, 32)
    assert equal_where(nonzero, PX + Poly.const(1), start, 32)
    assert not equal_where(nonzero, PX, start, 32)
    t3 = inner - floor(inner, 4).scale(4)
    assert not equal_where([("ne", t3, Poly.const(0), 32)], PX + Poly.const(1), PX + t3, 32)


def test_the_vectorised_rows_loop_is_accepted_with_the_remainder_at_the_vector_end() -> None:
    """The rows loop around a vectorised inner loop and its remainder is one grid; the
    remainder starts at the merge, read as the vector loop's end ``((m - 2) & -4) | 1`` (a
    live-in: clang computes it before the rows loop)."""
    plan = plan_of(MERGES, "sweep")
    remainder = next(t for _, t in plan.inner_trips if t.step in (1, -1))
    ends = [s for s in remainder.start.symbols() if s.kind == "value" and s.ref.owner.name == "arith.or"]
    assert len(ends) == 1, remainder


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [27, 30, 34])
def test_a_vectorised_sweep_runs_as_one_grid(device: str, m: int) -> None:
    """m - 2 = 25 (a remainder of 1 after the vector loop), 28 (none: the remainder is
    skipped), 32: the output is wasmtime's; a row with a remainder launches one grid."""
    n = 11
    calls = [("fill", [(I32, n * m), (I32, ARRAY_A), (I32, 7)]),
             ("sweep", i32s(ARRAY_B, ARRAY_A, n, m))]  # fmt: skip
    offload = run_both(MERGES, calls, device)
    if m == 27:
        assert offloaded_at_depth(offload, "sweep", 1) == 1


@pytest.mark.parametrize("m", [3, 4, 5, 6])
def test_rows_too_short_for_the_vector_loop_stay_exact(m: int) -> None:
    """Rows of 1 to 4 interior points (the vector loop skipped, the remainder from 1): the
    output is wasmtime's whether the grid launches or its guard declines."""
    run_both(MERGES, [("fill", i32s(5 * m, ARRAY_A, 3)), ("sweep", i32s(ARRAY_B, ARRAY_A, 5, m))])


@pytest.mark.parametrize("device", DEVICES)
def test_trmm_with_a_peeled_step_runs_its_columns_offloaded(device: str) -> None:
    """trmm's ``k`` loop starts at ``i`` or ``i + 1`` (a step peeled when ``(1 - i) & 1``):
    the ``j`` loop around it is accepted and launches for the rows, the ``i`` loop is
    sequential by its own dependence (it reads rows later rows write)."""
    reports = {(r.func.name, r.loop.depth): r for r in analyze_module(translate_module(load(MERGES)))}
    assert reports[("trmm", 2)].verdict == "offload", reports[("trmm", 2)].reason
    assert "across iterations" in reports[("trmm", 1)].reason
    calls = [("filld", i32s(M * M, ARRAY_A, 37)), ("filld", i32s(M * N, ARRAY_B, 11)),
             ("trmm", [(F64, 0x3FF8000000000000), (I32, ARRAY_A), (I32, ARRAY_B)])]  # fmt: skip
    offload = run_both(MERGES, calls, device)
    assert offloaded_at_depth(offload, "trmm", 2) >= M - 2


# The inner loop starts at ``select(i + 1, i, i & 1)``: i rounded up to even; rows of 16
# words, the first n of them written from there.
SELECTED = """(module (memory (export "memory") 1)
  (func (export "rows") (param $n i32) (param $base i32) (local $i i32) (local $j i32)
    (loop $outer
      (local.set $j (select (i32.add (local.get $i) (i32.const 1)) (local.get $i)
                            (i32.and (local.get $i) (i32.const 1))))
      (block $done
        (br_if $done (i32.ge_s (local.get $j) (local.get $n)))
        (loop $inner
          (i32.store (i32.add (local.get $base) (i32.shl (i32.add (i32.shl (local.get $i)
              (i32.const 4)) (local.get $j)) (i32.const 2))) (i32.add (local.get $i) (local.get $j)))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $inner (i32.lt_s (local.get $j) (local.get $n)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $outer (i32.lt_s (local.get $i) (local.get $n))))))"""


@pytest.mark.parametrize("device", DEVICES)
def test_a_select_of_two_starts_is_one_value(device: str) -> None:
    """A ``select`` on ``i & 1`` between ``i + 1`` and ``i`` starts the inner loop at
    ``i + (i & 1)``: the rows loop is one launch, its stores wasmtime's."""
    data = wat(SELECTED)
    plan = plan_of(data, "rows")
    ((_, inner),) = plan.inner_trips
    assert inner.start.floors(), inner
    offload = run_both(data, [("rows", i32s(9, 0x1000))], device)
    assert offloaded_at_depth(offload, "rows", 1) == 1


def test_unproven_merges_keep_the_reason() -> None:
    """A start chosen between 0 and ``i`` by ``i & 2`` is no polynomial (the selector may be
    2): the rows loop keeps its precise reason."""
    data = wat(
        SELECTED.replace("(i32.const 1)))\n", "(i32.const 2)))\n", 1).replace(
            "(i32.add (local.get $i) (i32.const 1)) (local.get $i)", "(i32.const 0) (local.get $i)", 1
        )
    )
    reports = [r for r in analyze_module(translate_module(load(data))) if r.loop.depth == 1]
    assert reports[0].verdict == "reject"
    assert "trip count that depends on memory or unknown values" in reports[0].reason


@pytest.mark.parametrize("device", DEVICES)
def test_a_triangle_filled_by_a_vector_loop_and_its_remainder_runs_exactly(device: str) -> None:
    """symm's upper triangle (``j`` from ``i + 1``), vectorised: rows whose vector loop or
    remainder is skipped behind tests before a join. The remainder, entered through that
    join, counts ``(36 - i) mod 2`` (zero on the rows the vector loop covers, not a rotated
    loop's wrapped count): the rows loop launches once, as one grid, exactly."""
    calls = [("filld", i32s(M * M, ARRAY_A, 5)), ("upper", i32s(ARRAY_A))]
    offload = run_both(MERGES, calls, device)
    assert offloaded_at_depth(offload, "upper", 1) == 1


# tests/compiler/data/upper.c: the same triangle, scalar, unrolled by four.
UPPER = (Path(__file__).parent / "data" / "upper.wasm").read_bytes()


def test_an_unrolled_loop_behind_a_join_is_read_as_tested_at_its_top() -> None:
    """The unrolled loop is entered past the join of the peeled remainder and the path
    around it, behind ``(35 - i) >=u 3`` and ``i <=u 35``: the tests in front of the join
    hold on both paths, and isl proves them the loop's own exit test one step before its
    start on the wrapped values, for the rows ``0 <= i <= 36`` (its count is a number),
    so both inner loops count exactly (none of them "at least once")."""
    plan = plan_of(UPPER, "upper")
    assert len(plan.inner_trips) == 2
    assert all(t.top for _, t in plan.inner_trips), plan.inner_trips
    run_both(UPPER, [("upper", i32s(ARRAY_A))])


def test_the_kernels_around_merges_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    """The rows loop of the vectorised sweep (v128 loop and remainder inside each thread),
    trmm's columns and the triangles, as PTX that ptxas takes."""
    module = translate_module(load(MERGES))
    wanted = {("sweep", 1), ("trmm", 2), ("upper", 1)}
    plans = [
        r.plan
        for r in analyze_module(module)
        if r.verdict == "offload" and (r.func.name, r.loop.depth) in wanted
    ]
    assert len(plans) == 3
    assemble(ptxas, plans_ptx(module, plans, "sm_90"), "sm_90", tmp_path)
