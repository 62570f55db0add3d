"""Trip counts: how many times a loop runs, as a formula of the values at loop entry.

A countable loop has one way out (branches to blocks that only trap do not count), a
conditional branch on an integer compare, taken either at the top of the header (the loop
tests before each iteration, and nothing with an effect runs before the test) or at a
latch (a rotated loop, which runs at least once), or at the end of a header that works
before it (clang's loop unrolled by two for an odd count, the test between the halves:
counted as a rotated loop, since its header runs as one's body does, and the blocks after
the test run one iteration fewer, :func:`in_tail`). The compare is followed through the
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
at a corner of their box, which is what the runtime guards take. Bounds may also hold
floor symbols (``i & -4`` after clang unrolls a loop by four) of such affine values, each
with a constant coefficient: still monotone in each counter, so the corners still serve.

clang enters an unrolled loop and its remainder only past tests of their own (``if (n - 1
>= 3)``, ``if (n & 3)``), and joins the unrolled loop's exit with the path that skipped
it. :func:`guarded_as_top` reads such a rotated loop as tested at its top when its entry
test holds exactly where its exit test would, one step before its start (syntactically,
or proven with isl over the enclosing counters); :func:`exit_merge` reads the join as the
loop's bound, the value its counter equals when a "!=" test lets it go. clang's scalar
remainder after a vectorised loop is entered through a join of two ways (around the
vector loop for a short row; past it, where it left some elements): :func:`entered_as_tested`
reads each join as its ways, alternatives of the tests their branches take, so that the
remainder counts zero where the vector loop covered the whole range, rather than a
rotated loop's wrapped 2^32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import FunctionLoops, Reject, at, only_traps
from tensorwasm.compiler.analysis.plan import TripCount
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.dialect import arith
from tensorwasm.dialect.ir import Block, LoopInfo, Op, Value

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
    cmp, stays, top = exit_test(values.facts, loop)
    pred = cmp.attrs["pred"] if stays else NEGATE[cmp.attrs["pred"]]
    x, y = (values.expr(v) for v in cmp.operands)
    k = values.counter(loop)
    if x is None or y is None:
        raise Reject(f"loop at +0x{loop.offset:x} has a trip count that depends on memory or unknown values")
    if not x.uses(k):
        x, y, pred = y, x, SWAP[pred]
    if any(k in f.leaves() for f in x.floors() | y.floors()):
        raise Reject(f"loop at +0x{loop.offset:x} has an exit test that is not affine in its own counter")
    split = x.split(k)
    if split is None or y.uses(k) or not split[1].is_constant() or split[1].constant == 0:
        raise Reject(f"loop at +0x{loop.offset:x} has no counted exit test")
    start, step = split
    # The counters made so far of loops inside the candidate and deeper than this one: each
    # symbol of the test asked alone (a set of them all cost the nest's depth per loop).
    for s in start.leaves() | y.leaves():
        if (
            s.kind == "counter" and s is not k and values.counters.get(s.ref) is s
            and s.ref.depth > loop.depth and s.ref.header in values.body
        ):  # fmt: skip
            raise Reject(f"loop at +0x{loop.offset:x} has an exit test that depends on an inner loop")
    return TripCount(top, pred, start, step.constant, y, cmp.operands[0].type.bits)


def exit_test(facts: FunctionLoops, loop: LoopInfo) -> tuple[Op, bool, bool]:
    """The compare that decides whether ``loop`` goes on, whether the loop stays when it
    holds, and whether it is tested at the loop's top; :class:`Reject` where the loop has
    no such test. What this reads is the loop's alone, whichever candidate holds it: made
    once per loop and function (every enclosing candidate asks again)."""
    return _known_exit_test(facts, loop)[:3]


def exits_mid_body(facts: FunctionLoops, loop: LoopInfo) -> bool:
    """Whether ``loop``'s exit test ends its header after work of the iteration (clang's
    loop unrolled by two for an odd count: ``loop { body(j); if (j == n) break; body(j+1);
    j += 2 }``): its header runs as a loop tested at its bottom counts, and every other
    block of its body (:func:`in_tail`) one time less. False where it has no counted test."""
    try:
        return _known_exit_test(facts, loop)[3]
    except Reject:
        return False


def in_tail(facts: FunctionLoops, loop: LoopInfo, block: Block) -> bool:
    """``block`` of ``loop``'s body runs after an exit test in the middle of the body: on
    the iterations after which the loop goes on, so iteration ``k`` runs it exactly where
    iteration ``k + 1`` runs."""
    return block is not loop.header and block in facts.bodies[loop] and exits_mid_body(facts, loop)


def _known_exit_test(facts: FunctionLoops, loop: LoopInfo) -> tuple[Op, bool, bool, bool]:
    known = facts.exit_tests.get(loop)
    if known is None:
        try:
            known = facts.exit_tests[loop] = _exit_test(facts, loop)
        except Reject as exc:
            known = facts.exit_tests[loop] = exc
    if isinstance(known, Reject):
        raise Reject(str(known))
    return known


def _exit_test(facts: FunctionLoops, loop: LoopInfo) -> tuple[Op, bool, bool, bool]:
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
    effects = [op for op in block.ops[:-1] if not op.opdef.pure] if top else []
    for op in effects:
        if _depends_on(cmp, op, block):
            hint = " (its counter lives in memory, as in unoptimised code)" if op.name == "mem.load" else ""
            raise Reject(f"loop at +0x{loop.offset:x} runs {op.name} at {at(op)} before its exit test{hint}")
    if effects:
        # clang's loop unrolled by two for an odd count: the test halfway through. The
        # header runs once more than the rest, as the header of a loop tested at its
        # bottom does: counted so, with the rest of the body one iteration short.
        return cmp, stays, False, True
    return cmp, stays, top, False


def _depends_on(value_op: Op, op: Op, block) -> bool:
    """Whether ``value_op`` reads what ``op`` gives, through ops of ``block``."""
    seen: set[int] = set()
    work = [value_op]
    while work:
        current = work.pop()
        if current is op:
            return True
        if id(current) in seen:
            continue
        seen.add(id(current))
        for operand in current.operands:
            owner = operand.owner
            if isinstance(owner, Op) and owner.block is block:
                work.append(owner)
    return False


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
    docstring), and free of every other counter. Each symbol is asked alone whether it is a
    counter, and one around ``loop`` (sets of them all cost the nest's depth per loop)."""
    if not any(_moving(values, s) for poly in (trip.start, trip.bound) for s in poly.symbols()):
        return  # (nor does their difference move: it has no other symbols)
    diff = trip.bound - trip.start
    for poly in (trip.start, trip.bound, diff):
        for sym in [s for s in poly.symbols() if _moving(values, s)]:
            split = poly.split(sym)
            if split is None or not split[1].is_constant() or not _affine_in(values, loop, sym):
                raise Reject(
                    f"inner loop at +0x{loop.offset:x} has bounds that are not affine in the "
                    f"counters of the loops around it"
                )
            if poly is diff and trip.pred in ("ne", "eq") and split[1].constant % trip.step:
                raise Reject(
                    f"inner loop at +0x{loop.offset:x} may step over its bound on some "
                    f"iterations of the loops around it"
                )


