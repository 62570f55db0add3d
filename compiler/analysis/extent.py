"""The range of an address over a triangular nest, for the runtime guards.

An inner loop whose bounds move with the enclosing counters (``j <= i``) makes the box of
the counters' ranges a loose hold on an access's addresses: ``C[j][i]`` for ``j >= i``
would reach twice past the end of ``C``. :func:`extent` gives the least and the greatest
address over the nest itself. It imports nothing of the analysis, so the guards load it on
a warm start at no cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.poly import Poly, Symbol

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.plan import TripCount


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
