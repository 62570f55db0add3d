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

Legal, with isl on the launched loop's iteration domain and within one of its iterations,
when a store of a phase's grid loop

- meets no access of that grid loop in another of its iterations (any iterations of the
  loops between), and
- meets no access of the phase outside the grid loop, nor a load of the launched loop's
  body outside every phase (those run in every thread), in any iteration.

A pair that meets only for some values of the sizes and live-ins, or that isl cannot model
because two base pointers (live-ins) separate it, becomes a guard (``LoopPlan.row_guarded``:
their byte ranges apart within one iteration); any other pair it cannot model, or one
that meets whatever the values, keeps the loop at one thread per iteration. So do a body that stores
outside its child loops, may trap (a barrier waits for every thread of the block), has a
gathered load or a reduction, or a child whose values are read after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import FunctionLoops, Reject
from tensorwasm.compiler.analysis.induction import kernel_computes
from tensorwasm.compiler.analysis.isl import NestModel, _context, isl
from tensorwasm.compiler.analysis.plan import LoopPlan, LoopReport, Phase

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues
    from tensorwasm.dialect.ir import Block, LoopInfo

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
        if plan is None or plan.reductions or plan.collapse or plan.gathers or plan.loop not in kept:
            continue
        if plan.vector_ivs:  # (the phase kernel computes no v128 induction variable)
            continue
        try:
            phases, guarded = _phases(facts, plan, by_loop, kept[plan.loop])
        except Reject:
            continue  # one thread per iteration, as before
        plan.phases, plan.row_guarded = phases, guarded
        names = [
            f"+0x{p.grid.offset:x}" + (f" inside +0x{p.loop.offset:x}" if p.grid is not p.loop else "")
            for p in phases
        ]
        report.reason += f"; distributed: {len(phases)} phase(s) of a 2-D grid over " + ", ".join(names)


def _phases(
    facts: FunctionLoops, plan: LoopPlan, by_loop: dict[LoopInfo, LoopReport], values: LoopValues
) -> tuple[tuple[Phase, ...], list[tuple[int, int]]]:
    loops = facts.func.loops
    children = [m for m in loops if m.parent is plan.loop]
    if not children:
        raise Reject("no inner loop")
    inside = set().union(*(facts.bodies[c] for c in children))
    way_out = _exit(facts, plan.loop)
    for block in plan.blocks:
        for op in block.ops:
            if op.name == "mem.store" and block not in inside:
                raise Reject("stores outside its inner loops")
            if not _harmless(op):
                raise Reject(f"{op.name} may trap")
        if any(s not in plan.blocks and s is not way_out for s in block.successors):
            raise Reject("more than one way out")
    trips = dict(plan.inner_trips)
    phases = []
    for child in children:
        grid = _grid_loop(facts, child, by_loop, loops)
        counter = values.counter(grid)
        trip = trips.get(counter)
        if trip is None or trip.pred not in COUNTED or not _toward(trip):
            raise Reject("a grid loop the kernel cannot count")
        moving = {s for s in trip.start.leaves() | trip.bound.leaves() if s.kind == "counter"}
        if moving - {plan.counter} or (moving and trip.pred == "ne" and abs(trip.step) != 1):
            raise Reject("a grid loop whose count moves with the loops inside the launched one")
        if not (kernel_computes(trip.start) and kernel_computes(trip.bound)):
            raise Reject("a grid loop whose bounds hold a floor division the kernel cannot recompute")
        for arg in grid.header.args:
            if (
                arg not in plan.ivs
                and arg not in plan.invariant_args
                and _read(facts, arg, facts.bodies[grid])
            ):
                raise Reject("a grid loop carries a value")
        exits = (_exit(facts, child), _exit(facts, grid))
        if any(b is None or b not in plan.blocks or any(facts.users.get(a) for a in b.args) for b in exits):
            raise Reject("a value of an inner loop is read after it")
        if sum(p not in facts.bodies[child] for p in facts.preds[child.header]) != 1:
            raise Reject("an inner loop entered from two places")
        for loop in {child, grid}:  # its values are not read after it (nor, for the grid, after iteration t)
            body = facts.bodies[loop]
            if any(b not in body for blk in body for v in _defined(blk) for _, b in facts.users.get(v, [])):
                raise Reject(f"a value of the loop at +0x{loop.offset:x} is read after it")
        phases.append(Phase(child, grid, counter, trip, facts.bodies[child], facts.bodies[grid], *exits))
    return tuple(phases), _legal(facts, plan, values, phases)


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
    grid = inner[0]
    around = facts.bodies[child] - facts.bodies[grid]
    if any(op.name == "mem.store" for b in around for op in b.ops):
        raise Reject("stores between the interchanged loops")
    return grid


def _parallel(report: LoopReport | None) -> bool:
    return report is not None and report.plan is not None and not report.plan.reductions


def _harmless(op) -> bool:
    """An op that cannot trap in the kernel (affine accesses are proven by the guards)."""
    if op.opdef.terminator:
        return op.name != "cf.trap" and op.name != "cf.return"
    return op.opdef.pure or op.name in ("mem.load", "mem.store")


def _exit(facts: FunctionLoops, loop: LoopInfo) -> Block | None:
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
    model = NestModel(values, plan.trip, plan.inner_trips)
    same_row = f"{model.var(plan.loop, 'x')} = {model.var(plan.loop, 'y')}"
    guarded = []
    for i, store in enumerate(plan.accesses):
        if not store.store:
            continue
        phase = next(p for p in phases if store.op.block in facts.bodies[p.grid])
        for j, other in enumerate(plan.accesses):
            block = other.op.block
            home = next((p for p in phases if block in facts.bodies[p.loop]), None)
            if home is not None and home is not phase:
                continue  # another phase: the barrier keeps the row's order
            relation = same_row
            if block in facts.bodies[phase.grid]:
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