def _moving(values: LoopValues, sym) -> bool:
    """``sym`` is a counter of the candidate's nest, or a floor symbol of a value holding one."""
    return _is_counter(values, sym) or (
        sym.kind == "floor" and any(_is_counter(values, t) for t in sym.leaves())
    )


def _is_counter(values: LoopValues, sym) -> bool:
    """``sym`` is the counter of a loop of the candidate's nest, made so far."""
    return sym.kind == "counter" and values.counters.get(sym.ref) is sym


def _encloses(values: LoopValues, loop: LoopInfo, sym) -> bool:
    """``sym`` is the counter of a loop around ``loop`` inside the candidate: up the loops
    around ``loop`` while they are the candidate's (a loop of its nest has its header in
    the candidate's body), no further than ``sym``'s loop's depth."""
    if not _is_counter(values, sym):
        return False
    outer = loop.parent
    while outer is not None and outer.header in values.body and outer.depth >= sym.ref.depth:
        if outer is sym.ref:
            return True
        outer = outer.parent
    return False


def _affine_in(values: LoopValues, loop: LoopInfo, sym) -> bool:
    """``sym`` is the counter of a loop around ``loop``, or the floor of a value affine in
    such counters (constant coefficients) and free of every other counter."""
    if sym.kind != "floor":
        return _encloses(values, loop, sym)
    inner = sym.ref[0]
    for s in inner.symbols():
        if s.kind == "floor" or (_is_counter(values, s) and not _encloses(values, loop, s)):
            return False
        if _is_counter(values, s):
            split = inner.split(s)
            if split is None or not split[1].is_constant():
                return False
    return True


