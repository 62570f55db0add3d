"""Exact dependences on the polyhedral model of a loop nest, with isl.

The candidate loop's iterations and those of the loops inside it form an integer set, the
*iteration domain*: the candidate's counter ``k`` in ``[0, T)`` for a trip count ``T``
left free (any count the runtime finds), each inner loop's counter from 0 while its exit
test holds. An inner loop whose bounds do not move with the counters around it runs a free
number of times ``N`` (again any count); one whose bounds do (a triangular or trapezoidal
nest) keeps its test as a constraint, ``start + step*j < bound`` and the like, over
mathematical integers: the runtime guards check, at the corners of the enclosing counters'
box, that those bounds lie in the range of the compare (so nothing wraps anywhere in the
box, bounds being affine). A loop tested at its bottom runs ``j = 0`` unconditionally, which
over-approximates one skipped by a test in front of it. The blocks after a loop's exit
test in the middle of its body (clang's unrolled-by-two loop for an odd count) have a
domain of their own: iteration ``j`` runs them exactly where iteration ``j + 1`` runs. A
block that every way to it inside the candidate reaches past a test taking one side (clang's
remainder of a loop unrolled by two, run only where the count is odd: ``(i & 1) != 0``) runs
only where those tests hold; a test of the counters alone, affine or quasi-affine, whose
operands lie in its compare's range over every counter value, narrows its accesses'
domains (:meth:`NestModel.path_tests`). The live-in values (base pointers, sizes) are
parameters, one per monomial of them.

For a store ``S`` and another access ``A`` of the body, each over the domain of the loops
around it, the *dependence* is the set of pairs of iterations, of different candidate
iterations, whose byte ranges meet: ``-width_S < addr_S(x) - addr_A(y) < width_A``.

- Empty: the pair never conflicts, whatever the parameters: the guards need not test it.
- Non-empty for every parameter value for which ``S`` and ``A`` run in two different
  iterations at all: the loop is sequential by proof (a time-step loop writes the same
  addresses in every iteration; a recurrence reads what the previous one wrote). A guard
  could only ever refuse it, so it is rejected now, and may enclose a device-resident
  region (:mod:`.regions`).

Anything else (a conflict that depends on the parameters, such as two base pointers that
may be equal: such pairs are not even modelled) is left to the runtime guards. A pair whose addresses or bounds are not
affine with constant coefficients in the counters, or that is read after an inner loop at
its exit value, is not modelled at all.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import Reject
from tensorwasm.compiler.analysis.poly import Poly, Symbol
from tensorwasm.support.lazy import LazyModule

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues
    from tensorwasm.compiler.analysis.plan import Access, TripCount
    from tensorwasm.compiler.analysis.privatise import Temporary
    from tensorwasm.compiler.analysis.trips import Test
    from tensorwasm.dialect.ir import Block, LoopInfo

isl = LazyModule("islpy", globals(), "isl")  # loaded by the first nest modelled

# The exit test that keeps a loop going, as a relation between its counter's value and
# its bound in mathematical integers (a "!=" test goes the way its step does).
_KEEPS = {"slt": "<", "ult": "<", "sle": "<=", "ule": "<=", "sgt": ">", "ugt": ">", "sge": ">=",
          "uge": ">=", "eq": "="}  # fmt: skip


class _NotAffine(Exception):
    """A polynomial with a product of counters, or of a counter and a live-in."""


class NestModel:
    """The iteration domain of one candidate loop and its accesses, as isl sets."""

    def __init__(
        self, values: LoopValues, trip: TripCount, inner: list[tuple[Symbol, TripCount]], fixed: bool = True
    ):
        self.values = values
        self.info = values.info
        self.trips = {values.counter(values.info): trip, **dict(inner)}
        self.counters = set(self.trips)
        self.params: dict[tuple, str] = {}
        self.names = {sym: f"c{n}" for n, sym in enumerate(sorted(self.trips, key=lambda s: s.order))}
        # A count known statically bounds the domain (PolyBench's sizes are numbers); the
        # proof that a loop is sequential keeps it free (``fixed`` false): that proof must
        # hold for every count, its domains being over-approximated.
        known = constant_count(trip) if fixed else None
        self.count = "T" if known is None else str(known)
        # The inner loops' counts known statically, as the candidate's (where ``fixed``).
        self.known = {sym: constant_count(t) for sym, t in inner} if fixed else {}
        self._paths: dict[tuple, list[Test]] = {}

    # -- affine text ----------------------------------------------------------------------

    def affine(self, poly: Poly, prefix: str) -> str:
        """``poly`` as isl text, counters as ``prefix`` + name, other monomials as parameters."""
        parts = []
        for monomial, coeff in poly.terms.items():
            counters = [s for s in monomial if s.leaves() & self.counters]
            if counters and len(monomial) > 1:
                raise _NotAffine
            if not monomial:
                parts.append(str(coeff))
                continue
            if counters and counters[0].kind == "floor":  # quasi-affine: isl's own floor
                inner, divisor = counters[0].ref
                name = f"floor(({self.affine(inner, prefix)})/{divisor})"
            elif counters:
                name = prefix + self.names[counters[0]]
            else:
                key = tuple(s.order for s in monomial)
                name = self.params.setdefault(key, f"p{len(self.params)}")
            parts.append(f"{coeff}*{name}")
        return " + ".join(parts) or "0"

    # -- domains --------------------------------------------------------------------------

    def loops_around(self, access: Access) -> list[LoopInfo]:
        """The loops of the nest around ``access``, outermost first."""
        block = access.op.block
        bodies = self.values.facts.bodies
        return [m for m in self.values.nested if block in bodies[m] and self.values.counter(m) in self.trips]

    def constraints(self, loops: list[LoopInfo], prefix: str, block: Block | None = None) -> list[str]:
        """The domain of the loops ``loops`` (outermost first) in variables named ``prefix``,
        of ``block`` where given: after a loop's exit test in the middle of its body, the
        iterations ``k`` where ``k + 1`` is in the loop's domain (:func:`.trips.in_tail`)."""
        from tensorwasm.compiler.analysis.trips import in_tail

        out = []
        for loop in loops:
            sym = self.values.counter(loop)
            var = prefix + self.names[sym]
            trip = self.trips[sym]
            after = block is not None and in_tail(self.values.facts, loop, block)
            nxt = f"({var} + 1)" if after else var
            if loop is self.info:
                out.append(f"0 <= {var} and {nxt} < {self.count}")
                continue
            moving = (trip.start.leaves() | trip.bound.leaves()) & self.counters
            if not moving:
                known = self.known.get(sym)
                out.append(f"0 <= {var} and {nxt} < {known if known is not None else 'N' + self.names[sym]}")
                continue
            keep = _KEEPS.get(trip.pred) or ("<" if trip.step > 0 else ">")
            bound = self.affine(trip.bound, prefix)
            start = self.affine(trip.start, prefix)
            at = f"{start} + {trip.step}*{nxt}"
            if trip.top:
                out.append(f"{var} >= 0 and {at} {keep} {bound}")
            else:  # iteration j runs when the test after iteration j - 1 held
                out.append(f"{var} >= 0 and ({nxt} = 0 or {at} + {-trip.step} {keep} {bound})")
        return out

    def path_tests(self, block: Block, loops: list[LoopInfo]) -> list[Test]:
        """The tests that hold wherever ``block`` runs, as ``(pred, x, y, bits)``: up the
        dominators of ``block`` to the candidate's header, each two-way branch only one of
        whose sides reaches it (:func:`.trips.dominating_test`), where the compare reads the
        counters of ``loops`` alone and its operands lie in its range over every counter
        value the guards let run (so the wrapped compare is the integers')."""
        key = (block, tuple(loops))
        found = self._paths.get(key)
        if found is None:
            found = self._paths[key] = self._path_tests(block, {self.values.counter(m) for m in loops})
        return found

    def _path_tests(self, block: Block, counters: set) -> list[Test]:
        from tensorwasm.compiler.analysis.trips import NEGATE, _aside, _through_boolean_tests, dominating_test
        from tensorwasm.dialect.ir import Op

        values, out = self.values, []
        while block is not self.info.header:
            dominator = values.facts.idom.get(block)
            if dominator is None or dominator not in values.body:
                break
            _, via = dominating_test(values, block)
            cmp = dominator.terminator.operands[0].owner if via is not None else None
            if isinstance(cmp, Op) and cmp.name == "arith.cmpi":
                cmp, negated = _through_boolean_tests(cmp)
                holds = (dominator.terminator.successors[0].block is via) != negated
                x, y = _aside(values, cmp.operands)
                if x is not None and y is not None and all(s in counters for s in x.leaves() | y.leaves()):
                    pred = cmp.attrs["pred"] if holds else NEGATE[cmp.attrs["pred"]]
                    test = (pred, x, y, cmp.operands[0].type.bits)
                    if _in_range(self, sorted(counters, key=lambda s: s.order), test):
                        out.append(test)
            block = dominator
        return out

    def _test(self, test: Test, prefix: str) -> str:
        pred, x, y, _ = test
        return f"({self.affine(x, prefix)}) {_RELATION[pred]} ({self.affine(y, prefix)})"

    def pair(self, store: Access, other: Access) -> tuple[object, object] | None:
        """(pairs of iterations in different candidate iterations running both accesses,
        those of them whose byte ranges meet), or None where the pair is not modelled."""
        k = self.names[self.values.counter(self.info)]
        return self.related(store, other, f"x{k} != y{k}")

    def var(self, loop: LoopInfo, prefix: str) -> str:
        """The variable of ``loop``'s counter on the store's (``x``) or the access's (``y``) side."""
        return prefix + self.names[self.values.counter(loop)]

    def related(self, store: Access, other: Access, relation: str) -> tuple[object, object] | None:
        """(pairs of iterations running both accesses and satisfying ``relation``, a constraint
        between the store's counters ``x...`` and the access's ``y...``; those of them whose
        byte ranges meet), or None where the pair is not modelled."""
        if store.address is None or other.address is None or store.beyond or other.beyond:
            return None
        if (store.address - other.address).leaves() - self.counters:
            return None  # apart by live-in values (two base pointers): only the guards can say
        try:
            outer_s, outer_a = self.loops_around(store), self.loops_around(other)
            if not outer_s or outer_s[0] is not self.info or not outer_a or outer_a[0] is not self.info:
                return None
            cons = self.constraints(outer_s, "x", store.op.block) + self.constraints(
                outer_a, "y", other.op.block
            )
            cons += [self._test(t, "x") for t in self.path_tests(store.op.block, outer_s)]
            cons += [self._test(t, "y") for t in self.path_tests(other.op.block, outer_a)]
            diff = f"({self.affine(store.address, 'x')}) - ({self.affine(other.address, 'y')})"
        except _NotAffine:
            return None
        variables = [f"x{self.names[self.values.counter(m)]}" for m in outer_s]
        variables += [f"y{self.names[self.values.counter(m)]}" for m in outer_a]
        free = sorted(
            {f"N{self.names[self.values.counter(m)]}" for m in outer_s + outer_a if m is not self.info}
            | set(self.params.values())
            | {"T"}
        )
        head = f"[{', '.join(free)}] -> {{ [{', '.join(variables)}] : "
        both = " and ".join(cons) + f" and {relation}"
        context = _context()
        pairs = isl.Set(head + both + " }", context=context)
        meet = isl.Set(
            head + both + f" and {diff} > -{store.width} and {diff} < {other.width} }}", context=context
        )
        return pairs, meet


