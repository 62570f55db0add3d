"""Loops over the columns of row-major matrices (tests/compiler/data/columns.c): iteration
``j`` touches column ``j`` only, one element per row, so the columns of different
iterations interleave in memory without sharing an element. The guards compare the
per-iteration footprints element by element (runtime/guards.py), not the byte ranges that
hold them: PolyBench's gramschmidt's ``j`` loop launches, with wasmtime's results bit for bit,
while columns that two iterations really share are refused."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.dialect.types import I32
from tensorwasm.runtime import guards
from tensorwasm.runtime.guards import GuardFailed, Range, check
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler import test_schedule as schedule
from tests.compiler.test_loop_kernels import assemble, plans_ptx

DATA = (Path(__file__).parent / "data" / "columns.wasm").read_bytes()
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
M, N = 40, 24  # rows, columns (columns.c)


def update_plan():
    """update's column loop: its plan, and its live-ins by local index: clang's loop reads
    k (local 0), &a[0][k] (local 4) and &q[0][k] (local 5)."""
    (report,) = [
        r
        for r in analyze_module(translate_module(load(DATA)))
        if r.func.name == "update" and r.loop.depth == 1
    ]
    plan = report.plan
    assert plan is not None and plan.inner_trips  # both i loops run inside each thread
    param = {index: sym for _, sym, kind, index in plan.live_ins if kind == "local"}
    return plan, param


def loop_stats(instance, func: str, depth: int) -> list:
    return [
        lp.stats for lp in instance.offload.loops if lp.plan.func.name == func and lp.plan.loop.depth == depth
    ]


def address(instance: ReferenceInstance, which: int) -> int:
    """The address of A (0) or Q (1)."""
    return instance.call("addr", [(I32, which)]).values[0][1]


@pytest.mark.parametrize("device", DEVICES)
def test_gramschmidt_column_loop_launches_and_matches_wasmtime(device):
    instance = schedule.run(device, [("init", []), ("gramschmidt", []), ("gramschmidt", [])], DATA)
    loops = [lp for lp in instance.offload.loops if lp.plan.func.name == "gramschmidt"]
    if device != "cpu":  # its k loop steps instead, one launch a call (tests/compiler/test_stepped.py)
        (k,) = [lp.stats for lp in loops if lp.plan.stepped]
        assert k.offloaded == 2 == k.arrivals and not k.declined
        return
    (column,) = [lp.stats for lp in loops if lp.plan.inner_trips]
    # Every arrival of the j loop launches (that of k = N - 1, with no column left, as none).
    assert column.offloaded == 2 * N - 2 == column.arrivals and not column.declined


@pytest.mark.parametrize("device", DEVICES)
def test_column_update_through_pointers_launches_where_columns_are_apart(device):
    reference = ReferenceInstance(DATA)
    a, q = address(reference, 0), address(reference, 1)
    calls = [("init", []), *((("update", [(I32, k), (I32, a), (I32, q)])) for k in range(0, N - 1, 3))]
    instance = schedule.run(device, calls, DATA)
    (stats,) = loop_stats(instance, "update", 1)
    assert stats.offloaded == len(calls) - 1 and not stats.declined


@pytest.mark.parametrize("device", DEVICES)
def test_column_update_that_reads_a_column_another_iteration_writes_declines(device):
    """q one element past a: q's column k is a's column k + 1, which iteration j = k + 1
    writes while every other iteration reads it."""
    reference = ReferenceInstance(DATA)
    a = address(reference, 0)
    instance = schedule.run(device, [("init", []), ("update", [(I32, 2), (I32, a), (I32, a + 8)])], DATA)
    (stats,) = loop_stats(instance, "update", 1)
    assert stats.offloaded == 0 and any("may overlap" in reason for reason in stats.declined)


@pytest.mark.parametrize(
    ("shift", "shared"),
    [
        (4 * M * N * 8, False),  # q far past a
        (0, False),  # q == a: column k is read by every iteration, and none writes it
        (8 * N, False),  # q[i][k] is a[i + 1][k]: rows apart, still column k
        (-8, False),  # a[i][k - 1]: left of every column written
        (8 * N - 8 * 3, True),  # a[i + 1][k - 3] is a[i][k + 21]: column 23, written by j = 23
        (8, True),  # q[i][k] is a[i][k + 1], which iteration j = k + 1 writes
        (8 * N + 8, True),  # a[i + 1][k + 1]
        (8 * N + 8 * 5, True),  # a[i + 1][k + 5]
        (4, True),  # half an element: meets a[i][k] and a[i][k + 1]
    ],
)
def test_the_guard_compares_columns_element_by_element(shift, shared):
    """The whole byte ranges of any two iterations' columns interleave; only an element both
    touch in different iterations refuses the launch."""
    plan, param = update_plan()
    a, k = 1 << 16, 2
    env = {param[0]: k, param[4]: a + 8 * k, param[5]: a + shift + 8 * k}
    if shared:
        with pytest.raises(GuardFailed, match="may overlap"):
            check(plan, env, 1 << 20, strict_alignment=False)
    else:
        assert check(plan, env, 1 << 20, strict_alignment=False).trip == N - 1 - k


def test_a_column_past_the_loops_reach_is_not_shared():
    """q's column k + 1 + (N - 1 - k) lies past the last column the loop writes, in the next
    row: no iteration writes it; one column earlier, the last iteration does."""
    plan, param = update_plan()
    a, k = 1 << 16, 4
    env = {param[0]: k, param[4]: a + 8 * k, param[5]: a + 8 * (N - k) + 8 * k}
    assert check(plan, env, 1 << 20, strict_alignment=False).trip == N - 1 - k
    env[param[5]] -= 8
    with pytest.raises(GuardFailed, match="may overlap"):
        check(plan, env, 1 << 20, strict_alignment=False)


def test_column_loop_kernels_assemble_for_sm_90(ptxas: str, tmp_path: Path) -> None:
    module = translate_module(load(DATA))
    plans = [
        r.plan
        for r in analyze_module(module)
        if r.plan is not None and r.func.name in ("gramschmidt", "update") and r.plan.inner_trips
        and not r.plan.stepped
    ]
    assert len(plans) == 2
    assemble(ptxas, plans_ptx(module, plans, "sm_90"), "sm_90", tmp_path)


def _footprint(rng: random.Random, outer: list[int]) -> Range:
    """A random affine footprint: its stride along each launched loop (``outer``: the
    launched loop, then a collapsed one), up to two inner loops, a width."""
    origin, element = rng.randrange(0, 64), rng.choice([1, 2, 4, 8])
    strides = [rng.choice([0, 1, 4, 8, -8, 24]) for _ in outer]
    lattice = tuple(
        (rng.choice([8, 16, 40, 96, -40]), rng.randrange(1, 6)) for _ in range(rng.randrange(0, 3))
    )
    lattice = tuple((st, n) for st, n in lattice if n > 1)
    spans = [st * (n - 1) for st, n in zip(strides, outer, strict=True)] + [st * (n - 1) for st, n in lattice]
    inner = [st * (n - 1) for st, n in lattice]
    lo = origin + sum(min(0, sp) for sp in spans)
    hi = origin + sum(max(0, sp) for sp in spans) + element
    base = origin + sum(min(0, sp) for sp in inner)
    width = sum(abs(sp) for sp in inner) + element
    return Range(lo, hi, base, strides[0], width, tuple(strides[1:]), True, origin, element, lattice)


def _bytes(r: Range, cell: tuple[int, ...]) -> set[int]:
    steps = [range(n) for _, n in r.lattice]
    out = set()
    for inner in itertools.product(*steps):
        at = (
            r.origin
            + r.stride * cell[0]
            + sum(st * c for st, c in zip(r.nest_strides, cell[1:], strict=True))
        )
        at += sum(st * i for (st, _), i in zip(r.lattice, inner, strict=True))
        out.update(range(at, at + r.element))
    return out


@pytest.mark.parametrize("dims", [1, 2])
def test_element_comparison_never_misses_a_shared_byte(dims):
    """Against every pair of cells, byte by byte, on random footprints: where a store and
    an access share a byte in two different cells, the guard says so."""
    rng = random.Random(19 + dims)
    apart = 0
    for _ in range(600):
        counts = tuple(rng.randrange(1, 5) for _ in range(dims))
        s, a = _footprint(rng, list(counts)), _footprint(rng, list(counts))
        cells = list(itertools.product(*(range(n) for n in counts)))
        shared = any(_bytes(s, c) & _bytes(a, d) for c in cells for d in cells if c != d)
        said = bool(guards._conflict(s, a, counts[0]) if dims == 1 else guards._conflict_grid(s, a, counts))
        assert said or not shared, (s, a, counts)
        apart += not said
    assert apart > 100  # and it does prove footprints apart, interleaved ones included


def test_a_pair_whose_elements_met_is_not_searched_again_and_again(monkeypatch):
    """Where a pair's element search found its footprints meeting ELEMENT_SEARCHES times,
    later arrivals take the byte ranges' answer without searching (a loop whose accesses
    really meet would search at every arrival); byte ranges apart still pass."""
    from tensorwasm.runtime import guards

    searched = []
    real = guards._elements_meet
    monkeypatch.setattr(guards, "_elements_meet", lambda *args: searched.append(1) or real(*args))
    plan, param = update_plan()
    a, k = 1 << 16, 2
    env = {param[0]: k, param[4]: a + 8 * k, param[5]: a + 8 + 8 * k}  # q's column is k + 1's
    per_arrival = []
    for _ in range(3 * guards.ELEMENT_SEARCHES):
        before = len(searched)
        with pytest.raises(GuardFailed, match="may overlap"):
            check(plan, env, 1 << 20, strict_alignment=False)
        per_arrival.append(len(searched) - before)
    first, later = per_arrival[: guards.ELEMENT_SEARCHES], per_arrival[guards.ELEMENT_SEARCHES :]
    # The pair that meets is searched ELEMENT_SEARCHES times, then no more; the pairs before
    # it, whose elements are apart, only at the first arrival (their search is remembered).
    assert first[0] > 1 and first[1:] == [1] * (guards.ELEMENT_SEARCHES - 1) and set(later) == {0}
    env[param[5]] = a + 4 * M * N * 8 + 8 * k  # far past a: never near
    assert check(plan, env, 1 << 20, strict_alignment=False).trip == N - 1 - k


def test_footprints_found_apart_are_remembered_for_as_many_iterations_or_fewer(monkeypatch):
    """The element search's answer, remembered for the counts it searched (``apart``), is
    the search's own for every later count: fewer iterations are apart as well, more are
    searched again. Random footprints, counts in random order, against searching afresh."""
    rng = random.Random(23)
    searches = []
    real = guards._elements_meet
    monkeypatch.setattr(guards, "_elements_meet", lambda *args: searches.append(1) or real(*args))
    remembered = 0
    for _ in range(300):
        dims = rng.choice([1, 2])
        most = [rng.randrange(2, 6) for _ in range(dims)]
        s, a = _footprint(rng, most), _footprint(rng, most)
        apart: dict = {}
        for _ in range(6):
            counts = [rng.randrange(1, n + 1) for n in most]
            outer = [(s.stride, a.stride, counts[0])]
            outer += list(zip(s.nest_strides, a.nest_strides, counts[1:], strict=True))
            before = len(searches)
            said = guards._by_elements(s, a, outer, True, apart)
            remembered += len(searches) == before
            assert bool(said) == real(s, a, outer), (s, a, outer)
    assert remembered > 200  # the table does spare searches

