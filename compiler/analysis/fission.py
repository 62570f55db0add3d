"""Fission: a sequential loop split into phases that each run in parallel.

PolyBench's atax: ``i { tmp[i] = 0; j: tmp[i] += A[i][j] * x[j]; j: y[j] += A[i][j] * tmp[i] }``.
Every iteration of ``i`` adds into all of ``y``, so :mod:`.isl` proves the loop sequential.
Its body still splits into two statement groups, each parallel across the whole loop: the
first (``tmp``) over ``i``, one thread running an iteration's part of it whole; the second
(``y``) over its ``j`` loop, one thread running every ``i`` in order for its own ``j`` (the
``j`` loop interchanged outward). Run one after the other, each over every iteration, the
whole grid waiting between them, every byte still sees its operations in Wasm order: each
``y[j]`` takes ``i`` ascending, after every ``tmp[i]`` is final.

The *phases* group the loop's stores. A child loop's stores are a group, with the stores
outside child loops before it (after the last child loop: with it). A group runs *whole*
(a thread per iteration of the loop, every child loop holding none of its stores skipped)
where that is legal, else over its child loop as the *grid loop* (a thread per iteration of
it, the loop's iterations in order inside, the other child loops skipped). A group that can
do neither is split in two (bicg: ``q[i] += A[i][j] * p[j]`` and ``s[j] += r[i] * A[i][j]`` in
one ``j`` loop): the stores that may each run whole, then the rest over the grid loop, or
the other way round. A phase makes its own stores only; what a load of another phase
computes is then unused, and its loads dead.

A load belongs to the phases whose stores its value reaches (through the body's values and
merges), to every phase where it reaches none. Legal, with isl over the loop's iteration
domain, when for each store ``S`` of phase ``P`` and each access ``A`` of phase ``Q`` the
iterations at which their byte ranges meet are

- for ``P = Q`` run whole: within one iteration of the loop only;
- for ``P = Q`` over grid loop ``G``: at one iteration of ``G`` only, both inside ``G``;
- for ``P`` before ``Q``: none where ``A`` comes first in Wasm's order (an earlier iteration
  of the loop, or the same one with ``A``'s statement not after ``S``'s);
- for ``P`` after ``Q``: none where ``S`` comes first.

A pair that isl cannot model because live-in base pointers separate it becomes a guard:
the two accesses' byte ranges apart over the whole launch. Any other such pair, one that
meets, a body that may trap, or a value of a child loop read after it keeps the loop
sequential (a device-resident region around its parallel inner loops).

A loop that does not split may still be *stepped* (:func:`split_stepped`, for a GPU): one
launch whose iterations run in order, each running its phases in turn, the grid waiting
after each. PolyBench's gramschmidt: ``k { nrm = sum of A[i][k]^2; R[k][k] = sqrt(nrm); i:
Q[i][k] = ...; j > k: { ... } }``. A child loop whose stores isl proves apart across its
iterations within one iteration of the loop runs over the grid (``i``, ``j``); the
statements and child loops between such loops (the norm's loop, ``R[k][k]``) run on one
thread. isl checks the pairs at one iteration of the loop only: within a grid phase they
meet at one grid iteration at most; across phases, only in the order the phases run them. A
child loop's value may be read after it only by the stores of the one-thread phase that
runs it. A loop whose phases would all run over the grid stays a region; one with none over
the grid stays on wasmtime.

A stepped loop whose one-thread phases run child loops (the serial work of PolyBench's
``lu``: ``i { j < i: { k < j: A[i][j] -= A[i][k] * A[k][j]; A[i][j] /= A[j][j] }; j >= i:
k < i: ... }``) may run as a *wavefront* instead (:func:`split_wavefront`): every child
loop with stores is a phase, each of its iterations at each iteration ``k`` of the loop a
task, run in step ``w = m * k + t + c`` (``t`` the child loop's iteration; ``m`` and ``c``
per phase, tried from a few small ones). Steps run in order, the whole grid waiting after
each; a step's tasks run at once, each one thread, its accesses in Wasm's order. isl
checks every store against every access the phases run: two tasks of one step must not
meet, and two of different steps may meet only where the earlier step holds the access
Wasm runs first. ``lu`` runs in step ``w = i + j``: its ``2n - 1`` steps against ``n``
iterations of one thread's rows.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import TYPE_CHECKING

from tensorwasm.compiler.analysis.accesses import reload_access
from tensorwasm.compiler.analysis.forest import FunctionLoops, Reject
from tensorwasm.compiler.analysis.isl import NestModel, _context, isl
from tensorwasm.compiler.analysis.plan import Access, Collapse, LoopPlan, Phase
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.compiler.analysis.schedule import check_body, exit_block, grid_trip
from tensorwasm.dialect import arith
from tensorwasm.dialect.ir import Op
from tensorwasm.support.records import replace

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.induction import LoopValues
    from tensorwasm.dialect.ir import Block, LoopInfo


def split_sequential(facts: FunctionLoops, plan: LoopPlan, values: LoopValues) -> None:
    """Give ``plan`` (its loop proven sequential) the phases of its fission, the pairs they
    settle and those left to the guards; :class:`Reject` says why it cannot be split."""
    _no_carried(plan)
    body = _Body(facts, plan, values)
    groups = body.groups()
    why = Reject("no phases")
    for candidate in _candidates(body, groups):
        try:
            phases, free = body.legal(candidate)
        except Reject as exc:
            why = exc
            continue
        plan.phases, plan.fission = tuple(phases), True
        plan.static_dependence_free = free
        return
    raise why


def split_stepped(facts: FunctionLoops, plan: LoopPlan, values: LoopValues) -> None:
    """Give ``plan`` (its loop proven sequential, and not split by :func:`split_sequential`)
    the phases each of its iterations runs in turn (``LoopPlan.stepped``): a child loop whose
    iterations are independent within one iteration of the loop runs over the grid; the
    statements and child loops between such loops run on one thread. :class:`Reject` says
    why not."""
    _no_carried(plan)
    body = _Body(facts, plan, values, stepped=True)
    kept: set = set()  # child loops that read a value of the one-thread run before them
    while True:
        chosen = body.stepped_phases(kept)
        made, free = body.legal(chosen)  # a loop split at its pivot checked as one thread's
        phases, serial = [], []
        for (_, mode), ph in zip(chosen, made, strict=True):
            if not (isinstance(mode, tuple) and mode[0] == "pivot"):
                phases.append(ph)
                continue
            _, (child,), at, guarded, cells = mode
            free = [pair for pair in free if pair not in guarded]
            grid = body._phase(sorted(ph.stores), child)
            task, serial_counters = child, {grid.counter}
            if cells is None:
                phases += [replace(grid, pivot=at, side=side) for side in (-1, 0, 1)]
            else:  # a grid of cells per part, rows split at ``at`` and columns at ``column``
                inner, column = cells
                counter = values.counter(inner)
                level = Collapse(inner, counter, dict(plan.inner_trips)[counter], set(facts.bodies[inner]))
                phases += [replace(grid, pivot=at, side=side, inner=level, inner_pivot=column, inner_side=cut)
                           for side in (-1, 0, 1) for cut in ((-1, 0, 1) if column else (0,))]  # fmt: skip
                task, serial_counters = inner, {grid.counter, counter}
            serial += [(ops, tuple(c for c in around if c not in serial_counters))
                       for ops, around in values.work(facts.bodies[task])]  # fmt: skip
        try:
            body.check_outflow(phases)
            break
        except _ReadElsewhere as why:
            if why.item not in body.children or why.item in kept:
                raise
            kept.add(why.item)  # (it joins the run that makes the value)
    if all(p.whole for p in phases):
        raise Reject("no child loop runs in parallel within an iteration")
    if not any(p.whole or p.pivot for p in phases):
        raise Reject("every phase runs over a loop (a device-resident region instead)")
    plan.phases, plan.fission, plan.stepped = tuple(phases), True, True
    plan.static_dependence_free = free
    grids = set().union(*(facts.bodies[p.grid] for p in phases if not p.whole))
    plan.serial_work = values.work([b for b in values.body_order if b not in grids]) + serial


# The steps ``w = m * k + t + c`` tried for a wavefront's phases, per phase: ``m`` from these,
# ``c = 0`` (a phase's grid loop starting at ``k``'s row, as ``lu``'s second ``j`` loop: 2).
WAVE_SLOPES = (1, 2, 0)
# Phases a wavefront may have (the schedules tried grow as 3 to this power).
MAX_WAVE_PHASES = 3


def split_wavefront(facts: FunctionLoops, plan: LoopPlan, values: LoopValues) -> None:
    """Give ``plan`` (a stepped loop whose one-thread phases run child loops) the phases and
    steps of a wavefront: each child loop with stores a phase, its tasks run in step ``w =
    m * k + t + c``, the first schedule isl finds legal. :class:`Reject` says why not (the
    plan is left as it was)."""
    accesses = plan.accesses
    try:
        _wavefront(facts, plan, values)
    except Reject:
        plan.accesses, plan.task_reloads = accesses, ()
        raise


def _wavefront(facts: FunctionLoops, plan: LoopPlan, values: LoopValues) -> None:
    reloads = _task_reloads(plan, values)
    body = _Body(facts, plan, values, stepped=True)
    entering = _entering(facts, plan, values)
    if any(body.item(a) not in body.children and a.op not in entering for a in plan.accesses):
        raise Reject("an access outside the child loops")
    phases = [
        (stores, child) for child in sorted(body.children, key=body.position)
        if (stores := [i for i in body.stores if body.item(plan.accesses[i]) is child])
    ]  # fmt: skip
    if len(phases) > MAX_WAVE_PHASES:
        raise Reject(f"more than {MAX_WAVE_PHASES} child loops with stores")
    # A grid loop whose start moves up with the loop's counter (lu's ``j`` from ``i``) tries
    # the step ``2 * k + t`` first (``t`` then ``j - i``: step ``i + j``), any other ``k + t``
    # (nussinov's ``j`` from ``i + 1``, ``i`` counting down: fewer steps).
    orders = []
    for stores, child in phases:
        moves = body._phase(stores, child).trip.start.split(plan.counter)
        up = moves is not None and moves[1].is_constant() and moves[1].constant > 0
        orders.append(sorted(WAVE_SLOPES, key=lambda m, preferred=2 if up else 1: m != preferred))
    _carried_apart(body, reloads)
    why = Reject("no schedule")
    for slopes in itertools.product(*orders):
        body.wave = tuple((m, 0) for m in slopes)
        try:
            made, free = body.legal(phases)
            body.check_outflow(made)
        except Reject as exc:
            why = exc
            continue
        plan.phases, plan.fission, plan.stepped, plan.wave = tuple(made), True, True, body.wave
        plan.static_dependence_free = free
        plan.task_work = tuple(
            tuple((ops, tuple(c for c in around if c is not ph.counter))
                  for ops, around in values.work(facts.bodies[ph.grid]))
            for ph in made
        )  # fmt: skip
        plan.serial_work = []
        plan.task_apart = body.apart_in_task(made)
        return
    raise Reject(f"no wavefront: {why}")


def _task_reloads(plan: LoopPlan, values: LoopValues) -> list[tuple[int, int]]:
    """The rotations of the child loops (``LoopValues.task_rotations``) as reloads: their
    accesses appended to ``plan.accesses`` and listed in ``plan.task_reloads``; returns, per
    reload of a loaded value, (the index of the load the back edge passes, the reload's)."""
    out, extra, listed = [], [], []
    for arg, (loop, load, address) in values.task_rotations.items():
        back = next((i for i, a in enumerate(plan.accesses) if a.op is load), None)
        if back is None:
            continue
        index = len(plan.accesses) + len(extra)
        extra.append(reload_access(values, loop, load, address))
        listed.append((arg, index))
        if load.name == "mem.load":  # (a stored one is the last stored there: accesses._stored_rotation)
            out.append((back, index))
    plan.accesses = [*plan.accesses, *extra]
    plan.task_reloads = tuple(listed)
    return out


def _entering(facts: FunctionLoops, plan: LoopPlan, values: LoopValues) -> set[Op]:
    """The loads made before a child loop only to enter its reloaded header arguments (a
    rotation's first value): a task reloads them, and the kernel's copies are dead."""
    reloaded = {arg for arg, _ in plan.task_reloads}
    out = set()
    for arg, _ in plan.task_reloads:
        loop = values.task_rotations[arg][0]
        first = facts.entry_edge_args(loop)[arg.index]
        uses = facts.users.get(first, [])
        if all(op.opdef.terminator and first not in op.operands and all(
                target in reloaded for s in op.successors
                for target, passed in zip(s.block.args, s.args, strict=True) if passed is first)
               for op, _ in uses):  # fmt: skip
            out.add(first.owner)
    return out


def _carried_apart(body: _Body, reloads: list[tuple[int, int]]) -> None:
    """:class:`Reject` where a store of a task may write the address of the load it carries
    to the next task (which then reloads memory, not the value loaded): isl, at one task."""
    plan, model = body.plan, body.model
    for back, _ in reloads:
        load = plan.accesses[back]
        child = body.item(load)
        same = (f"{model.var(plan.loop, 'x')} = {model.var(plan.loop, 'y')} and "
                f"{model.var(child, 'x')} = {model.var(child, 'y')}")  # fmt: skip
        for i in body.stores:
            store = plan.accesses[i]
            if body.item(store) is not child:
                continue
            try:
                meet = body._meeting(store, load, same)
                clear = meet is not None and meet.is_empty()
            except (Reject, isl.Error):
                clear = False
            if not clear:
                raise Reject(
                    f"the store at {store.where} may write what the load at {load.where} carries to the next task"
                )


def _no_carried(plan: LoopPlan) -> None:
    if plan.reductions or plan.private or plan.rotations or plan.vector_ivs or plan.collapse:
        raise Reject("it carries a value from one iteration to the next")


def describe(plan: LoopPlan) -> str:
    """The phases of a split loop, for its report."""
    if plan.wave:
        names = [
            f"over +0x{p.grid.offset:x} in steps w = {m}*k + t" + (f" + {c}" if c else "")
            + ": stores at " + ", ".join(plan.accesses[i].where for i in sorted(p.stores))
            for p, (m, c) in zip(plan.phases, plan.wave, strict=True)
        ]  # fmt: skip
        return (
            f"wavefront: {len(plan.phases)} phase(s), a task per grid iteration, steps in turn: "
            + "; ".join(names)
        )
    if plan.stepped:
        names = [
            ("one thread" if p.whole else f"over +0x{p.grid.offset:x}" + _part(p))
            + (": stores at " + ", ".join(plan.accesses[i].where for i in sorted(p.stores)) if p.stores else "")
            for p in plan.phases
        ]  # fmt: skip
        return f"stepped: each iteration runs {len(plan.phases)} phase(s) in turn: " + "; ".join(names)
    names = [
        "stores at " + ", ".join(plan.accesses[i].where for i in sorted(p.stores))
        + (" whole per iteration" if p.whole else f" over +0x{p.grid.offset:x}")
        for p in plan.phases
    ]  # fmt: skip
    return f"split into {len(plan.phases)} parallel phase(s): " + "; ".join(names)


# The divisors a pivot may have, ``t = floor((a * k + c) / d)`` (the cells of a loop clang
# unrolled by 2, 4 or 8 hold that many iterations: the column ``k`` is in cell ``k / 2``).
PIVOT_DIVISORS = (1, 2, 4, 8)


def pivot_text(pivot: tuple[int, int, int], k: str) -> str:
    """A pivot ``(a, c, d)`` as isl text over ``k``."""
    a, c, d = pivot
    return f"({a}*{k} + {c})" if d == 1 else f"floor(({a}*{k} + {c})/{d})"


def _pivot_point(pairs, side_s: int, side_a: int) -> tuple[int, int, int] | None:
    """``(a, c, d)`` where every pair of ``pairs`` (isl, ``[k, ...]``) has its store's task
    (dimension ``side_s``) or its access's (``side_a``) at ``floor((a * k + c) / d)``, else
    None: tried from a sample pair, slopes 1, 0 and -1, divisors :data:`PIVOT_DIVISORS`."""
    dims = isl.dim_type.set
    with contextlib.suppress(isl.Error):
        point = pairs.sample_point()
        k = point.get_coordinate_val(dims, 0).to_python()
        names = ", ".join(f"d{i}" for i in range(pairs.dim(dims)))
        for side in (side_s, side_a):
            t = point.get_coordinate_val(dims, side).to_python()
            for d in PIVOT_DIVISORS:
                for a in (1, 0, -1):
                    for c in range(d * t - a * k, d * t - a * k + d):
                        at = pivot_text((a, c, d), "d0")
                        away = isl.Set(
                            f"{{ [{names}] : d{side_s} != {at} and d{side_a} != {at} }}", context=_context()
                        )
                        if pairs.intersect(away).is_empty():
                            return a, c, d
    return None


def _out_of_order(rows: tuple[int, int, int], columns: tuple[int, int, int] | None) -> str:
    """The pairs of cells ``[k, t, u, s, v]`` (the store's ``(t, u)``, the access's ``(s, v)``)
    that parts split at row ``rows`` and column ``columns`` would run wrongly: in one part, or
    in two whose earlier holds the cell Wasm runs second."""

    def order(x: str, y: str, at: tuple[int, int, int] | None) -> tuple[str, str]:  # (part x < y, same part)
        if at is None:
            return "false", "true"
        p = pivot_text(at, "k")
        before = f"(({x} < {p} and {y} >= {p}) or ({x} = {p} and {y} > {p}))"
        same = f"(({x} < {p} and {y} < {p}) or ({x} = {p} and {y} = {p}) or ({x} > {p} and {y} > {p}))"
        return before, same

    t_before, t_same = order("t", "s", rows)
    s_before, _ = order("s", "t", rows)
    u_before, u_same = order("u", "v", columns)
    v_before, _ = order("v", "u", columns)
    store_part_first = f"({t_before} or ({t_same} and {u_before}))"
    access_part_first = f"({s_before} or ({t_same} and {v_before}))"
    store_first = "(t < s or (t = s and u < v))"
    access_first = "(s < t or (s = t and v < u))"
    return (f"{{ [k, t, u, s, v] : ({t_same} and {u_same}) or ({store_part_first} and {access_first}) "
            f"or ({access_part_first} and {store_first}) }}")  # fmt: skip


def _part(phase: Phase) -> str:
    """Which of a grid loop's iterations a phase split at a pivot runs, and its cells, for its
    report."""
    if phase.pivot is None:
        return "" if phase.inner is None else f" (cells of +0x{phase.inner.loop.offset:x})"

    def cut(name: str, pivot: tuple[int, int, int], side: int) -> str:
        a, c, d = pivot
        at = " + ".join(t for t in (f"{a}*k" if a else "", str(c) if c else "") if t) or "0"
        return f"{name} {('<', '=', '>')[side + 1]} " + (at if d == 1 else f"({at}) / {d}")

    text = cut("t", phase.pivot, phase.side)
    if phase.inner is not None:
        text += ", cells of +0x" + f"{phase.inner.loop.offset:x}"
        if phase.inner_pivot is not None:
            text += " " + cut("u", phase.inner_pivot, phase.inner_side)
    return f" ({text})"


def _candidates(body: _Body, groups: list[list[int]]):
    """The phase lists to try, as lists of (stores, "whole" or the grid loop): each group
    as one phase, whole where that holds within it, else over its grid loop; a group that
    can do neither split, the whole stores first or last."""
    choices: list[list[list[tuple[list[int], object]]]] = []
    for group in groups:
        options = [[(group, mode)] for mode in body.modes(group)]
        alone = [i for i in group if "whole" in body.modes([i])]
        rest = [i for i in group if i not in alone]
        if alone and rest:
            for mode in body.modes(rest):
                if mode != "whole":
                    options += [[(alone, "whole"), (rest, mode)], [(rest, mode), (alone, "whole")]]
        if not options:
            raise Reject(f"the stores at {', '.join(body.plan.accesses[i].where for i in group)} "
                         "run in parallel neither per iteration nor over a loop")  # fmt: skip
        choices.append(options)
    picks = [[]]
    for options in choices:  # every combination, the first options first (few: groups are few)
        picks = [p + o for p in picks for o in options][:16]
    yield from picks


class _Parts:
    """Where a stepped loop's child loop splits at a pivot (:meth:`pivot`), and whether its
    parts run as cells (:meth:`_cells`): isl on the body's model."""

    def __init__(self, body: _Body):
        self.body = body

    def pivot(self, stores: list[int], child: LoopInfo) -> tuple | None:
        """Where ``child``'s tasks (its iterations within one iteration of the loop) meet only
        at one of them, ``t = a * k + c`` (``k`` the loop's iteration; PolyBench's
        floyd-warshall: row ``k``, which every other row reads and only its own task writes):
        ``((a, c, d), the pairs left to the guards (base pointers apart), cells)``, else None.
        The tasks below it, the one at it, and those above it then run in turn, each part at
        once: two tasks of one part never meet, and the parts keep Wasm's order. ``cells``
        (:meth:`_cells`): where each part may run an iteration of ``child``'s inner loop a
        task, ``(that loop, its own pivot or None)``."""
        found = self._task_meets(stores, [child])
        if found is None:
            return None
        both, guarded = found
        at = _pivot_point(both, 1, 2)
        if at is None:
            return None
        return at, frozenset(guarded), self._cells(stores, child, at)

    def _task_meets(self, stores: list[int], levels: list[LoopInfo]) -> tuple[object, set] | None:
        """The pairs of different tasks, a task an iteration of the loops ``levels`` (a child
        loop, and the loop inside it) in one iteration ``k`` of the loop, at which a store of
        ``stores`` meets an access inside the last of them (isl: ``[k, the store's task's
        counters, the access's]``), and the pairs left to the guards; None where a pair is
        not modelled, or where none meets."""
        plan, model = self.body.plan, self.body.model
        inside = self.body.facts.bodies[levels[-1]]
        kx, ky = model.var(plan.loop, "x"), model.var(plan.loop, "y")
        differ = " or ".join(f"{model.var(m, 'x')} != {model.var(m, 'y')}" for m in levels)
        relation = f"{kx} = {ky} and ({differ})"
        meets, guarded, n = [], set(), len(levels)
        dims = isl.dim_type.set
        for i in stores:
            store = plan.accesses[i]
            if store.op.block not in inside:
                return None
            for j, other in enumerate(plan.accesses):
                if other.op.block not in inside:
                    continue
                try:
                    meet = self.body._meeting(store, other, relation)
                    if meet is None:
                        guarded.add((i, j))
                    elif not meet.is_empty():
                        ns, na = len(model.loops_around(store)), len(model.loops_around(other))
                        meet = meet.project_out(dims, ns + n + 1, na - n - 1).project_out(dims, ns, 1)
                        meets.append(meet.project_out(dims, n + 1, ns - n - 1))
                except (Reject, isl.Error):
                    return None
        if not meets:
            return None
        both = meets[0]
        for meet in meets[1:]:
            both = both.union(meet)
        return both, guarded

    def _cells(self, stores: list[int], child: LoopInfo, at: tuple[int, int, int]) -> tuple | None:
        """``(inner, its pivot or None)`` where each part of ``child`` split at ``at`` may run
        as a grid of cells, a task an iteration of ``child``'s one inner loop (floyd-warshall's
        ``j``: a cell per element, where a row per thread would leave the device idle), else
        None. Every access of ``child`` must be inside that loop, which carries nothing but
        counters and whose count does not move with ``child``'s; within a row the cells may
        meet at one column (the row's own ``k``), which splits each part again. isl checks
        that two cells of one part never meet, and that of two parts that meet, the earlier
        holds the cell Wasm runs first."""
        plan, bodies = self.body.plan, self.body.facts.bodies
        inner = [m for m in self.body.facts.func.loops if m.parent is child]
        if len(inner) != 1:
            return None
        (inner,) = inner
        if any(a.op.block in bodies[child] and a.op.block not in bodies[inner] for a in plan.accesses):
            return None
        if any(arg not in plan.ivs for arg in inner.header.args):
            return None
        trip = dict(plan.inner_trips).get(self.body.values.counter(inner))
        moving = trip is None or (trip.start.leaves() | trip.bound.leaves()) & {
            self.body.values.counter(child)
        }
        if moving:
            return None
        found = self._task_meets(stores, [child, inner])
        if found is None:
            return None
        cells, _ = found
        with contextlib.suppress(isl.Error):
            rows = cells.intersect(isl.Set("{ [k, t, u, s, v] : t = s }", context=_context()))
            column = None if rows.is_empty() else _pivot_point(rows, 2, 4)
            if column is None and not rows.is_empty():
                return None
            if not cells.intersect(isl.Set(_out_of_order(at, column), context=_context())).is_empty():
                return None
            return inner, column
        return None


def _wave_relation(body: _Body, made: list[Phase], p: int, q: int, store: Access, other: Access) -> str | None:
    """Where a wavefront's store (phase ``p``) and access (phase ``q``) must not meet, or
    None where ``q`` does not run the access (it is in a child loop ``q`` skips): tasks
    of one step run at once; of two steps, the earlier first, which must be the one
    holding the access Wasm runs first. One task's accesses keep their order."""
    grid_p, grid_q = made[p].grid, made[q].grid
    if other.op.block not in body.facts.bodies[grid_q]:
        return None
    var = body.model.var
    kx, ky, tx, ty = (
        var(body.plan.loop, "x"),
        var(body.plan.loop, "y"),
        var(grid_p, "x"),
        var(grid_q, "y"),
    )
    (mp, cp), (mq, cq) = body.wave[p], body.wave[q]
    ws, wa = f"{mp}*{kx} + {tx} + {cp}", f"{mq}*{ky} + {ty} + {cq}"
    if p == q:
        apart = f"({kx} != {ky} or {tx} != {ty})"
        store_first = f"({kx} < {ky} or ({kx} = {ky} and {tx} < {ty}))"
        access_first = f"({ky} < {kx} or ({kx} = {ky} and {ty} < {tx}))"
    else:
        apart = "0 = 0"
        store_first = f"{kx} <= {ky}" if p < q else f"{kx} < {ky}"
        access_first = f"{ky} < {kx}" if p < q else f"{ky} <= {kx}"
    return (f"{apart} and ({ws} = {wa} or ({ws} < {wa} and {access_first}) "
            f"or ({wa} < {ws} and {store_first}))")  # fmt: skip


class _Columns:
    """A stepped loop's grid loop split between its inner loops (:meth:`split`), one of them
    run as cells, and the relations isl checks such phases under (:meth:`relation`)."""

    def __init__(self, body: _Body):
        self.body = body

    def split(self, stores: list[int], child: LoopInfo) -> list[tuple[list[int], object]] | None:
        """A grid phase over ``child`` split between its inner loops, where each holds stores:
        one phase per inner loop over ``child``'s iterations, with the stores outside them
        before it, skipping the others; one whose accesses all lie in its inner loop runs it
        as cells, a task per iteration of both (PolyBench's gramschmidt, whose ``j`` loop sums
        ``R[k][j]`` down column ``j`` and then updates that column, runs the sums over ``j``
        and then the updates over ``(j, i)``, rather than both loops of a column on one
        thread). None where it does not split so: fewer than two inner loops, one with no
        store or two ways out, a value of one read after it, no phase run as cells (the split
        would add a barrier and no thread), or a pair isl finds out of order
        (:meth:`relation`)."""
        facts, plan = self.body.facts, self.body.plan
        inner = [m for m in facts.func.loops if m.parent is child]
        if len(inner) < 2:
            return None
        for m in inner:
            out = exit_block(facts, m)
            entries = sum(pred not in facts.bodies[m] for pred in facts.preds[m.header])
            if out is None or out not in facts.bodies[child] or entries != 1 or self.body._read_after(m, out):
                return None
        by_item: dict[object, list[int]] = {}
        for i in stores:
            block = plan.accesses[i].op.block
            by_item.setdefault(next((m for m in inner if block in facts.bodies[m]), block), []).append(i)
        if any(m not in by_item for m in inner):
            return None
        groups, pending = [], []
        for item in sorted(by_item, key=lambda it: facts.position[it.header if it in inner else it]):
            pending += by_item[item]
            if item in inner:
                groups.append((pending, item))
                pending = []
        if pending:  # (stores after the last inner loop: with it)
            groups[-1][0].extend(pending)
        split = []
        for group, home in groups:
            runs = [i for i, a in enumerate(plan.accesses) if a.op.block in facts.bodies[child]
                    and not any(a.op.block in facts.bodies[m] for m in inner if m is not home)
                    and (not a.store or i in group)]  # fmt: skip
            cells = home if self._as_cells(home, child, runs) else None
            split.append((group, ("split", child, tuple(m for m in inner if m is not home), cells)))
        if not any(mode[3] is not None for _, mode in split):  # (no more threads: a barrier more)
            return None
        try:
            self.body.legal(split)
        except Reject:
            return None
        return split

    def _as_cells(self, loop: LoopInfo, child: LoopInfo, runs: list[int]) -> bool:
        """Whether a phase over ``child`` that runs the accesses ``runs`` may take a task per
        iteration of its inner loop ``loop`` too: every one of them inside it, and ``loop``
        carrying nothing but counters, its count not moving with ``child``'s counter."""
        facts, values, plan = self.body.facts, self.body.values, self.body.plan
        if any(plan.accesses[i].op.block not in facts.bodies[loop] for i in runs):
            return False
        if any(arg not in plan.ivs for arg in loop.header.args):
            return False
        trip = dict(plan.inner_trips).get(values.counter(loop))
        return trip is not None and not (trip.start.leaves() | trip.bound.leaves()) & {values.counter(child)}

    def relation(self, made: list[Phase], p: int, q: int, store: Access, other: Access) -> str | None:
        """What, besides the same iteration of the loop, must not hold where a store (phase
        ``p``) and an access (phase ``q``) of phases :meth:`split` made meet; None for any
        other pair. A phase run as cells: two cells apart (an access outside its inner loop
        would run in every cell of the row: it must not meet at all). Two phases of one grid
        loop: the earlier runs all its iterations first, so they are out of order where the
        access Wasm runs first comes from the later phase."""
        bodies, var = self.body.facts.bodies, self.body.model.var
        grid = made[p].grid
        inside = store.op.block in bodies[grid] and other.op.block in bodies[grid]
        if p == q:
            cells = made[p].inner
            if cells is None or not inside:
                return None
            if store.op.block not in bodies[cells.loop] or other.op.block not in bodies[cells.loop]:
                return ""
            return (f" and ({var(grid, 'x')} != {var(grid, 'y')}"
                    f" or {var(cells.loop, 'x')} != {var(cells.loop, 'y')})")  # fmt: skip
        if made[p].whole or made[q].whole or grid is not made[q].grid or not inside:
            return None
        gx, gy = var(grid, "x"), var(grid, "y")
        first = self._first_in(grid, store, other)
        if p < q:
            return f" and {gy} {'<' if first else '<='} {gx}"
        return f" and {gx} {'<=' if first else '<'} {gy}"

    def _first_in(self, grid: LoopInfo, a: Access, b: Access) -> bool:
        """Whether ``a``'s statement comes before ``b``'s in an iteration of ``grid`` (a child
        loop: each statement an inner loop of it, or a block outside them)."""
        facts = self.body.facts
        inner = [m for m in facts.func.loops if m.parent is grid]

        def at(access: Access) -> int:
            block = access.op.block
            home = next((m for m in inner if block in facts.bodies[m]), None)
            return facts.position[home.header if home is not None else block]

        return at(a) < at(b)

    def phase(self, made: Phase, mode: tuple) -> Phase:
        """The phase over the grid loop ``made`` (the grid loop's whole phase) as ``mode``
        (``("split", grid loop, inner loops skipped, inner loop run as cells or None)``)
        runs it."""
        _, _, skipped, cells = mode
        facts, plan = self.body.facts, self.body.plan
        skip = {**made.skip, **{m.header: exit_block(facts, m) for m in skipped}}
        level = None
        if cells is not None:
            counter = self.body.values.counter(cells)
            level = Collapse(cells, counter, dict(plan.inner_trips)[counter], set(facts.bodies[cells]))
        return replace(made, skip=skip, inner=level)


class _ReadElsewhere(Reject):
    """A child loop's value read after it by the stores of ``item``, which another phase runs."""

    def __init__(self, why: str, item: object):
        super().__init__(why)
        self.item = item


class _Body:
    """The loop's body as fission sees it: its child loops, statements and stores."""

    def __init__(self, facts: FunctionLoops, plan: LoopPlan, values: LoopValues, stepped: bool = False):
        self.facts, self.plan, self.values = facts, plan, values
        self.stepped = stepped
        self.wave: tuple[tuple[int, int], ...] = ()  # a wavefront's steps (split_wavefront)
        self.children = [m for m in facts.func.loops if m.parent is plan.loop]
        if not self.children:
            raise Reject("no inner loop")
        check_body(facts, plan, values)
        self.exits: dict[LoopInfo, Block] = {}
        for child in self.children:
            out = exit_block(facts, child)
            if out is None or out not in plan.blocks:
                raise Reject("an inner loop with more than one way out")
            if sum(p not in facts.bodies[child] for p in facts.preds[child.header]) != 1:
                raise Reject("an inner loop entered from two places")
            self.exits[child] = out
            if not stepped:
                self._kept_inside(child)
        self.stores = [i for i, a in enumerate(plan.accesses) if a.store]
        if not self.stores:
            raise Reject("no store")
        if any(a.address is None for a in plan.accesses):
            raise Reject("an access isl cannot model")
        self.reaches = {i: self._loads_reaching(plan.accesses[i].op) for i in self.stores}
        self.model = NestModel(values, plan.trip, plan.inner_trips)
        self._modes: dict[tuple[int, ...], list] = {}

    # -- structure --------------------------------------------------------------------------

    def _kept_inside(self, child: LoopInfo) -> None:
        """:class:`Reject` where a value of ``child`` is read after it (a phase that skips
        the loop would have none)."""
        if self._read_after(child):
            raise Reject(f"a value of the loop at +0x{child.offset:x} is read after it")

    def _read_after(self, child: LoopInfo, out: Block | None = None) -> list:
        """The values ``child`` makes that something after it reads (its exit's arguments
        included; ``out``: the exit of a loop not among the loop's children)."""
        inside, users = self.facts.bodies[child], self.facts.users
        defined = [v for block in inside for v in (*block.args, *(r for op in block.ops for r in op.results))]
        read = [v for v in defined if any(where not in inside for _, where in users.get(v, []))]
        return read + [a for a in (out or self.exits[child]).args if users.get(a)]

    def item(self, access: Access) -> object:
        """The statement ``access`` belongs to: its child loop, or its block outside them."""
        block = access.op.block
        return next((c for c in self.children if block in self.facts.bodies[c]), block)

    def position(self, item: object) -> int:
        block = item.header if item in self.children else item
        return self.facts.position[block]

    def before(self, a: Access, b: Access) -> bool:
        """``a``'s statement comes before ``b``'s in every iteration (different statements)."""
        ia, ib = self.item(a), self.item(b)
        return ia is not ib and self.position(ia) < self.position(ib)

    def groups(self) -> list[list[int]]:
        """The stores by child loop in body order, those outside child loops with the next one."""
        by_item: dict[object, list[int]] = {}
        for i in self.stores:
            by_item.setdefault(self.item(self.plan.accesses[i]), []).append(i)
        groups, pending = [], []
        for item in sorted(by_item, key=self.position):
            pending += by_item[item]
            if item in self.children:
                groups.append(pending)
                pending = []
        if pending:
            if groups:
                groups[-1] += pending
            else:
                groups.append(pending)
        return groups

    def _loads_reaching(self, store: Op) -> set[Op]:
        """The loads whose values reach ``store`` (its address or value) inside the loop."""
        facts, plan = self.facts, self.plan
        loads, seen, work = set(), set(), list(store.operands)
        while work:
            v = work.pop()
            if v in seen:
                continue
            seen.add(v)
            block = facts.def_block.get(v)
            if block is None or block not in plan.blocks:
                continue  # a live-in
            owner = v.owner
            if isinstance(owner, Op):
                if owner.name == "mem.load":
                    loads.add(owner)
                work.extend(owner.operands)
            elif block is not plan.loop.header:  # a merge: what every edge into it passes
                for pred in facts.preds[block]:
                    for op in pred.ops:
                        work += [s.args[v.index] for s in op.successors if s.block is block]
        return loads

    # -- stepped loops -------------------------------------------------------------------------

    def stepped_phases(self, kept: set) -> list[tuple[list[int], object]]:
        """A stepped loop's phases in body order: each child loop whose stores may run over
        it as the grid within one iteration (or in parts, :meth:`pivot`), a phase of its own
        unless ``kept``; the statements and child loops between them, a phase on one thread
        (one with no store is left out: every phase skips its loops)."""
        items = sorted([*self.children, *{self.item(self.plan.accesses[i]) for i in self.stores}],
                       key=self.position)  # fmt: skip
        items = list(dict.fromkeys(items))
        phases: list[tuple[list[int], object]] = []
        run: list[object] = []

        def close() -> None:
            stores = [i for i in self.stores if self.item(self.plan.accesses[i]) in run]
            if stores:
                phases.append((stores, ("single", tuple(c for c in run if c in self.children))))
            run.clear()

        for item in items:
            stores = [i for i in self.stores if self.item(self.plan.accesses[i]) is item]
            alone = item in self.children and stores and item not in kept
            if alone and self._grid_alone(stores, item):
                close()
                phases += _Columns(self).split(stores, item) or [(stores, item)]
            elif alone and (split := _Parts(self).pivot(stores, item)) is not None:
                close()
                phases.append((stores, ("pivot", (item,), *split)))
            else:
                run.append(item)
        close()
        return phases

    def _grid_alone(self, stores: list[int], child: LoopInfo) -> bool:
        try:
            self.legal([(stores, child)], only=0)
        except Reject:
            return False
        return True

    def _stepped_relation(
        self, made: list[Phase], p: int, q: int, store: Access, other: Access
    ) -> str | None:
        """Where a stepped loop's store (phase ``p``) and access (phase ``q``) must not meet, or
        None where they may: iterations of the loop run in order, and within one its phases
        in turn, one thread running a phase on one thread in Wasm's order."""
        kx, ky = self.model.var(self.plan.loop, "x"), self.model.var(self.plan.loop, "y")
        if p == q and made[p].whole:
            return None
        if (split := _Columns(self).relation(made, p, q, store, other)) is not None:
            return f"{kx} = {ky}" + split
        if p == q:  # the grid's threads run one iteration of its loop each, in any order
            grid = made[p].grid
            if other.op.block in self.facts.bodies[grid]:
                return f"{kx} = {ky} and {self.model.var(grid, 'x')} != {self.model.var(grid, 'y')}"
            return f"{kx} = {ky}"
        if (p < q and self.before(store, other)) or (p > q and self.before(other, store)):
            return None  # the phases run in the statements' order
        return f"{kx} = {ky}"

    def apart_in_task(self, made: list[Phase]) -> frozenset[tuple[int, int]]:
        """The (store, access) pairs of each grid phase whose byte ranges never meet within
        one task (the same iteration of the loop and of the grid loop, any of the loops
        inside), for the stores an inner loop of the task repeats: isl's proof, on one base
        address (pairs apart by live-ins only are not claimed)."""
        plan, model, bodies = self.plan, self.model, self.facts.bodies
        reloads = {j for _, j in plan.task_reloads}  # (their op is the carried load's: its own access counts)
        out: set[tuple[int, int]] = set()
        for ph in made:
            if ph.whole:
                continue
            grid = bodies[ph.grid]
            inner = [m for m in self.values.nested if m is not ph.grid and m.header in grid]
            relation = (f"{model.var(plan.loop, 'x')} = {model.var(plan.loop, 'y')} and "
                        f"{model.var(ph.grid, 'x')} = {model.var(ph.grid, 'y')}")  # fmt: skip
            for i in ph.stores:
                store = plan.accesses[i]
                if not any(store.op.block in bodies[m] for m in inner):
                    continue
                for j, other in enumerate(plan.accesses):
                    if j == i or other.op.block not in grid or j in reloads:
                        continue
                    with contextlib.suppress(Reject):  # (they meet, or isl cannot say)
                        if not self._meets(store, other, relation):  # (True: the guards' word)
                            out.add((i, j))
        return frozenset(out)

    def check_outflow(self, phases: list[Phase]) -> None:
        """:class:`Reject` where a value a child loop makes is read after it by anything but
        the stores of the one-thread phase that runs the loop (another phase skips it)."""
        facts, plan = self.facts, self.plan
        for child in self.children:
            inside = facts.bodies[child]
            home = [n for n, ph in enumerate(phases) if ph.whole and child.header not in ph.skip]
            work = self._read_after(child)
            seen: set = set()
            while work:
                v = work.pop()
                if v in seen:
                    continue
                seen.add(v)
                for op, where in facts.users.get(v, []):
                    if where in inside:
                        continue
                    why = f"a value of the loop at +0x{child.offset:x} is read after it"
                    if where not in plan.blocks or not home:
                        raise Reject(why)
                    if op.successors:
                        if v in op.operands:
                            raise Reject(why + " (by a branch)")
                        for succ in op.successors:
                            for target, passed in zip(succ.block.args, succ.args, strict=True):
                                if passed is v:
                                    if succ.block is plan.loop.header:
                                        raise Reject(why + " (by the next iteration)")
                                    work.append(target)
                    elif op.name == "mem.store":
                        index = next(i for i in self.stores if plan.accesses[i].op is op)
                        if index not in phases[home[0]].stores:
                            raise _ReadElsewhere(why + " (by another phase)", self.item(plan.accesses[index]))
                    else:
                        work.extend(op.results)

    # -- legality -----------------------------------------------------------------------------

    def modes(self, group: list[int]) -> list:
        """How the stores ``group`` may run as one phase, on their own: "whole", and their
        child loop (the grid loop) where every one of them is inside it."""
        key = tuple(group)
        if key not in self._modes:
            found = []
            for mode in ["whole", *self.children]:
                if mode != "whole" and not all(
                    self.plan.accesses[i].op.block in self.facts.bodies[mode] for i in group
                ):
                    continue
                try:
                    self.legal([(group, mode)], only=0)
                except Reject:
                    continue
                found.append(mode)
            self._modes[key] = found
        return self._modes[key]

    def legal(
        self, phases: list[tuple[list[int], object]], only: int | None = None
    ) -> tuple[list[Phase], list]:
        """The phases and the pairs settled statically; :class:`Reject` where a pair meets out of
        order or cannot be modelled. ``only``: check the pairs within that phase alone."""
        plan, model = self.plan, self.model
        made = [self._phase(stores, mode) for stores, mode in phases]
        home = {i: n for n, (stores, _) in enumerate(phases) for i in stores}
        needs: dict[int, set[int]] = {}  # the phases each access runs in
        for j, access in enumerate(plan.accesses):
            if access.store:
                needs[j] = {home[j]} if j in home else set()
                continue
            reached = [i for i, loads in self.reaches.items() if access.op in loads]
            needs[j] = {home[i] for i in reached if i in home} if reached else set(home.values())
        free, guarded = [], set()
        kx, ky = model.var(plan.loop, "x"), model.var(plan.loop, "y")
        for i in home:
            p = home[i]
            store = plan.accesses[i]
            for j, other in enumerate(plan.accesses):
                for q in needs[j]:
                    if only is not None and (p != only or q != only):
                        continue
                    if self.wave:
                        relation = _wave_relation(self, made, p, q, store, other)
                        if relation is None:
                            continue
                    elif self.stepped:
                        relation = self._stepped_relation(made, p, q, store, other)
                        if relation is None:
                            continue
                    elif p == q and made[p].whole:
                        relation = f"{kx} != {ky}"
                    elif p == q:
                        grid = made[p].grid
                        inside = other.op.block in self.facts.bodies[grid]
                        relation = f"{model.var(grid, 'x')} != {model.var(grid, 'y')}" if inside else "0 = 0"
                    elif p < q:
                        relation = f"{ky} < {kx}" if self.before(store, other) else f"{ky} <= {kx}"
                    else:
                        relation = f"{kx} < {ky}" if self.before(other, store) else f"{kx} <= {ky}"
                    if self._meets(store, other, relation):
                        guarded.add((i, j))
                if (i, j) not in guarded:
                    free.append((i, j))
        return made, free

    def _meets(self, store: Access, other: Access, relation: str) -> bool:
        """False where the pair never meets under ``relation``; True where only the guards can
        say (base pointers apart); :class:`Reject` where it meets or cannot be modelled."""
        meet = self._meeting(store, other, relation)
        if meet is None:
            return True
        try:
            if meet.is_empty():
                return False
        except isl.Error:
            raise Reject("isl gave up on a pair") from None
        raise Reject(f"store at {store.where} meets {other.kind} at {other.where} out of order once split")

    def _meeting(self, store: Access, other: Access, relation: str) -> object | None:
        """The pairs of iterations (isl) where ``store`` and ``other`` meet under ``relation``;
        None where only the guards can say (base pointers apart); :class:`Reject` where it
        cannot be modelled. Two addresses apart by live-ins computed from the same values
        before the loop (jacobi's ``B + 8`` and ``B``) are modelled in those values."""
        if (store.address - other.address).leaves() - self.model.counters:
            rooted = (replace(store, address=self._rooted(store.address)),
                      replace(other, address=self._rooted(other.address)))  # fmt: skip
            if not (rooted[0].address - rooted[1].address).leaves() - self.model.counters:
                store, other = rooted
        _context().reset_operations()
        try:
            modelled = self.model.related(store, other, relation)
        except isl.Error:
            raise Reject("isl gave up on a pair") from None
        if modelled is not None:
            return modelled[1]
        if (store.address - other.address).leaves() - self.model.counters:
            return None
        raise Reject(f"store at {store.where} and {other.kind} at {other.where} are not modelled")

    def _rooted(self, poly: Poly) -> Poly:
        """``poly`` with each live-in that a sum, difference or multiple made before the loop
        expanded into the values it was made from."""
        total = Poly.const(0)
        for monomial, coeff in poly.terms.items():
            term = Poly.const(coeff)
            for sym in monomial:
                term = term * self._root(sym, 0)
            total = total + term
        return total

    def _root(self, sym, depth: int) -> Poly:
        op = sym.ref.owner if sym.kind == "value" else None
        if not isinstance(op, Op) or depth > 8 or op.name not in ("arith.add", "arith.sub", "arith.mul"):
            return Poly.symbol(sym)
        a, b = (self._made(v, depth + 1) for v in op.operands)
        if op.name == "arith.mul" and a.leaves() and b.leaves():
            return Poly.symbol(sym)
        return a + b if op.name == "arith.add" else a - b if op.name == "arith.sub" else a * b

    def _made(self, value, depth: int) -> Poly:
        owner = value.owner
        if isinstance(owner, Op) and owner.opdef is arith.constant and not owner.attrs["type"].is_float:
            ty, bits = owner.attrs["type"], owner.attrs["value"]
            return Poly.const(bits - (1 << ty.bits) if bits >> (ty.bits - 1) else bits)
        return self._root(self.values.symbol_for(value), depth)

    def _phase(self, stores: list[int], mode: object) -> Phase:
        plan = self.plan
        if isinstance(mode, tuple) and mode[0] == "split":  # over a grid loop, some of its inner loops skipped
            return _Columns(self).phase(self._phase(stores, mode[1]), mode)
        if isinstance(mode, tuple):  # a stepped loop's phase on one thread: its run's child loops
            held = mode[1]
            skip = {c.header: self.exits[c] for c in self.children if c not in held}
            return Phase(plan.loop, plan.loop, plan.counter, plan.trip, stores=frozenset(stores), whole=True,
                         skip=skip)  # fmt: skip
        holds = {
            c for c in self.children for i in stores if plan.accesses[i].op.block in self.facts.bodies[c]
        }
        if mode == "whole":
            skip = {c.header: self.exits[c] for c in self.children if c not in holds}
            return Phase(plan.loop, plan.loop, plan.counter, plan.trip, stores=frozenset(stores), whole=True,
                         skip=skip)  # fmt: skip
        grid: LoopInfo = mode
        trip = grid_trip(self.facts, plan, self.values, grid)
        skip = {c.header: self.exits[c] for c in self.children if c is not grid}
        bodies = self.facts.bodies[grid]
        return Phase(grid, grid, self.values.counter(grid), trip, set(bodies), set(bodies), self.exits[grid],
                     self.exits[grid], stores=frozenset(stores), skip=skip)  # fmt: skip