class _TestModel(NestModel):
    """The counters of the loops around one inner loop, for :func:`same_test`."""

    def __init__(self, values: LoopValues, counters: list[Symbol]):
        self.values = values
        self.info = values.info
        self.counters = set(counters)
        self.params = {}
        self.names = {sym: f"c{n}" for n, sym in enumerate(counters)}


# The largest value of a counter: the guards refuse a loop of more iterations than 2^31 - 1.
_COUNTER_MAX = (1 << 31) - 2
# The compare predicates as relations between mathematical integers.
_RELATION = {"eq": "=", "ne": "!=", "slt": "<", "ult": "<", "sle": "<=", "ule": "<=", "sgt": ">", "ugt": ">",
             "sge": ">=", "uge": ">="}  # fmt: skip


def same_test(values: LoopValues, loop: LoopInfo, tests: list[tuple], b: tuple) -> bool:
    """Whether integer compares ``(pred, x, y, bits)``, all of ``tests`` together and ``b``,
    hold on exactly the same iterations of the loops around inner ``loop`` (the candidate's included), as Wasm
    computes them: proven with isl over every counter value the guards let run (up to
    2^31 - 2; a candidate loop whose count is a number, PolyBench's sizes, up to that count)
    and every value of the live-ins, where for every one of them both compares' operands
    lie in the range their predicate reads (so the wrapped values are the integers), or
    else on the wrapped values (:func:`same_wrapped`); False where anything is not
    modelled."""
    counters, outer = [], loop.parent
    while outer is not None and outer in values.nested:
        counters.insert(0, values.counter(outer))
        outer = outer.parent
    every = [*tests, b]
    polys = [p for test in every for p in test[1:3]]
    if any(p.leaves() & set(values.counters.values()) - set(counters) for p in polys):
        return False
    last = {c: _COUNTER_MAX for c in counters}
    if values.counter(values.info) in last:
        last[values.counter(values.info)] = _candidate_last(values)
    return _same_in_range(values, counters, every, last) or same_wrapped(tests, b, last)


