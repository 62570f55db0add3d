"""The runtime's overlap tests against brute force over every pair of iterations."""

from __future__ import annotations

import itertools

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tensorwasm.runtime.guards import Range, _conflict_grid


def footprint(r: Range, cell: tuple[int, ...]) -> tuple[int, int]:
    start = r.base + sum(s * c for s, c in zip((r.stride, *r.nest_strides), cell, strict=True))
    return start, start + r.width


def brute_force(s: Range, a: Range, *counts: int) -> bool:
    cells = list(itertools.product(*map(range, counts)))
    for p in cells:
        s_lo, s_hi = footprint(s, p)
        for q in cells:
            a_lo, a_hi = footprint(a, q)
            if p != q and s_lo < a_hi and a_lo < s_hi:
                return True
    return False


def grid_range(base: int, strides: tuple[int, ...], width: int, counts: tuple[int, ...]) -> Range:
    corners = [
        base + sum(s * c for s, c in zip(strides, cell, strict=True))
        for cell in itertools.product(*((0, n - 1) for n in counts))
    ]
    return Range(min(corners), max(corners) + width, base, strides[0], width, tuple(strides[1:]))


strides = st.sampled_from([0, 4, 8, -4, 12, 16, 36, 40])


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 6), st.integers(1, 6), strides, strides, st.integers(-48, 48),
    st.sampled_from([4, 8]), st.sampled_from([4, 8, 16]), st.booleans(),
)  # fmt: skip
def test_2d_conflict_test_is_exact_for_equal_strides(trip, trip2, so, si, d, ws, wa, same) -> None:
    s = grid_range(1000, (so, si), ws, (trip, trip2))
    a = grid_range(1000 - d, (so, si) if same else (si, so), wa, (trip, trip2))
    found = bool(_conflict_grid(s, a, (trip, trip2)))
    truth = brute_force(s, a, trip, trip2)
    if (s.stride, s.nest_strides) == (a.stride, a.nest_strides):
        assert found == truth
    else:
        assert found or not truth  # conservative: never misses a conflict


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 9), strides, st.integers(-48, 48), st.sampled_from([1, 4, 8]), st.sampled_from([1, 4, 16])
)
def test_1d_conflict_test_is_exact_for_equal_strides(trip, stride, d, ws, wa) -> None:
    from tensorwasm.runtime.guards import _conflict

    s = grid_range(1000, (stride,), ws, (trip,))
    a = grid_range(1000 - d, (stride,), wa, (trip,))
    assert bool(_conflict(s, a, trip)) == brute_force(s, a, trip)


@settings(max_examples=400, deadline=None)
@given(
    st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 5)),
    st.tuples(strides, strides, strides), st.integers(-64, 64),
    st.sampled_from([4, 8]), st.sampled_from([4, 8, 16]),
)  # fmt: skip
def test_3d_conflict_test_is_exact_for_equal_strides(counts, steps, d, ws, wa) -> None:
    s = grid_range(1000, steps, ws, counts)
    a = grid_range(1000 - d, steps, wa, counts)
    assert bool(_conflict_grid(s, a, counts)) == brute_force(s, a, *counts)


def test_3d_conflict_test_gives_up_safely_past_its_budget(monkeypatch) -> None:
    import tensorwasm.runtime.guards as guards

    # A store against itself whose cells tile memory without overlapping: "no conflict",
    # found by search; with no search budget left, the answer is "may" (never a wrong "no").
    counts, steps = (50, 50, 5), (1000, 20, 4)
    s = grid_range(0, steps, 4, counts)
    assert not _conflict_grid(s, s, counts)
    monkeypatch.setattr(guards, "SEARCH_BUDGET", 0)
    assert _conflict_grid(s, s, counts)


