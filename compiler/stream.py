"""Several iterations per thread for streaming loop kernels, loads first.

A streaming kernel (saxpy, a vector add, an integer sum) is a few loads, a little
arithmetic and a store per iteration. Run as one iteration per thread, a thread waits for
its loads, stores, and has nothing else in flight; LLVM and ptxas may not move a load
above an earlier store, since nothing tells them the two do not meet.

The guards do. A 1-D loop kernel launches only after :func:`runtime.guards.check` found
that no store's footprint in one iteration meets any access's footprint in another (or
the analysis proved it: ``LoopPlan.static_dependence_free``); otherwise the loop runs on
the CPU. So the ops of *different* iterations may be interleaved freely. Within one
iteration an access may still meet a store (``y[i] = a * x[i] + y[i]`` with ``x == y``),
so an iteration's own memory ops keep their order.

:func:`attach_streaming` builds ``stream_<kernel>(k, lanes, live-ins...)``, which runs
iterations ``k + u * lanes`` for ``u < ITERATIONS_PER_THREAD`` and returns their results
(reduction partials) one iteration after the other. Each iteration's ops are copied as they
are; an op's *level* says which of its iteration's stores it must follow: a store's is the
number of stores before it, a load's the number up to the last of them it may meet, and
any other op's the highest of the ops it reads. The function emits, level by level: every
iteration's loads of that level (with the address arithmetic they need), then every
iteration's other ops of that level, then every iteration's store that ends the level; where
only stores are left, each iteration's stores together, in their order. Every operation and
every rounding is the kernel's; only the order of memory accesses that do not meet changes,
so each load is in flight before the first store of the chunk.

A load passes a store of its own iteration only where the two never meet. The analysis
settles it where the two addresses differ by a constant (clang's two-way unrolled
``y[i] = a * x[i] + y[i]`` reads ``y[i + 1]`` after it stores ``y[i]``); where live-ins
separate them (``x[i + 1]`` and ``y[i]``), the pair joins ``LoopPlan.row_guarded``, which
the guards test before each launch: a launch whose pair meets within an iteration runs on
the CPU. So an iteration's stores leave the thread one after the other, and the two halves of
a 32-byte sector reach the device's cache together: stored with a load round trip between
them, each half was written to it on its own (the suite's saxpy on an H200: twice the L2
write sectors of nvcc's kernel).

Only kernels that cannot trap take this form (a thread would otherwise stop between its
iterations at the first trap), whose blocks run one after the other with no branch that
chooses (no loop, no condition), with no gathered load, and no op with an effect other
than a proven load or store; nor bodies with a float square root or division (``LONG_OPS``:
they gain nothing from more iterations in flight). The launch entry (:func:`compiler.lower.function.lower_loop_entry`)
calls it for whole chunks and the kernel itself for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping

from tensorwasm.compiler.analysis.plan import LoopPlan
from tensorwasm.dialect import arith
from tensorwasm.dialect.builder import Builder
from tensorwasm.dialect.ir import Block, Function, Module, Op, Value
from tensorwasm.dialect.types import I32
from tensorwasm.dialect.verifier import verify_function
from tensorwasm.support.records import record

ITERATIONS_PER_THREAD = 4
# Ops of a kernel copied per iteration: a streaming body is a few dozen; more is not one.
MAX_KERNEL_OPS = 120
# Ops that keep a body to one iteration a thread: correctly rounded square roots and
# divisions are long sequences on the GPU, and four of them in flight per thread cost more
# than the loads gain (the suite's condmap on an H100, kernel time against nvcc's at n =
# 2^24 / 2^26: 1.04x / 0.96x one iteration a thread, 1.30x / 1.22x four; saxpy: 2.27x /
# 2.43x one, 1.17x / 1.13x four; on an H200, condmap's kernel under Nsight Compute: 222 us
# one, 290 us two, 305 us four). Such a body still streams, one iteration a call, where a
# load passes a store of its iteration (clang's two-way unrolled condmap).
LONG_OPS = frozenset({"arith.fsqrt", "arith.fdiv"})


@record(frozen=True)
class StreamingKernel:
    """``stream_<kernel>``'s function index and how many iterations one call runs."""

    index: int
    iterations: int


