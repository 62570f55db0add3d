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
are; an op's *level* is the number of its iteration's stores before it. The function emits,
level by level: every iteration's loads of that level (with the address arithmetic they
need), then every iteration's other ops of that level, then every iteration's store that
ends the level. Every operation and every rounding is the kernel's; only the order of
independent memory accesses of different iterations changes, so each load is in flight
before the first store of the chunk.

Only kernels that cannot trap take this form (a thread would otherwise stop between its
iterations at the first trap), whose blocks run one after the other with no branch that
chooses (no loop, no condition), with no gathered load, and no op with an effect other
than a proven load or store; nor bodies with a float square root or division (``LONG_OPS``:
they gain nothing from more iterations in flight). The launch entry (:func:`compiler.lower.function.lower_loop_entry`)
calls it for whole chunks and the kernel itself for the rest.
"""

from __future__ import annotations

from tensorwasm.dialect import arith
from tensorwasm.dialect.builder import Builder
from tensorwasm.dialect.ir import Block, Function, Module, Op, Value
from tensorwasm.dialect.types import I32
from tensorwasm.dialect.verifier import verify_function
from tensorwasm.support.records import record

ITERATIONS_PER_THREAD = 4
# Ops of a kernel copied per iteration: a streaming body is a few dozen; more is not one.
MAX_KERNEL_OPS = 120
# Ops after which a body is not streamed: correctly rounded square roots and divisions are
# long sequences on the GPU, and four of them in flight per thread cost more than the loads
# gain (the suite's condmap on an H100, kernel time against nvcc's at n = 2^24 / 2^26: 1.04x
# / 0.96x one iteration a thread, 1.30x / 1.22x four; saxpy: 2.27x / 2.43x one, 1.17x /
# 1.13x four).
LONG_OPS = frozenset({"arith.fsqrt", "arith.fdiv"})


@record(frozen=True)
class StreamingKernel:
    """``stream_<kernel>``'s function index and how many iterations one call runs."""

    index: int
    iterations: int


def attach_streaming(module: Module, kernel: Function) -> None:
    """Attach ``kernel.attrs["streaming"]`` (a :class:`StreamingKernel`) to a 1-D loop kernel
    that streams (see the module docstring); leave other kernels as they are."""
    from tensorwasm.compiler.prepare import kernel_may_trap

    plan = kernel.attrs.get("loop_plan")
    if plan is None or plan.collapse or plan.phases or plan.gathers:
        return
    ops = _straight_line(kernel)
    if ops is None or len(ops) > MAX_KERNEL_OPS or kernel_may_trap(module, kernel.index):
        return
    if any(op.name in LONG_OPS for op in ops):
        return
    fn = _build(module, kernel, ops, ITERATIONS_PER_THREAD)
    kernel.attrs["streaming"] = StreamingKernel(fn.index, ITERATIONS_PER_THREAD)


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


def _levels(ops: list[Op]) -> list[int]:
    """Each op's level: how many stores come before it."""
    levels, stores = [], 0
    for op in ops:
        levels.append(stores)
        stores += op.name == "mem.store"
    return levels


def _build(module: Module, kernel: Function, ops: list[Op], count: int) -> Function:
    params = (I32, I32, *kernel.params[1:])
    fn = Function(f"stream_{kernel.name}", len(module.functions), params, tuple(kernel.results) * count)
    module.functions.append(fn)
    entry = fn.add_block(params)
    b = Builder(fn, entry)
    k, lanes, *live = entry.args
    edges = {succ.block: succ for blk in kernel.blocks for succ in blk.terminator.successors}
    copies: list[dict[Value, Value]] = []
    for u in range(count):
        at = b.value(arith.add, k, b.value(arith.mul, lanes, b.constant(I32, u)))
        values = dict(zip(kernel.entry.args, [at, *live], strict=True))
        copies.append(values)
    body, levels = ops[:-1], _levels(ops[:-1])
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

    for level in range(max(levels, default=0) + 1):
        here = [n for n in range(len(body)) if levels[n] == level]
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
            for n in here:
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
