"""The launch entry of a distributed loop (see :mod:`compiler.distribute`).

GPU: ``tw_kernel_<index>(ctx, params, trip, out)``: block ``b`` runs iterations ``k = b,
b + blocks, ...`` of the loop; in each, its threads run the phases in order, thread
``lane`` taking the phase's grid iterations ``t = lane, lane + lanes, ...`` until the kernel
says there are no more, and the block waits at a barrier between phases. Iterations are independent
(no barrier between them). Every thread of a block runs the same iterations and meets every barrier, a thread that trapped included (it
stops calling the kernel; the trap code goes to the context at the end). Host:
``tw_loop_<index>(ctx, params, begin, end, out)``: iterations ``[begin, end)``, each phase's
grid iterations in order, one thread. A 3-D grid (the phases of a collapsed nest's inner
loop) takes the inner loop's count after ``trip`` / ``end``: on the GPU a block runs the
cells ``c = b, b + blocks, ...`` of both counters (``k = c / trip2``, ``k2 = c % trip2``), on
the host each iteration runs every ``k2`` in order; the kernel gets ``k2`` after ``t``.
"""

from __future__ import annotations

from llvmlite import ir

from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.lower.env import i64_const
from tensorwasm.compiler.lower.reduction import read_sreg
from tensorwasm.compiler.lower.types import I32_T, I64_T, VOID_T


def lower_phases_entry(lowering, index: int) -> str:
    """Emit the launch entry of kernel ``index``, a phase kernel; its name."""
    from tensorwasm.compiler.lower.function import _live_in_args, _report_trap, _slot, entry_frame

    kernel = lowering.dialect.functions[index]
    plan = kernel.attrs["loop_plan"]
    phases, levels = len(plan.phases), len(plan.collapse)
    gpu = lowering.target.is_gpu
    frame = entry_frame(lowering, index, 1 + levels)
    fn, b, ctx, slots, begin, own = frame.fn, frame.b, frame.ctx, frame.slots, frame.begin, frame.own
    trip, *nest = frame.bounds
    args = _live_in_args(b, kernel, slots, 3 + levels)
    if gpu:
        first, step = (b.zext(read_sreg(lowering.llvm, b, r), I64_T) for r in ("ctaid.x", "nctaid.x"))
        lane, lanes = (b.zext(read_sreg(lowering.llvm, b, r), I64_T) for r in ("tid.x", "ntid.x"))
    else:
        first, step, lane, lanes = begin, i64_const(1), i64_const(0), i64_const(1)
    call = lowering.function_for(index)

    def trapped() -> ir.Value:
        return b.icmp_unsigned("!=", b.load(_slot(b, own, abi.CTX_TRAP), typ=I64_T), i64_const(0))

    def counted(start, stride, bound, body) -> None:
        """``for (v = start; v < bound; v += stride) body(v)``; ``body`` may branch to the
        exit it is given to stop early."""
        before = b.block
        head, loop, after = (fn.append_basic_block(n) for n in ("head", "body", "after"))
        b.branch(head)
        b.position_at_end(head)
        v = b.phi(I64_T)
        v.add_incoming(start, before)
        b.cbranch(
            b.icmp_signed("<", v, bound) if bound is not None else ir.Constant(ir.IntType(1), 1), loop, after
        )
        b.position_at_end(loop)
        body(v, after)
        v.add_incoming(b.add(v, stride), b.block)
        b.branch(head)
        b.position_at_end(after)

    def row(k, _row_done, inner=()) -> None:
        for phase in range(phases):

            def grid_iteration(t, stop, phase=phase) -> None:
                go = fn.append_basic_block("call")
                b.cbranch(trapped(), stop, go)  # a trapped thread only meets the barriers
                b.position_at_end(go)
                more = b.call(
                    call,
                    [own, b.trunc(k, I32_T), ir.Constant(I32_T, phase), b.trunc(t, I32_T),
                     *(b.trunc(j, I32_T) for j in inner), *args],
                )  # fmt: skip
                cont = fn.append_basic_block("more")
                b.cbranch(b.icmp_unsigned("==", more, ir.Constant(I32_T, 0)), stop, cont)
                b.position_at_end(cont)

            counted(lane, lanes, None, grid_iteration)
            if gpu and phase + 1 < phases:  # the next phase reads what this one wrote
                b.call(_barrier(lowering), [ir.Constant(I32_T, 0)])

    if not nest:
        counted(first, step, trip, row)
    elif gpu:  # a block per cell of the two outer counters, numbered row-major
        (trip2,) = nest

        def cell(c, done) -> None:
            row(b.udiv(c, trip2), done, (b.urem(c, trip2),))

        counted(first, step, b.mul(trip, trip2), cell)
    else:
        (trip2,) = nest
        counted(
            first,
            step,
            trip,
            lambda k, done: counted(i64_const(0), step, trip2, lambda j, d: row(k, d, (j,))),
        )
    _report_trap(b, own, ctx)
    b.ret_void()
    return fn.name


def _barrier(lowering) -> ir.Function:
    """``barrier.sync 0``: the block's threads wait, and see each other's earlier writes. Not
    ``bar.sync`` (``barrier.sync.aligned``): the threads come from a loop they leave at
    different iterations, and the aligned form requires every warp to arrive converged."""
    name = "llvm.nvvm.barrier.cta.sync.all"
    found = lowering.llvm.globals.get(name)
    return found or ir.Function(lowering.llvm, ir.FunctionType(VOID_T, [I32_T]), name=name)