def attach_streaming(module: Module, kernel: Function, accesses: Mapping[int, int]) -> None:
    """Attach ``kernel.attrs["streaming"]`` (a :class:`StreamingKernel`) to a 1-D loop kernel
    that streams (see the module docstring); leave other kernels as they are. ``accesses``
    gives, by the id of each of the kernel's loads and stores, the index of its access in
    the plan (``LoopPlan.accesses``); a load not in it passes no store."""
    from tensorwasm.compiler.prepare import kernel_may_trap

    plan = kernel.attrs.get("loop_plan")
    if plan is None or plan.collapse or plan.phases or plan.gathers:
        return
    ops = _straight_line(kernel)
    if ops is None or len(ops) > MAX_KERNEL_OPS or kernel_may_trap(module, kernel.index):
        return
    edges = {succ.block: succ for blk in kernel.blocks for succ in blk.terminator.successors}
    levels, guarded = _levels(ops[:-1], edges, plan, accesses)
    count = ITERATIONS_PER_THREAD
    if any(op.name in LONG_OPS for op in ops):
        if not _passes(ops[:-1], levels):
            return  # one iteration in its own order: the kernel itself
        count = 1
    fn = _build(module, kernel, ops, levels, edges, count)
    plan.row_guarded.extend(pair for pair in guarded if pair not in plan.row_guarded)
    kernel.attrs["streaming"] = StreamingKernel(fn.index, count)


def _allowed(op: Op) -> bool:
    if op.name in ("mem.load", "mem.store"):
        return bool(op.attrs.get("proven")) and not op.attrs.get("gather") and not op.attrs.get("speculative")
    return op.opdef.pure and not op.opdef.terminator


def _straight_line(kernel: Function) -> list[Op] | None:
    """The kernel's ops in the order they run, with each block argument replaced by what
    its one incoming edge passes (``args``), ending with its ``cf.return``; None where a
    branch chooses, a block is entered twice, or an op is not :func:`_allowed`."""
    ops: list[Op] = []
    seen: set[Block] = set()
    block = kernel.entry
    while True:
        if block in seen:
            return None
        seen.add(block)
        for op in block.ops[:-1]:
            if not _allowed(op):
                return None
            ops.append(op)
        term = block.terminator
        if term.name == "cf.return":
            ops.append(term)
            return ops
        targets = {(succ.block, tuple(succ.args)) for succ in term.successors}
        if term.name not in ("cf.br", "cf.cond_br", "cf.switch") or len(targets) != 1:
            return None
        block = term.successors[0].block


def _levels(
    body: list[Op], edges: dict, plan: LoopPlan, accesses: Mapping[int, int]
) -> tuple[list[int], list[tuple[int, int]]]:
    """Each op's level (see the module docstring), and the (store, load) pairs of
    ``plan.accesses`` that the guards must find apart within an iteration for a load to
    pass a store of its own iteration."""
    position = {op: n for n, op in enumerate(body)}
    levels: list[int] = []
    stores: list[Op] = []
    guarded: list[tuple[int, int]] = []
    for op in body:
        if op.name == "mem.store":
            levels.append(len(stores))
            stores.append(op)
            continue
        read = [levels[position[v.owner]] for v in _defining_values(op, edges) if v.owner in position]
        level = max(read, default=0)
        if op.name == "mem.load":
            apart = [_apart(store, op, plan, accesses) for store in stores]
            level = max(level, max((t + 1 for t, how in enumerate(apart) if how is None), default=0))
            guarded += [
                (accesses[id(stores[t])], accesses[id(op)])
                for t in range(level, len(stores))
                if apart[t] == "guard"
            ]
        levels.append(level)
    return levels, guarded


