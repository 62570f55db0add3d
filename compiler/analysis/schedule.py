"""Distribution and interchange: the parallel dimensions of an imperfect nest as the grid.

A loop accepted with several loops in its body (gemm: ``i { j: C *= beta; k { j: C += ... } }``)
would run one thread per iteration, the whole row's work in that thread. Its iterations
are independent (that is why it was accepted), so one iteration's work may be shared by
several threads, provided every byte still sees that iteration's operations in Wasm order.
The launched loop is *distributed* over its child loops: each child is a *phase*; within
an iteration the phases run in program order, separated by a barrier of the block that
runs the iteration (one block per iteration on the GPU; the host runs the phases one after
the other). Within a phase the threads share the iterations of its *grid loop*: the child
itself when it is parallel, or, when the child is sequential (a ``k`` loop around an
update, proven so by isl) with one parallel loop inside, that loop *interchanged* outward:
each thread runs the child's iterations in order and enters the inner loop at its own
iteration only. Each ``C[i][j]`` then sees ``beta`` first, then ``k`` ascending, as in Wasm.

clang -O2 unrolls the j loops of a triangular nest (syrk: ``j <= i``) and leaves remainders:
``C *= beta`` becomes a loop by four up to ``(i + 1) & -4`` and a remainder loop from there,
two phases; the update's j loop inside k becomes a loop by two and, behind a test, one
element more. So:

- a merge after an inner loop that a later part of the body reads (the unrolled loop's end,
  where its remainder starts) is *pinned*: the kernel computes it from its polynomial in the
  launched loop's counter (``LoopPlan.pinned``), so a phase that skips the loop, or leaves
  the grid loop after its own iteration, still has it; a value of an inner loop read after
  it in any other way keeps the loop at one thread per iteration;
- stores of the child outside its grid loop (the remainder element) are the work of its
  *rest* (``Phase.rest``): one more thread, past the grid's iterations, runs the child's
  iterations with those stores and without the grid loop, while the grid's threads leave
  them out. Legal when such a store meets no access of another thread: of the grid loop, of
  the body outside every phase, or of the child before its grid loop (what every thread
  loads there), in any iterations; and the child carries only counted values, so every
  thread sees the same ones.

A body that stores outside its child loops (correlation: ``i { corr[i][i] = 1; j > i { ...
} }``) gets a phase of its own, first (``Phase.statements``): one thread of the row runs
the body with every child loop skipped, and the child loops' phases leave those stores
out. Legal when such a store meets no access of a child loop nor a load outside them (those
run in every thread, in every phase) in the same iteration, in any iterations of the inner
loops: moved ahead of the loops it follows, it is then still unseen by them.

Legal, with isl on the launched loop's iteration domain and within one of its iterations,
when a store of a phase's grid loop

- meets no access of that grid loop in another of its iterations (any iterations of the
  loops between), and
- meets no access of the phase outside the grid loop, nor a load of the launched loop's
  body outside every phase (those run in every thread), in any iteration.

The pair is modelled within one iteration of the launched loop: a row offset that is its
counter times a size (``i * n``: the sweeps of a grid, where clang's vector loop and its
scalar remainder are two phases over the row) is the same value for both accesses, one
parameter (:class:`_RowModel`). A pair that meets only for some values of the sizes and live-ins, or that isl cannot model
because two base pointers (live-ins) separate it, becomes a guard (``LoopPlan.row_guarded``:
their byte ranges apart within one iteration); any other pair it cannot model, or one
that meets whatever the values, keeps the loop at one thread per iteration. So does a body that
may trap (a barrier waits for every thread of the block; a division
by a constant that is neither 0 nor, for ``div_s``, -1 cannot), has a
gathered load or a reduction, or a child whose values are read after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import FunctionLoops, Reject
from tensorwasm.compiler.analysis.induction import kernel_computes
from tensorwasm.compiler.analysis.isl import NestModel, _context, isl
from tensorwasm.compiler.analysis.plan import LoopPlan, LoopReport, Phase, TripCount
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.compiler.analysis.trips import exits_mid_body
from tensorwasm.dialect import arith
from tensorwasm.dialect.types import I32, I64

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues
    from tensorwasm.dialect.ir import Block, LoopInfo, Value

# Exit tests the kernel can count in advance: the bounds may move with the launched loop's
# counter ("!=" only by steps of one where they do: a larger step's count needs the guards'
# divisibility test, which sees only the corners of the box).
COUNTED = frozenset({"slt", "ult", "sle", "ule", "sgt", "ugt", "sge", "uge", "ne"})


def schedule_phases(
    facts: FunctionLoops, reports: list[LoopReport], kept: dict[LoopInfo, LoopValues]
) -> None:
    """Distribute each accepted loop of ``reports`` (one function's) whose body is loops
    over its phases, where legal, and say so in its reason."""
    by_loop = {r.loop: r for r in reports}
    for report in reports:
        plan = report.plan
        if (
            plan is None
            or plan.reductions
            or plan.collapse
            or plan.gathers
            or plan.phases
            or plan.loop not in kept
        ):
            continue
        if plan.private:  # (a copy per thread: the threads of a row would share one iteration's)
            continue
        if plan.vector_ivs:  # (the phase kernel computes no v128 induction variable)
            continue
        try:
            phases, guarded, pinned = _phases(facts, plan, by_loop, kept[plan.loop])
        except Reject:
            continue  # one thread per iteration, as before
        plan.phases, plan.row_guarded, plan.pinned = phases, guarded, pinned
        names = [
            "the statements outside them"
            if p.statements
            else f"+0x{p.grid.offset:x}"
            + (f" inside +0x{p.loop.offset:x}" if p.grid is not p.loop else "")
            + (" and its rest" if p.rest else "")
            for p in phases
        ]
        report.reason += f"; distributed: {len(phases)} phase(s) of a 2-D grid over " + ", ".join(names)


def _phases(
    facts: FunctionLoops, plan: LoopPlan, by_loop: dict[LoopInfo, LoopReport], values: LoopValues
) -> tuple[tuple[Phase, ...], list[tuple[int, int]], tuple[tuple[Value, Poly], ...]]:
    loops = facts.func.loops
    children = [m for m in loops if m.parent is plan.loop]
    if not children:
        raise Reject("no inner loop")
    check_body(facts, plan, values)
    inside = set().union(*(facts.bodies[c] for c in children))
    # The body stores outside its child loops: a phase of one thread.
    statements = any(op.name == "mem.store" for block in plan.blocks - inside for op in block.ops)
    phases = []
    pins: dict[Value, Poly] = {}
    for child in children:
        grid = _grid_loop(facts, child, by_loop, loops)
        counter = values.counter(grid)
        trip = grid_trip(facts, plan, values, grid)
        exits = (exit_block(facts, child), exit_block(facts, grid))
        if any(b is None or b not in plan.blocks for b in exits):
            raise Reject("an inner loop with more than one way out")
        if sum(p not in facts.bodies[child] for p in facts.preds[child.header]) != 1:
            raise Reject("an inner loop entered from two places")
        for block in exits:  # what the loop passes on leaving it: pinned where read
            for arg in block.args:
                if facts.users.get(arg):
                    pins[arg] = _pinned(plan, values, arg)
        for loop in {child, grid}:  # its values are not read after it (nor, for the grid, after iteration t)
            pins.update(_escaping(facts, plan, values, loop))
        rest = _rest(facts, plan, child, grid)
        phases.append(
            Phase(child, grid, counter, trip, facts.bodies[child], facts.bodies[grid], *exits, rest)
        )
    pinned = tuple(sorted(pins.items(), key=lambda item: _position(facts, item[0])))
    guarded = _legal(facts, plan, values, phases)
    if statements:  # first: they meet no access of the child loops in the row (_legal)
        outside = plan.blocks - inside
        phases.insert(0, Phase(plan.loop, plan.loop, plan.counter, plan.trip, outside, statements=True))
    return tuple(phases), guarded, pinned


def check_body(facts: FunctionLoops, plan: LoopPlan, values: LoopValues) -> None:
    """:class:`Reject` where the launched loop's body cannot be run in phases: a loop of the
    nest exits in the middle of its body, an op may trap (a barrier waits for every thread),
    or the body has more than one way out."""
    if any(exits_mid_body(facts, m) for m in values.nested):
        raise Reject("a loop whose exit test is in the middle of its body")
    way_out = exit_block(facts, plan.loop)
    for block in plan.blocks:
        for op in block.ops:
            if not harmless(op):
                raise Reject(f"{op.name} may trap")
        if any(s not in plan.blocks and s is not way_out for s in block.successors):
            raise Reject("more than one way out")


def grid_trip(facts: FunctionLoops, plan: LoopPlan, values: LoopValues, grid: LoopInfo) -> TripCount:
    """The trip count of ``grid``, a loop inside the launched one whose iterations threads
    share, each entering it at its own iteration; :class:`Reject` where the kernel cannot
    count it from the launched loop's counter and the live-ins, or it carries a value."""
    trip = dict(plan.inner_trips).get(values.counter(grid))
    if trip is None or trip.pred not in COUNTED or not _toward(trip):
        raise Reject("a grid loop the kernel cannot count")
    moving = {s for s in trip.start.leaves() | trip.bound.leaves() if s.kind == "counter"}
    if moving - {plan.counter} or (moving and trip.pred == "ne" and not _meets_bound(trip)):
        raise Reject("a grid loop whose count moves with the loops inside the launched one")
    if not (kernel_computes(trip.start) and kernel_computes(trip.bound)):
        raise Reject("a grid loop whose bounds hold a floor division the kernel cannot recompute")
    reloaded = {arg for arg, _ in plan.task_reloads}
    for arg in grid.header.args:
        if arg in plan.ivs or arg in plan.invariant_args or arg in reloaded:
            continue
        if _read(facts, arg, facts.bodies[grid]):
            raise Reject("a grid loop carries a value")
    return trip


def _position(facts: FunctionLoops, arg: Value) -> tuple[int, int]:
    """Where a block argument stands in its function (an order that does not depend on sets)."""
    return facts.func.blocks.index(arg.owner), arg.index


def _escaping(facts: FunctionLoops, plan: LoopPlan, values: LoopValues, loop: LoopInfo) -> dict[Value, Poly]:
    """The merges a value of ``loop`` reaches on leaving it, pinned; :class:`Reject` where such
    a value is read otherwise (a thread that skips the loop, or leaves it early, has none)."""
    body = facts.bodies[loop]
    pins = {}
    for block in body:
        for value in _defined(block):
            for op, where in facts.users.get(value, []):
                if where in body:
                    continue
                if where not in plan.blocks or not op.opdef.terminator or value in op.operands:
                    raise Reject(f"a value of the loop at +0x{loop.offset:x} is read after it")
                for succ in op.successors:
                    for arg, passed in zip(succ.block.args, succ.args, strict=True):
                        if passed is value:
                            pins[arg] = _pinned(plan, values, arg)
    return pins


def _pinned(plan: LoopPlan, values: LoopValues, arg: Value) -> Poly:
    """The merge ``arg`` as the polynomial the kernel computes in its place (proven equal to
    what every edge passes: :func:`.trips.exit_merge`, :mod:`.merges`), or :class:`Reject`."""
    poly = values.expr(arg) if arg.type in (I32, I64) and arg.owner.attrs.get("loop") is None else None
    known = {plan.counter} | {sym for _, sym, _, _ in plan.live_ins}
    if poly is None or not kernel_computes(poly) or not poly.leaves() <= known:
        raise Reject("a value of an inner loop is read after it")
    return poly


def _rest(facts: FunctionLoops, plan: LoopPlan, child: LoopInfo, grid: LoopInfo) -> bool:
    """Whether ``child`` stores outside its grid loop (the remainder of an unrolled grid loop):
    that work is one more thread's. Every thread runs ``child``'s iterations with the same
    values only where what its header carries is counted (or fixed), not computed."""
    between = facts.bodies[child] - facts.bodies[grid]
    if grid is child or not any(op.name == "mem.store" for b in between for op in b.ops):
        return False
    for arg in child.header.args:
        if arg not in plan.ivs and arg not in plan.invariant_args and _read(facts, arg, facts.bodies[child]):
            raise Reject(f"the loop at +0x{child.offset:x} carries a value around the stores of its rest")
    return True


def _after(facts: FunctionLoops, phase: Phase) -> set[Block]:
    """The blocks of ``phase``'s loop past its grid loop in an iteration: what they load
    reaches no grid iteration (what the loop carries is counted, :func:`_rest`)."""
    before, work = {phase.grid.header}, [phase.grid.header]
    while work:
        block = work.pop()
        if block is phase.loop.header:
            continue
        for pred in facts.preds[block]:
            if pred in phase.blocks and pred not in before:
                before.add(pred)
                work.append(pred)
    return phase.blocks - phase.grid_blocks - before


def _meets_bound(trip) -> bool:
    """A "!=" test's counter meets its bound wherever it does at one corner of the box the
    guards test: every term of the distance that moves with a counter (floor symbols
    included: clang's ``i & -4`` bound of a loop unrolled by four) is a multiple of the step."""
    step = abs(trip.step)
    return all(
        coeff % step == 0
        for monomial, coeff in (trip.bound - trip.start).terms.items()
        if any(leaf.kind == "counter" for sym in monomial for leaf in sym.leaves())
    )


def _toward(trip) -> bool:
    """The counter moves toward its bound (the kernel counts such loops only)."""
    if trip.pred == "ne":
        return trip.step != 0
    return trip.step > 0 if trip.pred[1:] in ("lt", "le") else trip.step < 0


def _grid_loop(facts: FunctionLoops, child: LoopInfo, by_loop: dict, loops: list) -> LoopInfo:
    """The loop of ``child``'s phase whose iterations the threads share."""
    if _parallel(by_loop.get(child)):
        return child
    inner = [m for m in loops if m.parent is child]
    if len(inner) != 1 or not _parallel(by_loop.get(inner[0])):
        raise Reject(f"the loop at +0x{child.offset:x} has no parallel loop to spread")
    return inner[0]


def _parallel(report: LoopReport | None) -> bool:
    return (
        report is not None
        and report.plan is not None
        and not report.plan.reductions
        and not report.plan.fission
    )


def harmless(op) -> bool:
    """An op that cannot trap in the kernel (affine accesses are proven by the guards)."""
    if op.opdef.terminator:
        return op.name != "cf.trap" and op.name != "cf.return"
    return op.opdef.pure or op.name in ("mem.load", "mem.store") or arith.division_cannot_trap(op)


def exit_block(facts: FunctionLoops, loop: LoopInfo) -> Block | None:
    """The one block control reaches on leaving ``loop``, or None."""
    body = facts.bodies[loop]
    outs = {s for b in body for s in b.successors if s not in body}
    return outs.pop() if len(outs) == 1 else None


def _defined(block: Block) -> list:
    return [*block.args, *(r for op in block.ops for r in op.results)]


def _read(facts: FunctionLoops, arg, body: set) -> bool:
    return any(b in body for _, b in facts.users.get(arg, []))


def _legal(
    facts: FunctionLoops, plan: LoopPlan, values: LoopValues, phases: list[Phase]
) -> list[tuple[int, int]]:
    """The pairs left to the row guard; :class:`Reject` where one may meet or is not modelled."""
    model = _RowModel(values, plan.trip, plan.inner_trips)
    same_row = f"{model.var(plan.loop, 'x')} = {model.var(plan.loop, 'y')}"
    guarded = []
    after = {p.loop: _after(facts, p) for p in phases if p.rest}
    for i, store in enumerate(plan.accesses):
        if not store.store:
            continue
        phase = next((p for p in phases if store.op.block in p.blocks), None)
        in_grid = phase is not None and store.op.block in phase.grid_blocks
        for j, other in enumerate(plan.accesses):
            block = other.op.block
            home = next((p for p in phases if block in p.blocks), None)
            if phase is None:  # a statement outside the child loops: its phase runs first
                if home is None and other.store:
                    continue  # the statements' own thread runs both, in order
            elif home is not None and home is not phase:
                continue  # another phase: the barrier keeps the row's order
            elif (
                not in_grid
                and home is phase
                and block not in phase.grid_blocks
                and (other.store or block in after[phase.loop])
            ):
                continue  # the rest's own thread runs both, in order (the others skip its stores)
            relation = same_row
            if in_grid and block in phase.grid_blocks:
                relation += f" and {model.var(phase.grid, 'x')} != {model.var(phase.grid, 'y')}"
            _context().reset_operations()
            try:
                modelled = model.related(store, other, relation)
                if modelled is not None:
                    pairs, meet = modelled
                    if meet.is_empty():
                        continue
                    if pairs.params().is_subset(meet.params()):
                        raise Reject(
                            f"store at {store.where} meets {other.kind} at {other.where} in another thread"
                        )
            except isl.Error:
                raise Reject("isl gave up on a pair") from None
            if modelled is None:
                if store.address is None or other.address is None:
                    raise Reject("an access isl cannot model")
                if not (store.address - other.address).leaves() - model.counters:
                    raise Reject(f"store at {store.where} and {other.kind} at {other.where} are not modelled")
            guarded.append((i, j))  # they meet for some sizes only, or apart by base pointers
    return guarded


class _RowModel(NestModel):
    """The nest as :func:`_legal` relates it: both accesses of a pair in one iteration of
    the launched loop. A row's offset that is a product of its counter and live-ins (the
    row stride ``n * 4`` times the row: the sweeps of a 2-D grid) is then one value for
    both, a parameter of its own; isl's model needs constant coefficients on counters."""

    def affine(self, poly: Poly, prefix: str) -> str:
        row = self.values.counter(self.info)
        fixed = Poly({m: c for m, c in poly.terms.items() if _row_product(m, row, self.counters)})
        parts = [super().affine(poly - fixed, prefix)]
        for monomial, coeff in fixed.terms.items():
            key = ("row", *(s.order for s in monomial))
            parts.append(f"{coeff}*{self.params.setdefault(key, f'p{len(self.params)}')}")
        return " + ".join(parts)


def _row_product(monomial: tuple, row, counters: set) -> bool:
    """A product of the launched loop's counter and live-ins only (no other counter)."""
    return (
        len(monomial) > 1
        and row in monomial
        and all(s is row or not (s.leaves() & counters) for s in monomial)
    )