def _same_in_range(values: LoopValues, counters: list[Symbol], every: list[tuple], last: dict) -> bool:
    """:func:`same_test` where every compare's operands lie in its predicate's range."""
    polys = [p for test in every for p in test[1:3]]
    model = _TestModel(values, counters)
    try:
        texts = [model.affine(p, "x") for p in polys]
    except _NotAffine:
        return False
    variables = ", ".join(f"x{model.names[c]}" for c in counters)
    domain = " and ".join(f"0 <= x{model.names[c]} <= {last[c]}" for c in counters) or "true"
    head = f"[{', '.join(sorted(model.params.values()))}] -> {{ [{variables}] : {domain}"
    relations = [(test[0], test[3], texts[2 * n], texts[2 * n + 1]) for n, test in enumerate(every)]
    context = _context()
    context.reset_operations()
    try:
        whole = isl.Set(head + " }", context=context)
        if not whole.is_subset(isl.Set(f"{head} and {_read_ranges(relations)} }}", context=context)):
            return False
        conditions = [f"{x} {_RELATION[pred]} {y}" for pred, _, x, y in relations]
        entered = isl.Set(f"{head} and {' and '.join(conditions[:-1])} }}", context=context)
        return entered.is_equal(isl.Set(f"{head} and {conditions[-1]} }}", context=context))
    except isl.Error:
        return False


