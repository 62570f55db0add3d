"""Dependence tests between a loop's stores and its accesses, across iterations.

Iterations run in any order on the device, so a store of iteration ``k`` must not meet an
access of another iteration. For each store with affine address ``s(k)`` and each access
with affine address ``a(k)`` (``c``: the store's coefficient of the loop's counter ``k``):

- where both move by ``c`` with ``k`` and the same way with every inner counter, and
  ``s - a`` is a non-zero integer multiple ``d`` of ``c``, the access touches what the
  store writes ``|d|`` iterations away, whatever the values: a loop-carried dependence.
  It rejects the loop when closer than :data:`DEPENDENCE_DISTANCE_GUARDED`, and is left to
  the runtime guards otherwise (it exists only when the loop runs longer than that);
- where ``s - a`` and ``c`` are constants and no inner counter moves the store, the byte
  ranges ``[s, s + width)`` at iteration ``k`` and ``[a, a + width)`` at ``k - delta``
  overlap for an integer ``delta != 0`` exactly when one lies strictly inside an interval
  of rationals: a proven overlap rejects the loop, and a proven absence frees the runtime
  from testing the pair.

Every other pair is left to the guards, which compare the concrete byte ranges before
each launch.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import Reject
from tensorwasm.compiler.analysis.plan import Access
from tensorwasm.compiler.analysis.poly import Poly

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues

# A dependence this many iterations apart or more is left to the run-time guards (it
# exists only when the loop runs longer than that); a closer one rejects the loop, since a
# loop of fewer iterations would not pay for a launch anyway.
DEPENDENCE_DISTANCE_GUARDED = 16


def static_dependences(values: LoopValues, accesses: list[Access]) -> list[tuple[int, int]]:
    """Settle pairs whose addresses differ by a constant; raise on a proven conflict.
    Returns the index pairs proven independent (the runtime need not test them)."""
    k = values.counter(values.info)
    counters = set(values.counters.values())
    free = []
    for i, s in enumerate(accesses):
        if not s.store:
            continue
        for j, a in enumerate(accesses):
            if a.address is None or s.address is None:
                continue
            if any(f.leaves() & counters for f in s.address.floors() | a.address.floors()):
                continue  # quasi-affine: isl and the guards settle it
            diff = s.address - a.address
            split = s.address.split(k)
            other = a.address.split(k)
            if split is None or other is None:
                continue
            c = split[1]
            distance = _multiple_of(diff, c)
            if (
                distance is not None and distance != 0 and c == other[1]
                and _same_inner_terms(s.address, a.address, counters - {k})
            ):  # fmt: skip
                if abs(distance) >= DEPENDENCE_DISTANCE_GUARDED:
                    # Apart by more iterations than a loop too short to launch runs:
                    # the guards settle it at run time from the actual trip count.
                    continue
                # The access reads (or writes) what the store wrote |distance| iterations
                # earlier, whatever the values: a loop-carried dependence.
                raise Reject(
                    f"store at {s.where} may overlap {a.kind} at {a.where} across iterations "
                    f"(distance {abs(distance)})"
                )
            if not diff.is_constant() or not c.is_constant():
                continue
            if (s.address.leaves() & counters) - {k}:
                continue  # inner loops: the runtime compares per-iteration footprints
            if _overlaps_across_iterations(diff.constant, c.constant, s.width, a.width):
                raise Reject(f"store at {s.where} may overlap {a.kind} at {a.where} across iterations")
            free.append((i, j))
    return free


def _multiple_of(diff: Poly, c: Poly) -> int | None:
    """m such that diff == m * c, if there is an integer one (c not zero)."""
    if not c.terms:
        return None
    if not diff.terms:
        return 0
    monomial, coeff = next(iter(c.terms.items()))
    have = diff.terms.get(monomial, 0)
    if have % coeff:
        return None
    m = have // coeff
    return m if diff == c.scale(m) else None


def _same_inner_terms(a: Poly, b: Poly, counters: set) -> bool:
    """The two addresses move the same way with every inner loop counter."""
    for counter in counters:
        sa, sb = a.split(counter), b.split(counter)
        if sa is None or sb is None or sa[1] != sb[1]:
            return False
    return True


def _overlaps_across_iterations(d: int, c: int, ws: int, wa: int) -> bool:
    """Is there an integer delta != 0 with -ws < d + c*delta < wa (store at k, access at k - delta)?"""
    if c == 0:
        return -ws < d < wa
    lo, hi = Fraction(-ws - d, c), Fraction(wa - d, c)
    if lo > hi:
        lo, hi = hi, lo
    first = int(lo) + 1 if lo >= 0 or lo == int(lo) else int(lo)
    if first <= lo:
        first += 1
    candidates = range(first, int(hi) + 2)
    return any(lo < delta < hi and delta != 0 for delta in candidates)