def _passes(body: list[Op], levels: list[int]) -> bool:
    """Whether a load of ``body`` passes a store before it (its level is lower than the
    number of stores before it)."""
    stores = 0
    for op, level in zip(body, levels, strict=True):
        if op.name == "mem.load" and level < stores:
            return True
        stores += op.name == "mem.store"
    return False


def _apart(store: Op, load: Op, plan: LoopPlan, accesses: Mapping[int, int]) -> str | None:
    """Whether ``load`` never meets ``store`` of the same iteration: "static" where their
    addresses differ by a constant that keeps the two apart, "guard" where live-ins decide
    (both affine), None where they may meet."""
    i, j = accesses.get(id(store)), accesses.get(id(load))
    if i is None or j is None:
        return None
    s, a = plan.accesses[i], plan.accesses[j]
    if s.address is None or a.address is None:
        return None
    gap = a.address - s.address
    if gap.is_constant():
        return "static" if gap.constant >= s.width or -gap.constant >= a.width else None
    return "guard"


def _build(
    module: Module, kernel: Function, ops: list[Op], levels: list[int], edges: dict, count: int
) -> Function:
    params = (I32, I32, *kernel.params[1:])
    fn = Function(f"stream_{kernel.name}", len(module.functions), params, tuple(kernel.results) * count)
    module.functions.append(fn)
    entry = fn.add_block(params)
    b = Builder(fn, entry)
    k, lanes, *live = entry.args
    copies: list[dict[Value, Value]] = []
    for u in range(count):
        at = b.value(arith.add, k, b.value(arith.mul, lanes, b.constant(I32, u)))
        values = dict(zip(kernel.entry.args, [at, *live], strict=True))
        copies.append(values)
    body = ops[:-1]
    emitted: set[tuple[int, int]] = set()

    def value_of(values: dict[Value, Value], v: Value) -> Value:
        found = values.get(v)
        if found is None:  # a block argument: what its one incoming edge passes
            found = values[v] = value_of(values, edges[v.owner].args[v.index])
        return found

    def emit(u: int, n: int) -> None:
        if (u, n) in emitted:
            return
        emitted.add((u, n))
        op, values = body[n], copies[u]
        new = b.op(op.opdef, [value_of(values, v) for v in op.operands], dict(op.attrs))
        values.update(zip(op.results, new.results, strict=True))

    position = {op: n for n, op in enumerate(body)}

    def needs(n: int, found: set[int]) -> None:
        """The ops of ``body[n]``'s level that it reads, directly or not, into ``found``."""
        for v in _defining_values(body[n], edges):
            owner = v.owner
            m = position.get(owner) if isinstance(owner, Op) else None
            if m is not None and levels[m] == levels[n] and m not in found:
                found.add(m)
                needs(m, found)

    top = max(levels, default=0)
    at = [[n for n in range(len(body)) if levels[n] == level] for level in range(top + 1)]
    last = top  # from this level up, an iteration's stores leave together
    while last > 0 and all(body[n].name == "mem.store" for n in at[last]):
        last -= 1
    for level in range(last + 1):
        here = at[level]
        for u in range(count):  # loads first, with the arithmetic their addresses need
            wanted: set[int] = set()
            for n in here:
                if body[n].name == "mem.load":
                    wanted.add(n)
                    needs(n, wanted)
            for n in sorted(wanted):
                emit(u, n)
        for u in range(count):
            for n in here:
                if body[n].name != "mem.store":
                    emit(u, n)
        for u in range(count):
            for n in here if level < last else [n for later in at[last:] for n in later]:
                if body[n].name == "mem.store":
                    emit(u, n)
    ret = ops[-1]
    b.ret([value_of(values, v) for values in copies for v in ret.operands])
    verify_function(fn)
    return fn


def _defining_values(op: Op, edges: dict) -> list[Value]:
    """The values ``op`` reads, block arguments followed to what their edge passes."""
    out = []
    stack = list(op.operands)
    while stack:
        v = stack.pop()
        if isinstance(v.owner, Block) and v.owner in edges:
            stack.append(edges[v.owner].args[v.index])
        else:
            out.append(v)
    return out