def _read_ranges(relations: list[tuple[str, int, str, str]]) -> str:
    """Both operands of each compare ``(pred, bits, x, y)`` (isl text) in the range its
    predicate reads, as one condition."""
    out = []
    for pred, bits, x, y in relations:
        lo, hi = (0, (1 << bits) - 1) if pred.startswith("u") else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        out += [f"{lo} <= {x} <= {hi}", f"{lo} <= {y} <= {hi}"]
    return " and ".join(out)


def _in_range(model: NestModel, counters: list[Symbol], test: Test) -> bool:
    """Whether both operands of compare ``test`` (of the ``counters`` alone) lie in the range
    its predicate reads for every counter value up to the guards' largest."""
    pred, x, y, bits = test
    try:
        relation = (pred, bits, model.affine(x, "x"), model.affine(y, "x"))
    except _NotAffine:
        return False
    variables = ", ".join(f"x{model.names[c]}" for c in counters)
    domain = " and ".join(f"0 <= x{model.names[c]} <= {_COUNTER_MAX}" for c in counters) or "true"
    head = f"{{ [{variables}] : {domain}"
    context = _context()
    try:
        whole = isl.Set(head + " }", context=context)
        return whole.is_subset(isl.Set(f"{head} and {_read_ranges([relation])} }}", context=context))
    except isl.Error:
        return False


