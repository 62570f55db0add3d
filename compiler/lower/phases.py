"""The launch entries of a distributed loop and of a split one (see :mod:`compiler.distribute`).

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

A split loop's entries (:func:`lower_fission_entry`): the phases in turn over the whole
loop, the grid waiting between them (GPU), or the host's threads sharing each phase
(``tw_phase_<index>``).
"""

from __future__ import annotations

from llvmlite import ir

from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.lower.env import i64_const
from tensorwasm.compiler.lower.reduction import read_sreg
from tensorwasm.compiler.lower.types import I32_T, I64_T, PTR_T, VOID_T


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
        _counted(fn, b, start, stride, bound, body)

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


def lower_fission_entry(lowering, index: int) -> str:
    """Emit the launch entry of a split sequential loop's phase kernel (:mod:`compiler.analysis.fission`);
    its name.

    GPU: ``tw_kernel_<index>(ctx, params, trip, out)``: the phases in order, the whole grid
    waiting between them (:func:`_grid_barrier`; the runtime launches no more blocks than can
    be resident at once). Thread ``g`` of ``G`` runs a whole phase for iterations ``k = g, g +
    G, ...`` of the loop, and a phase over a grid loop for its iterations ``t = g, g + G,
    ...``, each ``t`` in every iteration ``k`` in order, until no ``k`` has a ``t`` that far.
    Host: ``tw_loop_<index>(ctx, params, begin, end, out)``: the same on one thread, over
    iterations ``[begin, end)`` (the runtime gives it the whole loop at once)."""
    from tensorwasm.compiler.lower.function import _live_in_args, _report_trap, entry_frame

    kernel = lowering.dialect.functions[index]
    plan = kernel.attrs["loop_plan"]
    gpu = lowering.target.is_gpu
    frame = entry_frame(lowering, index, 1)
    fn, b, ctx, slots, own = frame.fn, frame.b, frame.ctx, frame.slots, frame.own
    (end,) = frame.bounds
    cells = any(p.inner is not None for p in plan.phases)  # a cell's index ``u`` after ``t``
    args = _live_in_args(b, kernel, slots, 3 + cells)
    if gpu:
        lanes = b.zext(read_sreg(lowering.llvm, b, "ntid.x"), I64_T)
        block = b.zext(read_sreg(lowering.llvm, b, "ctaid.x"), I64_T)
        lane = b.zext(read_sreg(lowering.llvm, b, "tid.x"), I64_T)
        blocks = b.zext(read_sreg(lowering.llvm, b, "nctaid.x"), I64_T)
        first = b.add(b.mul(block, lanes), lane)
        step = b.mul(blocks, lanes)
        begin = i64_const(0)
        rows_cols = (block, blocks, lane, lanes)
    else:
        first, step, begin = i64_const(0), i64_const(1), frame.begin
        rows_cols = (None, i64_const(1), None, i64_const(1))  # (the host's one thread: _spread)
    call = lowering.function_for(index)

    def run(k, phase: int, t, u=None) -> ir.Value:
        operands = [own, b.trunc(k, I32_T), ir.Constant(I32_T, phase), b.trunc(t, I32_T)]
        if cells:
            operands.append(b.trunc(u, I32_T) if u is not None else ir.Constant(I32_T, 0))
        return b.call(call, [*operands, *args])

    if plan.wave:
        _wavefront(lowering, fn, b, index, plan, run, first if gpu else None, step, begin, end)
        _report_trap(b, own, ctx)
        b.ret_void()
        return fn.name
    if plan.stepped:
        _stepped(lowering, fn, b, index, plan, run, first if gpu else None, step, begin, end, rows_cols)
        _report_trap(b, own, ctx)
        b.ret_void()
        return fn.name
    for phase, ph in enumerate(plan.phases):
        if ph.whole:
            _counted(
                fn, b, first if gpu else begin, step, end, lambda k, _stop, p=phase: run(k, p, i64_const(0))
            )
        else:

            def grid_iteration(t, stop, p=phase) -> None:
                more = _any_iteration(fn, b, begin, end, lambda k: run(k, p, t))
                go = fn.append_basic_block("more")
                b.cbranch(b.icmp_unsigned("==", more, ir.Constant(I32_T, 0)), stop, go)
                b.position_at_end(go)

            _counted(fn, b, first, step, None, grid_iteration)
        if gpu and phase + 1 < len(plan.phases):  # the next phase reads what this one wrote
            _grid_barrier(lowering, b, fn, index)
    _report_trap(b, own, ctx)
    b.ret_void()
    if not gpu:
        _host_phase_entry(lowering, index, plan)
    return fn.name