def guarded_as_top(
    values: LoopValues, loop: LoopInfo, trip: TripCount, through_joins: bool = True
) -> TripCount:
    """An inner loop tested at its bottom, entered only past tests that together hold
    exactly where its own exit test would one step before its start (clang's rotated loop
    behind ``if (n > 0)``; an unrolled one behind ``if (n - 1 >= 3)`` and bounded by ``n &
    -4``), as the equivalent loop tested at its top: it runs no iteration exactly where those
    tests fail, which the count of a rotated loop (at least one) cannot say on the rows that
    skip it. The nearest test is compared syntactically, and the chain of tests in front of
    the loop, nearest first, proven equivalent with isl; with ``through_joins``, then the
    ways through the joins in front of it (:func:`entered_as_tested`: clang's scalar
    remainder, entered past a vectorised loop or around it, which runs no iteration where
    the vector loop covered the whole range)."""
    if trip.top:
        return trip
    guards = entry_guards(values, loop)
    before = trip.start - Poly.const(trip.step)
    tests = []
    for _, cmp, enters_when in guards:
        pred = cmp.attrs["pred"] if enters_when else NEGATE[cmp.attrs["pred"]]
        x, y = _aside(values, cmp.operands)
        if x is None or y is None:
            break
        tests.append((pred, x, y, cmp.operands[0].type.bits))
    own = (trip.pred, before, trip.bound, trip.bits)
    same = False
    if tests:
        pred, x, y, bits = tests[0]
        same = bits == trip.bits and (
            (pred, x, y) == (trip.pred, before, trip.bound)
            or (SWAP[pred], y, x) == (trip.pred, before, trip.bound)
        )
        if not same:
            from tensorwasm.compiler.analysis.isl import same_test

            same = any(same_test(values, loop, tests[:n], own) for n in range(1, len(tests) + 1))
    if not same and not (through_joins and entered_as_tested(values, loop, own)):
        return trip
    return TripCount(True, trip.pred, before, trip.step, trip.bound, trip.bits)


# How many ways from a test to the join in front of a loop are read, and how many blocks
# each may pass on average: beyond them the loop is left as counted at its bottom.
_MAX_PATHS = 16
_MAX_PATH_BLOCKS = 64

# A compare that holds: (predicate, lhs, rhs, bits).
Test = tuple[str, Poly, Poly, int]


def entered_as_tested(values: LoopValues, loop: LoopInfo, own: Test) -> bool:
    """Whether ``loop`` is entered exactly where ``own`` holds (its exit test one step
    before its start), read through the joins in front of it: clang's scalar remainder
    after a vectorised loop is entered from two ways, past the test that skips the vector
    loop (a row too short for it) and past the vector loop and the test that skips the
    remainder where the vector loop left nothing (``n - 2 == (n - 2) & -16``). Each join
    reads as the ways to it from its immediate dominator, each the conjunction of the
    branches it takes (a loop on the way run whole), the ways as alternatives
    (:func:`entry_clauses`); the nearest clauses are proven equivalent to ``own`` where
    those further up hold, with isl (:func:`.isl.same_clauses`), on the values as the code
    before the candidate computes them, wrapping included."""
    from tensorwasm.compiler.analysis.isl import same_clauses

    clauses = entry_clauses(values, loop)
    return bool(clauses) and same_clauses(values, loop, clauses, own)


def entry_clauses(values: LoopValues, loop: LoopInfo) -> list[list[list[Test]]]:
    """What holds where ``loop`` is entered, nearest first: a clause per step up the blocks
    in front of it (each of them computing only pure values), from a block to its immediate
    dominator inside the candidate, the alternatives of the clause the ways between the two
    (:func:`_ways`), each the tests its branches take. It stops where a way is not read."""
    facts = values.facts
    block = next(p for p in facts.preds[loop.header] if p not in facts.bodies[loop])
    out: list[list[list[Test]]] = []
    if block.terminator.name != "cf.br":  # (Wasm enters a loop by falling into it)
        return out
    while all(op.opdef.pure for op in block.ops[:-1]):
        dominator = facts.idom.get(block)
        if dominator is None or dominator not in values.body:
            break
        ways = _ways(values, dominator, block)
        if ways is None:
            break
        out.append(ways)
        block = dominator
    return out


