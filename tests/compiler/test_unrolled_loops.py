"""Loops clang -O2 unrolls: bounds that are bit masks of a counter (``n & -4``, ``n & 3``) as
quasi-affine values (floor symbols), the rotated loops behind their own entry tests read as
tested at their top, the merge that starts a remainder loop as the unrolled loop's exit
value; and the enclosing loops, accepted, run offloaded exactly as on wasmtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.extent import box_range, nest_range
from tensorwasm.compiler.analysis.forest import FunctionLoops
from tensorwasm.compiler.analysis.induction import LoopValues
from tensorwasm.compiler.analysis.isl import same_test
from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.analysis.plan import AnalysisOptions, LoopPlan, TripCount
from tensorwasm.compiler.analysis.poly import Poly, Symbol
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.compiler.lower.function import FunctionLowering, ModuleLowering, lower_loop_entry, reachable
from tensorwasm.compiler.outline import outline
from tensorwasm.compiler.target import ARCH_PTX, NVPTXTarget
from tensorwasm.dialect.types import F64, I32
from tensorwasm.runtime.guards import GuardFailed, _most_trips, check, inputs
from tests.compiler.test_loop_kernels import assemble, plans_ptx
from tests.compiler.test_poly_loops import DEVICES, offloaded_at_depth, run_both, verdicts
from tests.conftest import wat

# tests/compiler/data/unrolled.c, built as its header says: N x N doubles.
UNROLLED = (Path(__file__).parent / "data" / "unrolled.wasm").read_bytes()
N = 37  # as unrolled.c defines it (odd, and not a multiple of 4: every remainder runs)
ARRAY_A, ARRAY_C = 0x10000, 0x100000 - N * N * 8  # C ends linear memory


def i32s(*values: int) -> list:
    return [(I32, v) for v in values]


def plan_of(func: str, depth: int = 1) -> LoopPlan:
    report = next(r for r in analyze_module(translate_module(load(UNROLLED))) if r.func.name == func
                  and r.loop.depth == depth)  # fmt: skip
    assert report.verdict == "offload", report.reason
    return report.plan


def floors_of(poly: Poly) -> list[tuple[Poly, int]]:
    return [f.ref for f in poly.floors()]


def test_bit_masks_are_floors_exact_modulo_2_32() -> None:
    """``x & -4`` is ``4 * floor(x / 4)`` and ``x & 3`` is ``x - 4 * floor(x / 4)`` modulo 2^32
    for every integer congruent to ``x`` (negative ones and wrapped ones included)."""
    x = Symbol("value", None, "x")
    px = Poly.symbol(x)
    for d in (2, 4, 8, 1 << 31):
        down = Poly.symbol(Symbol.floor(px, d)).scale(d)
        low = px - down
        for value in (0, 1, 3, 5, 7, -1, -3, -8, 2**31 - 1, -(2**31), 2**32 + 5, 12345678901):
            assert down.evaluate({x: value}) % 2**32 == (value & -d) % 2**32, (d, value)
            assert low.evaluate({x: value}) % 2**32 == (value & (d - 1)) % 2**32, (d, value)


def test_the_unrolled_loops_bounds_are_floors_of_the_row() -> None:
    """syrk's row: the unrolled loop runs to ``(i + 1) & -4``, tested at its top (its entry
    test ``i >= 3`` proven the same with isl), the remainder from ``(i + 1) & 3`` down to 0,
    and the k loop's inner loop unrolled by two to ``(i + 1) & -2``."""
    plan = plan_of("syrk")
    i = Poly.symbol(plan.counter) + Poly.const(1)
    moving = [t for _, t in plan.inner_trips if t.bound.floors() or t.start.floors()]
    assert len(moving) == 3
    assert all(t.top for t in moving)  # rotated loops behind their entry tests, at their top
    assert sorted(d for t in moving for _, d in floors_of(t.start) + floors_of(t.bound)) == [2, 4, 4]
    assert all(inner == i for t in moving for inner, _ in floors_of(t.start) + floors_of(t.bound))
    remainder = next(t for t in moving if t.step == -1)
    floor4 = next(iter(remainder.start.floors()))
    assert remainder.start == i - Poly.symbol(floor4).scale(4)  # (i + 1) & 3


