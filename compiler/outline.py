"""Outlining: a loop the analysis accepted becomes a kernel function of one iteration.

The kernel ``loop_<func>_<offset>(k, live-ins...) -> (partials...)`` runs iteration ``k``:
its entry block computes every induction variable of the loop as ``start + step * k``,
binds loop-invariant header values to their entry values and reductions to their identity,
then runs a copy of the loop body. Inner loops are copied whole and run sequentially in
the thread, except collapsed ones (:class:`compiler.analysis.plan.Collapse`, the kernel's
second and third counters): the thread enters each at its own iteration and runs only
that one of the innermost. Branches back to the header, and the loop's exit, end the iteration and
return each reduction's contribution; trap blocks the body can reach are copied too. A v128
live-in comes as its two i64 halves, put together again in the entry block; a v128
reduction starts from its lanes' identities and returns each lane's contribution; a v128
induction variable is ``start + k * step`` lane by lane (:func:`vector_iv_at`). The
kernel goes through the ordinary lowering, so it runs on the GPU and on the host alike;
the launch entry points around it live in :mod:`compiler.lower.function`.
"""

from __future__ import annotations

from tensorwasm.compiler.analysis.isl import constant_count
from tensorwasm.compiler.analysis.liveness import widened_in
from tensorwasm.compiler.analysis.plan import Access, LoopPlan, Reduction, ReductionKind
from tensorwasm.compiler.analysis.poly import Poly, Symbol
from tensorwasm.compiler.analysis.reductions import lane_identity
from tensorwasm.compiler.distribute import outline_phases
from tensorwasm.compiler.tile import tile_kernel
from tensorwasm.dialect import arith, gpu, mem, simd
from tensorwasm.dialect.builder import Builder
from tensorwasm.dialect.ir import Block, Function, Module, Op, Successor, Value
from tensorwasm.dialect.types import I32, I64, V128, Type
from tensorwasm.dialect.verifier import reverse_postorder, verify_function


def identity_bits(op: str, ty: Type) -> int:
    """The identity element of a reduction (a :class:`ReductionKind` or its name), as a bit
    pattern of ``ty``."""
    return ReductionKind(op).identity(ty.bits)


def kernel_name(plan: LoopPlan) -> str:
    return f"loop_{plan.func.name}_{plan.loop.offset:x}"