def _ways(values: LoopValues, dominator: Block, join: Block) -> list[list[Test]] | None:
    """The ways from ``dominator`` to ``join``, its immediate dominator (inside the body,
    passing neither the dominator again nor the header of a loop holding it: that would be
    a next iteration), each as the tests its branches take; an inner loop on the way is
    passed whole, from its header to its one way out (the tests inside it are its
    iterations'). None where a way takes a branch not modelled, leaves a loop by more than
    one way, a test reads a counter of no loop around the join, or there are too many."""
    facts = values.facts
    around = {m.header for m in values.nested if dominator in facts.bodies[m]}
    mine = {values.counters.get(m) for m in values.nested if join in facts.bodies[m]}
    ways: list[list[Test]] = []
    stack: list[tuple[Block, list[Test]]] = [(dominator, [])]
    steps = 0
    while stack:
        block, tests = stack.pop()
        steps += 1
        if steps > _MAX_PATHS * _MAX_PATH_BLOCKS:
            return None
        inner = block.attrs.get("loop")
        if block is not dominator and inner is not None and inner in facts.bodies and inner.header is block:
            leaving = [
                succ.block for b, term in facts.exits(inner) for succ in term.successors
                if succ.block not in facts.bodies[inner] and not only_traps(succ.block)
            ]  # fmt: skip
            if len(set(leaving)) != 1:
                return None
            edges: list[tuple[Block, Test | None]] = [(leaving[0], None)]
        else:
            edges = _edges(values, block)
            if edges is None:
                return None
        for succ, test in edges:
            if succ is dominator or succ in around or succ not in values.body or only_traps(succ):
                continue
            taken = tests if test is None else [*tests, test]
            if test is not None and any(
                s.kind == "counter" and s not in mine for side in test[1:3] for s in side.leaves()
            ):
                return None
            if succ is join:
                ways.append(taken)
                if len(ways) > _MAX_PATHS:
                    return None
            else:
                stack.append((succ, taken))
    return ways


def _edges(values: LoopValues, block: Block) -> list[tuple[Block, Test | None]] | None:
    """The successors of ``block`` with the test each edge takes (None: no test), none
    where it leaves the function, or None where it branches other than on an integer
    compare of polynomials."""
    term = block.terminator
    if not term.successors:
        return []
    if term.name == "cf.br":
        return [(term.successors[0].block, None)]
    if term.name != "cf.cond_br":
        return None
    if term.successors[0].block is term.successors[1].block:
        return [(term.successors[0].block, None)]
    cmp = term.operands[0].owner
    if not (isinstance(cmp, Op) and cmp.name == "arith.cmpi"):
        return None
    cmp, negated = _through_boolean_tests(cmp)
    x, y = _aside(values, cmp.operands)
    if x is None or y is None:
        return None
    pred, bits = cmp.attrs["pred"], cmp.operands[0].type.bits
    held, failed = (NEGATE[pred], pred) if negated else (pred, NEGATE[pred])
    return [(term.successors[0].block, (held, x, y, bits)), (term.successors[1].block, (failed, x, y, bits))]


def _aside(values: LoopValues, operands: list[Value]) -> list[Poly | None]:
    """The operands of an entry test as polynomials, leaving no symbol behind: the test only
    decides how the loop is read, so a live-in it alone reads (one no local may hold at the
    candidate's entry) must not become one of the kernel's."""
    symbols, memo, floors = dict(values.symbols), dict(values.memo), dict(values.floor_symbols)
    try:
        return [values.expr(v) for v in operands]
    finally:
        values.symbols, values.memo, values.floor_symbols = symbols, memo, floors


def entry_guards(values: LoopValues, loop: LoopInfo) -> list[tuple[object, Op, bool]]:
    """The tests in front of ``loop`` that decide whether it runs at all, nearest first:
    (the test's block, the compare, whether the way to the loop is taken when it holds),
    up a chain of blocks of one predecessor each that only compute pure values, and past a
    join to the test every path to it passes (:func:`dominating_test`)."""
    facts = values.facts
    block = next(p for p in facts.preds[loop.header] if p not in facts.bodies[loop])
    out = []
    while all(op.opdef.pure or op.name == "mem.load" for op in block.ops[:-1]):
        guard, via = (
            (facts.preds[block][0], block) if len(facts.preds[block]) == 1 else dominating_test(values, block)
        )
        if guard not in values.body:
            break
        term = guard.terminator
        if term.name == "cf.cond_br" and term.successors[0].block is not term.successors[1].block:
            cmp = term.operands[0].owner
            if not (isinstance(cmp, Op) and cmp.name == "arith.cmpi"):
                break
            cmp, negated = _through_boolean_tests(cmp)
            if via is not None:
                out.append((guard, cmp, (term.successors[0].block is via) != negated))
        elif term.name != "cf.br":
            break
        block = guard
    return out


