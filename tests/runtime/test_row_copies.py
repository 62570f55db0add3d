"""Launches outside a region copy a column of a row-major matrix, or the tails of its rows,
as rows (:class:`runtime.spans.Rows`, one 2-D copy on the CUDA device) instead of the whole
range that holds them, in and back, and never copy back a byte between the rows."""

from __future__ import annotations

import pytest

from tensorwasm.dialect.types import I32
from tensorwasm.runtime.guards import Launch, Range
from tensorwasm.runtime.planning import MERGED_SPANS, access_rows, copy_plan, merged_spans
from tensorwasm.runtime.spans import Rows, Span
from tests.compiler import test_schedule as schedule
from tests.conftest import wat

DEVICES = ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)]


def column(origin: int, stride: int, pitch: int, count: int, element: int = 8, trip: int = 1) -> Range:
    """An access at ``origin + stride * t + pitch * r`` for t < trip, r < count."""
    first = origin + min(0, stride * (trip - 1))
    last = origin + max(0, stride * (trip - 1)) + pitch * (count - 1) + element
    return Range(first, last, origin, stride, pitch * (count - 1) + element, (), True, origin, element,
                 ((pitch, count),))  # fmt: skip


def test_a_column_and_the_tails_of_rows_are_copied_as_rows() -> None:
    q = column(1 << 20, 0, 9600, 1000)  # q[i][k]: one element a row
    assert access_rows(q, 600) == Rows(1 << 20, 8, 9600, 1000)
    tails = column(8 * 700, 8, 9600, 1000, trip=500)  # a[i][j], j from 700 to 1199
    assert access_rows(tails, 500) == Rows(8 * 700, 8 * 500, 9600, 1000)
    wide = column(8 * 500, 8, 9600, 1000, trip=700)  # more than half of each row
    assert access_rows(wide, 700) is None  # (copied as its range)
    back = column(8 * 10, -8, 9600, 1000, trip=5)  # j counting down: the rows start 4 left
    assert access_rows(back, 5) == Rows(8 * 6, 40, 9600, 1000)


def test_what_is_not_a_set_of_rows_is_copied_as_its_range() -> None:
    q = column(0, 0, 9600, 1000)
    plain = Range(0, 800, 0, 8, 8)  # no inner loop moves it
    assert access_rows(plain, 100) is None
    two = Range(q.lo, q.hi, 0, 0, q.width, (), True, 0, 8, ((9600, 1000), (8, 2)))
    assert access_rows(two, 10) is None  # two inner loops move it
    grid = Range(q.lo, q.hi, 0, 0, q.width, (64,), True, 0, 8, ((9600, 1000),))
    assert access_rows(grid, 10) is None  # a collapsed nest's
    tight = Range(q.lo, q.hi - 9600, 0, 0, q.width, (), True, 0, 8, ((9600, 1000),))
    assert access_rows(tight, 10) is None  # rows past the range the guards checked
    assert access_rows(Range(0, 8, 0, 0, 8, (), True, 0, 0, ((9600, 1000),)), 1) is None  # no element


def test_every_written_byte_goes_back_as_it_came_in() -> None:
    q, a = column(1 << 20, 0, 9600, 1000), column(8 * 700, 8, 9600, 1000, trip=500)
    small = Range(1 << 22, (1 << 22) + 64, 1 << 22, 8, 8)
    launch = Launch(500, {}, [q, a, small], [a, small])
    needed = tuple(merged_spans([q, a, small, a, small]))
    written = tuple(merged_spans([a, small]))
    copies_in, copies_out = copy_plan(launch, needed, written)
    assert set(copies_in) == {access_rows(q, 500), access_rows(a, 500), Span(small.lo, small.hi)}
    assert set(copies_out) == {access_rows(a, 500), Span(small.lo, small.hi)}
    # Where the other written ranges would be merged into one covering span (which could
    # hold bytes between rows that never came in), nothing goes by rows.
    many = [Range(i * 4096, i * 4096 + 8, i * 4096, 0, 8) for i in range(MERGED_SPANS + 1)]
    launch = Launch(500, {}, [q, *many], [a, *many])
    needed, written = tuple(merged_spans([q, *many, a, *many])), tuple(merged_spans([a, *many]))
    assert copy_plan(launch, needed, written) == (needed, written)


# bump(k): columns j < k of a 32 x 16 matrix of i32, each element below the first row
# incremented by the one above it (the launched loop over j; the inner loop over the rows
# runs in order, so it is not a dimension of the grid); poke(at, v): one store, on wasmtime.
COLUMNS = """(module (memory (export "memory") 1)
  (func (export "bump") (param $k i32) (local $j i32) (local $i i32) (local $at i32)
    (block $done (loop $cols
      (br_if $done (i32.ge_u (local.get $j) (local.get $k)))
      (local.set $i (i32.const 1))
      (loop $rows
        (local.set $at (i32.add (i32.mul (local.get $i) (i32.const 64)) (i32.shl (local.get $j) (i32.const 2))))
        (i32.store (local.get $at)
          (i32.add (i32.load (local.get $at)) (i32.load (i32.sub (local.get $at) (i32.const 64)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $rows (i32.lt_u (local.get $i) (i32.const 32))))
      (local.set $j (i32.add (local.get $j) (i32.const 1)))
      (br $cols))))
  (func (export "poke") (param $at i32) (param $v i32) (i32.store (local.get $at) (local.get $v))))
"""


@pytest.mark.parametrize("device", DEVICES)
def test_bytes_between_the_rows_keep_what_wasmtime_wrote_there(device) -> None:
    """Between two launches that copy three columns by rows, wasmtime writes between the
    rows (another column, and one of the three): the second launch brings back its
    columns and leaves the rest as wasmtime made it, as wasmtime's own run does."""
    calls = [
        ("bump", [(I32, 3)]),
        ("poke", [(I32, 2 * 64 + 40), (I32, 999)]),  # a[2][10]: between the rows
        ("poke", [(I32, 5 * 64 + 8), (I32, 7)]),  # a[5][2]: in a row the launch copies
        ("bump", [(I32, 3)]),
    ]
    instance = schedule.run(device, calls, wat(COLUMNS))
    (lp,) = [lp for lp in instance.offload.loops if lp.plan.loop.depth == 1]
    # Each launch copied two sets of 31 rows of 12 bytes in (rows 0 to 30, which it reads,
    # and rows 1 to 31, which it reads and writes) and the second set back, not the
    # ranges of 1,996 bytes that hold them.
    assert lp.stats.offloaded == 2 and not lp.plan.collapse
    assert lp.stats.bytes_in == 2 * 2 * 31 * 12 and lp.stats.bytes_out == 2 * 31 * 12
