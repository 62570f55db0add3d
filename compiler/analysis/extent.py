"""The range of an address over a triangular nest, for the runtime guards.

An inner loop whose bounds move with the enclosing counters (``j <= i``) makes the box of
the counters' ranges a loose hold on an access's addresses: ``C[j][i]`` for ``j >= i``
would reach twice past the end of ``C``. :func:`extent` gives the least and the greatest
address over the nest itself. It imports nothing of the analysis, so the guards load it on
a warm start at no cost.

:func:`box_range` bounds a quasi-affine value (floor symbols of affine values: clang's
unrolled loops) over the box of the counters' ranges, for the guards.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.poly import Poly, Symbol

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.plan import TripCount


def _bearing(address: Poly, trips: list, known: set) -> list:
    """The loops of ``trips`` whose counters ``address`` uses, and those their bounds use."""
    used = address.leaves() & known
    grown = True
    while grown:
        grown = False
        for sym, trip in trips:
            more = (trip.start.leaves() | trip.bound.leaves()) & known if sym in used else set()
            if not more <= used:
                used |= more
                grown = True
    return [(sym, trip) for sym, trip in trips if sym in used]


def extent(
    address: Poly,
    trips: list[tuple[Symbol, TripCount]],
    env: Mapping[Symbol, int],
    counts: Mapping[Symbol, int],
) -> tuple[int, int] | None:
    """The least and the greatest value of ``address`` over a nest with triangular inner
    loops (``trips``: the counters and trip counts, outermost first; ``counts``: each
    loop's count, an inner one's largest), for the live-ins ``env``; None where an inner
    loop whose bounds move steps by more than one or is tested at its bottom by an ordered
    compare (the box of ``counts`` then serves).

    Innermost first, each moving counter is replaced by the end of its range that
    maximises (minimises) the address: 0, or its last iteration, an affine function of the
    counters around it. What is left is affine in counters of fixed ranges, taken at the
    corners of their box. Rows where an inner loop runs no iteration only add values
    below the greatest (above the least), so the result holds every address."""
    known = {sym for sym, _ in trips}
    trips = _bearing(address, trips, known)  # (a loop the address does not move with only repeats it)
    if any(quasi(p, known) for _, t in trips for p in (t.start, t.bound)) or quasi(address, known):
        return None  # floors of the counters: the box (box_range) serves
    rest, coeffs = address, {}
    for sym, _ in trips:
        rest, coeff = rest.split(sym)
        coeffs[sym] = coeff.evaluate(env)
    base = rest.evaluate(env)
    ends = []
    for want in (min, max):
        expr = {**coeffs, None: base}
        for sym, trip in reversed(trips):
            moving = (trip.start.symbols() | trip.bound.symbols()) & known
            if not moving or not expr.get(sym):
                continue
            if abs(trip.step) != 1 or not (trip.top or trip.pred == "ne"):
                return None  # (a loop tested at its bottom by "<" runs once on rows it would skip)
            c = expr.pop(sym)
            if (c > 0) == (want is max):  # this end is the last iteration
                for term, value in _last_iteration(trip, env, known).items():
                    expr[term] = expr.get(term, 0) + c * value
        const = expr.pop(None)
        ends.append(const + sum(want(0, c * max(counts[sym] - 1, 0)) for sym, c in expr.items()))
    return ends[0], ends[1]


def _last_iteration(trip: TripCount, env: Mapping[Symbol, int], known: set[Symbol]) -> dict:
    """The counter's value on the last iteration of a loop stepping by one (tested at its
    top, or by "!=" at its bottom), as an affine
    function of the enclosing counters (``{counter: coefficient, None: constant}``)."""
    distance = (trip.bound - trip.start) if trip.step > 0 else (trip.start - trip.bound)
    if trip.pred in ("sle", "ule", "sge", "uge") or not trip.top:
        # A "!=" loop tested at its bottom runs one more time than its distance (never
        # less than none: the guards check its start lies on the side its step goes).
        distance = distance + Poly.const(1)
    out: dict = {None: -1}
    for sym in distance.symbols() & known:
        distance, coeff = distance.split(sym)
        out[sym] = coeff.evaluate(env)
    out[None] += distance.evaluate(env)
    return out


def quasi(poly: Poly, counters) -> bool:
    """``poly`` holds a floor symbol of one of ``counters``."""
    return any(f.leaves() & counters for f in poly.floors())


def box_range(poly: Poly, env: Mapping[Symbol, int], counts: Mapping[Symbol, int]) -> tuple[int, int]:
    """The least and the greatest value of ``poly`` (affine in the counters of ``counts``,
    each from 0 to its count less one, and in floor symbols of values affine in them, each
    alone in its term) for the live-ins ``env``, or bounds of them.

    Where every counter moves every term the same way (a floor is monotone in its value),
    the extremes are at corners of the box, and exact. Otherwise each term ``e *
    floor(x / d)`` is ``(e / d) * x - (e / d) * (x mod d)``: the first part is affine, taken
    at the corners, and the residue adds at most ``|e / d| * (d - 1)`` either way."""
    counters = [c for c in counts if c in poly.leaves()]
    floors = [f for f in poly.floors() if f.leaves() & counts.keys()]
    directions: dict[Symbol, set[int]] = {c: set() for c in counters}
    for sym in [*counters, *floors]:
        coeff = poly.split(sym)[1].evaluate(env)
        if sym.kind != "floor":
            directions[sym].add(_sign(coeff))
            continue
        inner = sym.ref[0]
        for c in counters:
            if inner.uses(c):
                slope = inner.split(c)[1].evaluate(env)
                directions[c].add(_sign(coeff) * _sign(slope))
    corners = [
        {**env, **dict(zip(counters, corner, strict=True))}
        for corner in itertools.product(*((0, max(counts[c] - 1, 0)) for c in counters))
    ]
    if all(len(d - {0}) <= 1 for d in directions.values()):
        values = [poly.evaluate(at) for at in corners]
        return min(values), max(values)
    from fractions import Fraction  # (here: a launch's guards rarely need it, and its import is ~3 ms)

    rest, slack_lo, slack_hi = poly, Fraction(0), Fraction(0)
    parts = []
    for f in floors:
        rest, coeff = rest.split(f)
        e = Fraction(coeff.evaluate(env), f.ref[1])
        parts.append((f.ref[0], e))
        span = -e * (f.ref[1] - 1)
        slack_lo += min(0, span)
        slack_hi += max(0, span)
    values = [rest.evaluate(at) + sum(e * inner.evaluate(at) for inner, e in parts) for at in corners]
    lo, hi = min(values) + slack_lo, max(values) + slack_hi
    return -((-lo.numerator) // lo.denominator), hi.numerator // hi.denominator


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def nest_range(
    poly: Poly,
    trips: list[tuple[Symbol, TripCount]],
    env: Mapping[Symbol, int],
    counts: Mapping[Symbol, int],
) -> tuple[int, int]:
    """Bounds of a quasi-affine ``poly`` over a nest (``trips``: the inner loops, outermost
    first; ``counts``: every counter's count over the box, the launched loop's included).

    Innermost first, an inner counter that ``poly`` holds only in its own terms is replaced
    by the end of its range that moves ``poly`` the way wanted: 0, or its last iteration as
    a polynomial in the counters around it (a ``!=`` loop's distance divided by its step,
    where that division is exact). ``n & 3`` in a remainder loop's start and ``n & -4`` in
    its address then cancel in the polynomial itself, and :func:`box_range` takes the rest.
    An inner counter that defeats this keeps its box."""
    ends = []
    for want in (-1, 1):
        expr = poly
        for sym, trip in reversed(trips):
            if sym not in expr.leaves() or sym not in expr.symbols():
                continue
            rest, coeff = expr.split(sym)
            if sym in rest.leaves() or sym in coeff.leaves() or coeff.leaves() & counts.keys():
                continue
            c = coeff.evaluate(env)
            if (c > 0) != (want > 0):
                expr = rest
                continue
            last = _last_polynomial(trip)
            if last is not None:
                expr = rest + coeff * last
        low, high = box_range(expr, env, counts)
        ends.append(low if want < 0 else high)
    return ends[0], ends[1]


def _last_polynomial(trip: TripCount) -> Poly | None:
    """The counter's value on a loop's last iteration as a polynomial of the values around
    it (its count less one), where that count is one: a "!=" loop, or a loop stepping by
    one tested at its top; None otherwise."""
    distance = (trip.bound - trip.start) if trip.step > 0 else (trip.start - trip.bound)
    step = abs(trip.step)
    if trip.pred in ("sle", "ule", "sge", "uge"):
        distance = distance + Poly.const(1)
    elif trip.pred != "ne" and step != 1:
        return None
    if any(c % step for c in distance.terms.values()):
        return None
    count = Poly({m: c // step for m, c in distance.terms.items()})
    if not trip.top:
        count = count + Poly.const(1)
    return count - Poly.const(1)