@pytest.mark.parametrize("device", DEVICES)
def test_syrk_unrolled_by_clang_runs_one_thread_per_row(device: str) -> None:
    alpha, beta = (F64, 0x3FF8000000000000), (F64, 0x3FF3333333333333)  # 1.5, 1.2
    calls = [("fill", i32s(N, ARRAY_A, 37)), ("fill", i32s(N, ARRAY_C, 5)),
             ("syrk", [alpha, beta, (I32, ARRAY_C), (I32, ARRAY_A)])]  # fmt: skip
    offload = run_both(UNROLLED, calls, device)
    assert offloaded_at_depth(offload, "syrk", 1) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_remainder_step_at_the_masks_value_runs_offloaded(device: str) -> None:
    """``j < i`` unrolled by two: the lone remainder step stores at ``B[i][i & -2]``, an
    address through the merge of the unrolled loop's exit and the path around it."""
    plan = plan_of("strict_lower")
    assert any(a.store and a.address.floors() for a in plan.accesses)
    calls = [("fill", i32s(N, ARRAY_A, 37)), ("fill", i32s(N, ARRAY_C, 11)),
             ("strict_lower", i32s(ARRAY_A, ARRAY_C))]  # fmt: skip
    offload = run_both(UNROLLED, calls, device)
    assert offloaded_at_depth(offload, "strict_lower", 1) == 1


def test_guards_take_the_remainders_largest_count_not_a_corners() -> None:
    """The remainder runs ``(i + 1) & 3`` times: 3 at its most, though both corners of ``i``
    (0 and 36) give 1; and the whole plan passes the guards with C at the end of memory."""
    plan = plan_of("syrk")
    remainder = next(t for _, t in plan.inner_trips if t.step == -1)
    assert _most_trips(remainder, {}, {plan.counter: N}) == 3
    env = {sym: {"local2": ARRAY_C, "local3": ARRAY_A}.get(sym.name, 0) for sym in inputs(plan)}
    launch = check(plan, env, 0x100000, strict_alignment=True)
    assert launch.trip == N