def _stepped(lowering, fn, b, index: int, plan, run, first, step, begin, end, rows_cols) -> None:
    """A stepped loop (``LoopPlan.stepped``): every thread walks the loop's iterations in
    order; in each, the phases in turn: one on one thread runs on thread 0 of the grid (the
    host's one thread: ``first`` None), one over a grid loop on every thread, thread ``g``
    taking its iterations ``t = g, g + G, ...``; the whole grid waits after each phase, so
    the next phase, and the next iteration, sees what it wrote. A grid phase split at a pivot
    ``t = floor((a * k + c) / d)`` (``Phase.pivot``) takes the iterations below it over the
    grid, the one at it on one thread, or those above it over the grid; one run as cells
    (``Phase.inner``) takes its rows ``t`` over the grid's blocks (``rows_cols``: this block,
    the blocks, this thread, a block's threads) and a row's cells ``u`` (the part's, split at
    its own pivot) over the block's threads."""
    gpu = first is not None
    lead = b.icmp_unsigned("==", first, i64_const(0)) if gpu else None
    zero = ir.Constant(I32_T, 0)

    def alone(condition, call) -> None:  # ``call()`` on one thread, where ``condition`` holds
        if condition is None:
            call()
            return
        then, after = fn.append_basic_block("alone"), fn.append_basic_block("alone_done")
        b.cbranch(condition, then, after)
        b.position_at_end(then)
        call()
        b.branch(after)
        b.position_at_end(after)

    def window(k, pivot, side) -> tuple:  # (first iteration, bound or None) of a part
        if pivot is None:
            return i64_const(0), None
        a, c, d = pivot
        at = b.ashr(b.add(b.mul(k, i64_const(a)), i64_const(c)), i64_const(d.bit_length() - 1))
        if side < 0:
            return i64_const(0), at
        after = b.add(at, i64_const(1))
        low = at if side == 0 else after
        low = b.select(b.icmp_signed("<", low, i64_const(0)), i64_const(0), low)
        return low, (after if side == 0 else None)

    def iteration(k, _stop) -> None:
        for p, ph in enumerate(plan.phases):
            if ph.whole:
                alone(lead, lambda p=p: run(k, p, i64_const(0)))
            elif ph.inner is not None:
                _cells(fn, b, k, p, ph, run, window, rows_cols)
            elif ph.pivot is not None and ph.side == 0:
                low, bound = window(k, ph.pivot, 0)
                there = b.icmp_signed("<", low, bound)
                alone(b.and_(lead, there) if gpu else there, lambda p=p, low=low: run(k, p, low))
            else:
                low, bound = window(k, ph.pivot, ph.side)

                def grid_iteration(t, stop, p=p) -> None:
                    go = fn.append_basic_block("more")
                    b.cbranch(b.icmp_unsigned("==", run(k, p, t), zero), stop, go)
                    b.position_at_end(go)

                for start, stride in _spread(b, low, first, step):
                    _counted(fn, b, start, stride, bound, grid_iteration)
            if gpu:  # the next phase, or the next iteration, reads what it wrote
                _grid_barrier(lowering, b, fn, index)

    _counted(fn, b, begin, i64_const(1), end, iteration)


# A cell index past any row's cells (the guards launch no loop of 2^31 - 1 iterations or more).
_PAST_CELLS = (1 << 31) - 1


def _spread(b, low, first, stride) -> list[tuple]:
    """How the threads take a part's iterations from ``low`` on: (start, stride) loops run
    in turn. The GPU's thread ``first`` takes every ``stride``-th; the host's one thread (the
    simulated device, ``first`` None) takes the odd ones, then the even ones: any two
    neighbouring iterations of a part run out of Wasm's order, as a GPU's threads may run
    them, so that a part whose tasks meet differs from wasmtime there too."""
    if first is not None:
        return [(b.add(low, first), stride)]
    return [(b.add(low, i64_const(1)), i64_const(2)), (low, i64_const(2))]


