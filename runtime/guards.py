"""Runtime guards: the checks the analysis left for concrete values, made before a launch.

Given the live-in values of one arrival at a loop, :func:`check` computes the trip count
(refusing loops whose counter would wrap or never reach its bound), the byte range every
access touches over the whole iteration space (refusing any outside linear memory), and
tests every store against every other access: same stride -> the exact cross-iteration
overlap test on per-iteration footprints; otherwise the whole ranges must be disjoint.
Anything refused runs as the original loop on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.analysis.loops import Access, LoopPlan, TripCount
from compiler.analysis.poly import Symbol

MAX_TRIP = (1 << 31) - 1


class GuardFailed(Exception):
    """A guard refused the launch; the message says which."""


@dataclass
class Range:
    lo: int  # first byte
    hi: int  # one past the last byte
    base: int  # at counter 0 of the launched loop, with inner counters at their minimum
    stride: int  # per iteration of the launched loop
    width: int  # bytes touched per iteration of the launched loop (per grid cell of a nest)
    stride2: int = 0  # per iteration of a collapsed inner loop


@dataclass
class Launch:
    trip: int
    env: dict[Symbol, int]
    reads: list[Range]
    writes: list[Range]
    gathers: bool = False  # loads at unknown addresses: the device needs all of memory
    trip2: int | None = None  # a collapsed nest's inner trip count (the grid's 2nd dimension)
    inner: dict[Symbol, int] | None = None  # every inner loop's trip count


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


def check(plan: LoopPlan, env: dict[Symbol, int], memory_size: int) -> Launch:
    trip = trip_count(plan.trip, env)
    if trip == 0:
        return Launch(0, env, [], [])  # the body never runs: nothing is touched
    inner = {}
    for counter, inner_trip in plan.inner_trips:
        # The analysis made sure the inner count does not change between iterations.
        probe = dict(env)
        probe[plan.counter] = 0
        inner[counter] = trip_count(inner_trip, probe)
    nest = plan.collapse
    trip2 = inner[nest.counter] if nest else None
    if trip2 == 0:
        raise GuardFailed("the collapsed inner loop runs no iteration")
    launched = {plan.counter, nest.counter} if nest else {plan.counter}
    reads, writes = [], []
    ranges: list[tuple[Access, Range]] = []
    counts = {plan.counter: trip, **inner}
    for access, split in zip(plan.accesses, _split_addresses(plan), strict=True):
        if split is None:
            ranges.append((access, None))  # a gather: checked by the kernel itself
            continue
        rng = _range(split, plan, env, counts, launched, access.width)
        if rng.lo < 0 or rng.hi > memory_size:
            raise GuardFailed(f"{access.kind} at {access.where} reaches outside linear memory")
        ranges.append((access, rng))
        (writes if access.store else reads).append(rng)
    if trip * (trip2 or 1) > 1:
        # Pairs the analysis settled are independent across outer iterations only: a
        # collapsed nest tests every pair across grid cells.
        free = set(plan.static_dependence_free) if not nest else set()
        for i, (s, rs) in enumerate(ranges):
            if not s.store:
                continue
            for j, (a, ra) in enumerate(ranges):
                if (i, j) in free or ra is None:
                    continue
                if _conflict2(rs, ra, trip, trip2) if nest else _conflict(rs, ra, trip):
                    raise GuardFailed(f"store at {s.where} may overlap {a.kind} at {a.where}")
    return Launch(trip, env, reads, writes, bool(plan.gathers), trip2, inner)


def _split_addresses(plan: LoopPlan) -> list:
    """Per access: its address as (the part without counters, [(counter, coefficient)]),
    split once per plan rather than on every arrival."""
    cached = plan.__dict__.get("_guard_splits")
    if cached is None:
        counters = [plan.counter, *(c for c, _ in plan.inner_trips)]
        cached = []
        for access in plan.accesses:
            if access.address is None:
                cached.append(None)
                continue
            rest, coeffs = access.address, []
            for counter in counters:
                rest, coeff = rest.split(counter)
                coeffs.append((counter, coeff))
            cached.append((rest, coeffs))
        plan.__dict__["_guard_splits"] = cached
    return cached


def _range(split, plan: LoopPlan, env, counts: dict[Symbol, int], launched: set[Symbol], width: int) -> Range:
    rest, coeff_polys = split
    base = rest.evaluate(env)
    lo = hi = base
    inner_lo = inner_hi = base
    stride = stride2 = 0
    for counter, poly in coeff_polys:
        coeff = poly.evaluate(env) if poly.terms else 0
        span = coeff * max(counts[counter] - 1, 0)
        lo += min(0, span)
        hi += max(0, span)
        if counter is plan.counter:
            stride = coeff
        elif counter in launched:
            stride2 = coeff
        else:
            inner_lo += min(0, span)
            inner_hi += max(0, span)
    return Range(lo, hi + width, inner_lo, stride, inner_hi + width - inner_lo, stride2)


def _conflict2(s: Range, a: Range, trip: int, trip2: int) -> bool:
    """May the store's footprint in one grid cell meet the access's in another cell?

    With equal strides the footprints of cells ``(o, i)`` and ``(o', i')`` overlap iff
    ``-ws < d + so*(o-o') + si*(i-i') < wa``: for each difference along one dimension that
    can come close enough, the other difference is solved exactly, in integers. Otherwise
    the whole ranges must be apart.
    """
    if s.lo >= a.hi or a.lo >= s.hi:
        return False  # never near each other
    if (s.stride, s.stride2) != (a.stride, a.stride2):
        return True
    d = s.base - a.base
    (walk, n_walk), (solve, n_solve) = (s.stride, trip), (s.stride2, trip2)
    if walk == 0:
        (walk, n_walk), (solve, n_solve) = (solve, n_solve), (walk, n_walk)
    if walk == 0:  # every cell touches the same bytes
        return -s.width < d < a.width and trip * trip2 > 1
    reach = max(s.width, a.width) + abs(solve) * (n_solve - 1)
    lo, hi = sorted(((-reach - d) // walk, (reach - d) // walk))
    for delta in range(max(lo - 1, -(n_walk - 1)), min(hi + 1, n_walk - 1) + 1):
        if _solvable(d + walk * delta, solve, n_solve, s.width, a.width, delta != 0):
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


def _conflict(s: Range, a: Range, trip: int) -> bool:
    """May the store's footprint in one iteration meet the access's in another?"""
    if s.stride == a.stride:
        return _solvable(s.base - a.base, s.stride, trip, s.width, a.width, zero_ok=False)
    return s.lo < a.hi and a.lo < s.hi