def test_what_a_plan_keeps_for_its_guards_is_what_each_arrival_would_make() -> None:
    """The pairs the guards test and the nest's shape (the counters each inner loop's bounds
    move with, floors among them, whether the nest is triangular) are made once per plan:
    on every loop the compiler's test programs offload, they are what the per-arrival
    definitions give (collapsed nests, privatised temporaries and triangular nests among
    them)."""
    from pathlib import Path

    from tensorwasm.compiler.analysis.extent import quasi
    from tensorwasm.compiler.analysis.loops import analyze_module
    from tensorwasm.compiler.frontend import load, translate_module
    from tensorwasm.runtime.guards import _nest_shape, _pairs

    seen = {"collapsed": 0, "private": 0, "triangular": 0}
    twins = {"accesses": 0}
    data = Path(__file__).parents[1] / "compiler" / "data"
    for path in sorted(data.glob("*.wasm")):
        for report in analyze_module(translate_module(load(path.read_bytes()))):
            plan = report.plan
            if plan is None:
                continue
            free = set(plan.static_dependence_free) if not plan.collapse else set()
            free |= {(i, j) for copy in plan.private for i in copy.accesses for j in copy.accesses}
            n = len(plan.accesses)
            same = [  # each access's first twin: the same kind, width and affine address
                next(
                    j for j in range(k + 1)
                    if a.address is not None and (b := plan.accesses[j]).address == a.address
                    and (b.store, b.width, b.offset, b.beyond) == (a.store, a.width, a.offset, a.beyond)
                ) if a.address is not None else k
                for k, a in enumerate(plan.accesses)
            ]  # fmt: skip
            pairs = [(same[i], same[j]) for i in range(n) if plan.accesses[i].store for j in range(n)
                     if (i, j) not in free]  # fmt: skip
            assert _pairs(plan) == list(dict.fromkeys(pairs)), path.name
            twins["accesses"] += n - len(set(same))
            counts = {plan.counter: 1}
            moves, triangular = _nest_shape(plan)
            for (counter, trip), (moving, floors) in zip(plan.inner_trips, moves, strict=True):
                assert moving == [c for c in counts if c in trip.start.leaves() | trip.bound.leaves()]
                assert floors == (quasi(trip.start, counts.keys()) or quasi(trip.bound, counts.keys()))
                counts[counter] = 1
            assert triangular == any(
                (t.start.leaves() | t.bound.leaves()) & counts.keys() for _, t in plan.inner_trips
            )
            seen["collapsed"] += bool(plan.collapse)
            seen["private"] += bool(plan.private)
            seen["triangular"] += triangular
    assert all(seen.values()), seen
    assert twins["accesses"] > 0  # (accesses whose twin's range and pairs stand for theirs)


# row(a, v, n): a[2j] = a[2j + 1] = the f64 at v, for j < n: an unrolled loop's two loads of
# one element, each before a store.
ROW = """(module (memory (export "memory") 1)
  (func (export "row") (param $a i32) (param $v i32) (param $n i32) (local $j i32)
    (loop $l
      (f64.store (i32.add (local.get $a) (i32.shl (local.get $j) (i32.const 4))) (f64.load (local.get $v)))
      (f64.store (i32.add (i32.add (local.get $a) (i32.shl (local.get $j) (i32.const 4))) (i32.const 8))
                 (f64.load (local.get $v)))
      (local.set $j (i32.add (local.get $j) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $j) (local.get $n))))))"""


def test_twin_loads_are_tested_once_and_still_against_every_store() -> None:
    """The two loads of ``v`` are twins: one range, one set of pairs. Where ``v`` lies among
    the stores' bytes the guards still decline, and memory ends as wasmtime leaves it."""


    from tensorwasm.compiler.analysis.loops import analyze_module
    from tensorwasm.compiler.frontend import load, translate_module
    from tensorwasm.runtime.guards import _pairs, _twins
    from tests.conftest import wat

    wasm = wat(ROW)
    (plan,) = [r.plan for r in analyze_module(translate_module(load(wasm))) if r.plan is not None]
    loads = [k for k, a in enumerate(plan.accesses) if not a.store]
    assert len(loads) == 2 and _twins(plan)[loads[1]] == loads[0]
    assert all(j != loads[1] for _, j in _pairs(plan))
    for v, launched in ((4096, 1), (1024 + 8 * 37, 0)):  # apart from a[0:128), then inside it
        loop = _rows_as_wasmtime(wasm, [(1024, v, 64)], 512)
        assert loop.offloaded == launched, loop.declined