def outline(module: Module, plan: LoopPlan) -> Function:
    """Build the iteration kernel of ``plan`` and append it to ``module``."""
    if plan.phases:  # a distributed body: one phase of one iteration per call
        return outline_phases(module, plan, kernel_name(plan))
    func = plan.func
    header = plan.loop.header
    nest = plan.collapse
    counters = (I32,) * (1 + len(nest))
    params = (*counters, *(v.type for v, *_ in plan.live_ins))
    results = tuple(r.arg.type for r in plan.reductions)
    kernel = Function(kernel_name(plan), len(module.functions), params, results)
    kernel.attrs["loop_plan"] = plan
    module.functions.append(kernel)
    entry = kernel.add_block(params)
    b = Builder(kernel, entry)
    k = entry.args[0]
    mapping: dict[Value, Value] = {}
    by_symbol = {}
    halves: dict[Value, list[Value]] = {}
    for (value, sym, kind, _), param in zip(plan.live_ins, entry.args[len(counters) :], strict=True):
        mapping[value] = param
        by_symbol[sym] = param
        if kind.startswith("v128 "):
            halves.setdefault(value.owner.operands[0], []).append(param)
    for vector, (low, high) in halves.items():
        mapping[vector] = b.value(
            simd.replace_lane,
            b.value(simd.splat, low, op="i64x2.splat"),
            high,
            op="i64x2.replace_lane",
            lane=1,
        )

    def emit_poly(poly: Poly, ty: Type, b: Builder = b) -> Value:
        total = None
        for monomial, coeff in poly.terms.items():
            term = b.constant(ty, coeff)
            for sym in monomial:
                factor = k if sym is plan.counter else by_symbol[sym]
                if factor.type is not ty:
                    factor = b.value(arith.sext, factor, to=ty)
                term = b.value(arith.mul, term, factor)
            total = term if total is None else b.value(arith.add, total, term)
        return total if total is not None else b.constant(ty, 0)

    def value_of(v: Value) -> Value:
        mapped = mapping.get(v)
        if mapped is not None:
            return mapped
        owner = v.owner
        if isinstance(owner, Op) and owner.opdef is arith.constant:
            with_entry = Builder(kernel, entry)
            mapped = with_entry.constant(owner.attrs["type"], owner.attrs["value"])
            entry.ops.insert(0, entry.ops.pop())  # keep constants ahead of their uses
            mapping[v] = mapped
            return mapped
        widened = widened_in(v, [value for value, *_ in plan.live_ins])
        if widened is not None:  # the compare's 0-or-1 came in: test it again
            held = mapping[plan.live_ins[widened][0]]
            at_entry = Builder(kernel, entry)  # the entry's branch goes last at the end
            mapping[v] = at_entry.value(arith.cmpi, held, at_entry.constant(held.type, 0), pred="ne")
            return mapping[v]
        if isinstance(owner, Op) and owner.name.startswith(("arith.", "simd.")) and owner.opdef.pure:
            # Pure arithmetic before the loop that no local holds: recomputed from its
            # operands (the analysis made sure they reach the kernel).
            operands = [value_of(x) for x in owner.operands]
            clone = Op(
                owner.opdef,
                operands,
                tuple(r.type for r in owner.results),
                dict(owner.attrs),
                [],
                owner.offset,
            )
            clone.block = entry
            entry.ops.append(clone)
            for old, new in zip(owner.results, clone.results, strict=True):
                mapping[old] = new
            return mapping[v]
        raise KeyError(f"value {v} has no counterpart in the kernel")

    reloads = {header.args[arg]: plan.accesses[index] for arg, index in plan.rotations}
    reductions: dict[Value, Reduction] = {r.arg: r for r in plan.reductions}
    vectors = {r.vector: r for r in plan.reductions if r.vector is not None}
    for arg in header.args:
        if arg in vectors:
            mapping[arg] = b.constant(V128, _vector_identity(vectors[arg]))
        elif arg in plan.ivs:
            start, step = plan.ivs[arg]
            mapping[arg] = emit_poly(start + step * Poly.symbol(plan.counter), arg.type)
        elif arg in plan.vector_ivs:
            start, step, add = plan.vector_ivs[arg]
            mapping[arg] = vector_iv_at(b, value_of(start), value_of(step), add, k)
        elif arg in plan.invariant_args:
            mapping[arg] = value_of(plan.invariant_args[arg])
        elif arg in reloads:  # a rotated load: the previous iteration's, made again
            access = reloads[arg]
            address = emit_poly(access.address, I32)
            attrs = {**access.op.attrs, "offset": 0, "proven": True}
            mapping[arg] = b.op(mem.load, [address], attrs).results[0]
        elif arg in reductions:
            mapping[arg] = b.constant(arg.type, identity_bits(reductions[arg].op, arg.type))
        else:  # never read inside the loop
            mapping[arg] = b.constant(arg.type, 0) if not arg.type.is_ref else b.constant(I64, 0)

    body = [blk for blk in func.blocks if blk in plan.blocks]
    traps = [
        s.block for blk in body for s in blk.terminator.successors
        if s.block not in plan.blocks and s.block.terminator.name == "cf.trap"
    ]  # fmt: skip
    clones: dict[Block, Block] = {}
    for blk in body + [t for i, t in enumerate(traps) if t not in traps[:i]]:
        clone = kernel.add_block([] if blk is header else [a.type for a in blk.args])
        clones[blk] = clone
        if blk is not header:
            for old, new in zip(blk.args, clone.args, strict=True):
                mapping[old] = new
    done = kernel.add_block(results)
    Builder(kernel, done).ret(done.args)
    b.br(clones[header])
    # A collapsed level is entered at its thread's iteration; the innermost one runs that
    # one iteration and the thread is done.
    starts = {
        level.loop.header: _inner_start(kernel, level, plan, counter, clones, emit_poly)
        for level, counter in zip(nest, entry.args[1:], strict=False)
    }
    bodies = {level.loop.header: level.blocks for level in nest}
    innermost = nest[-1] if nest else None

    identity = [value_of_identity(b, r) for r in plan.reductions]
    checked = {id(a.op) for a in plan.gathers} if any(a.store for a in plan.accesses) else set()
    # Affine accesses: the guards prove them in bounds (and aligned on a GPU) before a launch.
    # An op's own access comes first: a rotated load's reload (the previous iteration's
    # address, made in the entry block) follows as an access of the same op.
    proven: dict[int, Access] = {}
    numbered: dict[int, int] = {}  # the index of each op's own access in plan.accesses
    for n, access in enumerate(plan.accesses):
        if access.address is not None:
            proven.setdefault(id(access.op), access)
            numbered.setdefault(id(access.op), n)
    accesses: dict[int, int] = {}  # the same, by the id of the kernel's copy of the op
    held = {plan.counter: k, **by_symbol}
    held.update((level.counter, arg) for level, arg in zip(nest, entry.args[1:], strict=False))
    copies = _PrivateCopies(kernel, b, plan, entry.args, emit_poly) if plan.private else None
    for blk, clone in clones.items():
        for op in blk.ops:
            if op.name == "global.get" and op.results[0] in mapping:
                continue  # read once at loop entry and passed in
            operands = [value_of(v) for v in op.operands]
            succs = []
            for succ in op.successors:
                if (
                    innermost
                    and blk in innermost.blocks
                    and (succ.block is innermost.loop.header or succ.block not in innermost.blocks)
                ):
                    succs.append(Successor(done, []))  # one inner iteration per thread
                elif succ.block in starts and blk not in bodies[succ.block]:
                    succs.append(Successor(starts[succ.block], [value_of(v) for v in succ.args]))
                elif succ.block in starts:  # back to a collapsed level's header: done too
                    succs.append(Successor(done, []))
                elif succ.block is header:
                    succs.append(Successor(done, _carried(plan, succ, clone, value_of)))
                elif succ.block in clones:
                    succs.append(Successor(clones[succ.block], [value_of(v) for v in succ.args]))
                else:  # the loop's exit: this iteration is over
                    back = next((s for s in op.successors if s.block is header), None)
                    succs.append(Successor(done, _carried(plan, back, clone, value_of) if back else identity))
            attrs = dict(op.attrs)
            if id(op) in checked:
                attrs["gather"] = True
            if id(op) in proven:
                attrs["proven"] = True
                wide = exact_address(Builder(kernel, clone), proven[id(op)], held)
                if wide is not None:
                    operands[0] = wide
                    attrs["wide_address"] = True
            new = Op(op.opdef, operands, tuple(r.type for r in op.results), attrs, succs, op.offset)
            if id(op) in numbered:
                accesses[id(new)] = numbered[id(op)]
            results = new.results
            if copies is not None and id(op) in copies.ops:  # a privatised temporary's access
                clone, results = copies.redirect(clone, new, op, value_of(op.operands[0]))
            else:
                new.block = clone
                clone.ops.append(new)
            for old, result in zip(op.results, results, strict=True):
                mapping[old] = result
    _place_constants_first(entry)
    if nest:  # the code after the inner loop is skipped: drop what nothing reaches now
        live = set(reverse_postorder(kernel))
        kernel.blocks = [blk for blk in kernel.blocks if blk in live]
    verify_function(kernel)
    if plan.private:  # (a tiled or streaming kernel would share a thread's copy)
        kernel.attrs["tiling"] = "its temporaries are privatised: a copy per thread"
    else:
        tile_kernel(module, kernel, plan, clones, accesses)  # gemm-shaped 2-D nests: tiled variants too
    return kernel