def _cells(fn, b, k, p: int, ph, run, window, rows_cols) -> None:
    """Phase ``p``, run as cells (``Phase.inner``): rows ``t`` of its part over the blocks,
    a row's cells ``u`` of its part over the block's threads. The kernel returns 0 past the
    grid loop's last row, 2 past a row's last cell."""
    block, blocks, lane, lanes = rows_cols
    rows_low, rows_bound = window(k, ph.pivot, ph.side)
    cols_low, cols_bound = window(k, ph.inner_pivot, ph.inner_side)
    for start, stride in _spread(b, rows_low, block, blocks):
        rows_done = fn.append_basic_block("rows_done")
        _cell_rows(
            fn, b, k, p, run, start, stride, rows_bound, rows_done, (cols_low, cols_bound, lane, lanes)
        )
        b.branch(rows_done)
        b.position_at_end(rows_done)


def _cell_rows(fn, b, k, p: int, run, start, stride, rows_bound, rows_done, cols) -> None:
    """One loop over rows of a phase run as cells (:func:`_cells`), its cells' loops inside."""
    cols_low, cols_bound, lane, lanes = cols

    def row(t, _next_rows) -> None:
        if rows_bound is None:  # past the grid loop's last row? (the kernel checks ``t`` first)
            there = fn.append_basic_block("row_there")
            probe = run(k, p, t, i64_const(_PAST_CELLS))
            b.cbranch(b.icmp_unsigned("==", probe, ir.Constant(I32_T, 0)), rows_done, there)
            b.position_at_end(there)

        def cell(u, next_row) -> None:
            got = run(k, p, t, u)
            go, past_cells = fn.append_basic_block("cell_more"), fn.append_basic_block("cells_past")
            b.cbranch(b.icmp_unsigned("==", got, ir.Constant(I32_T, 1)), go, past_cells)
            b.position_at_end(past_cells)
            b.cbranch(b.icmp_unsigned("==", got, ir.Constant(I32_T, 0)), rows_done, next_row)
            b.position_at_end(go)

        for begin, step in _spread(b, cols_low, lane, lanes):
            _counted(fn, b, begin, step, cols_bound, cell)

    _counted(fn, b, start, stride, rows_bound, row)


def _wavefront(lowering, fn, b, index: int, plan, run, first, step, begin, end) -> None:
    """A wavefront (``LoopPlan.wave``): steps ``w = 0, 1, ...`` in turn until one finds no
    task left. In step ``w`` thread ``g`` of ``G`` takes the loop's iterations ``k = g, g + G,
    ...`` and, for each phase ``(m, c)``, runs the task ``t = w - m * k - c`` where ``t >= 0``
    (the kernel says whether the phase's grid loop has that iteration at ``k``); a ``(k,
    phase)`` whose ``t`` is below 0, or whose task ran, may have tasks in later steps. The
    whole grid waits after each step, and learns there whether any thread had one left (a
    flag per step, three in turn: :func:`_wave_flags`). The host's one thread runs the same
    steps over ``[begin, end)``."""
    gpu = first is not None
    zero = ir.Constant(I32_T, 0)
    before = b.block
    head, done = fn.append_basic_block("w_head"), fn.append_basic_block("w_done")
    b.branch(head)
    b.position_at_end(head)
    w = b.phi(I64_T)
    w.add_incoming(i64_const(0), before)

    def tasks(k) -> ir.Value:  # 1 where (k, some phase) may have a task in this step or later
        left = zero
        for p, (m, c) in enumerate(plan.wave):
            t = b.sub(w, b.add(b.mul(k, i64_const(m)), i64_const(c)))
            came, ready, joined = b.block, fn.append_basic_block("task"), fn.append_basic_block("task_done")
            b.cbranch(b.icmp_signed("<", t, i64_const(0)), joined, ready)
            b.position_at_end(ready)
            ran = b.zext(b.icmp_unsigned("!=", run(k, p, t), zero), I32_T)
            ran_end = b.block
            b.branch(joined)
            b.position_at_end(joined)
            more = b.phi(I32_T)
            more.add_incoming(ir.Constant(I32_T, 1), came)
            more.add_incoming(ran, ran_end)
            left = b.or_(left, more)
        return left

    left = _any_iteration(fn, b, first if gpu else begin, end, tasks, step if gpu else None)
    if gpu:
        flags, lead = _wave_flags(lowering, index), b.icmp_unsigned("==", first, i64_const(0))
        three = i64_const(3)
        own_flag, next_flag = (b.gep(flags, [zero, b.trunc(b.urem(b.add(w, i64_const(n)), three), I32_T)])
                               for n in (0, 1))  # fmt: skip
        _store_if(fn, b, lead, zero, next_flag)  # read by no one until the next step sets it
        _store_if(fn, b, b.icmp_unsigned("!=", left, zero), ir.Constant(I32_T, 1), own_flag)
        _grid_barrier(lowering, b, fn, index)
        left = b.load_atomic(own_flag, "monotonic", 4)
    w.add_incoming(b.add(w, i64_const(1)), b.block)
    b.cbranch(b.icmp_unsigned("!=", left, zero), head, done)
    b.position_at_end(done)
    if gpu:  # the flag two steps on was set in the step before the last: clear it for the next launch
        last_but_one = b.gep(flags, [zero, b.trunc(b.urem(b.add(w, i64_const(2)), three), I32_T)])
        _store_if(fn, b, lead, zero, last_but_one)