def test_loads_of_other_bytes_are_not_twins() -> None:
    """The second load reads ``w``, not ``v``: where only ``w`` lies among the stores' bytes,
    the guards decline (they would not, were it taken for the first load's twin)."""
    import wasmtime

    import tensorwasm
    from tensorwasm.compiler.analysis.loops import analyze_module
    from tensorwasm.compiler.frontend import load, translate_module
    from tensorwasm.runtime.guards import _twins
    from tests.conftest import wat

    text = ROW.replace("(param $n i32)", "(param $n i32) (param $w i32)").replace(
        "(i32.const 8))\n                 (f64.load (local.get $v))", "(i32.const 8))\n                 (f64.load (local.get $w))"
    )
    assert "(local.get $w)" in text
    wasm = wat(text)
    (plan,) = [r.plan for r in analyze_module(translate_module(load(wasm))) if r.plan is not None]
    assert _twins(plan) == list(range(len(plan.accesses)))
    store = wasmtime.Store()
    instance = tensorwasm.instantiate(store, wasm, [], device="cpu", offload="always")
    instance.exports(store)["row"](store, 1024, 4096, 64, 1024 + 8 * 37)
    (loop,) = tensorwasm.report(instance).loops
    assert loop.offloaded == 0 and any("overlap" in reason for reason in loop.declined), loop.declined


def test_a_triangular_range_leaves_out_loops_its_address_does_not_move_with():
    """nussinov's ``seq[j]`` in ``i { j > i { k: ... } }``: the ``k`` loop's start is a floor
    of ``j`` (clang's unrolled loop), which no exact extent models, yet ``seq[j]`` does not
    move with ``k``: its range is the triangle's, not the box's (which reaches 2,500 bytes
    past ``seq``, into the next array, and declined every launch)."""
    from tensorwasm.compiler.analysis.extent import extent
    from tensorwasm.compiler.analysis.plan import TripCount
    from tensorwasm.compiler.analysis.poly import Poly, Symbol

    i, j, k = (Poly.symbol(Symbol("counter", n, f"k{n}")) for n in (1, 2, 3))
    (si,), (sj,), (sk,) = i.symbols(), j.symbols(), k.symbols()
    n = 2500
    row = TripCount(True, "slt", Poly.const(0), 1, Poly.const(n), 32)
    cells = TripCount(True, "slt", Poly.const(0), 1, i - Poly.const(0), 32)  # j < i: a triangle
    floor = Poly.symbol(Symbol.floor(j, 2))
    inner = TripCount(True, "slt", floor, 1, j, 32)
    address = Poly.symbol(Symbol("value", "seq", "seq")) + j
    env = {s: 1000 for s in address.symbols() if s.kind == "value"}
    counts = {si: n, sj: n - 1, sk: n}
    assert extent(address, [(si, row), (sj, cells), (sk, inner)], env, counts) == (1000, 1000 + n - 2)
    assert extent(address + k, [(si, row), (sj, cells), (sk, inner)], env, counts) is None


def _row_plan(text: str = ROW):
    from tensorwasm.compiler.analysis.loops import analyze_module
    from tensorwasm.compiler.frontend import load, translate_module
    from tests.conftest import wat

    (plan,) = [r.plan for r in analyze_module(translate_module(load(wat(text)))) if r.plan is not None]
    return plan


