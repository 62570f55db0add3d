"""The kernel of a distributed loop: one phase of one iteration, for one grid iteration.

:mod:`compiler.analysis.schedule` splits a loop's body into phases (its child loops) and
names each phase's grid loop. The kernel ``loop_<func>_<offset>(k, phase, t, live-ins...)
-> (more)`` runs, in iteration ``k`` of the loop, phase ``phase`` for iteration ``t`` of
that phase's grid loop, and returns 0 when ``t`` is past the grid loop's count (past its
rest, where it has one: the thread has no more work in this phase), else 1. It is a copy of the loop's body, one per
phase, in which

- the other phases' child loops are skipped (the edge into one goes to its exit; nothing
  computed inside a child is read after it);
- the phase's grid loop is entered at iteration ``t`` (its induction variables moved by
  ``step * t``), and the end of that iteration leaves it, so a sequential loop around it
  (the interchanged ``k``) runs all its iterations in order, each with iteration ``t``;
- in a phase with a rest (stores around the grid loop: clang's remainder of an unrolled
  one), ``t`` equal to the grid's count runs the body with the grid loop skipped, and the
  other values of ``t`` run it without those stores;
- the stores outside every child loop (correlation's ``corr[i][i] = 1``) are the work of
  the first phase, where they are (``Phase.statements``): it runs the body for ``t == 0``
  only, every child loop skipped; the other phases leave those stores out;
- the merges the analysis pinned (an unrolled loop's end) are computed at the kernel's
  entry from their polynomials, and edges into them pass a zero nothing reads;
- the loop's back edge and exit end the call;
- in a 3-D grid (a collapsed nest whose inner loop has the phases,
  :func:`compiler.analysis.nests.phase_nests`) the collapsed loop is entered at iteration
  ``k2`` (a parameter after ``t``) and its back edge ends the call too.

A split sequential loop's phases (:mod:`compiler.analysis.fission`, ``LoopPlan.fission``)
make only their own stores (``Phase.stores``) and skip the child loops ``Phase.skip``
names; a phase run whole takes no ``t`` (one call per iteration ``k``); one over a grid
loop enters it at ``t`` as above.

The launch entry (:func:`compiler.lower.function.lower_loop_entry`) calls it for every
phase in turn, each thread of the iteration's block taking ``t = lane, lane + lanes, ...``
until it returns 0, with a barrier between phases on the GPU.
"""

from __future__ import annotations

from tensorwasm.compiler.analysis.liveness import widened_in
from tensorwasm.compiler.analysis.plan import LoopPlan, Phase, TripCount
from tensorwasm.compiler.analysis.poly import Poly
from tensorwasm.dialect import arith, mem, simd
from tensorwasm.dialect.builder import Builder
from tensorwasm.dialect.ir import Block, Function, Module, Op, Successor, Value
from tensorwasm.dialect.types import I32, I64, Type
from tensorwasm.dialect.verifier import reverse_postorder, verify_function


