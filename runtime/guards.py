"""Runtime guards: the checks the analysis left for concrete values, made before a launch.

Given the live-in values of one arrival at a loop, :func:`check` computes the trip count
(refusing loops whose counter would wrap or never reach its bound), the byte range every
access touches over the whole iteration space (refusing any outside linear memory), and
tests every store against every other access: same stride -> the exact cross-iteration
overlap test on per-iteration footprints; otherwise the whole ranges must be disjoint.
A footprint is first taken as the bytes between its least and its greatest address; where
that meets another iteration's, it is taken element by element (a lattice: one element per
value of the inner counters), which settles a column of a row-major matrix per iteration
(PolyBench's gramschmidt): the columns interleave, but no two iterations share an element.
Anything refused runs as the original loop on the CPU.
"""

from __future__ import annotations

import itertools
import math

from tensorwasm.compiler.analysis.extent import box_range, extent, nest_range, quasi
from tensorwasm.compiler.analysis.plan import Access, LoopPlan, TripCount, proven_alignment
from tensorwasm.compiler.analysis.poly import Poly, Symbol
from tensorwasm.support.records import record

MAX_TRIP = (1 << 31) - 1


class GuardFailed(Exception):
    """A guard refused the launch; the message says which."""


class Range:
    """The bytes one access touches over a launch, and its footprint per iteration (a plain
    class with slots: a launch's guards make one per access, at every arrival whose
    live-ins are new)."""

    __slots__ = ("aligned", "base", "element", "hi", "lattice", "lo", "nest_strides", "origin", "stride", "width")

    def __init__(
        self,
        lo: int,  # first byte
        hi: int,  # one past the last byte
        base: int,  # at counter 0 of the launched loop, with inner counters at their minimum
        stride: int,  # per iteration of the launched loop
        width: int,  # bytes touched per iteration of the launched loop (per grid cell of a nest)
        nest_strides: tuple[int, ...] = (),  # per iteration of each collapsed inner loop
        aligned: bool = True,  # every address a multiple of the width, on every iteration
        # The footprint of one iteration element by element: the address at every counter 0,
        # the access's width, and (stride, count) per inner loop that moves it. No element
        # width (a quasi-affine address): the footprint is only the bytes from base to width.
        origin: int = 0,
        element: int = 0,
        lattice: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.lo, self.hi, self.base, self.stride, self.width = lo, hi, base, stride, width
        self.nest_strides, self.aligned = nest_strides, aligned
        self.origin, self.element, self.lattice = origin, element, lattice

    def _fields(self) -> tuple:
        return tuple(getattr(self, name) for name in _RANGE_FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Range:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # (mutable: the guards tighten a triangular nest's)

    def __repr__(self) -> str:
        return "Range(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in _RANGE_FIELDS) + ")"


_RANGE_FIELDS = ("lo", "hi", "base", "stride", "width", "nest_strides", "aligned", "origin", "element", "lattice")


@record
class Launch:
    trip: int
    env: dict[Symbol, int]
    reads: list[Range]
    writes: list[Range]
    gathers: bool = False  # loads at unknown addresses: the device needs all of memory
    nest: tuple[int, ...] = ()  # the collapsed inner loops' trip counts (the grid's further dimensions)
    inner: dict[Symbol, int] | None = None  # every inner loop's trip count
    rows: bool = False  # a distributed body: one block per iteration (compiler.distribute)
    lanes: int = 0  # then the most grid iterations of a phase in one (0: not known)
    # A split sequential loop (compiler.analysis.fission): the phases one after the other,
    # the whole grid waiting between them; at most ``lanes`` threads have work in one.
    spread: bool = False
    ranges: tuple[Range | None, ...] = ()  # per access, in the plan's order (None: a gather)


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def trip_count(trip: TripCount, env: dict[Symbol, int]) -> int:
    bits, step, pred = trip.bits, trip.step, trip.pred
    mod = 1 << bits
    start = trip.start.evaluate(env)
    bound = trip.bound.evaluate(env)
    if pred in ("ne", "eq"):
        if pred == "eq":
            exit_k = 0 if (start - bound) % mod else 1
        else:
            distance = (bound - start) % mod if step > 0 else (start - bound) % mod
            if distance % abs(step):
                raise GuardFailed("the counter steps over its bound")
            exit_k = distance // abs(step)
    else:
        signed = pred.startswith("s")
        s = _signed(start, bits) if signed else start % mod
        b = _signed(bound, bits) if signed else bound % mod
        lo, hi = (-(mod >> 1), (mod >> 1) - 1) if signed else (0, mod - 1)
        kind = pred[1:]
        if kind in ("lt", "le") and step > 0:
            past = b if kind == "lt" else b + 1
            exit_k = max(0, -((s - past) // step))
        elif kind in ("gt", "ge") and step < 0:
            past = b if kind == "gt" else b - 1
            exit_k = max(0, -((past - s) // -step))
        else:
            raise GuardFailed("the counter moves away from its bound")
        last = s + step * exit_k
        if not (lo <= last <= hi):
            raise GuardFailed("the counter would wrap around")
    count = exit_k if trip.top else exit_k + 1
    if count > MAX_TRIP:
        raise GuardFailed(f"trip count {count} is too large")
    return count


def check(plan: LoopPlan, env: dict[Symbol, int], memory_size: int, *, strict_alignment: bool) -> Launch:
    """The launch of ``plan`` for live-ins ``env``, or GuardFailed saying why not.

    The kernel accesses memory at affine addresses without testing them (see the ``proven``
    mark in :mod:`compiler.outline`): passing here means every such access, on every
    iteration, lies inside linear memory with a non-negative i32 operand (as Wasm computes
    it, without wrapping), and with ``strict_alignment`` (a GPU) is aligned to its width."""
    trip = trip_count(plan.trip, env)
    if trip == 0:
        return Launch(0, env, [], [])  # the body never runs: nothing is touched
    inner: dict[Symbol, int] = {}
    counts = {plan.counter: trip}
    moves, triangular = _nest_shape(plan)
    for (counter, inner_trip), (moving, floors) in zip(plan.inner_trips, moves, strict=True):  # outer loops first
        inner[counter] = counts[counter] = _most_trips(inner_trip, env, counts, moving, floors)
    nest = tuple(inner[level.counter] for level in plan.collapse)
    if 0 in nest:
        raise GuardFailed("a collapsed inner loop runs no iteration")
    ranges: list[Range | None] = []  # per access (None: a gather, checked by the kernel itself)
    levels = {level.counter: i for i, level in enumerate(plan.collapse)}
    twins = _twins(plan)
    for k, (access, split) in enumerate(zip(plan.accesses, _split_addresses(plan), strict=True)):
        if split is None:
            ranges.append(None)
            continue
        if twins[k] != k:  # the same bytes as an earlier access (an unrolled loop's loads)
            ranges.append(ranges[twins[k]])
            continue
        if split is QUASI:
            rng = _quasi_range(access, plan, env, counts)
        else:
            rng = _range(
                split, plan, env, counts, levels, access.width, access.beyond, proven_alignment(access.width)
            )
        if triangular and not access.beyond:  # the nest's own range, tighter than the box's
            tight = extent(access.address, [(plan.counter, plan.trip), *plan.inner_trips], env, counts)
            if tight is not None:
                rng.lo, rng.hi = max(rng.lo, tight[0]), min(rng.hi, tight[1] + access.width)
        _check_bounds(access, rng, memory_size, strict_alignment)
        ranges.append(rng)
    _test_pairs(plan, ranges, trip, nest)
    reads, writes = _by_kind(plan, ranges)
    if plan.fission:  # threads for the widest phase: the loop's iterations or a grid loop's
        # (a stepped loop's phase run whole is one thread's)
        whole = 1 if plan.stepped else trip
        lanes = max((whole if p.whole else inner.get(p.counter, 1 << 30) * _cells(p, inner) for p in plan.phases),
                    default=0)  # fmt: skip
        if plan.wave:  # a thread per iteration of the loop, running its tasks of each step
            lanes = trip
    else:
        lanes = max((inner.get(p.counter, 1 << 30) + p.rest for p in plan.phases), default=0)
    return Launch(
        trip, env, reads, writes, bool(plan.gathers), nest, inner, rows=bool(plan.phases) and not plan.fission,
        lanes=lanes, spread=plan.fission, ranges=tuple(ranges),
    )  # fmt: skip


def _by_kind(plan: LoopPlan, ranges: list[Range | None]) -> tuple[list[Range], list[Range]]:
    """The ranges of the loads and of the stores, in the plan's order (gathers left out)."""
    reads, writes = [], []
    for access, rng in zip(plan.accesses, ranges, strict=True):
        if rng is not None:
            (writes if access.store else reads).append(rng)
    return reads, writes


def _check_bounds(access: Access, rng: Range, memory_size: int, strict_alignment: bool) -> None:
    """GuardFailed where an access's range reaches outside linear memory (or below its
    offset: a negative i32 operand), or, with ``strict_alignment``, is not aligned."""
    if rng.lo < access.offset or rng.hi > memory_size:
        raise GuardFailed(f"{access.kind} at {access.where} reaches outside linear memory")
    if strict_alignment and not rng.aligned:
        raise GuardFailed(
            f"{access.kind} at {access.where} is not aligned to {proven_alignment(access.width)} bytes"
            " on every iteration"
        )


def _test_pairs(
    plan: LoopPlan, ranges: list[Range | None], trip: int, nest: tuple[int, ...], moves: list[int] | None = None
) -> None:
    """GuardFailed where a store may meet another access across iterations (grid cells), or,
    for a distributed body, within one. ``moves``: per access, how far its range moved from
    a launch these pairs all passed; then only the pairs whose two accesses moved apart are
    tested (the others kept their distance, every test's answer with it)."""
    if trip * math.prod(nest) > 1 or plan.fission:
        met = plan.__dict__.setdefault("_elements_met", {})  # pair -> element searches that met
        apart = plan.__dict__.setdefault("_elements_apart", {})  # see _by_elements
        grid = (trip, *nest)
        for pair in _pairs(plan):
            i, j = pair
            rs, ra = ranges[i], ranges[j]
            if ra is None or (moves is not None and moves[i] == moves[j]):
                continue
            exact = met.get(pair, 0) < ELEMENT_SEARCHES
            if plan.fission:  # a split loop's phases reorder its iterations: apart over the launch
                conflict = rs.lo < ra.hi and ra.lo < rs.hi
            elif nest:
                conflict = _conflict_grid(rs, ra, grid, exact, apart)
            else:
                conflict = _conflict(rs, ra, trip, exact, apart)
            if conflict:
                if conflict is ELEMENTS:
                    met[pair] = met.get(pair, 0) + 1
                s, a = plan.accesses[i], plan.accesses[j]
                raise GuardFailed(f"store at {s.where} may overlap {a.kind} at {a.where}")
    for i, j in plan.row_guarded:  # a distributed body's threads share one iteration
        if moves is not None and moves[i] == moves[j]:
            continue
        if _meets_in_row(ranges[i], ranges[j]):
            s, a = plan.accesses[i], plan.accesses[j]
            raise GuardFailed(f"store at {s.where} may meet {a.kind} at {a.where} within one iteration")


def address_only(plan: LoopPlan) -> frozenset[Symbol]:
    """The live-ins that only move the loop's accesses: in no trip count, in no coefficient
    of a counter, and in each address as a constant times the value alone, so that a new
    value of one moves each access's range as a whole (:func:`moved`). None for a nest
    whose inner bounds move with the counters around them, or with an address holding a
    floor of a counter: their ranges are not made that way."""
    return _address_terms(plan)[0]


def _address_terms(plan: LoopPlan) -> tuple[frozenset[Symbol], list[dict[Symbol, int] | None]]:
    """:func:`address_only`'s live-ins, and per access (None for a gather) the constant each
    of them is multiplied by in its address (made once per plan)."""
    cached = plan.__dict__.get("_address_terms")
    if cached is None:
        splits = _split_addresses(plan)
        if QUASI in splits or _nest_shape(plan)[1]:
            cached = plan.__dict__["_address_terms"] = (frozenset(), [])
            return cached
        polys = [plan.trip.start, plan.trip.bound]
        for _, trip in plan.inner_trips:
            polys += [trip.start, trip.bound]
        polys += [coeff for split in splits if split is not None for _, coeff in split[1]
                  if coeff.__class__ is not int]  # fmt: skip
        counters = {plan.counter, *(counter for counter, _ in plan.inner_trips)}
        free = inputs(plan) - counters - frozenset().union(*(poly.leaves() for poly in polys))
        terms: list[dict[Symbol, int] | None] = []
        for split in splits:
            if split is None:
                terms.append(None)
                continue
            linear = {}
            for monomial, coeff in split[0].terms.items():
                if len(monomial) == 1 and monomial[0] in free:
                    linear[monomial[0]] = coeff
                else:  # (a product, or a value under another operation: it does not move so)
                    free = free - frozenset().union(*(sym.leaves() for sym in monomial))
            terms.append(linear)
        terms = [t if t is None else {sym: c for sym, c in t.items() if sym in free} for t in terms]
        cached = plan.__dict__["_address_terms"] = (free, terms)
    return cached


def moved(plan: LoopPlan, env: dict[Symbol, int], memory_size: int, before: Launch, *,
          strict_alignment: bool) -> Launch | None:  # fmt: skip
    """:func:`check`'s launch for ``env`` from ``before``, its launch for other values of
    live-ins that only move addresses (:func:`address_only`; the same memory size): each
    access's range moves by what its address moves; bounds and alignment are tested again
    where a range moved, and the overlap tests only for pairs that moved apart. None where
    ``before`` is not such a launch (check decides then). A loop whose row pointer or
    time-step element moves at every arrival checks in microseconds (PolyBench's fdtd-2d)."""
    if not before.ranges and before.trip:
        return None
    free, terms = _address_terms(plan)
    changed = [(sym, env[sym] - value) for sym, value in before.env.items() if env[sym] != value]
    if any(sym not in free for sym, _ in changed):
        return None
    if not before.trip:
        return Launch(0, env, [], [])
    moves, ranges = [], []
    new: dict[int, Range] = {}  # (twins share their range)
    for access, linear, old in zip(plan.accesses, terms, before.ranges, strict=True):
        if old is None:
            moves.append(0)
            ranges.append(None)
            continue
        move = 0
        for sym, delta in changed:
            move += linear.get(sym, 0) * delta
        moves.append(move)
        rng = old if not move else new.get(id(old))
        if rng is None:
            align = proven_alignment(access.width)
            if move % align and not old.aligned:
                return None  # (misaligned before: by its counters' strides or its start, unknown)
            rng = new[id(old)] = Range(
                old.lo + move, old.hi + move, old.base + move, old.stride, old.width, old.nest_strides,
                old.aligned and move % align == 0, old.origin + move, old.element, old.lattice,
            )  # fmt: skip
            _check_bounds(access, rng, memory_size, strict_alignment)
        ranges.append(rng)
    _test_pairs(plan, ranges, before.trip, before.nest, moves)
    reads, writes = _by_kind(plan, ranges)
    return Launch(
        before.trip, env, reads, writes, before.gathers, before.nest, before.inner, rows=before.rows,
        lanes=before.lanes, spread=before.spread, ranges=tuple(ranges),
    )  # fmt: skip


def _cells(phase, inner: dict) -> int:
    """A row's cells in a phase run as cells (``Phase.inner``), else 1."""
    return 1 if phase.inner is None else inner.get(phase.inner.counter, 1 << 30)


def _pairs(plan: LoopPlan) -> list[tuple[int, int]]:
    """The (store, access) pairs the guards test, by index in ``plan.accesses``, made once
    per plan: every store against every access, less the pairs the analysis settled
    (independent across outer iterations only, so none in a collapsed nest, which tests
    every pair across grid cells) and those among a privatised temporary's accesses (they
    meet only in each thread's own copy); each pair as its accesses' first twins
    (:func:`_twins`), once."""
    cached = plan.__dict__.get("_guard_pairs")
    if cached is None:
        free = set(plan.static_dependence_free) if not plan.collapse else set()
        free |= {(i, j) for copy in plan.private for i in copy.accesses for j in copy.accesses}
        accesses = range(len(plan.accesses))
        twins = _twins(plan)
        pairs = ((twins[i], twins[j]) for i in accesses if plan.accesses[i].store for j in accesses
                 if (i, j) not in free)  # fmt: skip
        cached = list(dict.fromkeys(pairs))
        plan.__dict__["_guard_pairs"] = cached
    return cached


def _twins(plan: LoopPlan) -> list[int]:
    """Per access, the first access (by index) that touches the same bytes on every
    iteration: the same kind, width and affine address (clang unrolls a loop that loads
    one element into as many loads of it as the unrolled copies). Its range, bounds and
    pairs are the twin's, so they are made once. A gather is its own."""
    cached = plan.__dict__.get("_guard_twins")
    if cached is None:
        first: dict[tuple, int] = {}
        cached = []
        for k, a in enumerate(plan.accesses):
            key = (a.store, a.width, a.offset, a.beyond, a.address) if a.address is not None else k
            cached.append(first.setdefault(key, k))
        plan.__dict__["_guard_twins"] = cached
    return cached


def _nest_shape(plan: LoopPlan) -> tuple[list[tuple[list[Symbol], bool]], bool]:
    """What the nest's inner trip counts are made of, taken once per plan: per inner loop,
    the counters around it that its bounds move with and whether they hold a floor of one
    (see :func:`_most_trips`); and whether any does move (a triangular nest)."""
    cached = plan.__dict__.get("_nest_shape")
    if cached is None:
        around = [plan.counter]
        moves = []
        for counter, trip in plan.inner_trips:
            leaves = trip.start.leaves() | trip.bound.leaves()
            floors = quasi(trip.start, set(around)) or quasi(trip.bound, set(around))
            moves.append(([c for c in around if c in leaves], floors))
            around.append(counter)
        cached = plan.__dict__["_nest_shape"] = (moves, any(moving for moving, _ in moves))
    return cached


def _most_trips(trip: TripCount, env: dict[Symbol, int], counts: dict[Symbol, int],
                moving: list[Symbol] | None = None, floors: bool | None = None) -> int:  # fmt: skip
    """The most iterations an inner loop runs on any iteration of the loops around it. Its
    bounds are affine in their counters (the analysis made sure), so the most is at a corner
    of their box: each counter at 0 or at its last iteration. Ranges taken over that box
    hold every access of a triangular nest. ``moving`` and ``floors``: the counters of
    ``counts`` its bounds move with, and whether they hold a floor of one (made here where
    not given: :func:`_nest_shape` keeps them per plan)."""
    if moving is None:
        moving = [c for c in counts if c in trip.start.leaves() | trip.bound.leaves()]
    if floors is None:
        floors = quasi(trip.start, counts.keys()) or quasi(trip.bound, counts.keys())
    if floors:
        return _most_trips_quasi(trip, env, {c: counts[c] for c in moving})
    most = 0
    for corner in itertools.product(*((0, max(counts[c] - 1, 0)) for c in moving)):
        probe = {**env, **dict(zip(moving, corner, strict=True))}
        if moving:  # the analysis's model of such a nest holds where no bound wraps
            _check_unwrapped(trip, probe)
        most = max(most, trip_count(trip, probe))
    return most


def _check_unwrapped(trip: TripCount, env: dict[Symbol, int]) -> None:
    """The bounds of a triangular inner loop, at one corner, in the range of its compare (a
    "!=" test: its start on the side of its bound its step goes to), so that the integers
    the analysis reasoned on are the ones the loop computes."""
    start, bound = trip.start.evaluate(env), trip.bound.evaluate(env)
    half = 1 << (trip.bits - 1)
    lo, hi = (0, 2 * half) if trip.pred.startswith("u") else (-half, half)
    if not (lo <= start < hi and lo <= bound < hi) or (trip.pred == "ne" and (bound - start) * trip.step < 0):
        raise GuardFailed("an inner loop's bounds wrap around on some iteration of the loops around it")


def _most_trips_quasi(trip: TripCount, env: dict[Symbol, int], counts: dict[Symbol, int]) -> int:
    """:func:`_most_trips` for bounds holding floors of the counters (an unrolled loop's
    ``i & -4``, its remainder's ``i & 3``), which need not be extreme at the corners: the
    bounds' ranges over the box (``box_range``) in the range of the compare, and the most
    iterations from the largest distance the counter can go."""
    half = 1 << (trip.bits - 1)
    lo, hi = (0, 2 * half - 1) if trip.pred.startswith("u") else (-half, half - 1)
    for poly in (trip.start, trip.bound):
        least, most = box_range(poly, env, counts)
        if least < lo or most > hi:
            raise GuardFailed("an inner loop's bounds wrap around on some iteration of the loops around it")
    least, most = box_range(trip.bound - trip.start, env, counts)
    step = trip.step
    kind = trip.pred[1:] if trip.pred not in ("ne", "eq") else trip.pred
    if (kind in ("lt", "le") and step < 0) or (kind in ("gt", "ge") and step > 0) or kind == "eq":
        raise GuardFailed("the counter moves away from its bound")
    if kind == "ne" and (least if step > 0 else -most) < 0:
        raise GuardFailed("an inner loop's bounds wrap around on some iteration of the loops around it")
    # Every term that moves is a multiple of the step (the analysis made sure): the
    # distance at the box's first corner says whether it always is.
    if kind == "ne" and (trip.bound - trip.start).evaluate({**env, **dict.fromkeys(counts, 0)}) % step:
        raise GuardFailed("the counter steps over its bound")
    distance = (most if step > 0 else -least) + (kind in ("le", "ge"))
    count = max(0, -(-distance // abs(step))) + (not trip.top)
    if count > MAX_TRIP:
        raise GuardFailed(f"trip count {count} is too large")
    return count


def _quasi_range(access: Access, plan: LoopPlan, env: dict[Symbol, int], counts: dict[Symbol, int]) -> Range:
    """The bytes an access at a quasi-affine address (floors of the counters: an unrolled
    loop's remainder) touches: its stride along the launched loop, the least and the
    greatest of the rest over the nest (``nest_range``: each counter up to its exit value
    where the access comes after its loop), and the whole range, from the whole address;
    aligned when every term moves it by multiples of its width."""
    rest, stride_poly = access.address.split(plan.counter)
    stride = stride_poly.evaluate(env)
    box = {c: counts[c] + (c in access.beyond) for c in counts}
    low, high = nest_range(rest, plan.inner_trips, env, box)
    fixed, aligned, align = 0, True, proven_alignment(access.width)
    for monomial, coeff in access.address.terms.items():
        known = [s for s in monomial if not (s.leaves() & box.keys())]
        factor = coeff * Poly({tuple(known): 1}).evaluate(env)
        if len(known) == len(monomial):
            fixed += factor
        else:
            aligned = aligned and factor % align == 0
    aligned = aligned and fixed % align == 0
    # The whole range, taken on the whole address (a floor may undo the stride's drift),
    # and the footprint of one iteration, which the overlap tests slide by the stride.
    first, last = nest_range(access.address, plan.inner_trips, env, box)
    return Range(first, last + access.width, low, stride, high + access.width - low, aligned=aligned)


# What _split_addresses gives an address that holds a floor of a counter: its range is
# _quasi_range's, made without a split.
QUASI = "quasi"


def _split_addresses(plan: LoopPlan) -> list:
    """Per access: its address as (the part without counters, [(counter, coefficient)]: a
    coefficient that holds no live-in as its value), split once per plan rather than on
    every arrival; None for a gather, :data:`QUASI` for an address that holds a floor of a
    counter."""
    cached = plan.__dict__.get("_guard_splits")
    if cached is None:
        counters = [plan.counter, *(c for c, _ in plan.inner_trips)]
        cached = []
        for access in plan.accesses:
            if access.address is None:
                cached.append(None)
                continue
            if quasi(access.address, set(counters)):
                cached.append(QUASI)
                continue
            rest, coeffs = access.address, []
            for counter in counters:
                rest, coeff = rest.split(counter)
                coeffs.append((counter, coeff.constant if coeff.is_constant() else coeff))
            cached.append((rest, coeffs))
        plan.__dict__["_guard_splits"] = cached
    return cached


def _range(
    split,
    plan: LoopPlan,
    env,
    counts: dict[Symbol, int],
    levels: dict[Symbol, int],
    width: int,
    beyond: frozenset = frozenset(),
    align: int | None = None,
) -> Range:
    """The bytes one access touches over the iteration space: each counter from 0 to its
    last iteration, or to its exit value for an inner loop the access comes after; aligned
    when every address is a multiple of ``align`` (default: the width). ``levels``: the
    collapsed nest's counters, by level."""
    align = align or width
    rest, coeff_polys = split
    base = rest.evaluate(env)
    lo = hi = base
    inner_lo = inner_hi = base
    aligned = base % align == 0
    stride = 0
    nest_strides = [0] * len(levels)
    lattice = []
    for counter, poly in coeff_polys:
        coeff = poly if poly.__class__ is int else poly.evaluate(env)
        last = max(counts[counter] - 1, 0) + (counter in beyond)
        span = coeff * last
        aligned = aligned and (coeff % align == 0 or last == 0)
        lo += min(0, span)
        hi += max(0, span)
        if counter is plan.counter:
            stride = coeff
        elif counter in levels:
            nest_strides[levels[counter]] = coeff
        else:
            inner_lo += min(0, span)
            inner_hi += max(0, span)
            if span:
                lattice.append((coeff, last + 1))
    return Range(
        lo, hi + width, inner_lo, stride, inner_hi + width - inner_lo, tuple(nest_strides), aligned,
        base, width, tuple(lattice),
    )  # fmt: skip


# Differences between grid cells tried before a collapsed nest's overlap test gives up and
# answers "may overlap" (the launch then runs on the CPU).
SEARCH_BUDGET = 20_000
# Element-by-element searches of one pair of a loop that found its footprints meeting (or
# ran out of budget) before the pair's later arrivals take the byte ranges' answer, "may
# overlap", without searching: floyd-warshall's k loop, whose row and column really meet,
# searched at each of its 2800 arrivals for milliseconds (6 s of a 15 s kernel).
ELEMENT_SEARCHES = 4
# What the overlap tests answer where the byte ranges meet and the element search did too.
ELEMENTS = 2


def _conflict_grid(
    s: Range, a: Range, counts: tuple[int, ...], exact: bool = True, apart: dict | None = None
) -> bool | int:
    """May the store's footprint in one grid cell meet the access's in another cell?

    With equal strides the footprints of cells ``c`` and ``c'`` overlap iff
    ``-ws < d + sum(stride_i * (c_i - c'_i)) < wa``. Differences are tried along the
    dimensions of larger stride first, each only as far as what the smaller ones can add
    still reaches, and the last is solved exactly, in integers. Otherwise the whole ranges
    must be apart. Where footprints meet so, they are compared element by element (unless
    not ``exact``: then they may meet), :data:`ELEMENTS` where that found them meeting.
    """
    if s.lo >= a.hi or a.lo >= s.hi:
        return False  # never near each other
    strides = (s.stride, *s.nest_strides)
    outer = list(zip(strides, (a.stride, *a.nest_strides), counts, strict=True))
    if strides != (a.stride, *a.nest_strides):
        return _by_elements(s, a, outer, exact, apart)
    dims = sorted(zip(strides, counts, strict=True), key=lambda dim: -abs(dim[0]))
    budget = [SEARCH_BUDGET]
    return _meets(s.base - a.base, dims, s.width, a.width, False, budget) and _by_elements(
        s, a, outer, exact, apart
    )


# Footprints found apart element by element, kept per plan before the table starts again.
APART_KEPT = 4096


def _by_elements(
    s: Range, a: Range, outer: list[tuple[int, int, int]], exact: bool, apart: dict | None = None
) -> bool | int:
    """Footprints whose byte ranges meet: :data:`ELEMENTS` where their elements may meet too
    (:func:`_elements_meet`; without searching where not ``exact``), else False.

    ``apart`` remembers the searches that found them apart, by everything the answer
    depends on but the launched loops' counts, with those counts: fewer iterations search a
    part of the same space, so they are apart too. gramschmidt's column loop arrives 1,200
    times, each with one iteration fewer and the footprints' shape unchanged: one search."""
    if not exact:
        return True
    key = None
    if apart is not None:
        key = (s.origin - a.origin, s.element, a.element, s.lattice, a.lattice, tuple(o[:2] for o in outer))
        counts = apart.get(key)
        if counts is not None and all(n <= m for (_, _, n), m in zip(outer, counts, strict=True)):
            return False
    if _elements_meet(s, a, outer):
        return ELEMENTS
    if key is not None:
        if len(apart) >= APART_KEPT:
            apart.clear()
        apart[key] = tuple(n for _, _, n in outer)
    return False


def _elements_meet(s: Range, a: Range, outer: list[tuple[int, int, int]]) -> bool:
    """May an element the store writes in one iteration (grid cell) be one the access
    touches in another? Both footprints element by element: the address at every counter 0
    plus ``stride * counter`` for each loop, the launched ones (``outer``: the store's
    stride, the access's, the count) and the inner ones, each inner counter from 0 to its
    last value. Along a launched loop, the store's counter ``c`` and the access's ``c - d``
    (``d`` not zero along some launched loop) move the difference by ``(ss - sa)*c + sa*d``;
    ``c - d`` is not kept in range, and the inner counters of one stride are taken together,
    their ranges added: each widens what is searched, never narrows it, so the test stays
    sound. Without elements (a quasi-affine footprint) the caller's answer stands; with
    equal strides and no inner loop it was already exact."""
    if not (s.element and a.element):
        return True
    if not (s.lattice or a.lattice) and all(ss == sa for ss, sa, _ in outer):
        return True
    dims: list[tuple[int, int, int, bool]] = []  # (stride > 0, lo, hi, outer)
    free: dict[int, tuple[int, int]] = {}  # stride > 0 -> the range of its counters' sum

    def add(stride: int, lo: int, hi: int) -> None:
        if stride < 0:
            stride, lo, hi = -stride, -hi, -lo
        if stride:
            have = free.get(stride, (0, 0))
            free[stride] = (have[0] + lo, have[1] + hi)

    for ss, sa, n in outer:
        dims.append((abs(sa), -(n - 1), n - 1, True))  # d
        add(ss - sa, 0, n - 1)  # c
    for stride, n in s.lattice:
        add(stride, 0, n - 1)
    for stride, n in a.lattice:
        add(-stride, 0, n - 1)
    dims += [(stride, lo, hi, False) for stride, (lo, hi) in free.items()]
    dims.sort(key=lambda dim: -dim[0])
    return _in_window(s.origin - a.origin, dims, s.element, a.element, False, [SEARCH_BUDGET])


def _in_window(
    x: int, dims: list[tuple[int, int, int, bool]], ws: int, wa: int, moved: bool, budget: list[int]
) -> bool:
    """Is there ``t_i`` in ``[lo_i, hi_i]`` for each dimension ``(stride_i, lo_i, hi_i,
    outer_i)`` (strides not negative, largest first), not zero along every outer one
    unless ``moved``, with ``-ws < x + sum(stride_i * t_i) < wa``? True as well once
    ``budget`` runs out."""
    if not dims:
        return moved and -ws < x < wa
    (stride, lo, hi, outer), rest = dims[0], dims[1:]
    if stride == 0:  # only whether an outer difference is zero matters
        tries: list[int] | range = [0, 1] if outer and hi > 0 else [0]
    else:  # only as far as what the rest adds can still bring the sum into the window
        least = sum(st * tl for st, tl, _, _ in rest)
        most = sum(st * th for st, _, th, _ in rest)
        first = max((-ws - most - x) // stride + 1, lo)
        last = min(-((x + least - wa) // stride) - 1, hi)
        tries = range(first, last + 1)
    for t in tries:
        budget[0] -= 1
        if budget[0] < 0 or _in_window(x + stride * t, rest, ws, wa, moved or (outer and t != 0), budget):
            return True
    return False


def _meets(x: int, dims: list[tuple[int, int]], ws: int, wa: int, moved: bool, budget: list[int]) -> bool:
    """Is there a difference ``t`` (``|t_i| < n_i``, not all zero unless ``moved``) with
    ``-ws < x + sum(stride_i * t_i) < wa``? True as well once ``budget`` runs out."""
    (stride, n), rest = dims[0], dims[1:]
    if not rest:
        return _solvable(x, stride, n, ws, wa, moved)
    if stride == 0:
        tries: range = range(min(n, 2))  # only whether this difference is zero matters
    else:
        reach = sum(abs(st) * (nt - 1) for st, nt in rest)
        sx, sstride, sws, swa = (x, stride, ws, wa) if stride > 0 else (-x, -stride, wa, ws)
        first = max((-sws - reach - sx) // sstride + 1, -(n - 1))
        last = min(-((sx - swa - reach) // sstride) - 1, n - 1)
        tries = range(first, last + 1)
    for t in tries:
        budget[0] -= 1
        if budget[0] < 0 or _meets(x + stride * t, rest, ws, wa, moved or t != 0, budget):
            return True
    return False


def _solvable(x: int, solve: int, n: int, ws: int, wa: int, zero_ok: bool) -> bool:
    """Is there an integer ``t``, ``|t| < n`` (and ``t != 0`` unless ``zero_ok``), with
    ``-ws < x + solve*t < wa``?"""
    if solve == 0:
        return -ws < x < wa and (zero_ok or n > 1)
    if solve < 0:
        x, solve, ws, wa = -x, -solve, wa, ws
    first = max((-ws - x) // solve + 1, -(n - 1))  # smallest t with x + solve*t > -ws
    last = min(-((x - wa) // solve) - 1, n - 1)  # largest t with x + solve*t < wa
    return first <= last and (zero_ok or not first == last == 0)


def _meets_in_row(s: Range, a: Range) -> bool:
    """May the store's footprint in one iteration (one cell of a nest) meet the access's in
    the same iteration?"""
    if s.stride == a.stride and s.nest_strides == a.nest_strides:
        return s.base < a.base + a.width and a.base < s.base + s.width
    return s.lo < a.hi and a.lo < s.hi


def _conflict(s: Range, a: Range, trip: int, exact: bool = True, apart: dict | None = None) -> bool | int:
    """May the store's footprint in one iteration meet the access's in another? (As
    :func:`_conflict_grid` answers.)"""
    if s.lo >= a.hi or a.lo >= s.hi:
        return False  # never near each other (another array, most often)
    if s.stride == a.stride and not _solvable(
        s.base - a.base, s.stride, trip, s.width, a.width, zero_ok=False
    ):
        return False
    return _by_elements(s, a, [(s.stride, a.stride, trip)], exact, apart)


def inputs(plan: LoopPlan) -> frozenset[Symbol]:
    """Every value :func:`check` reads from its ``env``: those in the trip counts and in the
    access addresses. Its outcome depends on no other live-in, so the runtime keeps it per
    these alone (a time step's counter, read only by the loop's arithmetic, does not count);
    and it passes ``check`` only these, so a read of any other fails loudly (a KeyError)."""
    cached = plan.__dict__.get("_guard_inputs")
    if cached is None:
        polys = [plan.trip.start, plan.trip.bound]
        for _, trip in plan.inner_trips:
            polys += [trip.start, trip.bound]
        polys += [access.address for access in plan.accesses if access.address is not None]
        cached = frozenset().union(*(poly.leaves() for poly in polys))
        plan.__dict__["_guard_inputs"] = cached
    return cached
