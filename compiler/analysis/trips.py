"""Trip counts: how many times a loop runs, as a formula of the values at loop entry.

A countable loop has one way out (branches to blocks that only trap do not count), a
conditional branch on an integer compare, taken either at the top of the header (the loop
tests before each iteration, and nothing with an effect runs before the test) or at a
latch (a rotated loop, which runs at least once). The compare is followed through the
``x == 0`` / ``x != 0`` tests clang -O2 wraps around a kept loop condition. One side must
be ``start + step * k`` in the loop's counter ``k`` with a constant, non-zero step, the
other free of ``k`` and of every inner loop's counter; the result is a :class:`TripCount`
``pred(start + step*k, bound)`` that the runtime evaluates on the live-in values.

An inner loop's bounds may move with the counters of the loops around it (``j <= i`` in a
triangular nest, ``j < i + w`` in a trapezoidal one). :func:`check_affine_bounds` accepts
them when each such counter enters linearly, with a constant coefficient (and, for a
``!=`` test, one the step divides, so the counter meets its bound on every iteration of
the loops around): the count is then affine in those counters (up to ``max(0, .)`` and a
rounding up, both monotone), so its largest value over the enclosing loops' iterations is
at a corner of their box, which is what the runtime guards take.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import Reject, at
from tensorwasm.compiler.analysis.plan import TripCount
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.dialect import arith
from tensorwasm.dialect.ir import LoopInfo, Op, Value

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues

# Compare predicates: the one that holds when ``pred`` does not, and the one that holds
# with the operands swapped.
NEGATE = {"eq": "ne", "ne": "eq", "slt": "sge", "sge": "slt", "sgt": "sle", "sle": "sgt",
          "ult": "uge", "uge": "ult", "ugt": "ule", "ule": "ugt"}  # fmt: skip
SWAP = {"eq": "eq", "ne": "ne", "slt": "sgt", "sgt": "slt", "sle": "sge", "sge": "sle",
        "ult": "ugt", "ugt": "ult", "ule": "uge", "uge": "ule"}  # fmt: skip


def trip_count(values: LoopValues, loop: LoopInfo) -> TripCount:
    """The trip count of ``loop`` (the candidate loop or one inside it), or :class:`Reject`."""
    facts = values.facts
    body = facts.bodies[loop]
    exits = facts.exits(loop)
    if len(exits) != 1:
        raise Reject(f"loop at +0x{loop.offset:x} has {len(exits)} exits (an early exit)")
    block, term = exits[0]
    if term.name != "cf.cond_br":
        raise Reject(f"loop at +0x{loop.offset:x} leaves through a {term.name}")
    cond = term.operands[0]
    stays = term.successors[0].block in body
    cmp = cond.owner
    if not (isinstance(cmp, Op) and cmp.name == "arith.cmpi"):
        raise Reject(f"loop at +0x{loop.offset:x} exits on a condition that is not an integer compare")
    cmp, negated = _through_boolean_tests(cmp)
    if negated:
        stays = not stays
    bottom = block in facts.latches[loop] and any(s.block is loop.header for s in term.successors)
    top = not bottom and block is loop.header
    if not top and not bottom:
        raise Reject(f"loop at +0x{loop.offset:x} exits from the middle of its body")
    if top:
        for op in block.ops[:-1]:
            if not op.opdef.pure:
                hint = (
                    " (its counter lives in memory, as in unoptimised code)" if op.name == "mem.load" else ""
                )
                raise Reject(
                    f"loop at +0x{loop.offset:x} runs {op.name} at {at(op)} before its exit test{hint}"
                )
    pred = cmp.attrs["pred"] if stays else NEGATE[cmp.attrs["pred"]]
    x, y = (values.expr(v) for v in cmp.operands)
    k = values.counter(loop)
    if x is None or y is None:
        raise Reject(f"loop at +0x{loop.offset:x} has a trip count that depends on memory or unknown values")
    if not x.uses(k):
        x, y, pred = y, x, SWAP[pred]
    split = x.split(k)
    if split is None or y.uses(k) or not split[1].is_constant() or split[1].constant == 0:
        raise Reject(f"loop at +0x{loop.offset:x} has no counted exit test")
    start, step = split
    other_counters = {s for s in start.symbols() | y.symbols() if s.kind == "counter" and s is not k}
    # (the counters made so far of loops inside the candidate and deeper than this one)
    inner = {sym for m, sym in values.counters.items() if m.depth > loop.depth and m.header in values.body}
    if other_counters & inner:
        raise Reject(f"loop at +0x{loop.offset:x} has an exit test that depends on an inner loop")
    return TripCount(top, pred, start, step.constant, y, cmp.operands[0].type.bits)


def _through_boolean_tests(cmp: Op) -> tuple[Op, bool]:
    """The compare a chain of ``x == 0`` / ``x != 0`` tests of a compare's result decides
    (clang -O2 keeps a loop's exit compare in a local and branches on its ``eqz``), and
    whether the chain negates it."""
    negated = False
    while cmp.attrs["pred"] in ("eq", "ne"):
        a, b = cmp.operands
        zero = next((v for v in (a, b) if _is_zero(v)), None)
        tested = b if zero is a else a
        if isinstance(tested.owner, Op) and tested.owner.name == "arith.zext":
            tested = tested.owner.operands[0]  # the i1 compare widened to i32
        if zero is None or not (isinstance(tested.owner, Op) and tested.owner.name == "arith.cmpi"):
            break
        negated ^= cmp.attrs["pred"] == "eq"
        cmp = tested.owner
    return cmp, negated


def _is_zero(v: Value) -> bool:
    owner = v.owner
    return isinstance(owner, Op) and owner.opdef is arith.constant and owner.attrs["value"] == 0


def check_affine_bounds(values: LoopValues, loop: LoopInfo, trip: TripCount) -> None:
    """:class:`Reject` unless the bounds of inner ``loop`` are affine in the counters of the
    loops around it inside the candidate loop (constant coefficients; see the module's
    docstring), and free of every other counter."""
    enclosing = set()
    outer = loop.parent
    while outer is not None and outer in values.nested:
        enclosing.add(values.counter(outer))
        outer = outer.parent
    counters = set(values.counters.values())
    diff = trip.bound - trip.start
    for poly in (trip.start, trip.bound, diff):
        for sym in poly.symbols() & counters:
            split = poly.split(sym)
            if sym not in enclosing or split is None or not split[1].is_constant():
                raise Reject(
                    f"inner loop at +0x{loop.offset:x} has bounds that are not affine in the "
                    f"counters of the loops around it"
                )
            if poly is diff and trip.pred in ("ne", "eq") and split[1].constant % trip.step:
                raise Reject(
                    f"inner loop at +0x{loop.offset:x} may step over its bound on some "
                    f"iterations of the loops around it"
                )


def guarded_as_top(values: LoopValues, loop: LoopInfo, trip: TripCount) -> TripCount:
    """An inner loop tested at its bottom, entered only past a test equal to its own exit
    test one step before its start (clang's rotated loop behind ``if (n > 0)``), as the
    equivalent loop tested at its top: it runs no iteration exactly where that test fails,
    which the count of a rotated loop (at least one) cannot say on the rows that skip it."""
    if trip.top:
        return trip
    facts = values.facts
    block = next(p for p in facts.preds[loop.header] if p not in facts.bodies[loop])
    while len(block.ops) == 1 and block.terminator.name == "cf.br" and len(facts.preds[block]) == 1:
        guard = facts.preds[block][0]
        term = guard.terminator
        if term.name == "cf.br":
            block = guard
            continue
        if term.name != "cf.cond_br" or term.successors[0].block is term.successors[1].block:
            return trip
        cmp = term.operands[0].owner
        if not (isinstance(cmp, Op) and cmp.name == "arith.cmpi"):
            return trip
        cmp, negated = _through_boolean_tests(cmp)
        enters_when = (term.successors[0].block is block) != negated
        pred = cmp.attrs["pred"] if enters_when else NEGATE[cmp.attrs["pred"]]
        x, y = (values.expr(v) for v in cmp.operands)
        before = trip.start - Poly.const(trip.step)
        same = (pred, x, y) == (trip.pred, before, trip.bound) or (SWAP[pred], y, x) == (
            trip.pred,
            before,
            trip.bound,
        )
        if not same or cmp.operands[0].type.bits != trip.bits:
            return trip
        return TripCount(True, trip.pred, before, trip.step, trip.bound, trip.bits)
    return trip