class _PrivateCopies:
    """The accesses of a loop's privatised temporaries (``LoopPlan.private``), redirected: each
    thread reads and writes a copy of its own (a ``private`` array of the kernel: local memory
    on the GPU, the stack on the host), element ``(address - base) / width``, except the
    thread of the last iteration (the last of every grid dimension), which uses memory, so
    that memory ends as the sequential loop leaves it. The analysis proved that every element
    an iteration reads it wrote before (:mod:`compiler.analysis.privatise`)."""

    def __init__(self, kernel: Function, b: Builder, plan: LoopPlan, counters: list[Value], emit_poly):
        self.kernel = kernel
        self.ops: dict[int, tuple[str, Value, Type]] = {}
        kernel.attrs["private"] = {}
        for n, copy in enumerate(plan.private):
            name = f"t{n}"
            kernel.attrs["private"][name] = (copy.type, copy.count)
            base = emit_poly(copy.base, I32)
            for index in copy.accesses:
                self.ops[id(plan.accesses[index].op)] = (name, base, copy.type)
        last = None
        for counter, trip in zip(counters, [plan.trip, *(c.trip for c in plan.collapse)], strict=False):
            count = constant_count(trip)  # (the analysis made sure it is a number)
            at_end = b.value(arith.cmpi, counter, b.constant(I32, count - 1), pred="eq")
            last = at_end if last is None else b.value(arith.select, last, at_end, last)
        self.last = last

    def redirect(self, block: Block, new: Op, op: Op, address: Value) -> tuple[Block, list[Value]]:
        """Append ``new`` (the kernel's copy of ``op``, a load or store at the i32 ``address``
        plus its offset) to ``block`` for the last iteration, its private counterpart for
        the others; the block that follows both, and ``op``'s results there."""
        name, base, element = self.ops[id(op)]
        kernel = self.kernel
        real, own = kernel.add_block([]), kernel.add_block([])
        after = kernel.add_block([r.type for r in new.results])
        Builder(kernel, block).cond_br(self.last, real, [], own, [])
        new.block = real
        real.ops.append(new)
        Builder(kernel, real).br(after, list(new.results))
        b = Builder(kernel, own)
        offset = op.attrs.get("offset", 0)
        at = b.value(arith.add, address, b.constant(I32, offset)) if offset else address
        shift = b.constant(I32, (element.bits // 8).bit_length() - 1)
        index = b.value(arith.shr_u, b.value(arith.sub, at, base), shift)
        if op.name == "mem.load":
            value = b.value(gpu.shared_load, index, array=name, type=element)
            if value.type is not op.results[0].type:
                value = b.value(arith.bitcast, value, to=op.results[0].type)
            b.br(after, [value])
        else:
            value = new.operands[1]
            if value.type is not element:
                value = b.value(arith.bitcast, value, to=element)
            b.op(gpu.shared_store, [index, value], {"array": name})
            b.br(after, [])
        return after, list(after.args)


def exact_address(b: Builder, access: Access, held: dict[Symbol, Value]) -> Value | None:
    """A proven access's i32 operand as ``trunc`` of its value computed in 64 bits from its
    polynomial, each i32 symbol zero-extended; None where the polynomial has a symbol the
    kernel does not hold as a value (an inner loop's counter, a floor).

    The guards evaluate the polynomial on the live-ins as unsigned values and the counters
    from 0, and launch only where it lies in [0, memory size) on every iteration: there the
    64-bit sum is the exact address, with no wrap to undo, and the lowering
    (:func:`compiler.lower.memory.proven_address`) adds it to the memory base as it is. Terms
    come in one order and the constant last, so neighbour accesses (``a[i-1]``, ``a[i+1]``)
    share every term but the constant, which LLVM folds into the load's immediate offset
    (the order measured best on the suite's stencils in registers and instructions)."""
    poly = access.address - Poly.const(access.offset)
    if not poly.symbols() <= held.keys() or any(held[s].type not in (I32, I64) for s in poly.symbols()):
        return None
    if not all(isinstance(c, int) for c in poly.terms.values()):
        return None
    wide: dict[Symbol, Value] = {}
    total = None

    # The counters' terms first: their sum is the part an iteration's accesses share
    # (LLVM adds each array's live-in base to it); then the live-ins' terms.
    def key(monomial: tuple[Symbol, ...]) -> tuple[bool, list[int]]:
        return not any(s.kind == "counter" for s in monomial), [s.order for s in monomial]

    for monomial in sorted((m for m in poly.terms if m), key=key):
        term = None
        for sym in monomial:
            if sym not in wide:
                value = held[sym]
                wide[sym] = value if value.type is I64 else b.value(arith.zext, value, to=I64)
            term = wide[sym] if term is None else b.value(arith.mul, term, wide[sym])
        if poly.terms[monomial] != 1:
            term = b.value(arith.mul, term, b.constant(I64, poly.terms[monomial]))
        total = term if total is None else b.value(arith.add, total, term)
    if poly.constant:
        constant = b.constant(I64, poly.constant)
        total = constant if total is None else b.value(arith.add, total, constant)
    if total is None:
        total = b.constant(I64, 0)
    return b.value(arith.trunc, total, to=I32)


def _inner_start(kernel: Function, level, plan: LoopPlan, k2: Value, clones, emit_poly) -> Block:
    """The entry into a collapsed inner loop: its induction variables jump to iteration ``k2``."""
    header = level.loop.header
    start = kernel.add_block([a.type for a in header.args])
    b = Builder(kernel, start)
    values = []
    for arg, entering in zip(header.args, start.args, strict=True):
        if arg in plan.ivs:
            step = emit_poly(plan.ivs[arg][1], arg.type, b)
            count = k2 if arg.type is I32 else b.value(arith.sext, k2, to=arg.type)
            entering = b.value(arith.add, entering, b.value(arith.mul, step, count))
        values.append(entering)
    b.br(clones[header], values)
    return start


def vector_iv_at(b: Builder, start: Value, step: Value, add: str, k: Value) -> Value:
    """A v128 induction variable at iteration ``k``: ``start + k * step`` per lane of the
    shape of ``add`` ("i32x4.add"), wrapping as Wasm's lane-wise add does. ``i8x16`` has no
    multiply: ``k * step`` there is the sum of ``step << j`` over the bits j of ``k`` (only
    the low 8 bits matter modulo 2^8)."""
    shape = add.split(".", 1)[0]
    if shape == "i8x16":
        scaled = b.constant(V128, 0)
        for j in range(8):
            bit = b.value(arith.and_, b.value(arith.shr_u, k, b.constant(I32, j)), b.constant(I32, 1))
            mask = b.value(simd.splat, b.value(arith.sub, b.constant(I32, 0), bit), op="i8x16.splat")
            shifted = b.value(simd.shift, step, b.constant(I32, j), op="i8x16.shl")
            term = b.value(simd.binary, shifted, mask, op="v128.and")
            scaled = b.value(simd.binary, scaled, term, op="i8x16.add")
    else:
        count = b.value(arith.sext, k, to=I64) if shape == "i64x2" else k
        scaled = b.value(
            simd.binary, step, b.value(simd.splat, count, op=f"{shape}.splat"), op=f"{shape}.mul"
        )
    return b.value(simd.binary, start, scaled, op=add)


def value_of_identity(b: Builder, r: Reduction) -> Value:
    # Built in the entry block before its branch; moved ahead by _place_constants_first.
    return b.constant(r.arg.type, identity_bits(r.op, r.arg.type))


def _carried(plan: LoopPlan, back: Successor, clone: Block, value_of) -> list[Value]:
    """The reductions' contributions of an iteration: the values its branch ``back`` to the
    header passes (at a latch that also exits, a do-while, too; elsewhere an iteration
    contributes nothing past the exit), a v128 one's lanes read out in ``clone``."""
    header = plan.loop.header
    out = []
    for r in plan.reductions:
        if r.vector is None:
            out.append(value_of(back.args[header.args.index(r.arg)]))
            continue
        lane = r.arg.owner
        read = Op(
            lane.opdef, [value_of(back.args[header.args.index(r.vector)])], (r.arg.type,), dict(lane.attrs)
        )
        read.block = clone
        clone.ops.append(read)
        out.append(read.results[0])
    return out


def _vector_identity(lane: Reduction) -> int:
    """A v128 reduction's identity, every lane the identity of its kind (``lane``: one of
    its lanes' reductions)."""
    _, bits, _ = simd.SHAPES[lane.arg.owner.attrs["op"].split(".", 1)[0]]
    one = lane_identity(lane.op, bits) & ((1 << bits) - 1)
    return sum(one << (bits * i) for i in range(128 // bits))


def _place_constants_first(entry: Block) -> None:
    """Keep the entry's terminator last after constants were added behind it."""
    term = [op for op in entry.ops if op.opdef.terminator]
    others = [op for op in entry.ops if not op.opdef.terminator]
    entry.ops = others + term