def _wave_flags(lowering, index: int) -> ir.GlobalVariable:
    """Kernel ``index``'s three step flags: step ``w`` sets flag ``w % 3`` where a thread has
    a task left, and global thread 0 clears flag ``(w + 1) % 3`` meanwhile (every thread read
    it after the barrier two steps back; none sets it before the next barrier). Zero when the
    module loads, and again when a launch ends."""
    module = lowering.llvm
    name = f"tw_wave_flags_{index}"
    found = module.globals.get(name)
    if found is None:
        kind = ir.ArrayType(I32_T, 3)
        found = ir.GlobalVariable(module, kind, name=name, addrspace=1)
        found.initializer = ir.Constant(kind, [0, 0, 0])
        found.linkage = "internal"
        found.align = 4
    return found


def _store_if(fn, b, condition, value, where) -> None:
    """``*where = value`` (relaxed, device-wide) where ``condition`` holds."""
    then, after = fn.append_basic_block("set"), fn.append_basic_block("set_done")
    b.cbranch(condition, then, after)
    b.position_at_end(then)
    b.store_atomic(value, where, "monotonic", 4)
    b.branch(after)
    b.position_at_end(after)


def _host_phase_entry(lowering, index: int, plan) -> None:
    """``tw_phase_<index>(ctx, params, phase, lo, hi, trip, out)``: phase ``phase`` for the
    threads ``[lo, hi)`` of the loop's ``trip`` iterations: iterations of the loop where it
    runs whole, else grid iterations (below the most any iteration of the loop has), which
    every iteration of the loop, in order, runs in turn (each grid iteration still sees the
    loop's iterations in order; a thread streams its part of each row). The host's threads
    share each phase in turn, waiting for each other between phases."""
    from tensorwasm.compiler.lower.function import (
        _live_in_args,
        _mark_context,
        _private_context,
        _report_trap,
    )

    signature = ir.FunctionType(VOID_T, [PTR_T, PTR_T, I64_T, I64_T, I64_T, I64_T, PTR_T])
    fn = ir.Function(lowering.llvm, signature, name=abi.phase_entry_name(index))
    lowering.target.mark_entry(fn)
    ctx, slots, phase, lo, hi, trip, out = fn.args
    for arg in (ctx, slots, out):
        _mark_context(arg)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    own = _private_context(b, ctx)
    kernel = lowering.dialect.functions[index]
    args = _live_in_args(b, kernel, slots, 3)
    call = lowering.function_for(index)

    def run(k, p: int, t) -> ir.Value:
        return b.call(call, [own, b.trunc(k, I32_T), ir.Constant(I32_T, p), b.trunc(t, I32_T), *args])

    done = fn.append_basic_block("done")
    for p, ph in enumerate(plan.phases):
        this, other = fn.append_basic_block(f"phase{p}"), fn.append_basic_block(f"not{p}")
        b.cbranch(b.icmp_signed("==", phase, i64_const(p)), this, other)
        b.position_at_end(this)
        if ph.whole:
            _counted(fn, b, lo, i64_const(1), hi, lambda k, _stop, p=p: run(k, p, i64_const(0)))
        else:  # each iteration of the loop over the range's grid iterations: rows streamed

            def row(k, _stop, p=p) -> None:
                _counted(fn, b, lo, i64_const(1), hi, lambda t, _s: run(k, p, t))

            _counted(fn, b, i64_const(0), i64_const(1), trip, row)
        b.branch(done)
        b.position_at_end(other)
    b.branch(done)
    b.position_at_end(done)
    _report_trap(b, own, ctx)
    b.ret_void()