def _candidate_last(values: LoopValues) -> int:
    """The candidate loop's last counter value: its count less one where that is a number
    (the counter never goes past it), else the guards' largest."""
    from tensorwasm.compiler.analysis.trips import trip_count

    try:
        known = constant_count(trip_count(values, values.info))
    except Reject:
        known = None
    return _COUNTER_MAX if known is None or known < 1 else min(known - 1, _COUNTER_MAX)


def same_clauses(values: LoopValues, loop: LoopInfo, clauses: list[list[list[Test]]], own: Test) -> bool:
    """Whether the nearest clauses (each true where one of its alternatives holds, each
    alternative a conjunction of tests) hold exactly where ``own`` does, wherever the
    clauses further up hold: the loop is entered only where all hold, so its count read at
    its top is the rotated loop's wherever it runs, and zero where the nearest ones skip it
    (further up, it is skipped with all the code around it). Proven for every value of the
    live-ins as the code before the candidate computes them (:func:`.merges._opened`), the
    counters of the loops around ``loop`` up to the largest the guards let run, and where
    the candidate's own count is one the guards let run (:func:`_launched`), as Wasm
    computes them (:class:`_Wrapped`); False where something is not modelled."""
    from tensorwasm.compiler.analysis.merges import _opened

    wide = values.unbounded

    def opened(test: Test) -> Test:
        pred, x, y, bits = test
        return pred, _opened(wide, x), _opened(wide, y), bits

    model = _Wrapped()
    try:
        parts = []  # (condition text, its existentials): texts first, so every name is made
        for alternatives in clauses:
            for tests in alternatives:
                model.wraps = []
                parts.append((model.holds([opened(t) for t in tests]), model.wraps))
        model.wraps = []
        parts.append((model.holds([opened(own)]), model.wraps))
        model.wraps = []
        launched = _launched(values, model, _opened)
        parts.append((launched, model.wraps))
    except _NotAffine:
        return False
    last = {}
    outer = loop.parent
    while outer is not None and outer in values.nested:
        counter = values.counter(outer)
        last[counter] = _candidate_last(values) if outer is values.info else _COUNTER_MAX
        outer = outer.parent
    bounds = " and ".join(
        f"0 <= {model.names[model.key((c,))]} <= {n}" for c, n in last.items() if model.key((c,)) in model.names
    ) or "true"  # fmt: skip
    _context().reset_operations()
    try:
        sets = []
        for condition, wraps in parts:
            model.wraps = wraps
            sets.append(model.set(condition, bounds))
        *tested, kept, context = sets
        held, n = [], 0  # each clause's set: the union of its alternatives'
        for alternatives in clauses:
            either = tested[n]
            for more in tested[n + 1 : n + len(alternatives)]:
                either = either.union(more)
            n += len(alternatives)
            held.append(either)
        for n in range(1, len(held) + 1):
            near, far = context, context
            for either in held[:n]:
                near = near.intersect(either)
            for either in held[n:]:
                far = far.intersect(either)
            if near.intersect(far).is_equal(kept.intersect(far)):
                return True
        return False
    except isl.Error:
        return False


def _launched(values: LoopValues, model, opened) -> str:
    """The candidate's count as one the guards let run, in ``model``'s text: for a "!="
    test, the distance its counter goes a multiple of its step, at most
    :data:`_COUNTER_MAX` steps past its first iteration; "true" for other tests, or
    where its count is not known."""
    from tensorwasm.compiler.analysis.trips import trip_count

    try:
        trip = trip_count(values, values.info)
    except Reject:
        return "true"
    if trip.pred != "ne":
        return "true"
    wide = values.unbounded
    step = abs(trip.step)
    distance = opened(wide, trip.bound) - opened(wide, trip.start)
    if trip.step < 0:
        distance = distance.scale(-1)
    n = len(model.wraps)
    wrap, steps = f"q{n}", f"q{n + 1}"
    model.wraps += [wrap, steps]
    most = _COUNTER_MAX + 1 if trip.top else _COUNTER_MAX
    return f"({model.text(distance)}) - {1 << trip.bits}*{wrap} = {step}*{steps} and 0 <= {steps} <= {most}"


