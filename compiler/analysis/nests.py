"""Collapsing perfect nests: a parallel loop whose body is one parallel loop gets a grid
dimension for it (and, one level further, a third).

The outer loop must have no reductions and exactly one child loop, itself accepted with
no reductions; outside that child the outer body must store nothing (every thread of a
row runs it), and the code after the child must not be able to trap (a collapsed thread
skips it). A child whose bounds move with the outer counter (a triangular nest) keeps
running inside the thread: a grid dimension has one count for every row. When the child collapses its own child the same way, the
nest becomes a 3-D grid, provided the grandchild's loop-carried values are still induction
variables or invariants of the outer loop. A loop with privatised temporaries (doitgen's
``sum``) collapses only with a child that privatises the same accesses, at counts that are
numbers (each thread of the grid works on its own copy). Children are settled before their parents, so
a parent sees its child's collapse.

A 2-D nest whose inner loop is distributed (:mod:`.schedule`: clang's vector loop over a
row and its scalar remainder, two phases) becomes phases of a 3-D grid
(:func:`phase_nests`): a block per cell of the outer two counters, its threads over the
phase's grid loop. The inner loop's schedule was proven within one of its iterations,
with everything the outer loop computes before it (``x * n * n``) a value the same for
both accesses of a pair; a cell of the grid is exactly one such iteration, so the same
phases, barriers and row guards hold there. Across cells the collapse's own guards apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.forest import FunctionLoops
from tensorwasm.compiler.analysis.induction import kernel_computes
from tensorwasm.compiler.analysis.isl import constant_count
from tensorwasm.compiler.analysis.plan import Collapse, LoopPlan, LoopReport
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.compiler.analysis.trips import exits_mid_body
from tensorwasm.dialect.ir import Block, LoopInfo, Op, Value
from tensorwasm.support.records import replace

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues


def collapse_nests(facts: FunctionLoops, reports: list[LoopReport]) -> None:
    """Give each accepted loop of ``reports`` (one function's) the grid dimensions its
    perfectly nested parallel loops allow, and say so in its reason."""
    by_loop = {r.loop: r for r in reports}
    for report in sorted(reports, key=lambda r: -r.loop.depth):  # children first
        plan = report.plan
        if plan is None or plan.reductions or plan.fission or exits_mid_body(facts, plan.loop):
            continue  # (a thread entering its child would run the child on the last row too)
        children = facts.children.get(plan.loop, [])
        if len(children) != 1:
            continue
        (child,) = children
        inner = by_loop[child]
        if inner.plan is None or inner.plan.reductions or inner.plan.fission:
            continue
        if not _same_copies(plan, inner.plan):
            continue
        outside = [b for b in plan.blocks if b not in facts.bodies[child]]
        if any(op.name == "mem.store" for b in outside for op in b.ops):
            continue
        if not all(_cannot_trap(op) for b in _after(facts, child, plan) for op in b.ops):
            continue
        levels = []
        for loop in (child, *(c.loop for c in inner.plan.collapse[:1])):
            body = facts.bodies[loop]
            if not all(a in plan.ivs or a in plan.invariant_args or not _read_in(facts, a, body)
                       for a in loop.header.args):  # fmt: skip
                break
            counter = next((c for c, _ in plan.inner_trips if c.ref is loop), None)
            if counter is None:
                break
            trip = next(t for c, t in plan.inner_trips if c is counter)
            if any(s.kind == "counter" for s in trip.start.leaves() | trip.bound.leaves()):
                break  # a triangular level: a grid dimension has one count for every row
            if plan.private and constant_count(trip) is None:
                break  # the thread of the last iteration works on memory: a count that is a number
            levels.append(Collapse(loop, counter, trip, body))
            if exits_mid_body(facts, loop):
                break  # its child runs one iteration fewer than it: no level of its own
        if levels:
            plan.collapse = tuple(levels)
            where = " and ".join(f"+0x{c.loop.offset:x}" for c in levels)
            report.reason += (
                f"; {len(levels) + 1}-D grid with the loop{'s' if len(levels) > 1 else ''} at {where}"
            )


def phase_nests(facts: FunctionLoops, reports: list[LoopReport], kept: dict[LoopInfo, LoopValues]) -> None:
    """Give each 2-D nest of ``reports`` (one function's) whose inner loop was distributed
    the inner loop's phases, as phases of a 3-D grid, where the kernel can compute what
    they need from the two outer counters and the live-ins; say so in its reason."""
    by_loop = {r.loop: r for r in reports}
    for report in reports:
        plan = report.plan
        if plan is None or len(plan.collapse) != 1 or plan.phases or plan.loop not in kept:
            continue
        if plan.reductions or plan.private or plan.gathers or plan.vector_ivs:
            continue
        (level,) = plan.collapse
        inner = by_loop[level.loop].plan
        if inner is None or not inner.phases or any(p.statements for p in inner.phases):
            continue  # (a phase of statements outside the loops stays a 2-D grid's)
        found = _lifted(facts, plan, level, inner, kept[plan.loop])
        if found is None:
            continue
        plan.phases, plan.row_guarded, plan.pinned = found
        names = ", ".join(
            f"+0x{p.grid.offset:x}" + (f" inside +0x{p.loop.offset:x}" if p.grid is not p.loop else "")
            + (" and its rest" if p.rest else "")
            for p in plan.phases
        )  # fmt: skip
        report.reason += f"; distributed: {len(plan.phases)} phase(s) of a 3-D grid over {names}"


def _lifted(facts: FunctionLoops, plan: LoopPlan, level: Collapse, inner: LoopPlan, values: LoopValues):
    """``inner``'s phases, row guards and pinned merges in the terms of ``plan`` (its counter,
    ``level``'s and its live-ins), or None where one of them is not computable there."""
    outside = [b for b in plan.blocks if b not in level.blocks]
    if not all(_cannot_trap(op) for b in outside for op in b.ops):
        # Every thread of a block runs them, at each of its calls: a trap would leave a
        # barrier short, and a load could see what the cell's earlier phase stored.
        return None
    known = {plan.counter, level.counter} | {sym for _, sym, _, _ in plan.live_ins}
    trips = dict(plan.inner_trips)
    phases = []
    for phase in inner.phases:
        counter = values.counter(phase.grid)
        trip = trips.get(counter)
        if trip is None or not _computable(trip.start, known) or not _computable(trip.bound, known):
            return None
        phases.append(replace(phase, counter=counter, trip=trip))
    pinned = []
    for arg, _ in inner.pinned:
        poly = values.expr(arg)
        if poly is None or not _computable(poly, known):
            return None
        pinned.append((arg, poly))
    index = _access_keys(plan)
    keys = list(_access_keys(inner))
    if any(k not in index for k in keys):
        return None
    guarded = [(index[keys[i]], index[keys[j]]) for i, j in inner.row_guarded]
    return tuple(phases), guarded, tuple(pinned)


def _computable(poly: Poly, known: set) -> bool:
    return kernel_computes(poly) and poly.leaves() <= known


def _access_keys(plan: LoopPlan) -> dict[tuple[int, int], int]:
    """Each access of ``plan`` by its op and the how-manieth access of that op it is (a
    rotated load has two), to its index."""
    seen: dict[int, int] = {}
    keys = {}
    for i, access in enumerate(plan.accesses):
        n = seen[id(access.op)] = seen.get(id(access.op), -1) + 1
        keys[(id(access.op), n)] = i
    return keys


def _same_copies(plan: LoopPlan, inner: LoopPlan) -> bool:
    """A loop with privatised temporaries collapses only with a child that privatises the same
    accesses: a thread then runs one iteration of the child, which must write all it reads."""

    def ops(p: LoopPlan) -> list[int]:
        return sorted(id(p.accesses[n].op) for copy in p.private for n in copy.accesses)

    return ops(plan) == ops(inner)


def _cannot_trap(op: Op) -> bool:
    return op.opdef.pure or (op.opdef.terminator and op.name != "cf.trap")


def _read_in(facts: FunctionLoops, arg: Value, body: set[Block]) -> bool:
    return any(b in body for _, b in facts.users.get(arg, []))


def _after(facts: FunctionLoops, child: LoopInfo, plan: LoopPlan) -> set[Block]:
    """The outer body's blocks reachable from the child loop's exits (not via the header)."""
    inner = facts.bodies[child]
    seen: set[Block] = set()
    work = [s for b in inner for s in b.successors if s not in inner]
    while work:
        b = work.pop()
        if b in seen or b is plan.loop.header or b not in plan.blocks:
            continue
        seen.add(b)
        work.extend(b.successors)
    return seen
