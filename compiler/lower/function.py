"""Lowering of dialect functions and whole-function entry points to LLVM IR.

:class:`ModuleLowering` owns one LLVM module per compilation: it declares lowered
functions on first use (so only what the entry points reach is compiled), refuses a
closure that reaches a host import, and writes the entry points of :mod:`abi`.
:class:`FunctionLowering` walks one dialect function block by block: block arguments
become phi nodes, each op goes to the lowering of its family (numeric, convert, memory,
control) through one table, and every failure is reported with the op, the function and
the Wasm byte offset it came from.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from llvmlite import ir

from tensorwasm.compiler.callgraph import indirect_candidates, reachable, recursive_functions
from tensorwasm.compiler.errors import CompileError, NotCompilable
from tensorwasm.compiler.lower import abi, control, convert, memory, numeric, shared, simd
from tensorwasm.compiler.lower.env import Environment, i64_const
from tensorwasm.compiler.lower.reduction import combine, fold_block, read_sreg
from tensorwasm.compiler.lower.types import (
    I32_T,
    I64_T,
    PTR_T,
    VOID_T,
    constant,
    from_slot,
    from_slots,
    int_of,
    llvm_type,
    slot_count,
    to_slots,
)
from tensorwasm.compiler.traps import TrapKind
from tensorwasm.dialect import cf
from tensorwasm.dialect.ir import Block, FuncSig, Function, Module, Op, Value
from tensorwasm.support.errors import TensorWasmError

LOWERINGS = {
    **numeric.LOWERINGS,
    **convert.LOWERINGS,
    **memory.LOWERINGS,
    **control.LOWERINGS,
    **simd.LOWERINGS,
    **shared.LOWERINGS,
}
TERMINATORS = {"cf.br", "cf.cond_br", "cf.switch", "cf.return", "cf.trap"}

# A function whose loops nest deeper than this is lowered ``optnone`` (and ``noinline``,
# which optnone needs): LLVM's loop passes visit every loop of a nest with all the loops
# inside it, time quadratic in the depth (800 nested loops: minutes at -O2), and the code
# of such a module is generated at level 0 (Target.codegen_machine). Real loop nests are
# a few loops deep; the PTX is still optimised by ptxas. (The loop analysis has its own,
# lower limit: ``compiler.analysis.forest.MAX_LOOP_DEPTH``.)
MAX_OPTIMISED_LOOP_DEPTH = 64


def optimised(func: Function) -> bool:
    """False where ``func``'s loops nest too deep for LLVM's optimiser (see above)."""
    return func.loop_depth <= MAX_OPTIMISED_LOOP_DEPTH


@dataclass(frozen=True)
class LowerOptions:
    """Options that change the generated code (part of every cache key).

    ``max_call_depth``: the call depth at which recursion traps where the context block
    sets none (``abi.CTX_DEPTH_LIMIT`` 0); executors set their own from the stack they have."""

    max_call_depth: int = 10_000


class ModuleLowering:
    """One LLVM module holding the entry points asked for and everything they reach."""

    def __init__(self, module: Module, target, options: LowerOptions | None = None, name: str = "wasm"):
        self.dialect = module
        self.target = target
        self.options = options or LowerOptions()
        self.llvm = ir.Module(name=name)
        self.llvm.triple = target.triple
        self.llvm.data_layout = target.data_layout
        self.functions: dict[int, ir.Function] = {}
        self.recursive: set[int] = set()

    def function_for(self, index: int) -> ir.Function:
        fn = self.functions.get(index)
        if fn is None:
            func = self.dialect.functions[index]
            results = [llvm_type(t) for t in func.results]
            if not results:
                ret = VOID_T
            elif len(results) == 1:
                ret = results[0]
            else:
                ret = ir.LiteralStructType(results)
            params = [PTR_T] + [llvm_type(t) for t in func.params]
            fn = ir.Function(self.llvm, ir.FunctionType(ret, params), name=f"wasm_f{index}")
            fn.linkage = "internal"
            _mark_context(fn.args[0])
            self.functions[index] = fn
        return fn

    def indirect_candidates(self, sig: FuncSig) -> list[int]:
        return indirect_candidates(self.dialect, sig)

    def lower_entries(self, indices: Iterable[int]) -> list[str]:
        """Lower whole-function entry points for ``indices``; returns their symbol names."""
        indices = list(indices)
        closure = reachable(self.dialect, indices)
        self.recursive = recursive_functions(self.dialect, closure)
        for index in closure:
            FunctionLowering(self, self.dialect.functions[index]).lower()
        return [self.lower_entry(index) for index in indices]

    def lower_entry(self, index: int) -> str:
        """``tw_call_<index>(ctx, io)``: clear the trap slot, call, store trap code and results
        (a v128 argument or result takes two slots, low half first)."""
        func = self.dialect.functions[index]
        fnty = ir.FunctionType(VOID_T, [PTR_T, PTR_T])
        entry = ir.Function(self.llvm, fnty, name=abi.entry_name(index))
        self.target.mark_entry(entry)
        ctx, io = entry.args
        b = ir.IRBuilder(entry.append_basic_block("entry"))

        slot = functools.partial(_slot, b)
        b.store(i64_const(0), slot(ctx, abi.CTX_TRAP))
        b.store(i64_const(0), slot(ctx, abi.CTX_DEPTH))
        args = []
        at = abi.IO_VALUES
        for t in func.params:
            halves = [b.load(slot(io, at + k), typ=I64_T) for k in range(slot_count(t))]
            args.append(from_slots(b, halves, llvm_type(t)))
            at += len(halves)
        value = b.call(self.function_for(index), [ctx, *args])
        b.store(b.load(slot(ctx, abi.CTX_TRAP), typ=I64_T), slot(io, abi.IO_TRAP))
        n = len(func.results)
        values = [value] if n == 1 else [b.extract_value(value, i) for i in range(n)]
        at = abi.IO_VALUES
        for v in values:
            for half in to_slots(b, v):
                b.store(half, slot(io, at))
                at += 1
        b.ret_void()
        return entry.name


class FunctionLowering:
    """Lowers one dialect function into the LLVM function its module declared."""

    def __init__(self, lowering: ModuleLowering, func: Function):
        self.lowering = lowering
        self.func = func
        self.module = lowering.llvm
        self.target = lowering.target
        self.fn = lowering.function_for(func.index)
        self.ctx = self.fn.args[0]
        self.values: dict = {}
        self.blocks: dict[Block, ir.Block] = {}
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.env = Environment(self.b, self.fn, self.ctx, self.target)
        self.depth: ir.Value | None = None
        self.shared: dict[str, tuple[ir.Value, ir.Type]] = {}  # shared arrays met so far (lower.shared)
        # Float results lowered without Wasm's NaN rule (numeric.PLAIN_FLOAT): their op and
        # the ops in their tree of such results; and the exact values of those made so far in
        # the current block (see ``exact``).
        self.deferred: dict[Value, tuple[Op, int]] = {}
        self.made_exact: dict[Value, ir.Value] = {}

    def llvm_type(self, ty) -> ir.Type:
        return llvm_type(ty)

    def lower(self) -> None:
        func = self.func
        if func.attrs.get("untranslated"):  # a module translated in part: never silently empty
            raise CompileError(f"function {func.index} ({func.name}) was not translated")
        for block in func.blocks:
            llvm_block = self.blocks[block] = self.fn.append_basic_block(f"bb{len(self.blocks)}")
            if block is not func.entry:
                with self.b.goto_block(llvm_block):
                    for arg in block.args:
                        self.values[arg] = self.b.phi(llvm_type(arg.type))
        for arg, value in zip(func.entry.args, self.fn.args[1:], strict=True):
            self.values[arg] = value
        if not optimised(func):
            self.fn.attributes.add("noinline")
            self.fn.attributes.add("optnone")
        if func.index in self.lowering.recursive:
            self._enter_depth()
        self.b.branch(self.blocks[func.entry])
        for block in func.blocks:
            self.b.position_at_end(self.blocks[block])
            self.made_exact = {}
            ahead = (0, -1)  # where the last look-ahead's run ends, and the deferred values then
            for n, op in enumerate(block.ops):
                if op.name == "mem.store" and (n >= ahead[0] or len(self.deferred) != ahead[1]):
                    ahead = (self._exact_ahead(block.ops, n), len(self.deferred))
                self._lower_op(op)

    def _enter_depth(self) -> None:
        """Count call depth in functions on a call cycle, trapping as stack exhaustion at the
        context's limit (the compiled default where it holds 0). Host code also traps where
        the native stack pointer is below the context's stack floor: the thread's own stack
        runs out before a depth would."""
        b, env = self.b, self.env
        depth = env.load_ctx(abi.CTX_DEPTH)
        given = env.load_ctx(abi.CTX_DEPTH_LIMIT)
        default = i64_const(self.lowering.options.max_call_depth)
        limit = b.select(b.icmp_unsigned("==", given, i64_const(0)), default, given)
        env.trap_if(b.icmp_unsigned(">=", depth, limit), TrapKind.STACK_OVERFLOW, "depth.ok")
        if not self.target.is_gpu:
            stacksave = self.module.globals.get("llvm.stacksave.p0")
            if stacksave is None:
                stacksave = ir.Function(self.module, ir.FunctionType(PTR_T, []), name="llvm.stacksave.p0")
            sp = b.ptrtoint(b.call(stacksave, []), I64_T)
            floor = env.load_ctx(abi.CTX_STACK_FLOOR)
            env.trap_if(b.icmp_unsigned("<", sp, floor), TrapKind.STACK_OVERFLOW, "stack.ok")
        env.store_ctx(abi.CTX_DEPTH, b.add(depth, i64_const(1)))
        self.depth = depth

    def _lower_op(self, op: Op) -> None:
        try:
            if op.name in numeric.PLAIN_FLOAT and not op.attrs.get("nan_free") and self._defer(op):
                return
            if self._deferred_select(op) and self._defer(op):
                return
            if op.name in numeric.NAN_BLIND and (op.name == "arith.cmpf" or op.attrs.get("nan_free")):
                args = [self.values[v] for v in op.operands]
            else:
                args = [self.exact(v) for v in op.operands]
            if op.name in TERMINATORS:
                self._terminator(op, args)
                return
            lower = LOWERINGS.get(op.name)
            if lower is None:
                if op.name == "arith.constant":
                    self.values[op.results[0]] = constant(op.attrs["type"], op.attrs["value"])
                    return
                raise CompileError(f"no lowering for {op.name}")
            result = lower(self, op, args)
            if isinstance(result, list):
                for r, v in zip(op.results, result, strict=True):
                    self.values[r] = v
            elif op.results:
                self.values[op.results[0]] = result
        except TensorWasmError as exc:
            if isinstance(exc, NotCompilable):
                raise
            where = f" at wasm offset 0x{op.offset:x}" if op.offset is not None else ""
            raise CompileError(
                f"function {self.func.index} ({self.func.name}): {op.name}{where}: {exc}"
            ) from exc

    # -- Wasm's NaN rule, deferred
    #
    # A float add, subtract, multiply, divide, square root or rounding returns what IEEE
    # returns, except that a NaN result must be the NaN Wasm (x86) picks: the first NaN
    # operand quieted, else the default NaN (numeric.wasm_nan_result, some ten instructions
    # each). IEEE's result is a NaN exactly where Wasm's is, and the two agree bit for bit
    # everywhere else. So these ops are lowered as the one instruction (the "fast" value)
    # and remembered; a use that reads a value's bits (anything but another such op or a
    # compare) asks for ``exact``: one NaN test on the fast value and, out of line where it
    # is a NaN, the op's tree rebuilt with the rule at every step, from the same operands.
    # A float select of a deferred value is deferred too: it picks a NaN exactly where it
    # picks one from the exact values, so one test of what it picked serves both arms
    # (condmap's ``x > 0 ? sqrt(x) * 2 : x * x - 0.25``, tested once at its store, not
    # twice at the select, which also kept the next element's work behind the tests).
    # A tree stops growing at MAX_DEFERRED ops: the op past it is lowered with the rule.

    MAX_DEFERRED = 32

    def _defer(self, op: Op) -> bool:
        """Lower ``op`` (a ``numeric.PLAIN_FLOAT`` op, or a float select of a deferred value)
        as the one instruction, remembering it, if its tree stays within MAX_DEFERRED ops;
        False where it must take the rule now."""
        size = 1 + sum(self.deferred[v][1] for v in op.operands if v in self.deferred)
        if size > self.MAX_DEFERRED:
            return False
        args = [self.values[v] for v in op.operands]
        fast = numeric.PLAIN_FLOAT.get(op.name, LOWERINGS[op.name])
        self.values[op.results[0]] = fast(self, op, args)
        self.deferred[op.results[0]] = (op, size)
        return True

    def _exact_ahead(self, ops: list[Op], n: int) -> int:
        """Before the run of stores at ``ops[n]`` (with the pure ops among them: addresses):
        the exact value of every deferred value made so far that the run stores, from one
        NaN test of them all (:meth:`_make_exact`). The stores then follow one another with
        no test between them, and every value they store is computed before the test: on
        the GPU the halves of a 32-byte sector leave a thread together (tested between its
        stores, condmap's unrolled body wrote each sector to L2 twice), and no load is sunk
        past a test to where its value is first used. Returns where the run ends."""
        group: list[Value] = []
        end = n
        while end < len(ops):  # the stores up to the next op other than a pure one
            op = ops[end]
            if op.name == "mem.store":
                group += [v for v in op.operands if v in self.deferred and v not in self.made_exact]
            elif not op.opdef.pure or op.opdef.terminator:
                break
            end += 1
        group = list(dict.fromkeys(group))
        if len(group) > 1:  # (one value: exact's own test, at its store)
            self._make_exact(group)
        return end

    def _deferred_select(self, op: Op) -> bool:
        """Whether ``op`` is a float select with a deferred arm."""
        return op.name == "arith.select" and any(v in self.deferred for v in op.operands[1:])

    def exact(self, value: Value) -> ir.Value:
        """The LLVM value of dialect ``value`` with Wasm's NaN rule applied (a deferred
        value's fast value where it is not a NaN, its rebuilt tree where it is)."""
        if value not in self.deferred:
            return self.values[value]
        made = self.made_exact.get(value)
        if made is not None:
            return made
        self._make_exact([value])
        return self.made_exact[value]

    def _make_exact(self, group: list[Value]) -> None:
        """The exact values of the deferred values ``group`` into ``made_exact``: one NaN
        test of their fast values and, out of line where any is a NaN, each tree rebuilt
        with the rule (taken, in a group of several, where its own value is the NaN)."""
        b = self.b
        fast = [self.values[v] for v in group]
        nans = [b.fcmp_unordered("uno", f, f) for f in fast]
        before = b.block
        slow = self.fn.append_basic_block("nan.rule")
        after = self.fn.append_basic_block("nan.done")
        branch = b.cbranch(functools.reduce(b.or_, nans), slow, after)
        branch.set_weights([1, 1 << 20])  # a NaN is rare: keep the rebuild out of line
        b.position_at_end(slow)
        chosen = []
        for value, f, nan in zip(group, fast, nans, strict=True):
            rebuilt = self._rebuild(value)
            if len(group) > 1:
                ity = int_of(f.type)
                rebuilt = b.bitcast(b.select(nan, b.bitcast(rebuilt, ity), b.bitcast(f, ity)), f.type)
            chosen.append(rebuilt)
        slow_end = b.block
        b.branch(after)
        b.position_at_end(after)
        for value, f, picked in zip(group, fast, chosen, strict=True):
            made = b.phi(f.type)
            made.add_incoming(f, before)
            made.add_incoming(picked, slow_end)
            self.made_exact[value] = made

    def _rebuild(self, root: Value) -> ir.Value:
        """The deferred ``root``'s tree lowered with Wasm's NaN rule at every op, operands
        first (iteratively: a tree may be MAX_DEFERRED deep)."""
        built: dict[Value, ir.Value] = {}

        def ready(v: Value) -> bool:
            return v not in self.deferred or v in built or v in self.made_exact

        def lowered(v: Value) -> ir.Value:
            for known in (built, self.made_exact):
                if v in known:
                    return known[v]
            return self.values[v]

        stack = [root]
        while stack:
            value = stack[-1]
            op = self.deferred[value][0]
            waiting = [v for v in op.operands if not ready(v)]
            if waiting:
                stack.extend(waiting)
                continue
            stack.pop()
            if value in built:
                continue
            args = [lowered(v) for v in op.operands]
            built[value] = LOWERINGS[op.name](self, op, args)
        return built[root]

    def _edge(self, succ) -> ir.Block:
        """The LLVM block a branch goes to, with its phis fed from the current block (the
        branch's arguments already made exact by ``_exact_arguments``)."""
        target = self.blocks[succ.block]
        for arg, value in zip(succ.block.args, succ.args, strict=True):
            incoming = self.made_exact[value] if value in self.deferred else self.values[value]
            self.values[arg].add_incoming(incoming, self.b.block)
        return target

    def _exact_arguments(self, op: Op) -> None:
        """Make every deferred value the terminator ``op`` passes to a block exact, before
        the branch (a block argument holds exact values: its phi has no tree to rebuild)."""
        for succ in op.successors:
            for value in succ.args:
                self.exact(value)

    def _edges(self, op: Op) -> list[ir.Block]:
        """Targets of a multi-way branch; a target reached twice with arguments gets its own
        edge block, since one predecessor cannot feed a phi two values."""
        seen: set[Block] = set()
        targets = []
        for succ in op.successors:
            if succ.block in seen and succ.block.args:
                edge = self.fn.append_basic_block("edge")
                with self.b.goto_block(edge):
                    self.b.branch(self._edge(succ))
                targets.append(edge)
            else:
                targets.append(self._edge(succ))
            seen.add(succ.block)
        return targets

    def _terminator(self, op: Op, args) -> None:
        self._exact_arguments(op)
        b = self.b
        opdef = op.opdef
        if opdef is cf.br:
            b.branch(self._edge(op.successors[0]))
        elif opdef is cf.cond_br:
            then, other = self._edges(op)
            b.cbranch(args[0], then, other)
        elif opdef is cf.switch:
            *cases, default = self._edges(op)
            switch = b.switch(args[0], default)
            for i, target in enumerate(cases):
                switch.add_case(ir.Constant(args[0].type, i), target)
        elif opdef is cf.return_:
            if self.depth is not None:
                self.env.store_ctx(abi.CTX_DEPTH, self.depth)
            ret = self.fn.function_type.return_type
            if not args:
                b.ret_void()
            elif len(args) == 1:
                b.ret(args[0])
            else:
                agg = ir.Constant(ret, None)
                for i, value in enumerate(args):
                    agg = b.insert_value(agg, value, i)
                b.ret(agg)
        elif opdef is cf.trap:
            self.env.trap(TrapKind.UNREACHABLE)


# -- loop kernels --------------------------------------------------------------------------


def _read_sreg(module: ir.Module, b: ir.IRBuilder, name: str) -> ir.Value:
    return b.zext(read_sreg(module, b, name), I64_T)


def lower_loop_entry(lowering: ModuleLowering, index: int, reductions: list[str]) -> str:
    """The launch entry of an iteration kernel.

    GPU: ``tw_kernel_<index>(ctx, params, trip, out)``, each thread taking iterations
    ``k = thread, thread + threads, ...`` below ``trip``. Host: ``tw_loop_<index>(ctx, params,
    begin, end, out)`` over ``[begin, end)``. Both read the live-ins from 64-bit slots at
    ``params``, run the iterations with a private copy of the context, stop at the first trap
    (its code goes to the context), and fold each thread's reduction partials into ``out``
    (on the GPU a block at a time, see :mod:`compiler.lower.reduction`). ``out`` holds the
    identities. The blocks at ``ctx``, ``params`` and ``out`` overlap nothing else.

    A collapsed nest (a kernel of two or three counters, see
    :class:`compiler.analysis.loops.Collapse`) takes the inner trip counts after ``trip`` /
    ``end``: on the GPU the grid's x dimension covers the innermost counter (neighbouring
    threads touch neighbouring elements) and y and z the outer ones; the host runs the
    inner counters in full for each outer one.
    """
    kernel = lowering.dialect.functions[index]
    if getattr(kernel.attrs.get("loop_plan"), "fission", False):
        from tensorwasm.compiler.lower.phases import lower_fission_entry

        return lower_fission_entry(lowering, index)
    if getattr(kernel.attrs.get("loop_plan"), "phases", ()):
        from tensorwasm.compiler.lower.phases import lower_phases_entry

        return lower_phases_entry(lowering, index)
    if kernel.attrs.get("tiled") is not None:
        from tensorwasm.compiler.lower.tiled import lower_tiled_entry

        return lower_tiled_entry(lowering, index, kernel.attrs["tiled"])
    if getattr(kernel.attrs.get("loop_plan"), "collapse", ()):
        return _lower_nest_entry(lowering, index)
    gpu = lowering.target.is_gpu
    frame = entry_frame(lowering, index, 1)
    fn, b, ctx, slots, begin, out, own = (
        frame.fn,
        frame.b,
        frame.ctx,
        frame.slots,
        frame.begin,
        frame.out,
        frame.own,
    )
    (trip,) = frame.bounds
    args = _live_in_args(b, kernel, slots, 1)
    result_types = [llvm_type(t) for t in kernel.results]
    # Each thread starts from the identities as constants: on the GPU, ``out`` already
    # holds other threads' partials by the time a late block starts.
    identities = [_identity(op, t) for op, t in zip(reductions, kernel.results, strict=True)]
    streaming = kernel.attrs.get("streaming")
    per_thread = streaming.iterations if streaming is not None else 1
    if gpu:
        lanes = _read_sreg(lowering.llvm, b, "ntid.x")
        block_span = b.mul(lanes, i64_const(per_thread))
        first = b.add(
            b.mul(_read_sreg(lowering.llvm, b, "ctaid.x"), block_span), _read_sreg(lowering.llvm, b, "tid.x")
        )
        step = b.mul(_read_sreg(lowering.llvm, b, "nctaid.x"), block_span)
    else:
        lanes, first, step = i64_const(1), begin, i64_const(per_thread)
    done = fn.append_basic_block("done")
    call = functools.partial(_call_iteration, b, own, args, len(result_types))
    iteration = functools.partial(call, lowering.function_for(index))
    if streaming is not None:
        FunctionLowering(lowering, lowering.dialect.functions[streaming.index]).lower()
        chunk = functools.partial(_call_chunk, b, own, args, lowering.function_for(streaming.index), lanes)
        parts = (per_thread, len(result_types))
        accs = _streaming_loops(
            b, fn, (first, step, lanes, trip), chunk, iteration, parts, reductions, identities, done
        )
    else:
        accs = _one_per_thread(b, fn, (first, step, trip), own, iteration, reductions, identities, done)
    b.position_at_end(done)
    _report_trap(b, own, ctx)
    out_slots = [_slot(b, out, i) for i in range(len(reductions))]
    if gpu and reductions:
        fold_block(lowering.llvm, b, reductions, accs, identities, out_slots)
    elif not gpu:
        for acc, slot in zip(accs, out_slots, strict=True):
            b.store(acc, slot)
    b.ret_void()
    return fn.name


def _call_iteration(b: ir.IRBuilder, own, args, results: int, fn: ir.Function, k: ir.Value) -> list[ir.Value]:
    """Call the iteration function ``fn`` for iteration ``k``; its reduction partials."""
    result = b.call(fn, [own, b.trunc(k, ir.IntType(32)), *args])
    return [result] if results == 1 else [b.extract_value(result, i) for i in range(results)]


def _head_phis(b: ir.IRBuilder, start, first: ir.Value, identities) -> tuple[ir.Value, list]:
    """At a loop's head: the counter and one accumulator per reduction, entered from block
    ``start`` with ``first`` and ``identities`` (the back edge adds its own values)."""
    k = b.phi(I64_T)
    k.add_incoming(first, start)
    accs = []
    for value in identities:
        acc = b.phi(value.type)
        acc.add_incoming(value, start)
        accs.append(acc)
    return k, accs


def _one_per_thread(b, fn, bounds, own, iteration, reductions, identities, done) -> list:
    """``for (k = first; k < trip; k += step)`` one iteration, stopping at a trap; the
    reduction accumulators as ``done`` sees them."""
    first, step, trip = bounds
    start = b.block
    head = fn.append_basic_block("head")
    body = fn.append_basic_block("body")
    b.branch(head)
    b.position_at_end(head)
    k, accs = _head_phis(b, start, first, identities)
    b.cbranch(b.icmp_signed("<", k, trip), body, done)
    b.position_at_end(body)
    parts = iteration(k)
    trapped = b.icmp_unsigned("!=", b.load(_slot(b, own, abi.CTX_TRAP), typ=I64_T), i64_const(0))
    new_accs = [combine(b, op, acc, part) for op, acc, part in zip(reductions, accs, parts, strict=True)]
    cont = fn.append_basic_block("next")
    b.cbranch(trapped, done, cont)
    b.position_at_end(cont)
    k.add_incoming(b.add(k, step), cont)
    for acc, value in zip(accs, new_accs, strict=True):
        acc.add_incoming(value, cont)
    b.branch(head)
    return accs


def _call_chunk(b: ir.IRBuilder, own, args, fn: ir.Function, lanes, k: ir.Value) -> list[ir.Value]:
    """Call ``stream_<kernel>`` for the chunk at ``k``: every result of every iteration."""
    i32 = ir.IntType(32)
    result = b.call(fn, [own, b.trunc(k, i32), b.trunc(lanes, i32), *args])
    if isinstance(result.type, ir.VoidType):
        return []
    if not isinstance(result.type, ir.LiteralStructType):
        return [result]
    return [b.extract_value(result, i) for i in range(len(result.type.elements))]


def _streaming_loops(b, fn, bounds, chunk, iteration, parts, reductions, identities, done) -> list:
    """A streaming kernel's iterations (:mod:`compiler.stream`), which cannot trap: while a
    whole chunk ``k, k + lanes, ...`` of ``per_thread`` iterations is below ``trip``, one
    call of ``stream_<kernel>`` runs it; then what is left of the last chunk (fewer than
    ``per_thread`` iterations: the next chunk starts past ``trip``) one at a time. Partials
    fold in iteration order on the host (``lanes`` 1) and in each thread's order on the
    GPU, as the one-per-thread loop does."""
    first, step, lanes, trip = bounds
    per_thread, width = parts
    start = b.block
    head, body, rest, rest_body = (fn.append_basic_block(n) for n in ("head", "chunk", "rest", "rest.body"))
    b.branch(head)
    b.position_at_end(head)
    k, accs = _head_phis(b, start, first, identities)
    last = b.add(k, b.mul(lanes, i64_const(per_thread - 1)))
    b.cbranch(b.icmp_signed("<", last, trip), body, rest)
    b.position_at_end(body)
    results = chunk(k)
    new_accs = list(accs)
    for u in range(per_thread):
        got = results[u * width : (u + 1) * width]
        new_accs = [
            combine(b, op, acc, part) for op, acc, part in zip(reductions, new_accs, got, strict=True)
        ]
    k.add_incoming(b.add(k, step), b.block)
    for acc, value in zip(accs, new_accs, strict=True):
        acc.add_incoming(value, b.block)
    b.branch(head)
    b.position_at_end(rest)
    j, rest_accs = _head_phis(b, head, k, accs)
    b.cbranch(b.icmp_signed("<", j, trip), rest_body, done)
    b.position_at_end(rest_body)
    folded = [
        combine(b, op, acc, part) for op, acc, part in zip(reductions, rest_accs, iteration(j), strict=True)
    ]
    j.add_incoming(b.add(j, lanes), b.block)
    for phi, value in zip(rest_accs, folded, strict=True):
        phi.add_incoming(value, b.block)
    b.branch(rest)
    return rest_accs


@dataclass
class EntryFrame:
    """A launch entry's function and its arguments: ``(ctx, params, [begin,] bounds..., out)``
    (``begin``, the first iteration, on the host only), with the builder at its entry block
    and the thread's own context."""

    fn: ir.Function
    b: ir.IRBuilder
    ctx: ir.Argument
    slots: ir.Argument
    begin: ir.Argument | None
    bounds: list[ir.Argument]
    out: ir.Argument
    own: ir.Value


def entry_frame(lowering: ModuleLowering, index: int, bounds: int) -> EntryFrame:
    """Declare kernel ``index``'s launch entry with ``bounds`` trip-count arguments and start
    its body: the context arguments marked, the private context made. On the GPU the
    live-ins come by value where they fit (``abi.params_by_value``): ``params`` is then a
    ``byval`` array, which NVPTX reads from the kernel's parameter space."""
    gpu = lowering.target.is_gpu
    words = abi.param_words(len(lowering.dialect.functions[index].attrs["loop_plan"].live_ins))
    by_value = gpu and abi.params_by_value(words)
    live_ins = ir.PointerType(ir.ArrayType(I64_T, words)) if by_value else PTR_T
    params = [PTR_T, live_ins, *[I64_T] * (bounds if gpu else bounds + 1), PTR_T]
    fn = ir.Function(lowering.llvm, ir.FunctionType(VOID_T, params), name=abi.loop_entry_name(index, gpu))
    lowering.target.mark_entry(fn)
    ctx, slots, *middle, out = fn.args
    begin = None if gpu else middle.pop(0)
    for block in (ctx, out) if by_value else (ctx, slots, out):
        _mark_context(block)
    if by_value:  # the live-ins in the kernel's parameter space (see abi)
        slots.add_attribute("byval")
        slots.attributes.align = 8
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    return EntryFrame(fn, b, ctx, slots, begin, middle, out, _private_context(b, ctx))


def counted_loop(b: ir.IRBuilder, fn: ir.Function, first, step, bound, exit_block, body) -> None:
    """``for (k = first; k < bound; k += step) body(k)``, leaving to ``exit_block`` (``k``
    of ``first``'s type: i64, or i32 below 2**31 and compared unsigned)."""
    start = b.block
    head = fn.append_basic_block("head")
    loop = fn.append_basic_block("body")
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(first.type)
    k.add_incoming(first, start)
    # i64 counters compare signed; i32 ones (see _thread_range) unsigned.
    below = b.icmp_signed("<", k, bound) if first.type == I64_T else b.icmp_unsigned("<", k, bound)
    b.cbranch(below, loop, exit_block)
    b.position_at_end(loop)
    body(k)
    k.add_incoming(b.add(k, step), b.block)
    b.branch(head)


def _private_context(b: ir.IRBuilder, ctx: ir.Value) -> ir.Value:
    """A copy of the context for this thread alone, which its iterations run with.

    Once LLVM inlines the iteration, the copy's slots become registers: the memory base and
    size are read once, and the trap slot read after each iteration is a value LLVM knows
    (zero unless the iteration's own trap path set it), not a load from the shared context.
    The call depth is then counted per thread, as each thread has its own stack. The copy's
    trap slot starts clear; a loop kernel cannot grow memory, so nothing but the trap code
    goes back to the shared context (written only when set: another thread may have stored
    its own)."""
    own = b.alloca(I64_T, size=i64_const(abi.CTX_SLOTS), name="ctx.own")
    own.align = 8
    for i in range(abi.CTX_SLOTS):
        value = i64_const(0) if i == abi.CTX_TRAP else b.load(_slot(b, ctx, i), typ=I64_T)
        b.store(value, _slot(b, own, i))
    return own


def _report_trap(b: ir.IRBuilder, own: ir.Value, ctx: ir.Value) -> None:
    """Copy a trap code from the thread's private context to the shared one, if it trapped."""
    code = b.load(_slot(b, own, abi.CTX_TRAP), typ=I64_T)
    with b.if_then(b.icmp_unsigned("!=", code, i64_const(0)), likely=False):
        b.store(code, _slot(b, ctx, abi.CTX_TRAP))


def _identity(op: str, ty) -> ir.Constant:
    """The identity of reduction ``op`` over dialect type ``ty``, as an LLVM constant."""
    from tensorwasm.compiler.outline import identity_bits

    return constant(ty, identity_bits(op, ty))


def _mark_context(arg: ir.Argument) -> None:
    """Attributes of a pointer to one of the runtime's blocks of 64-bit slots (context,
    parameters, results): never null, 8-byte aligned, and overlapping nothing else that
    the code reaches (linear memory, globals, tables: see :mod:`abi`), so LLVM keeps the
    memory base and size in registers across stores to linear memory."""
    arg.add_attribute("noalias")
    arg.add_attribute("nonnull")
    arg.attributes.align = 8


def _slot(b: ir.IRBuilder, base, i: int):
    return b.gep(base, [ir.Constant(I64_T, i)], source_etype=I64_T)


def _live_in_args(b: ir.IRBuilder, kernel, slots, counters: int) -> list:
    live_ins = kernel.params[counters:]
    held = getattr(getattr(slots.type, "pointee", None), "count", None)  # words by value
    if held is not None and len(live_ins) > held:
        raise CompileError(f"kernel {kernel.name} reads {len(live_ins)} live-ins from {held} words")
    return [from_slot(b, b.load(_slot(b, slots, i), typ=I64_T), llvm_type(t)) for i, t in enumerate(live_ins)]


def _thread_range(b: ir.IRBuilder, sreg, d: str) -> tuple[ir.Value, ir.Value]:
    """This thread's first counter and the grid's stride in dimension ``d``, as i32s.

    The guards launch no level of more than ``runtime.guards.MAX_TRIP`` (2**31 - 1)
    iterations, so a counter below its trip count fits 31 bits, and ``k + stride`` 32
    where the stride is at most 2**31. In y and z the grid holds at most 65535 blocks of
    1024 (y) or 64 (z) threads: below 2**26, as i32s as they are. In x (2**31 - 1 blocks
    of 1024) both are taken at most 2**31, which is past any trip count as the true value
    is: a thread so far out runs nothing, and one inside takes one iteration.

    Counted in 32 bits, a level's test is one compare and its step one add in the SASS
    (two each in 64), and the kernel's zero-extension of its i32 counter
    (``compiler.outline.exact_address``) needs no ``and`` with 0xffffffff."""
    first = b.add(b.mul(sreg(f"ctaid.{d}"), sreg(f"ntid.{d}")), sreg(f"tid.{d}"))
    stride = b.mul(sreg(f"nctaid.{d}"), sreg(f"ntid.{d}"))
    if d != "x":
        return b.trunc(first, I32_T), b.trunc(stride, I32_T)
    top = i64_const(1 << 31)
    return tuple(b.trunc(b.select(b.icmp_unsigned("<", v, top), v, top), I32_T) for v in (first, stride))


def _grid_covers(b: ir.IRBuilder, sreg, letters: str, bounds: list[ir.Value]) -> ir.Value:
    """Whether the grid has a thread for every counter of each level (``letters``: the
    levels' dimensions, outer to inner; ``bounds``: their trip counts as i32s, at most
    ``runtime.guards.MAX_TRIP``): then a thread's first counters are its only ones, and the
    loops over the levels run at most once. In x the grid is also held to 2**21 blocks (of
    at most 1024 threads: 2**31 threads), so that its width and a thread's first counter
    are exact as i32s. The same for every thread of the launch: the launch's own registers
    and arguments decide it, so no thread branches apart from another; and it is 32-bit
    arithmetic, as the loops' tests are (``sreg``: a special register as an i32)."""
    found = []
    for d, bound in zip(letters, bounds, strict=True):
        blocks = sreg(f"nctaid.{d}")
        if d == "x":
            found.append(b.icmp_unsigned("<=", blocks, ir.Constant(I32_T, 1 << 21)))
        found.append(b.icmp_unsigned(">=", b.mul(blocks, sreg(f"ntid.{d}")), bound))
    return functools.reduce(b.and_, found)


def _cell_once(b: ir.IRBuilder, fn: ir.Function, sreg, letters: str, bounds: list, cell, done) -> None:
    """Where the grid has a thread for every cell (:func:`_grid_covers`; the runtime
    launches such a grid where the device's limits allow), each thread runs its own cell
    (``cell(counters)``) or none, then goes to ``done``, without the loops' tests and steps;
    otherwise the builder is left where the loops over the cells begin."""
    single, looped = fn.append_basic_block("cell.once"), fn.append_basic_block("cells")
    b.cbranch(_grid_covers(b, sreg, letters, bounds), single, looped)
    b.position_at_end(single)
    firsts = [b.add(b.mul(sreg(f"ctaid.{d}"), sreg(f"ntid.{d}")), sreg(f"tid.{d}")) for d in letters]
    inside = functools.reduce(
        b.and_, (b.icmp_unsigned("<", k, bound) for k, bound in zip(firsts, bounds, strict=True))
    )
    run = fn.append_basic_block("cell.run")
    b.cbranch(inside, run, done)
    b.position_at_end(run)
    cell(firsts)
    b.branch(done)
    b.position_at_end(looped)


def _lower_nest_entry(lowering: ModuleLowering, index: int) -> str:
    """The launch entry of a collapsed nest (no reductions): ``(ctx, params, trip, trip2,
    [trip3,] out)`` on the GPU, ``(ctx, params, begin, end, trip2, [trip3,] out)`` on the
    host. On the GPU, x covers the innermost counter, y the next one out and z the
    outermost of a 3-D nest, each striding over what the grid's threads do not cover; where
    the grid covers every level and a cell has no loops of its own (:func:`_cell_once`),
    each thread runs its one cell without the loops, whose tests, steps and convergence
    points were a quarter of what a thread of the suite's stencil3d runs (107 SASS
    instructions, 81 without them; nvcc's kernel 53)."""
    kernel = lowering.dialect.functions[index]
    plan = kernel.attrs["loop_plan"]
    dims = len(plan.collapse) + 1
    gpu = lowering.target.is_gpu
    # A cell without loops of its own is a short thread, whose loops' tests and steps are a
    # large part of it: where the grid covers the nest, it runs without them. (A cell that
    # loops, doitgen's, gains nothing and ran slower so: its body is lowered once.)
    once = gpu and len(plan.inner_trips) == len(plan.collapse)
    frame = entry_frame(lowering, index, dims)
    fn, b, ctx, slots, begin, bounds, own = (
        frame.fn,
        frame.b,
        frame.ctx,
        frame.slots,
        frame.begin,
        frame.bounds,
        frame.own,
    )
    args = _live_in_args(b, kernel, slots, dims)
    done = fn.append_basic_block("done")

    def cell(counters) -> None:
        counters = counters if gpu else [b.trunc(k, I32_T) for k in counters]
        b.call(lowering.function_for(index), [own, *counters, *args])
        trapped = b.icmp_unsigned("!=", b.load(_slot(b, own, abi.CTX_TRAP), typ=I64_T), i64_const(0))
        cont = fn.append_basic_block("next")
        b.cbranch(trapped, done, cont)
        b.position_at_end(cont)

    if gpu:
        sreg = functools.partial(_read_sreg, lowering.llvm, b)
        bounds = [b.trunc(bound, I32_T) for bound in bounds]  # at most MAX_TRIP each
        if once:
            _cell_once(
                b, fn, functools.partial(read_sreg, lowering.llvm, b), "zyx"[3 - dims :], bounds, cell, done
            )
        # y and z count threads too: a block of several rows (32 x 8, as a hand-written
        # stencil launches) shares its rows' neighbours in L1 (runtime.planning.launch_grid).
        x, y, z = (_thread_range(b, sreg, d) for d in "xyz")
        ranges = [z, y, x] if dims == 3 else [y, x]
    else:
        ranges = [(begin, i64_const(1)), *[(i64_const(0), i64_const(1))] * (dims - 1)]

    def level(depth: int, outer: list, exit_block) -> None:
        """The loop over counter ``depth``, inside the loops over ``outer``."""

        def body(k) -> None:
            if depth + 1 == dims:
                cell([*outer, k])
                return
            after = fn.append_basic_block("row.done")
            level(depth + 1, [*outer, k], after)
            b.position_at_end(after)

        counted_loop(b, fn, *ranges[depth], bounds[depth], exit_block, body)

    level(0, [], done)
    b.position_at_end(done)
    _report_trap(b, own, ctx)
    b.ret_void()
    return fn.name
