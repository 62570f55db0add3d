"""Loop nests as clang -O2 and PolyBench shape them: the detector accepts them, and running
them offloaded (host backend) leaves memory identical to wasmtime's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.extent import extent
from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.plan import LoopPlan, TripCount
from tensorwasm.compiler.analysis.poly import Poly, Symbol
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import F64, I32
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler.test_loop_kernels import assemble, plans_ptx
from tests.conftest import wat

# Fills 64 KiB of memory with small integers derived from their index (both sides run it).
FILL = """
  (func (export "fill") (local $p i32)
    (loop $l
      (i32.store (local.get $p) (i32.rem_u (i32.mul (local.get $p) (i32.const 2654435761)) (i32.const 1000)))
      (local.set $p (i32.add (local.get $p) (i32.const 4)))
      (br_if $l (i32.lt_u (local.get $p) (i32.const 65536)))))
"""


def verdicts(data: bytes) -> dict[tuple[str, int], tuple[str, str]]:
    """(function, loop depth) -> (verdict, reason) of the first loop at that depth."""
    out: dict[tuple[str, int], tuple[str, str]] = {}
    for r in analyze_module(translate_module(load(data))):
        out.setdefault((r.func.name, r.loop.depth), (r.verdict, r.reason))
    return out


DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def run_both(data: bytes, calls: list[tuple[str, list]], device: str = "cpu") -> OffloadInstance:
    """Run ``calls`` on wasmtime and offloaded on ``device`` (the host backend, or the GPU):
    same results, same memory."""
    reference = ReferenceInstance(data)
    offload = OffloadInstance(data, device=device)
    for export, args in calls:
        assert offload.call(export, args) == reference.call(export, args), export
    assert offload.memory() == reference.memory("memory")
    return offload


def offloaded_at_depth(instance: OffloadInstance, func: str, depth: int) -> int:
    """Launches of the loops of ``func`` at ``depth``."""
    return sum(
        lp.stats.offloaded for lp in instance.offload.loops
        if lp.plan.func.name == func and lp.plan.loop.depth == depth
    )  # fmt: skip


def i32s(*values: int) -> list:
    return [(I32, v) for v in values]


# The outer loop carries $t (assigned in the inner loop), but every inner iteration sets it
# before reading it: dead in the outer loop, so it says nothing about it.
DEAD_CARRIED = f"""(module (memory (export "memory") 1) {FILL}
  (func (export "rowsum") (param $a i32) (param $out i32) (param $n i32)
    (local $i i32) (local $j i32) (local $t i32) (local $s i32)
    (loop $rows
      (local.set $s (i32.const 0))
      (local.set $j (i32.const 0))
      (loop $cols
        (local.set $t (i32.load (i32.add (local.get $a)
          (i32.shl (i32.add (i32.mul (local.get $i) (local.get $n)) (local.get $j)) (i32.const 2)))))
        (local.set $s (i32.add (local.get $s) (i32.mul (local.get $t) (local.get $t))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br_if $cols (i32.lt_s (local.get $j) (local.get $n))))
      (i32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2))) (local.get $s))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $rows (i32.lt_s (local.get $i) (local.get $n))))))
"""


@pytest.mark.parametrize("device", DEVICES)
def test_a_carried_local_overwritten_before_use_does_not_block_the_outer_loop(device: str) -> None:
    data = wat(DEAD_CARRIED)
    assert verdicts(data)[("rowsum", 1)][0] == "offload"
    offload = run_both(data, [("fill", []), ("rowsum", i32s(0, 40000, 60))], device)
    assert offloaded_at_depth(offload, "rowsum", 1) == 1


# The inner loop walks a pointer from a start no polynomial gives (a bit mask of the row),
# counting with a counter of its own: its loads are gathers, the outer loop stays parallel.
UNKNOWN_INNER_START = f"""(module (memory (export "memory") 1) {FILL}
  (func (export "masked") (param $a i32) (param $out i32) (param $n i32)
    (local $i i32) (local $c i32) (local $p i32) (local $s i32)
    (loop $rows
      (local.set $s (i32.const 0))
      (local.set $c (i32.const 0))
      (local.set $p (i32.add (local.get $a) (i32.shl (i32.and (local.get $i) (i32.const 7)) (i32.const 2))))
      (loop $cols
        (local.set $s (i32.xor (local.get $s) (i32.load (local.get $p))))
        (local.set $p (i32.add (local.get $p) (i32.const 12)))
        (local.set $c (i32.add (local.get $c) (i32.const 1)))
        (br_if $cols (i32.lt_s (local.get $c) (local.get $n))))
      (i32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2))) (local.get $s))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $rows (i32.lt_s (local.get $i) (local.get $n))))))