def _counted(fn, b, start, stride, bound, body) -> None:
    """``for (v = start; v < bound; v += stride) body(v, exit)`` (no bound: until ``body``
    branches to the exit it is given)."""
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


def _any_iteration(fn, b, begin, end, call, stride=None) -> ir.Value:
    """``call(k)`` for ``k`` in ``[begin, end)`` in order (every ``stride``-th: 1 unless
    given); the OR of what they returned."""
    before = b.block
    head, loop, after = (fn.append_basic_block(n) for n in ("k_head", "k_body", "k_after"))
    b.branch(head)
    b.position_at_end(head)
    k, seen = b.phi(I64_T), b.phi(I32_T)
    k.add_incoming(begin, before)
    seen.add_incoming(ir.Constant(I32_T, 0), before)
    b.cbranch(b.icmp_signed("<", k, end), loop, after)
    b.position_at_end(loop)
    more = b.or_(seen, call(k))
    k.add_incoming(b.add(k, stride if stride is not None else i64_const(1)), b.block)
    seen.add_incoming(more, b.block)
    b.branch(head)
    b.position_at_end(after)
    return seen


def _grid_barrier(lowering, b, fn, index: int) -> None:
    """Every thread of the grid waits until all have arrived, and then sees their writes.

    The block's threads meet at a barrier; its thread 0 counts the block in (a counter and a
    generation, a global of the kernel's own, zero when the module loads); the last block
    to arrive sets the counter back to 0 and moves the generation on, which the others wait
    for; then the block's threads meet again. The counter is 0 again after every barrier, so
    the next launch needs no reset. Legal only where every block of the grid is resident
    at once (a block spinning here would hold a multiprocessor another block waits for):
    the runtime launches no more blocks than the device has multiprocessors. The fences are
    the device's (``fence.sc.gpu``): every thread that meets here is the GPU's, and a
    system-wide fence waits for the host's view too (floyd-warshall's nine barriers per
    iteration: its kernel 0.295 -> 0.267 s on an H100)."""
    module = lowering.llvm
    pair = ir.ArrayType(I32_T, 2)
    name = f"tw_grid_barrier_{index}"
    state = module.globals.get(name)
    if state is None:
        state = ir.GlobalVariable(module, pair, name=name, addrspace=1)
        state.initializer = ir.Constant(pair, [0, 0])
        state.linkage = "internal"
        state.align = 8
    zero = ir.Constant(I32_T, 0)
    count, generation = (b.gep(state, [zero, ir.Constant(I32_T, n)]) for n in (0, 1))
    b.call(_barrier(lowering), [zero])
    lead, wait, last, spin, done = (fn.append_basic_block(n) for n in ("lead", "wait", "last", "spin", "met"))
    b.cbranch(b.icmp_unsigned("==", read_sreg(module, b, "tid.x"), zero), lead, done)
    b.position_at_end(lead)
    b.fence("seq_cst", "device")  # this block's writes before its arrival
    seen = b.load_atomic(generation, "acquire", 4)
    blocks = read_sreg(module, b, "nctaid.x")
    arrived = b.atomic_rmw("add", count, ir.Constant(I32_T, 1), "acq_rel")
    b.cbranch(b.icmp_unsigned("==", b.add(arrived, ir.Constant(I32_T, 1)), blocks), last, spin)
    b.position_at_end(last)
    b.fence("seq_cst", "device")  # (the atomics' orderings do not reach the PTX: the fences order them)
    b.store_atomic(zero, count, "monotonic", 4)
    b.atomic_rmw("add", generation, ir.Constant(I32_T, 1), "acq_rel")
    b.branch(wait)
    b.position_at_end(spin)
    now = b.load_atomic(generation, "acquire", 4)
    b.cbranch(b.icmp_unsigned("==", now, seen), spin, wait)
    b.position_at_end(wait)
    b.fence("seq_cst", "device")  # the other blocks' writes after it
    b.branch(done)
    b.position_at_end(done)
    b.call(_barrier(lowering), [zero])