def test_quasi_affine_ranges_hold_every_value() -> None:
    """Against enumeration: a remainder's start ``i - 4 * floor(i / 4)`` (residues: the
    corners would miss 3), a monotone unrolled bound (exact at the corners), and the
    remainder's address over the nest, where the floors cancel to the diagonal exactly."""
    i, j = Symbol("counter", None, "i"), Symbol("counter", None, "j")
    pi, pj = Poly.symbol(i), Poly.symbol(j)
    f4 = Poly.symbol(Symbol.floor(pi + Poly.const(1), 4))
    rows = 37
    start = pi + Poly.const(1) - f4.scale(4)
    seen = [(r + 1) % 4 for r in range(rows)]
    lo, hi = box_range(start, {}, {i: rows})
    assert lo <= min(seen) and hi >= max(seen) and hi == 3
    assert box_range(f4.scale(4), {}, {i: rows}) == (0, 4 * ((rows) // 4))
    # The remainder's address: row i, columns from (i + 1) & -4 up (j counts them).
    remainder = TripCount(True, "ne", start, -1, Poly.const(0), 32)
    address = Poly.const(4096) + pi.scale(8 * rows) + f4.scale(32) + pj.scale(8)
    low, high = nest_range(address, [(j, remainder)], {}, {i: rows, j: 3})
    seen = [
        4096 + 8 * rows * r + 8 * (4 * ((r + 1) // 4)) + 8 * c
        for r in range(rows)
        for c in range((r + 1) % 4)
    ]
    assert (low, high) == (min(seen), max(seen))


def _row_values(func: str) -> tuple[LoopValues, object]:
    module = translate_module(load(UNROLLED))
    function = next(f for f in module.functions if f.name == func)
    facts = FunctionLoops(module, function)
    info = next(m for m in function.loops if m.depth == 1)
    values = LoopValues(facts, info, AnalysisOptions())
    values.classify_header_args(info)
    return values, info


def test_entry_tests_are_proven_equivalent_or_not_with_isl() -> None:
    """``i >= 3`` enters a loop that runs while ``0 != 4 * floor((i + 1) / 4)``: the same
    rows; ``i >= 2`` is not (row 2 would skip nothing), nor is a test on a live-in, whose
    wrapping nothing bounds."""
    values, info = _row_values("syrk")
    inner = next(m for m in values.nested if m is not info)
    k = Poly.symbol(values.counter(info))
    bound = Poly.symbol(Symbol.floor(k + Poly.const(1), 4)).scale(4)
    own = ("ne", Poly.const(0), bound, 32)
    assert same_test(values, inner, [("uge", k, Poly.const(3), 32)], own)
    assert not same_test(values, inner, [("uge", k, Poly.const(2), 32)], own)
    n = Poly.symbol(Symbol("value", None, "n"))
    assert not same_test(values, inner, [("sge", n, Poly.const(3), 32)], ("ne", Poly.const(0), n, 32))
    # Two tests together: i != 0 and i != 1 enter a loop bounded by i & -2, which runs while i >= 2.
    bound2 = Poly.symbol(Symbol.floor(k, 2)).scale(2)
    both = [("ne", k, Poly.const(1), 32), ("ne", k, Poly.const(0), 32)]
    assert same_test(values, inner, both, ("ne", Poly.const(0), bound2, 32))
    assert not same_test(values, inner, both[:1], ("ne", Poly.const(0), bound2, 32))


def test_the_kernels_of_the_unrolled_nests_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    """The offloaded rows of syrk and strict_lower (floors in their bounds and addresses)
    as PTX that ptxas takes."""
    module = translate_module(load(UNROLLED))
    plans = [r.plan for r in analyze_module(module) if r.verdict == "offload" and r.loop.depth == 1
             and r.func.name in ("syrk", "strict_lower")]  # fmt: skip
    assert len(plans) == 2
    assemble(ptxas, plans_ptx(module, plans, "sm_90"), "sm_90", tmp_path)


def test_floor_symbols_survive_the_prepared_cache() -> None:
    """A plan with floors in its bounds, written as records and read back, still bounds its
    loops by the same counter (the floor's inner counter is the plan's own)."""
    from tensorwasm.runtime.prepared import RECORDS, _slim, _stand_in

    plan = RECORDS.loads(RECORDS.dumps(_slim(plan_of("syrk")), _stand_in))
    bounds = [t.bound for _, t in plan.inner_trips if t.bound.floors()]
    assert [b.evaluate({plan.counter: 6}) for b in bounds] == [4, 6]


# out[i] = a[i] + a[i + 1], a[i + 1] kept in a local for the next iteration's a[i] (a
# rotation), entered with a[0] loaded before the loop; and the same entered with a[1],
# which no iteration's reload would give.
ROTATED = """(module (memory (export "memory") 1)
  (func (export "fill") (local $p i32)
    (loop $l
      (i32.store (local.get $p) (i32.rem_u (i32.mul (local.get $p) (i32.const 2654435761)) (i32.const 1000)))
      (local.set $p (i32.add (local.get $p) (i32.const 4)))
      (br_if $l (i32.lt_u (local.get $p) (i32.const 65536)))))
  (func (export "pairs") (param $a i32) (param $out i32) (param $n i32)
    (local $i i32) (local $prev i32) (local $next i32)
    (local.set $prev (i32.load offset=%d (local.get $a)))
    (loop $l
      (local.set $next (i32.load offset=4 (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2)))))
      (i32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2)))
                 (i32.add (local.get $prev) (local.get $next)))
      (local.set $prev (local.get $next))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_s (local.get $i) (local.get $n))))))
"""


@pytest.mark.parametrize("device", DEVICES)
def test_a_rotated_load_is_reloaded_by_each_iteration(device: str) -> None:
    """The carried ``a[i + 1]`` is the next iteration's own ``a[i]``: accepted, the kernel
    reloads it (an access the guards check), and it launches where ``out`` is apart from
    ``a``, and declines where a store would meet a reload (same memory either way)."""
    data = wat(ROTATED % 0)
    verdict, reason = verdicts(data)[("pairs", 1)]
    assert verdict == "offload", reason
    apart = run_both(data, [("fill", []), ("pairs", i32s(0, 40000, 500))], device)
    assert offloaded_at_depth(apart, "pairs", 1) == 1
    for a, out in ((40000, 40004), (40004, 40000)):  # out[i] is a[i + 1] or a[i - 1]
        overlapping = run_both(data, [("fill", []), ("pairs", i32s(a, out, 500))], device)
        assert offloaded_at_depth(overlapping, "pairs", 1) == 0


def test_a_carried_load_entered_with_another_value_stays_carried() -> None:
    """Entered with ``a[1]`` rather than ``a[0]``: the first iteration's reload would differ."""
    verdict, reason = verdicts(wat(ROTATED % 4))[("pairs", 1)]
    assert verdict == "reject" and "carried" in reason, reason


def test_the_kernel_of_a_rotated_load_assembles_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    """The kernel that reloads the carried ``a[i + 1]`` as PTX that ptxas takes."""
    module = translate_module(load(wat(ROTATED % 0)))
    (plan,) = [r.plan for r in analyze_module(module) if r.verdict == "offload" and r.func.name == "pairs"]
    assert plan.rotations
    target = NVPTXTarget("sm_90", ARCH_PTX["sm_90"])
    lowering = ModuleLowering(module, target)
    kernel = outline(module, plan)
    assert sum(op.name == "mem.load" for op in kernel.blocks[0].ops) == 1  # the reload, at entry
    for index in reachable(module, [kernel.index]):
        FunctionLowering(lowering, module.functions[index]).lower()
    lower_loop_entry(lowering, kernel.index, [r.op for r in plan.reductions])
    assemble(ptxas, target.emit_ptx(str(lowering.llvm)), "sm_90", tmp_path)


# Rows whose only child loop runs to i & -4: distributed, the phase's grid loop bounded by a
# floor that the kernel of the phase computes as the mask.
MASKED_ROWS = """(module (memory (export "memory") 1)
  (func (export "rows") (param $out i32) (param $n i32) (local $i i32) (local $j i32) (local $b i32)
    (loop $li
      (local.set $b (i32.and (local.get $i) (i32.const -4)))
      (local.set $j (i32.const 0))
      (block $skip
        (br_if $skip (i32.ge_s (local.get $j) (local.get $b)))
        (loop $lj
          (i32.store (i32.add (local.get $out)
                              (i32.add (i32.mul (local.get $i) (i32.const 256)) (i32.shl (local.get $j) (i32.const 2))))
                     (i32.add (local.get $i) (local.get $j)))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $lj (i32.lt_s (local.get $j) (local.get $b)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $li (i32.lt_s (local.get $i) (local.get $n))))))
"""


@pytest.mark.parametrize("device", DEVICES)
def test_a_distributed_phase_bounded_by_a_mask(device: str) -> None:
    data = wat(MASKED_ROWS)
    plan = next(r.plan for r in analyze_module(translate_module(load(data))) if r.loop.depth == 1)
    (phase,) = plan.phases
    assert phase.trip.bound.floors()
    offload = run_both(data, [("rows", i32s(1024, 50))], device)
    assert offloaded_at_depth(offload, "rows", 1) == 1


def test_guards_refuse_an_unrolled_loop_that_would_step_over_its_bound() -> None:
    """``j += 4`` while ``j != 4 * floor(i / 4) + 2`` never meets its bound: refused, where
    the same loop bounded by ``4 * floor(i / 4)`` runs ``floor(i / 4)`` times at most."""
    i = Symbol("counter", None, "i")
    f4 = Poly.symbol(Symbol.floor(Poly.symbol(i), 4)).scale(4)
    good = TripCount(True, "ne", Poly.const(0), 4, f4, 32)
    assert _most_trips(good, {}, {i: 37}) == 9
    with pytest.raises(GuardFailed, match="steps over"):
        _most_trips(TripCount(True, "ne", Poly.const(0), 4, f4 + Poly.const(2), 32), {}, {i: 37})