def constant_count(trip: TripCount) -> int | None:
    """The trip count of a loop whose start and bound are numbers in the range of its
    compare (PolyBench's sizes are), counting up or down by a "!=" or an ordered test, as
    the guards would find it; None otherwise."""
    if not (trip.start.is_constant() and trip.bound.is_constant()):
        return None
    start, bound, step = trip.start.constant, trip.bound.constant, trip.step
    half = 1 << (trip.bits - 1)
    lo, hi = (0, 2 * half) if trip.pred.startswith("u") else (-half, half)
    if not (lo <= start < hi and lo <= bound < hi):
        return None
    distance = (bound - start) * (1 if step > 0 else -1)
    if trip.pred == "ne":
        if distance < 0 or distance % abs(step):
            return None
        exit_k = distance // abs(step)
    elif (trip.pred[1:] in ("lt", "le") and step > 0) or (trip.pred[1:] in ("gt", "ge") and step < 0):
        exit_k = max(0, -(-(distance + (trip.pred[1:] in ("le", "ge"))) // abs(step)))
    else:
        return None
    return exit_k if trip.top else exit_k + 1


# isl operations one pair may take before it is left to the guards (deep nests with many
# parameters can make the projections expensive; a typical pair takes a few thousand).
MAX_OPERATIONS = 200_000


@functools.cache
def _context() -> object:
    """The isl context of the analysis, with the bound on operations."""
    context = isl.Context()
    context.set_max_operations(MAX_OPERATIONS)
    return context


def exact_dependences(
    values: LoopValues, trip: TripCount, inner: list[tuple[Symbol, TripCount]], accesses: list[Access],
    settled: set[tuple[int, int]],
) -> tuple[list[tuple[int, int]], list[Temporary]]:  # fmt: skip
    """The store/access index pairs (not in ``settled``) proven never to meet across
    iterations, and the privatisable temporaries (:mod:`.privatise`) that every pair
    meeting in every launch lies within; :class:`Reject` where a pair meets in every
    launch of two iterations or more outside a temporary."""
    model = NestModel(values, trip, inner)
    loose = NestModel(values, trip, inner, fixed=False) if model.count != "T" else model
    free: list[tuple[int, int]] = []
    temporaries: dict[int, Temporary | None] = {}  # store -> the temporary it writes
    for i, store in enumerate(accesses):
        if not store.store:
            continue
        for j, other in enumerate(accesses):
            if (i, j) in settled:
                continue
            _context().reset_operations()
            try:
                modelled = model.pair(store, other)
                if modelled is None:
                    continue
                pairs, meet = modelled
                independent = meet.is_empty()
                if not independent and loose is not model:
                    pairs, meet = loose.pair(store, other)
                always = not independent and pairs.params().is_subset(meet.params())
            except isl.Error:  # over the bound on operations: left to the guards
                continue
            if independent:
                free.append((i, j))
            elif always and not _within_temporary(loose, accesses, i, j, temporaries):
                what = "writes" if other.store else "reads"
                raise Reject(
                    f"sequential: store at {store.where} writes what another iteration {what} "
                    f"({other.kind} at {other.where}) on every launch (isl)"
                )
    return free, list(dict.fromkeys(t for t in temporaries.values() if t is not None))


def _within_temporary(
    model: NestModel, accesses: list[Access], i: int, j: int, temporaries: dict[int, Temporary | None]
) -> bool:
    """Whether store ``i`` and access ``j`` both belong to a privatisable temporary
    (:mod:`.privatise`): their dependence across iterations goes with a copy per iteration.
    ``temporaries`` keeps each store's answer."""
    from tensorwasm.compiler.analysis.privatise import temporary_of  # (it builds on this module)

    if i not in temporaries:
        temporaries[i] = next((t for t in temporaries.values() if t is not None and i in t.stores), None)
        if temporaries[i] is None:
            temporaries[i] = temporary_of(model, accesses, i)
    temporary = temporaries[i]
    return temporary is not None and j in temporary.accesses


class _Wrapped:
    """Compares as Wasm computes them, in isl text: every symbol stands for any integer
    congruent to its value (each polynomial must not depend on which: every floor ``c *
    floor(x / d)`` alone in its term with ``d`` dividing ``c``), and each compare reads its
    operands wrapped into its predicate's range. Products of symbols are variables of
    their own (losing facts, never adding one); :class:`_NotAffine` where a floor sits in a
    product."""

    def __init__(self):
        self.names: dict[tuple, str] = {}
        self.wraps: list[str] = []

    @staticmethod
    def key(monomial: tuple) -> tuple:
        return tuple((s.kind, id(s.ref)) for s in sorted(monomial, key=lambda s: (s.kind, id(s.ref))))

    def text(self, poly: Poly) -> str:
        parts = []
        for monomial, coeff in poly.terms.items():
            floors = [s for s in monomial if s.kind == "floor"]
            if floors and (len(monomial) > 1 or coeff % floors[0].ref[1]):
                raise _NotAffine
            if not monomial:
                parts.append(str(coeff))
            elif floors:
                inner, divisor = floors[0].ref
                parts.append(f"{coeff}*floor(({self.text(inner)})/{divisor})")
            else:
                parts.append(f"{coeff}*{self.names.setdefault(self.key(monomial), f'v{len(self.names)}')}")
        return " + ".join(parts) or "0"

    def holds(self, tests: list[tuple]) -> str:
        """The conjunction of ``tests`` (``(pred, x, y, bits, ...)``), existentials in :attr:`wraps`."""
        conditions = []
        for pred, x, y, width, *_ in tests:
            lo, hi = (0, (1 << width) - 1) if pred[0] in "ue" or pred == "ne" else (
                -(1 << (width - 1)), (1 << (width - 1)) - 1)  # fmt: skip
            n = len(self.wraps)
            wx, wy = f"({self.text(x)}) - {1 << width}*q{n}", f"({self.text(y)}) - {1 << width}*q{n + 1}"
            self.wraps += [f"q{n}", f"q{n + 1}"]
            conditions.append(
                f"{lo} <= {wx} <= {hi} and {lo} <= {wy} <= {hi} and {wx} {_RELATION[pred]} {wy}"
            )
        return " and ".join(conditions) or "true"

    def set(self, condition: str, bounds: str = "true") -> object:
        variables = ", ".join(self.names.values())
        where = f"exists ({', '.join(self.wraps)}: {condition})" if self.wraps else condition
        return isl.Set(f"{{ [{variables}] : {bounds} and {where} }}", context=_context())


def equal_where(tests: list[tuple], a: Poly, b: Poly, bits: int) -> bool:
    """Whether ``a`` and ``b`` are equal modulo 2^bits wherever the compares ``tests``
    (``(pred, x, y, bits, ...)``, each holding) hold, as Wasm computes them (see
    :class:`_Wrapped`); False where something is not modelled, or isl gives up."""
    model = _Wrapped()
    try:
        goal = f"exists (r: ({model.text(a)}) - ({model.text(b)}) = {1 << bits}*r)"
        held = model.holds(tests)
    except _NotAffine:
        return False
    _context().reset_operations()
    try:
        tested = model.set(held)
        model.wraps = []
        return tested.is_subset(model.set(goal))
    except isl.Error:
        return False


def same_wrapped(tests: list[tuple], own: tuple, last: dict[Symbol, int]) -> bool:
    """Whether the compares ``tests`` together and ``own`` hold on exactly the same values,
    as Wasm computes them (wrapped, see :class:`_Wrapped`), for counters ``k`` of ``last``
    in ``[0, last[k]]`` and any live-ins; False where something is not modelled."""
    model = _Wrapped()
    try:
        entered = model.holds(tests)
        first = model.wraps
        model.wraps = []
        kept = model.holds([own])
    except _NotAffine:
        return False
    bounds = " and ".join(
        f"0 <= {model.names[model.key((c,))]} <= {n}" for c, n in last.items() if model.key((c,)) in model.names
    ) or "true"  # fmt: skip
    _context().reset_operations()
    try:
        second = model.wraps
        model.wraps = first
        a = model.set(entered, bounds)
        model.wraps = second
        return a.is_equal(model.set(kept, bounds))
    except isl.Error:
        return False