@settings(max_examples=300, deadline=None)
@given(
    a=st.integers(0, 70_000), v=st.integers(0, 70_000), strict=st.booleans(),
    start=st.sampled_from([(1024, 4096), (0, 2048), (60_000, 2052)]),
)  # fmt: skip
def test_a_launch_moved_by_its_pointers_is_the_one_the_guards_would_make(a, v, strict, start) -> None:
    """ROW's ``a`` and ``v`` only move addresses: from a launch the guards allowed, the launch
    for other values of them (:func:`runtime.guards.moved`) is the one :func:`check` makes,
    or fails with its message (outside memory, misaligned, ``v`` among the stores)."""
    from tensorwasm.runtime.guards import GuardFailed, address_only, check, moved

    plan = _row_plan()
    by_local = {int(sym.name.removeprefix("local")): sym for _, sym, _, _ in plan.live_ins}
    assert address_only(plan) == {by_local[0], by_local[1]}  # (not n: the trip count)
    size = 65536

    def env(pa, pv):
        return {by_local[0]: pa, by_local[1]: pv, by_local[2]: 64}

    try:
        before = check(plan, env(*start), size, strict_alignment=strict)
    except GuardFailed:  # (a misaligned start on a GPU: no launch to move)
        assume(strict and start[1] % 8)
        return
    try:
        want = check(plan, env(a, v), size, strict_alignment=strict)
    except GuardFailed as exc:
        want = str(exc)
    try:
        got = moved(plan, env(a, v), size, before, strict_alignment=strict)
    except GuardFailed as exc:
        got = str(exc)
    if got is None:  # a misaligned start: whether a moved range is aligned is not known
        assert not all(r.aligned for r in before.ranges)
        return
    assert got == want


def test_a_value_under_a_product_does_not_count_as_moving_addresses_alone() -> None:
    """``v * w`` in an address: a new ``v`` does not move the range by a constant, so
    neither ``v`` nor ``w`` is taken to only move it; ``a`` still is."""
    from tensorwasm.runtime.guards import address_only

    text = ROW.replace("(param $n i32)", "(param $n i32) (param $w i32)").replace(
        "(f64.load (local.get $v))", "(f64.load (i32.mul (local.get $v) (local.get $w)))", 1
    )
    assert "i32.mul (local.get $v)" in text
    plan = _row_plan(text)
    by_local = {int(sym.name.removeprefix("local")): sym for _, sym, _, _ in plan.live_ins}
    assert address_only(plan) == {by_local[0]}


def test_arrivals_whose_pointers_move_take_the_last_launch_moved(monkeypatch) -> None:
    """ROW called with ``v`` one element further at each call (a time step's element) and
    ``a`` a row further: the guards check the first arrival and move its launch for the
    others; an arrival whose ``v`` lies among the stores still declines. Memory ends as
    wasmtime leaves it."""


    from tensorwasm.runtime import guards
    from tests.conftest import wat

    checked = []
    check = guards.check

    def counted(*args, **kwargs):
        checked.append(1)
        return check(*args, **kwargs)

    monkeypatch.setattr(guards, "check", counted)
    wasm = wat(ROW)
    calls = [(1024 + 1024 * k, 8 + 8 * k, 64) for k in range(12)] + [(1024, 1024 + 8 * 5, 64)]
    loop = _rows_as_wasmtime(wasm, calls, 8192)
    assert loop.offloaded == 12 and any("overlap" in reason for reason in loop.declined), loop.declined
    assert len(checked) == 1  # the first arrival's (the last one's overlap is found by moving too)


def _rows_as_wasmtime(wasm: bytes, calls: list[tuple[int, int, int]], doubles: int):
    """ROW's ``row`` called with each of ``calls`` on memory holding ``0.0, 1.0, ...`` (its
    first ``doubles``), offloaded on the host backend and on plain wasmtime: memory ends the
    same. The offloaded loop's report."""
    import struct

    import wasmtime

    import tensorwasm

    memories, loop = [], None
    for offload in (True, False):
        store = wasmtime.Store()
        if offload:
            instance = tensorwasm.instantiate(store, wasm, [], device="cpu", offload="always")
        else:
            instance = wasmtime.Instance(store, wasmtime.Module(store.engine, wasm), [])
        memory = instance.exports(store)["memory"]
        memory.write(store, struct.pack(f"<{doubles}d", *range(doubles)), 0)
        for args in calls:
            instance.exports(store)["row"](store, *args)
        memories.append(memory.read(store, 0, 65536))
        if offload:
            (loop,) = tensorwasm.report(instance).loops
    assert memories[0] == memories[1]
    return loop