"""


@pytest.mark.parametrize("device", DEVICES)
def test_an_inner_counter_from_an_unknown_start_leaves_the_outer_loop_parallel(device: str) -> None:
    data = wat(UNKNOWN_INNER_START)
    assert verdicts(data)[("masked", 1)][0] == "offload"
    offload = run_both(data, [("fill", []), ("masked", i32s(0, 40000, 50))], device)
    assert offloaded_at_depth(offload, "masked", 1) == 1


# Loop nests in C (tests/compiler/data/nests.c, built as its header says): n x n doubles.
NESTS = (Path(__file__).parent / "data" / "nests.wasm").read_bytes()
N = 40  # as nests.c defines it
# C ends linear memory (1 MiB): the box of a triangular nest's counters would take the
# store to C[j][i] (j >= i) twice as far, so only the nest's exact range passes the guards.
ARRAY_A, ARRAY_B, ARRAY_C = 0x10000, 0x20000, 0x100000 - N * N * 8


def plan_of(data: bytes, func: str, depth: int) -> LoopPlan:
    report = next(r for r in analyze_module(translate_module(load(data))) if r.func.name == func
                  and r.loop.depth == depth)  # fmt: skip
    assert report.verdict == "offload", report.reason
    return report.plan


def fills() -> list[tuple[str, list]]:
    return [("fill", i32s(N, ARRAY_A, 37)), ("fill", i32s(N, ARRAY_B, 11)), ("fill", i32s(N, ARRAY_C, 5))]


@pytest.mark.parametrize("device", DEVICES)
def test_a_triangular_nest_runs_one_thread_per_row(device: str) -> None:
    """``j < i``: the inner loop's count moves with the row; the guards take its largest."""
    plan = plan_of(NESTS, "lower", 1)
    (_, inner), *_ = plan.inner_trips
    assert plan.counter in inner.bound.symbols() | inner.start.symbols()
    assert not plan.collapse  # a grid dimension would need one count for every row
    beta = (F64, 0x3FF8000000000000)  # 1.5
    offload = run_both(NESTS, [*fills(), ("lower", [beta, (I32, ARRAY_A), (I32, ARRAY_B)])], device)
    assert offloaded_at_depth(offload, "lower", 1) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_symmetric_stores_are_proven_independent_on_the_triangle(device: str) -> None:
    """Row i writes C[i][j] and C[j][i] for j >= i: the two stores meet only on the same
    row, which isl proves on the triangular domain, so no guard compares them; and the
    guards bound C[j][i] by the triangle, not by the box of (i, j)."""
    plan = plan_of(NESTS, "symmetric", 1)
    stores = [i for i, a in enumerate(plan.accesses) if a.store]
    assert len(stores) == 2
    assert (stores[0], stores[1]) in plan.static_dependence_free
    assert (stores[1], stores[0]) in plan.static_dependence_free
    offload = run_both(NESTS, [*fills(), ("symmetric", i32s(ARRAY_A, ARRAY_C))], device)
    assert offloaded_at_depth(offload, "symmetric", 1) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_time_loop_is_sequential_by_proof_and_a_device_resident_region(device: str) -> None:
    """Every step of jacobi-1d writes B[1..n-2]: rejected statically (a guard could only
    refuse it), so the loop holds its two parallel loops as a region."""
    report = next(r for r in analyze_module(translate_module(load(NESTS))) if r.func.name == "jacobi"
                  and r.loop.depth == 1)  # fmt: skip
    assert report.verdict == "reject" and report.reason.startswith("sequential:"), report.reason
    offload = run_both(NESTS, [*fills(), ("jacobi", i32s(6, 1000, ARRAY_A, ARRAY_B))], device)
    assert offloaded_at_depth(offload, "jacobi", 2) == 12
    regions = offload.offload.regions
    assert len(regions) == 1 and len(regions[0].children) == 2


def test_the_extent_of_a_triangular_nest_holds_every_address_and_no_more() -> None:
    """Against enumeration: ``j`` from ``i`` to ``n`` (every row runs: exact) and ``j`` below
    ``i`` (row 0 runs nothing: it may only widen the range), for coefficients of each sign."""
    i, j, n = Symbol("counter", None, "i"), Symbol("counter", None, "j"), Symbol("value", None, "n")
    pi, pj, pn = Poly.symbol(i), Poly.symbol(j), Poly.symbol(n)
    upper = TripCount(True, "slt", pi, 1, pn, 32)  # j = i + k_j < n: k_j counts from 0
    below = TripCount(True, "slt", Poly.const(0), 1, pi, 32)
    for trip, rows, exact in ((upper, lambda r, m: range(r, m), True), (below, lambda r, m: range(r), False)):
        for a, b in ((8, 640), (640, -8), (-24, 8), (-8, -640)):
            address = Poly.const(5000) + pi.scale(a) + (trip.start + pj).scale(b)
            m = 12
            seen = [5000 + a * r + b * c for r in range(m) for c in rows(r, m)]
            counts = {i: m, j: m}
            lo, hi = extent(address, [(i, TripCount(True, "slt", Poly.const(0), 1, pn, 32)), (j, trip)], {n: m},
                            counts)  # fmt: skip
            assert lo <= min(seen) and hi >= max(seen), (a, b)
            if exact:
                assert (lo, hi) == (min(seen), max(seen)), (a, b)


def test_the_kernels_of_the_nests_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    """Every offloaded loop of nests.c (triangular nests included) as PTX that ptxas takes."""
    module = translate_module(load(NESTS))
    plans = [r.plan for r in analyze_module(module) if r.verdict == "offload"]
    assert {(p.func.name, p.loop.depth) for p in plans} >= {("lower", 1), ("symmetric", 1), ("jacobi", 2)}
    assemble(ptxas, plans_ptx(module, plans, "sm_90"), "sm_90", tmp_path)