def dominating_test(values: LoopValues, block) -> tuple[object | None, object | None]:
    """(the immediate dominator of the join ``block``, the side of its two-way branch that
    every path to ``block`` takes, or None where both sides reach it), or (None, None) where
    that dominator is outside the candidate loop or ends in no two-way branch. Reaching
    ``block`` passes neither the dominator again nor the header of a loop holding it (that
    would be the next iteration). clang joins a peeled step and the path around it in front
    of an unrolled loop (symm's initialisation): the tests in front of that join hold on
    both paths."""
    facts = values.facts
    dominator = facts.idom.get(block)
    if dominator is None or dominator not in values.body:
        return None, None
    term = dominator.terminator
    if term.name != "cf.cond_br" or term.successors[0].block is term.successors[1].block:
        return None, None
    around = {m.header for m in values.nested if dominator in facts.bodies[m]}
    reaching = [
        succ.block for succ in term.successors
        if _reaches(facts, values.body, succ.block, block, {dominator} | around)
    ]  # fmt: skip
    return dominator, reaching[0] if len(reaching) == 1 else None


def _reaches(facts, body: set, start, target, avoid: set) -> bool:
    """``target`` is reachable from ``start`` inside ``body`` without entering ``avoid``."""
    seen, todo = set(), [start]
    while todo:
        block = todo.pop()
        if block is target:
            return True
        if block in seen or block in avoid or block not in body:
            continue
        seen.add(block)
        todo.extend(succ.block for succ in block.terminator.successors)
    return False


def incoming(facts: FunctionLoops, value: Value) -> list[tuple[Block, Value]]:
    """What each edge into the block of the block argument ``value`` passes it, with the
    edge's predecessor (an edge per successor entry: a ``br_table`` may name it twice)."""
    block = value.owner
    return [
        (pred, succ.args[value.index])
        for pred in facts.preds[block]
        for succ in pred.terminator.successors
        if succ.block is block
    ]


def exit_merge(values: LoopValues, value: Value) -> Poly | None:
    """A merge of a value at an inner loop's exit and the value the loop's entry test passes
    when it skips the loop, as one polynomial. A "!=" test lets the loop go only when its
    counter equals its bound, so its last iteration is ``(bound - start) / step`` (where
    that division is exact), and a value ``a + b * k`` of it is ``a + b * last`` there; the
    skipping path must pass that value at ``last = -1``, where the exit test (equivalent to
    the entry test) lets the loop go before its first iteration. clang joins an unrolled
    loop and the path around it so, to start the remainder loop. The last iteration is the
    integers' only where the runtime guards check the bounds do not wrap (they move with
    the enclosing counters) or they are numbers; the counter itself is its bound however
    it wraps. None where the merge is not of that form."""
    facts, block = values.facts, value.owner
    edges = incoming(facts, value)
    for _, v in edges:
        loop = next(
            (m for m in reversed(values.nested) if m is not values.info
             and (facts.def_block.get(v) in facts.bodies[m] or facts.def_block.get(v) in _after(facts, m))
             and block not in facts.bodies[m]),
            None,
        )  # fmt: skip
        if loop is not None:
            break
    else:
        return None
    try:
        trip = trip_count(values, loop)
    except Reject:
        return None
    # (Read without the ways through joins: the skipping edges below must be the guards'
    # own, where the exit test lets the loop go before its first iteration.)
    guarded = guarded_as_top(values, loop, trip, through_joins=False)
    if trip.pred != "ne" or trip.top or not guarded.top:
        return None
    k = values.counter(loop)
    split = values.expr(v).split(k) if values.expr(v) is not None else None
    if split is None or any(k in p.leaves() for p in split):
        return None
    rest, slope = split
    if rest + slope * Poly.symbol(k) == trip.start + Poly.symbol(k).scale(trip.step):
        exit_value = trip.bound  # the counter itself
    else:
        distance = trip.bound - trip.start
        enclosing = set(values.counters.values()) - {k}
        if any(c % trip.step for c in distance.terms.values()) or not (
            distance.leaves() & enclosing or (distance.is_constant() and distance.constant * trip.step >= 0)
        ):
            return None
        last = Poly({m: c // trip.step for m, c in distance.terms.items()})
        exit_value = rest + slope * last
    guard_blocks = {guard for guard, *_ in entry_guards(values, loop)}
    for pred, w in edges:
        if w is v:
            continue
        if pred not in guard_blocks or values.expr(w) != rest - slope:
            return None
    return exit_value


def _after(facts, loop: LoopInfo) -> set:
    """The blocks right after ``loop``'s exit that only it reaches: a value computed there
    from the loop's values is still one of its last iteration."""
    out = set()
    for block, term in facts.exits(loop):
        for succ in term.successors:
            if succ.block not in facts.bodies[loop] and facts.preds[succ.block] == [block]:
                out.add(succ.block)
    return out