class _Scope:
    """The kernel's values for the loop's: parameters, the entry's recomputed values, and
    (per phase) the copied body's."""

    def __init__(self, kernel: Function, entry: Block, plan: LoopPlan):
        self.kernel, self.entry, self.plan = kernel, entry, plan
        self.k = entry.args[0]
        # a 3-D grid's second counter comes after ``t``, then a phase's cell (``Phase.inner``)
        levels = len(plan.collapse)
        self.cell = entry.args[3 + levels] if any(p.inner is not None for p in plan.phases) else None
        levels += self.cell is not None
        self.counters = {
            plan.counter: self.k,
            **{c.counter: a for c, a in zip(plan.collapse, entry.args[3:], strict=False)},
        }
        self.shared: dict[Value, Value] = {}
        self.by_symbol = {}
        halves: dict[Value, list[Value]] = {}
        for (value, sym, kind, _), param in zip(plan.live_ins, entry.args[3 + levels :], strict=True):
            self.shared[value] = param
            self.by_symbol[sym] = param
            if kind.startswith("v128 "):  # a vector made before the loop comes in as two i64 lanes
                halves.setdefault(value.owner.operands[0], []).append(param)
        b = Builder(kernel, entry)
        for vector, (low, high) in halves.items():
            splat = b.value(simd.splat, low, op="i64x2.splat")
            self.shared[vector] = b.value(simd.replace_lane, splat, high, op="i64x2.replace_lane", lane=1)

    def poly(self, poly: Poly, ty: Type, b: Builder) -> Value:
        """``poly`` (in the loop's counter and the live-ins) computed as ``ty``."""
        total = None
        for monomial, coeff in poly.terms.items():
            if monomial and monomial[0].kind == "floor":  # c * floor(x / d), d | c: (c/d) * (x & -d)
                inner, divisor = monomial[0].ref
                masked = b.value(arith.and_, self.poly(inner, ty, b), b.constant(ty, -divisor))
                term = b.value(arith.mul, b.constant(ty, coeff // divisor), masked)
                total = term if total is None else b.value(arith.add, total, term)
                continue
            term = b.constant(ty, coeff)
            for sym in monomial:
                factor = self.counters[sym] if sym in self.counters else self.by_symbol[sym]
                if factor.type is not ty:
                    factor = b.value(arith.sext, factor, to=ty)
                term = b.value(arith.mul, term, factor)
            total = term if total is None else b.value(arith.add, total, term)
        return total if total is not None else b.constant(ty, 0)

    def value(self, v: Value, mapping: dict[Value, Value]) -> Value:
        """The kernel's value for ``v``: the phase's copy, or one the entry computes."""
        found = mapping.get(v)
        if found is None:
            found = self.shared.get(v)
        if found is not None:
            return found
        owner = v.owner
        at_entry = Builder(self.kernel, self.entry)
        if isinstance(owner, Op) and owner.opdef is arith.constant:
            made = at_entry.constant(owner.attrs["type"], owner.attrs["value"])
        elif (widened := widened_in(v, [value for value, *_ in self.plan.live_ins])) is not None:
            held = self.shared[self.plan.live_ins[widened][0]]  # the compare's 0-or-1 came in
            made = at_entry.value(arith.cmpi, held, at_entry.constant(held.type, 0), pred="ne")
        elif isinstance(owner, Op) and owner.name.startswith("arith.") and owner.opdef.pure:
            operands = [self.value(x, mapping) for x in owner.operands]
            clone = Op(owner.opdef, operands, tuple(r.type for r in owner.results), dict(owner.attrs), [],
                       owner.offset)  # fmt: skip
            clone.block = self.entry
            self.entry.ops.append(clone)
            for old, new in zip(owner.results, clone.results, strict=True):
                self.shared[old] = new
            return self.shared[v]
        else:
            raise KeyError(f"value {v} has no counterpart in the kernel")
        self.shared[v] = made
        return made


def outline_phases(module: Module, plan: LoopPlan, name: str) -> Function:
    """Build the phase kernel of ``plan`` (which has phases) and append it to ``module``."""
    cells = any(p.inner is not None for p in plan.phases)  # a cell's index after ``t`` (_Scope.cell)
    params = (I32, I32, I32, *(I32 for _ in plan.collapse), *((I32,) if cells else ()),
              *(v.type for v, *_ in plan.live_ins))  # fmt: skip
    kernel = Function(name, len(module.functions), params, (I32,))
    kernel.attrs["loop_plan"] = plan
    module.functions.append(kernel)
    entry = kernel.add_block(params)
    scope = _Scope(kernel, entry, plan)
    b = Builder(kernel, entry)
    for arg in plan.loop.header.args:
        if arg in plan.ivs:
            start, step = plan.ivs[arg]
            scope.shared[arg] = scope.poly(start + step * Poly.symbol(plan.counter), arg.type, b)
        elif arg in plan.invariant_args:
            scope.shared[arg] = scope.value(plan.invariant_args[arg], {})
        else:  # never read inside the loop
            scope.shared[arg] = b.constant(arg.type if not arg.type.is_ref else I64, 0)
    for arg, poly in plan.pinned:  # merges after inner loops, whichever path reached them
        scope.shared[arg] = scope.poly(poly, arg.type, b)
    more, over, row_over = kernel.add_block([]), kernel.add_block([]), kernel.add_block([])
    Builder(kernel, more).ret([Builder(kernel, more).constant(I32, 1)])
    Builder(kernel, over).ret([Builder(kernel, over).constant(I32, 0)])
    Builder(kernel, row_over).ret([Builder(kernel, row_over).constant(I32, 2)])  # past a row's cells
    _, phase, t = entry.args[:3]
    test = entry
    split: dict[tuple, Block] = {}  # a loop split at its pivot: one copy for its three parts
    for index, ph in enumerate(plan.phases):
        b = Builder(kernel, test)
        counted, test = kernel.add_block([]), kernel.add_block([])
        b.cond_br(b.value(arith.cmpi, phase, b.constant(I32, index), pred="eq"), counted, [], test, [])
        b = Builder(kernel, counted)
        if ph.pivot is not None:
            key = (ph.grid.header, ph.stores)
            if key in split:
                b.br(split[key])
                continue
            split[key] = counted
        past = over
        if ph.whole:  # a split loop's phase run whole for iteration k: one call
            b.br(_copy_body(kernel, plan, ph, scope, t, more))
            continue
        if ph.statements:  # the statements outside the child loops: one thread, t == 0
            first = b.value(arith.cmpi, t, b.constant(I32, 0), pred="eq")
            b.cond_br(first, _copy_body(kernel, plan, ph, scope, t, more), [], over, [])
            continue
        if ph.rest:  # iteration t == the grid's count: the rest's thread
            past = kernel.add_block([])
            rest = Builder(kernel, past)
            rest.cond_br(_within(rest, ph.trip, scope, t, extra=1), _copy_body(kernel, plan, ph, scope, t, more, rest=True), [], over, [])  # fmt: skip
        body = _copy_body(kernel, plan, ph, scope, t, more)
        if ph.inner is not None:  # cell u of row t: one iteration of the grid loop's inner loop
            row = kernel.add_block([])
            cell = Builder(kernel, row)
            cell.cond_br(_within(cell, ph.inner.trip, scope, scope.cell), body, [], row_over, [])
            body = row
        b.cond_br(_within(b, ph.trip, scope, t), body, [], past, [])
    Builder(kernel, test).br(over)
    _constants_first(entry)
    live = set(reverse_postorder(kernel))
    kernel.blocks = [blk for blk in kernel.blocks if blk in live]
    verify_function(kernel)
    return kernel


def _copy_body(
    kernel: Function, plan: LoopPlan, ph: Phase, scope: _Scope, t: Value, more: Block, rest: bool = False
) -> Block:
    """The loop body as phase ``ph`` runs it for grid iteration ``t``, or with ``rest`` as its
    rest's thread runs it (the grid loop skipped, the stores around it kept: a grid
    iteration's copy leaves them out); returns its first block."""
    header = plan.loop.header
    pinned = {arg for arg, _ in plan.pinned}
    mapping: dict[Value, Value] = {}
    body = [blk for blk in plan.func.blocks if blk in plan.blocks]
    clones: dict[Block, Block] = {}
    for blk in body:
        clone = kernel.add_block([] if blk is header else [a.type for a in blk.args])
        clones[blk] = clone
        if blk is not header:
            mapping.update((a, c) for a, c in zip(blk.args, clone.args, strict=True) if a not in pinned)
    grid = ph.grid.header
    start = (
        None if rest or ph.statements or ph.whole
        else _enter_at(kernel, plan, grid, scope, t, clones[grid], ph.counter)
    )  # fmt: skip
    # A 3-D grid's second level: entered at the block's iteration, which ends the call.
    levels = {c.loop.header: (c, _enter_at(kernel, plan, c.loop.header, scope, a, clones[c.loop.header]))
              for c, a in zip(plan.collapse, scope.entry.args[3:], strict=False)}  # fmt: skip
    if ph.inner is not None:  # a phase run as cells: the inner loop entered at cell u, which ends the call
        cells = ph.inner.loop.header
        levels[cells] = (ph.inner, _enter_at(kernel, plan, cells, scope, scope.cell, clones[cells]))
    loops = [p for p in plan.phases if not p.statements and not plan.fission]
    children = {p.loop.header: p for p in loops}
    bodies = {p.loop.header: p.blocks for p in loops}
    grid_body = ph.grid_blocks
    kept = {id(plan.accesses[i].op) for i in ph.stores}
    scopes = _task_scopes(kernel, plan)
    # A stepped loop's phase skips child loops whose values the statements after them read
    # for another phase's stores (left out here): those reads get zeros.
    skipped = _skipped_blocks(plan, ph)

    def operand(v: Value, blk: Block) -> Value:
        if skipped and blk not in skipped and _home(v) in skipped:
            return _zero(kernel, v.type)
        return scope.value(v, mapping)

    if plan.fission:  # a split loop's phase: its own stores only (``kept``)
        around = set()
    elif ph.statements:  # every child loop skipped, the stores outside them kept
        around = set()
    else:  # the rest's stores (its thread's alone), and the statements' (their phase's)
        around = (set() if rest else ph.blocks - grid_body) | (plan.blocks - set().union(*bodies.values()))
    for blk, clone in clones.items():
        for op in blk.ops:
            if op.name == "mem.store" and (blk in around or (plan.fission and id(op) not in kept)):
                continue
            succs = []
            for succ in op.successors:
                target = succ.block
                args = [
                    _zero(kernel, a.type) if a in pinned else operand(v, blk)
                    for a, v in zip(target.args, succ.args, strict=True)
                ]
                other = children.get(target)
                level = levels.get(target)
                if target is header or target not in plan.blocks or (level and blk in level[0].blocks):
                    succs.append(Successor(more, []))  # this iteration's phase is over
                elif level:
                    succs.append(Successor(level[1], args))
                elif target in ph.skip:  # a split loop's child loop this phase skips
                    succs.append(Successor(clones[ph.skip[target]], _zeros(kernel, ph.skip[target])))
                elif other is not None and other is not ph and blk not in bodies[target]:
                    succs.append(Successor(clones[other.exit], _zeros(kernel, other.exit)))  # skipped
                elif target is grid and blk not in grid_body and rest:
                    succs.append(Successor(clones[ph.grid_exit], _zeros(kernel, ph.grid_exit)))  # skipped
                elif target is grid and blk not in grid_body:
                    succs.append(Successor(start, args))  # entered at iteration t
                elif target is grid:  # iteration t is done: leave the grid loop
                    succs.append(Successor(clones[ph.grid_exit], _zeros(kernel, ph.grid_exit)))
                else:
                    succs.append(Successor(clones[target], args))
            new = Op(op.opdef, [operand(v, blk) for v in op.operands],
                     tuple(r.type for r in op.results), dict(op.attrs), succs, op.offset)  # fmt: skip
            if op.name in ("mem.load", "mem.store"):
                new.attrs["proven"] = True  # affine: the guards proved every address
                new.attrs.update(scopes.get(id(op), {}))
            new.block = clone
            clone.ops.append(new)
            mapping.update(zip(op.results, new.results, strict=True))
    return clones[header]


def _task_scopes(kernel: Function, plan: LoopPlan) -> dict[int, dict[str, object]]:
    """The alias attributes of the accesses :attr:`LoopPlan.task_apart` pairs, by the id of
    their op: a store's ``alias_scope`` (a name of its own in the kernel) and an access's
    ``noalias`` (the scopes of the stores it never meets within a task), which the lowering
    gives LLVM as scoped no-alias metadata (:func:`compiler.lower.memory.mark_aliasing`)."""
    out: dict[int, dict[str, object]] = {}
    for i, j in sorted(plan.task_apart):
        name = f"{kernel.name}.store{i}"
        out.setdefault(id(plan.accesses[i].op), {})["alias_scope"] = name
        found = out.setdefault(id(plan.accesses[j].op), {})
        found["noalias"] = (*found.get("noalias", ()), name)
    return out


def _enter_at(
    kernel: Function, plan: LoopPlan, header: Block, scope: _Scope, t: Value, target: Block, counter=None
) -> Block:
    """The entry into the loop at ``header`` (a grid loop, a 3-D grid's second level): its
    induction variables jump to iteration ``t``, and a wavefront's task loads again what the
    previous task carried to it (``LoopPlan.task_reloads``: the grid loop's ``counter`` at
    ``t``)."""
    start = kernel.add_block([a.type for a in header.args])
    b = Builder(kernel, start)
    reloads = {arg: plan.accesses[index] for arg, index in plan.task_reloads}
    values = []
    for arg, entering in zip(header.args, start.args, strict=True):
        if arg in plan.ivs:
            step = scope.poly(plan.ivs[arg][1], arg.type, b)
            count = t if arg.type is I32 else b.value(arith.sext, t, to=arg.type)
            entering = b.value(arith.add, entering, b.value(arith.mul, step, count))
        elif arg in reloads and counter is not None:
            access = reloads[arg]
            scope.counters[counter] = t  # (the same parameter in every phase)
            made = access.op.attrs  # the carried load's, or the store's whose value is carried
            attrs = {"type": arg.type, "bits": made["bits"], "signed": made.get("signed", False),
                     "offset": 0, "align": made["align"], "proven": True}  # fmt: skip
            entering = b.op(mem.load, [scope.poly(access.address, I32, b)], attrs).results[0]
        values.append(entering)
    b.br(target, values)
    return start


def _skipped_blocks(plan: LoopPlan, ph: Phase) -> set[Block]:
    """The blocks of the child loops a stepped loop's phase ``ph`` skips (none otherwise)."""
    if not plan.stepped:
        return set()
    found: set[Block] = set()
    for header, out in ph.skip.items():
        work = [header]
        while work:
            blk = work.pop()
            if blk in found or blk is out or blk is plan.loop.header or blk not in plan.blocks:
                continue
            found.add(blk)
            work += blk.successors
    return found


def _home(v: Value) -> Block | None:
    owner = v.owner
    return owner if isinstance(owner, Block) else getattr(owner, "block", None)


def _zeros(kernel: Function, block: Block) -> list[Value]:
    """Arguments for ``block`` that nothing reads (the analysis made sure, or pinned them)."""
    return [_zero(kernel, a.type) for a in block.args]


def _zero(kernel: Function, ty: Type) -> Value:
    return Builder(kernel, kernel.blocks[0]).constant(ty, 0)


def _within(b: Builder, trip: TripCount, scope: _Scope, t: Value, extra: int = 0) -> Value:
    """Whether ``t`` is below the grid loop's count in this iteration (plus ``extra``), as
    ``runtime.guards.trip_count`` counts it (the guards made sure its bounds do not wrap),
    without a division: with ``d`` the distance to the bound (clamped at 0) and ``s`` the
    step's size, ``t < ceil(d / s)`` exactly when ``s * t < d`` (tested at the top), and
    ``t < ceil(d / s) + 1`` exactly when ``s * t < d + s`` (tested after the body). A "!="
    test's distance is a multiple of ``s``."""
    ty = I32 if trip.bits == 32 else I64
    start, bound = scope.poly(trip.start, ty, b), scope.poly(trip.bound, ty, b)
    step = abs(trip.step)
    if trip.pred == "ne":
        diff = b.value(arith.sub, bound, start) if trip.step > 0 else b.value(arith.sub, start, bound)
        if ty is I32:
            diff = b.value(arith.zext, diff, to=I64)
    else:
        if ty is I32:
            widen = arith.sext if trip.pred.startswith("s") else arith.zext
            start, bound = b.value(widen, start, to=I64), b.value(widen, bound, to=I64)
        diff = b.value(arith.sub, bound, start) if trip.step > 0 else b.value(arith.sub, start, bound)
        if trip.pred[1:] in ("le", "ge"):
            diff = b.value(arith.add, diff, b.constant(I64, 1))
        zero = b.constant(I64, 0)
        diff = b.value(arith.select, b.value(arith.cmpi, diff, zero, pred="sgt"), diff, zero)
    if not trip.top or extra:
        diff = b.value(arith.add, diff, b.constant(I64, step * ((not trip.top) + extra)))
    scaled = b.value(arith.mul, b.value(arith.sext, t, to=I64), b.constant(I64, step))
    return b.value(arith.cmpi, scaled, diff, pred="slt")


def _constants_first(entry: Block) -> None:
    """Keep the entry's terminator last after values were added behind it."""
    term = [op for op in entry.ops if op.opdef.terminator]
    entry.ops = [op for op in entry.ops if not op.opdef.terminator] + term
