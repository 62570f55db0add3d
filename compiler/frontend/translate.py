"""Translation of decoded Wasm functions into the dialect.

One pass over each function body, opcode by opcode, with a value stack and a control
stack, in the manner of a baseline compiler. Values on the stack are SSA values. Locals
live in an environment (one current SSA value per local) instead of memory: ``local.set``
just rebinds the slot. Wasm's structured control becomes a CFG with block arguments:

* a ``block`` or ``if`` gets a merge block only when something branches to its end; each
  branch records the environment it leaves with, and at ``end`` the merge block takes an
  argument for every local (and result) whose incoming values differ;
* a ``loop`` gets a header block marked as a loop header; since back edges are not known
  when the header is made, it takes an argument for each local the loop body assigns
  (found by scanning the body once) unless that local is dead at the header (its reads
  all inside the loop, behind a write that starts the body: pruned SSA), the others keep
  their value through the loop;
* code after ``br``, ``br_table``, ``return`` and ``unreachable`` is dead and skipped,
  whole nested constructs at a time.

Comparisons produce ``i1`` and are widened to ``i32`` for the Wasm stack; a branch on a
widened comparison uses the ``i1`` directly. The handler of each opcode is chosen from its
row in :mod:`compiler.frontend.opcodes` (SIMD rows by :mod:`compiler.frontend.translate_simd`);
:func:`mapping` describes that choice for the docs.
"""

from __future__ import annotations

import bisect
import gc
from collections.abc import Callable

from tensorwasm.compiler.errors import TranslateError
from tensorwasm.compiler.frontend import translate_simd
from tensorwasm.compiler.frontend.module import Instr, WasmModule
from tensorwasm.compiler.frontend.opcodes import OPCODES, Feature, Opcode
from tensorwasm.dialect import OPS, arith, cf, mem, variables
from tensorwasm.dialect import func as funcd
from tensorwasm.dialect.builder import Builder
from tensorwasm.dialect.ir import (
    Block,
    FuncSig,
    Function,
    GlobalDecl,
    LoopInfo,
    MemoryDecl,
    Module,
    Op,
    Successor,
    TableDecl,
    Value,
)
from tensorwasm.dialect.types import I1, I32, V128, Type
from tensorwasm.dialect.verifier import verify_function
from tensorwasm.support.errors import TensorWasmError

Handler = Callable[["FunctionTranslator", Instr], None]


class Frame:
    """One entry of the control stack: a ``block``, ``loop``, ``if`` or the function body."""

    __slots__ = (
        "assigned",
        "false_succ",
        "header",
        "height",
        "if_env",
        "if_params",
        "kind",
        "loop",
        "params",
        "pending",
        "results",
    )  # fmt: skip

    def __init__(self, kind: str, height: int, params: tuple[Type, ...], results: tuple[Type, ...]):
        self.kind = kind
        self.height = height  # value stack height below the frame's parameters
        self.params = params
        self.results = results
        # Forward branches to the frame's end: (successor to patch, locals, values passed).
        self.pending: list[tuple[Successor, list[Value], list[Value]]] = []
        self.header: Block | None = None  # loop header
        self.assigned: list[int] = []  # locals the loop body assigns
        self.if_env: list[Value] | None = None
        self.if_params: list[Value] = []
        self.false_succ: Successor | None = None  # the if's false edge until 'else' is seen
        self.loop: LoopInfo | None = None


class FunctionTranslator:
    """Translates one function body; see the module docstring for the algorithm."""

    def __init__(self, wasm: WasmModule, func: Function, index: int):
        self.wasm = wasm
        self.func = func
        self.index = index
        self.b = Builder(func)
        self.stack: list[Value] = []
        self.ctrl: list[Frame] = []
        self.env: list[Value] = []
        self.reachable = True
        self.loops: list[LoopInfo] = []
        self.body: list[Instr] = []
        self.constants: dict[tuple[Type, int], Value] = {}
        self.loop_assigned: dict[int, list[int]] | None = None  # see loop_assignments

    # -- helpers -------------------------------------------------------------------------

    def pop(self, n: int) -> list[Value]:
        if n == 0:
            return []
        values = self.stack[-n:]
        del self.stack[-n:]
        return values

    def block_sig(self, imm) -> tuple[tuple[Type, ...], tuple[Type, ...]]:
        if imm is None:
            return (), ()
        if isinstance(imm, Type):
            return (), (imm,)
        sig = self.wasm.types[imm[1]]
        return sig.params, sig.results

    def to_i1(self, value: Value) -> Value:
        """A Wasm i32 condition as an i1, reusing the comparison it was widened from."""
        owner = value.owner
        if isinstance(owner, Op) and owner.opdef is arith.zext and owner.operands[0].type is I1:
            return owner.operands[0]
        zero = self.constant(value.type, 0)
        return self.b.value(arith.cmpi, value, zero, pred="ne")

    def widen(self, flag: Value) -> Value:
        return self.b.value(arith.zext, flag, to=I32)

    def new_block(self, arg_types=()) -> Block:
        return self.func.add_block(arg_types)

    def switch_to(self, block: Block) -> None:
        self.b.block = block
        self.reachable = True
        self.constants = {}

    def constant(self, ty: Type, bits: int) -> Value:
        """A constant, shared with an equal one earlier in the same block."""
        key = (ty, bits)
        value = self.constants.get(key)
        if value is None:
            value = self.constants[key] = self.b.constant(ty, bits)
        return value

    def branch_op(self, opdef, operands: list[Value], succs: list[Successor]) -> None:
        """Emit a terminator whose successors may still be placeholders to patch later."""
        op = Op(opdef, operands, (), {}, succs, self.b.offset)
        op.block = self.b.block
        self.b.block.ops.append(op)
        self.reachable = False

    def branch_to(self, depth: int) -> Successor:
        """A successor for a branch to the frame ``depth`` levels out, with the values it carries."""
        frame = self.ctrl[-1 - depth]
        succ = self._branch_to(frame)
        # The branch leaves every loop opened inside the target frame.
        for inner in self.ctrl[len(self.ctrl) - depth :]:
            if inner.kind == "loop":
                inner.loop.exits.append((succ, list(self.env)))
        return succ

    def _branch_to(self, frame: Frame) -> Successor:
        if frame.kind == "loop":
            n = len(frame.params)
            args = [self.env[i] for i in frame.assigned] + (self.stack[-n:] if n else [])
            return Successor(frame.header, args)
        n = len(frame.results)
        succ = Successor(None, [])  # type: ignore[arg-type]
        frame.pending.append((succ, list(self.env), self.stack[-n:] if n else []))
        return succ

    def merge(self, frame: Frame) -> None:
        """Close a block/if/function frame: make its merge block (if needed) and go on there."""
        pending = frame.pending
        if not pending:
            self.reachable = False
            return
        envs = [p[1] for p in pending]
        vals = [p[2] for p in pending]
        arg_types: list[Type] = []
        local_args: list[int] = []
        result_args: list[int] = []
        if len(pending) > 1:
            n = len(pending)
            # Column by column: a local (or result) needs an argument when its incoming
            # values differ (tuple.count compares by identity for values, in C).
            for i, column in enumerate(zip(*envs, strict=True)):
                if column.count(column[0]) != n:
                    local_args.append(i)
                    arg_types.append(column[0].type)
            for k, column in enumerate(zip(*vals, strict=True)):
                if column.count(column[0]) != n:
                    result_args.append(k)
                    arg_types.append(frame.results[k])
        block = self.new_block(arg_types)
        for succ, env, values in pending:
            succ.block = block
            succ.args = [env[i] for i in local_args] + [values[k] for k in result_args]
        env = list(envs[0])
        results = list(vals[0])
        for arg, i in zip(block.args, local_args, strict=False):
            env[i] = arg
        for arg, k in zip(block.args[len(local_args) :], result_args, strict=True):
            results[k] = arg
        self.env = env
        del self.stack[frame.height :]
        self.stack.extend(results)
        self.switch_to(block)

    # -- the driver ----------------------------------------------------------------------

    def translate(self, params: tuple[Type, ...], results: tuple[Type, ...], locals_, body) -> None:
        self.body = body
        entry = self.new_block(params)
        self.b.block = entry
        self.env = list(entry.args)
        zeros: dict[Type, Value] = {}
        for ty in locals_:
            if ty not in zeros:
                zeros[ty] = self._zero(ty)
            self.env.append(zeros[ty])
        self.ctrl.append(Frame("func", 0, (), results))
        handlers = HANDLERS
        i, n = 0, len(body)
        while i < n:
            instr = body[i]
            self.b.offset = instr.offset
            try:
                if not self.reachable:
                    name = instr.op.name
                    if name in ("block", "loop", "if"):
                        i = instr.match + 1  # a whole dead construct
                        continue
                    if name != "end" and name != "else":
                        i += 1
                        continue
                if instr.op.name == "loop":
                    self._loop(instr, i)
                else:
                    handlers[instr.op](self, instr)
            except TensorWasmError as exc:
                raise TranslateError(
                    f"function {self.index} ({self.func.name}): {instr.op.name} at offset "
                    f"0x{instr.offset:x}: {exc}"
                ) from exc
            i += 1

    def _zero(self, ty: Type) -> Value:
        if ty.is_ref:
            return self.b.value(variables.ref_null, type=ty)
        if ty is V128:
            return translate_simd.zero(self)
        return self.constant(ty, 0)

    def _loop(self, instr: Instr, index: int) -> None:
        params, results = self.block_sig(instr.imm)
        if self.loop_assigned is None:
            self.loop_assigned = loop_assignments(self.body)
        assigned = self.loop_assigned[index]
        args = self.pop(len(params))
        entry_env = list(self.env)
        frame = Frame("loop", len(self.stack), params, results)
        frame.assigned = assigned
        header = self.new_block([self.env[i].type for i in assigned] + list(params))
        self.b.br(header, [self.env[i] for i in assigned] + args)
        self.switch_to(header)
        for k, i in enumerate(assigned):
            self.env[i] = header.args[k]
        self.stack.extend(header.args[len(assigned) :])
        parent = self.loops[-1] if self.loops else None
        info = LoopInfo(header, instr.offset, len(self.loops) + 1, parent, index, instr.match,
                        entry_env, assigned)  # fmt: skip
        header.attrs["loop"] = info
        self.func.loops.append(info)
        self.loops.append(info)
        frame.header = header
        frame.loop = info
        self.ctrl.append(frame)


def loop_assignments(body: list[Instr]) -> dict[int, list[int]]:
    """The locals each ``loop`` of ``body`` (by its index) needs as header arguments, sorted:
    those it sets or tees inside it, less those dead at its header (see :class:`_Accesses`).

    One pass collects the sets: a ``local.set``/``local.tee`` goes to the innermost open
    loop, and a loop's set, less its dead locals, joins its parent's when it closes (work in
    proportion to the sets made and the arguments kept, not to the body times its nesting
    depth)."""
    found: dict[int, list[int]] = {}
    open_loops: list[tuple[int, int, set[int]]] = []  # (index, index of its end, locals)
    accesses = _Accesses(body)

    def close() -> None:
        index, end, locals_ = open_loops.pop()
        live = [i for i in sorted(locals_) if not accesses.dead_at_header(i, index, end)]
        found[index] = live
        if open_loops:
            # A local dead at this header is dead at every enclosing one: all its reads are
            # in this loop, behind the write that starts it (see _Accesses).
            open_loops[-1][2].update(live)

    for i, x in enumerate(body):
        while open_loops and i >= open_loops[-1][1]:
            close()
        name = x.op.name
        if name == "loop":
            open_loops.append((i, x.match, set()))
        elif (name == "local.set" or name == "local.tee") and open_loops:
            open_loops[-1][2].add(x.imm)
    while open_loops:
        close()
    return found


class _Accesses:
    """Where each local is read and written, to prune loop header arguments (pruned SSA).

    A local the loop assigns is dead at the loop's header, and needs no argument there, when
    (1) its first access inside the loop, in body order, is a write directly in the loop's
    body (inside no ``block``, ``if`` or inner ``loop`` of it), and (2) nothing outside the
    loop reads it. By (1) every path from the header to a read inside the loop passes that
    write: no branch inside the loop can jump over an instruction that no inner construct
    holds, and the only backward target before it is the header itself. By (2) a path that
    leaves the loop reads the local nowhere, except by entering the loop again at its
    header. Clang's counters of inner loops (set to their start before each inner loop,
    read nowhere else) are this case: without the rule, each loop of a nest n deep carries
    every inner loop's counter, n * n / 2 arguments made and then found dead."""

    def __init__(self, body: list[Instr]):
        self.body = body
        self.positions: dict[int, list[int]] = {}  # local -> body indices of its accesses
        self.reads: dict[int, tuple[int, int]] = {}  # local -> (first, last) index of a read
        self.parent: list[int] = []  # body index -> index of the innermost open construct
        opened: list[int] = [-1]
        for i, x in enumerate(body):
            name = x.op.name
            if name == "end" and len(opened) > 1:  # (the body's own end closes nothing here)
                opened.pop()
            self.parent.append(opened[-1])
            if name in ("block", "loop", "if"):
                opened.append(i)
            elif name in ("local.get", "local.set", "local.tee"):
                self.positions.setdefault(x.imm, []).append(i)
                if name == "local.get":
                    self.reads[x.imm] = (self.reads.get(x.imm, (i, i))[0], i)

    def dead_at_header(self, local: int, loop: int, end: int) -> bool:
        first, last = self.reads.get(local, (loop + 1, loop + 1))
        if first <= loop or last >= end:
            return False  # read outside the loop
        positions = self.positions[local]
        at = positions[bisect.bisect_right(positions, loop)]  # the loop assigns it: one exists
        return at < end and self.body[at].op.name != "local.get" and self.parent[at] == loop


# -- handlers of structured control ------------------------------------------------------


def _block(t: FunctionTranslator, instr: Instr) -> None:
    params, results = t.block_sig(instr.imm)
    t.ctrl.append(Frame("block", len(t.stack) - len(params), params, results))


def _if(t: FunctionTranslator, instr: Instr) -> None:
    cond = t.to_i1(t.stack.pop())
    params, results = t.block_sig(instr.imm)
    frame = Frame("if", len(t.stack) - len(params), params, results)
    frame.if_env = list(t.env)
    frame.if_params = t.stack[len(t.stack) - len(params) :]
    then = t.new_block()
    frame.false_succ = Successor(None, [])  # type: ignore[arg-type]
    t.branch_op(cf.cond_br, [cond], [Successor(then, []), frame.false_succ])
    t.switch_to(then)
    t.ctrl.append(frame)


def _else(t: FunctionTranslator, instr: Instr) -> None:
    frame = t.ctrl[-1]
    if t.reachable:
        t.branch_op(cf.br, [], [t.branch_to(0)])
    other = t.new_block()
    frame.false_succ.block = other
    frame.false_succ = None
    t.env = list(frame.if_env)
    del t.stack[frame.height :]
    t.stack.extend(frame.if_params)
    t.switch_to(other)


def _end(t: FunctionTranslator, instr: Instr) -> None:
    frame = t.ctrl[-1]
    if frame.kind == "loop":
        t.ctrl.pop()
        loop = t.loops.pop()
        if t.reachable:
            loop.exits.append((None, list(t.env)))
        return  # nothing branches to a loop's end: fall through in place
    if frame.false_succ is not None:  # an if without else: the false edge skips to the end
        frame.pending.append((frame.false_succ, frame.if_env, frame.if_params))
        frame.false_succ = None
    if t.reachable and frame.pending:
        t.branch_op(cf.br, [], [t.branch_to(0)])
    t.ctrl.pop()
    if frame.pending:
        t.merge(frame)
    if frame.kind == "func" and t.reachable:
        t.b.ret(t.pop(len(frame.results)))
        t.reachable = False


def _br(t: FunctionTranslator, instr: Instr) -> None:
    depth = instr.imm
    if depth == len(t.ctrl) - 1:
        _return(t, instr)
        return
    t.branch_op(cf.br, [], [t.branch_to(depth)])


def _br_if(t: FunctionTranslator, instr: Instr) -> None:
    cond = t.to_i1(t.stack.pop())
    taken = t.branch_to(instr.imm)
    cont = t.new_block()
    t.branch_op(cf.cond_br, [cond], [taken, Successor(cont, [])])
    t.switch_to(cont)


def _br_table(t: FunctionTranslator, instr: Instr) -> None:
    index = t.stack.pop()
    labels, default = instr.imm
    succs = [t.branch_to(depth) for depth in labels]
    succs.append(t.branch_to(default))
    t.branch_op(cf.switch, [index], succs)


def _return(t: FunctionTranslator, instr: Instr) -> None:
    for loop in t.loops:
        loop.returns = True
    t.b.ret(t.pop(len(t.func.results)))
    t.reachable = False


def _unreachable(t: FunctionTranslator, instr: Instr) -> None:
    t.b.trap("unreachable")
    t.reachable = False


def _nop(t: FunctionTranslator, instr: Instr) -> None:
    pass


def _drop(t: FunctionTranslator, instr: Instr) -> None:
    t.stack.pop()


def _select(t: FunctionTranslator, instr: Instr) -> None:
    cond = t.to_i1(t.stack.pop())
    a, b = t.pop(2)
    t.stack.append(t.b.value(arith.select, cond, a, b))


def _local_get(t: FunctionTranslator, instr: Instr) -> None:
    t.stack.append(t.env[instr.imm])


def _local_set(t: FunctionTranslator, instr: Instr) -> None:
    t.env[instr.imm] = t.stack.pop()


def _local_tee(t: FunctionTranslator, instr: Instr) -> None:
    t.env[instr.imm] = t.stack[-1]


def _call(t: FunctionTranslator, instr: Instr) -> None:
    sig = t.wasm.func_sig(instr.imm)
    args = t.pop(len(sig.params))
    op = t.b.op(funcd.call, args, {"callee": instr.imm, "sig": sig})
    t.stack.extend(op.results)


def _call_indirect(t: FunctionTranslator, instr: Instr) -> None:
    type_index, table = instr.imm
    sig = t.wasm.types[type_index]
    slot = t.stack.pop()
    args = t.pop(len(sig.params))
    attrs = {"table": table, "type": type_index, "sig": sig}
    op = t.b.op(funcd.call_indirect, [*args, slot], attrs)
    t.stack.extend(op.results)


def _global_get(t: FunctionTranslator, instr: Instr) -> None:
    ty = t.wasm.global_types()[instr.imm].type
    t.stack.append(t.b.value(variables.global_get, index=instr.imm, type=ty))


def _global_set(t: FunctionTranslator, instr: Instr) -> None:
    ty = t.wasm.global_types()[instr.imm].type
    t.b.op(variables.global_set, [t.stack.pop()], {"index": instr.imm, "type": ty})


def _table_type(t: FunctionTranslator, table: int) -> Type:
    return t.wasm.table_types()[table].elem


def _ref_null(t: FunctionTranslator, instr: Instr) -> None:
    t.stack.append(t.b.value(variables.ref_null, type=instr.imm))


def _ref_is_null(t: FunctionTranslator, instr: Instr) -> None:
    ref = t.stack.pop()
    t.stack.append(t.widen(t.b.value(variables.ref_is_null, ref, type=ref.type)))


def _ref_func(t: FunctionTranslator, instr: Instr) -> None:
    t.stack.append(t.b.value(variables.ref_func, func=instr.imm))


def _table_op(opdef, n_operands: int) -> Handler:
    def handle(t: FunctionTranslator, instr: Instr) -> None:
        args = t.pop(n_operands)
        attrs = {"table": instr.imm, "type": _table_type(t, instr.imm)}
        t.stack.extend(t.b.op(opdef, args, attrs).results)

    handle.__doc__ = opdef.name
    return handle


def _table_copy(t: FunctionTranslator, instr: Instr) -> None:
    dst, src = instr.imm
    t.b.op(variables.table_copy, t.pop(3), {"dst": dst, "src": src})


def _table_init(t: FunctionTranslator, instr: Instr) -> None:
    elem, table = instr.imm
    t.b.op(variables.table_init, t.pop(3), {"elem": elem, "table": table})


def _elem_drop(t: FunctionTranslator, instr: Instr) -> None:
    t.b.op(variables.elem_drop, [], {"elem": instr.imm})


def _memory_init(t: FunctionTranslator, instr: Instr) -> None:
    data, memory = instr.imm
    t.b.op(mem.init, t.pop(3), {"data": data, "memory": memory})


def _data_drop(t: FunctionTranslator, instr: Instr) -> None:
    t.b.op(mem.data_drop, [], {"data": instr.imm})


def _memory_copy(t: FunctionTranslator, instr: Instr) -> None:
    dst, src = instr.imm
    t.b.op(mem.copy, t.pop(3), {"dst_memory": dst, "src_memory": src})


def _memory_op(opdef, n_operands: int) -> Handler:
    def handle(t: FunctionTranslator, instr: Instr) -> None:
        t.stack.extend(t.b.op(opdef, t.pop(n_operands), {"memory": 0}).results)

    return handle


# -- handlers generated from table rows -----------------------------------------------------


def _access_bits(op: Opcode) -> int:
    name = op.name.split(".", 1)[1]
    for bits in (8, 16, 32):
        if name.endswith(f"{bits}") or f"{bits}_" in name:
            return bits
    return int(op.name[1:3])


def _load(op: Opcode) -> Handler:
    ty = OPS_TYPES[op.result_types[0]]
    attrs_base = {"type": ty, "bits": _access_bits(op), "signed": op.name.endswith("_s")}

    def handle(t: FunctionTranslator, instr: Instr) -> None:
        align, offset = instr.imm
        attrs = {**attrs_base, "offset": offset, "align": align}
        t.stack.append(t.b.op(mem.load, [t.stack.pop()], attrs).results[0])

    return handle


def _store(op: Opcode) -> Handler:
    bits = _access_bits(op)

    def handle(t: FunctionTranslator, instr: Instr) -> None:
        align, offset = instr.imm
        t.b.op(mem.store, t.pop(2), {"bits": bits, "offset": offset, "align": align})

    return handle


def _const(op: Opcode) -> Handler:
    ty = OPS_TYPES[op.result_types[0]]
    mask = (1 << ty.bits) - 1

    def handle(t: FunctionTranslator, instr: Instr) -> None:
        t.stack.append(t.constant(ty, instr.imm & mask))

    return handle


def _compare(op: Opcode) -> Handler:
    name, pred = op.dialect.split()
    opdef = OPS[name]
    unary = len(op.operand_types) == 1  # eqz compares with zero

    def handle(t: FunctionTranslator, instr: Instr) -> None:
        if unary:
            lhs = t.stack.pop()
            rhs = t.constant(lhs.type, 0)
        else:
            lhs, rhs = t.pop(2)
        t.stack.append(t.widen(t.b.value(opdef, lhs, rhs, pred=pred)))

    return handle


def _cast(op: Opcode) -> Handler:
    opdef = OPS[op.dialect]
    to = OPS_TYPES[op.result_types[0]]

    def handle(t: FunctionTranslator, instr: Instr) -> None:
        t.stack.append(t.b.value(opdef, t.stack.pop(), to=to))

    return handle


def _sext_inreg(op: Opcode) -> Handler:
    bits = _access_bits(op)

    def handle(t: FunctionTranslator, instr: Instr) -> None:
        t.stack.append(t.b.value(arith.sext_inreg, t.stack.pop(), bits=bits))

    return handle


def _uniform(op: Opcode) -> Handler:
    opdef = OPS[op.dialect]
    arity = len(op.operand_types)

    def handle(t: FunctionTranslator, instr: Instr) -> None:
        t.stack.append(t.b.op(opdef, t.pop(arity)).results[0])

    return handle


OPS_TYPES: dict[str, Type] = {}


def _build_handlers() -> tuple[dict[Opcode, Handler], dict[str, str]]:
    """The handler of every supported row, and the docs' description of what it emits."""
    from tensorwasm.dialect.types import by_name

    OPS_TYPES.update({n: by_name(n) for n in ("i32", "i64", "f32", "f64")})
    fixed: dict[str, tuple[Handler, str]] = {
        "unreachable": (_unreachable, "cf.trap {kind = unreachable}"),
        "nop": (_nop, "(nothing)"),
        "block": (_block, "a merge block with arguments, if anything branches to its end"),
        "loop": (None, "a loop header block with arguments for the assigned locals live at it"),
        "if": (_if, "cf.cond_br to a then block and an else block or the merge block"),
        "else": (_else, "starts the else block"),
        "end": (_end, "closes the construct: merge block, or cf.return at the function end"),
        "br": (_br, "cf.br passing locals and label values (cf.return at the function level)"),
        "br_if": (_br_if, "cf.cond_br to the target and a continuation block"),
        "br_table": (_br_table, "cf.switch"),
        "return": (_return, "cf.return"),
        "call": (_call, "func.call"),
        "call_indirect": (_call_indirect, "func.call_indirect"),
        "drop": (_drop, "(nothing: the value is left unused)"),
        "select": (_select, "arith.select (condition through arith.cmpi ne unless an i1 exists)"),
        "select_t": (_select, "arith.select"),
        "local.get": (_local_get, "(SSA: the local's current value)"),
        "local.set": (_local_set, "(SSA: rebinds the local)"),
        "local.tee": (_local_tee, "(SSA: rebinds the local, keeps the value)"),
        "global.get": (_global_get, "global.get"),
        "global.set": (_global_set, "global.set"),
        "table.get": (_table_op(variables.table_get, 1), "table.get"),
        "table.set": (_table_op(variables.table_set, 2), "table.set"),
        "table.size": (_table_op(variables.table_size, 0), "table.size"),
        "table.grow": (_table_op(variables.table_grow, 2), "table.grow"),
        "table.fill": (_table_op(variables.table_fill, 3), "table.fill"),
        "table.copy": (_table_copy, "table.copy"),
        "table.init": (_table_init, "table.init"),
        "elem.drop": (_elem_drop, "table.elem_drop"),
        "ref.null": (_ref_null, "ref.null"),
        "ref.is_null": (_ref_is_null, "ref.is_null + arith.zext"),
        "ref.func": (_ref_func, "ref.func"),
        "memory.size": (_memory_op(mem.size, 0), "mem.size"),
        "memory.grow": (_memory_op(mem.grow, 1), "mem.grow"),
        "memory.fill": (_memory_op(mem.fill, 3), "mem.fill"),
        "memory.copy": (_memory_copy, "mem.copy"),
        "memory.init": (_memory_init, "mem.init"),
        "data.drop": (_data_drop, "mem.data_drop"),
    }
    handlers: dict[Opcode, Handler] = {}
    docs: dict[str, str] = {}
    for op in OPCODES:
        if not op.supported:
            continue
        if op.name in fixed:
            handler, doc = fixed[op.name]
        elif op.feature is Feature.SIMD:
            handler, doc = translate_simd.handler(op)
        elif op.dialect == "mem.load":
            handler, doc = (
                _load(op),
                f"mem.load {{bits = {_access_bits(op)}, signed = {op.name.endswith('_s')}}}",
            )
        elif op.dialect == "mem.store":
            handler, doc = _store(op), f"mem.store {{bits = {_access_bits(op)}}}"
        elif op.dialect == "arith.constant":
            handler, doc = _const(op), "arith.constant"
        elif op.dialect.startswith(("arith.cmpi", "arith.cmpf")):
            handler = _compare(op)
            name, pred = op.dialect.split()
            zero = "arith.constant 0 + " if len(op.operand_types) == 1 else ""
            doc = f"{zero}{name} {pred} + arith.zext"
        elif op.dialect == "arith.sext_inreg":
            handler, doc = _sext_inreg(op), f"arith.sext_inreg {{bits = {_access_bits(op)}}}"
        elif op.operand_types != op.result_types and len(op.operand_types) == 1:
            handler, doc = _cast(op), f"{op.dialect} (to {op.result_types[0]})"
        else:
            handler, doc = _uniform(op), op.dialect
        if handler is not None:
            handlers[op] = handler
        docs[op.name] = doc
    return handlers, docs


HANDLERS, MAPPING = _build_handlers()


def mapping(name: str) -> str:
    """What the translator emits for the Wasm opcode ``name`` (for docs/opcodes.md)."""
    return MAPPING[name]


# -- modules -------------------------------------------------------------------------------


def translate_module(wasm: WasmModule, *, verify: bool = True, only: set[int] | None = None) -> Module:
    """Translate every function of a decoded (and validated) module into the dialect; with
    ``only``, just those defined functions (the others keep their signature and no body,
    marked ``attrs["untranslated"]``: see :func:`loop_closure`)."""
    # The IR is a dense graph of small objects with reference cycles (values point at their
    # ops and back): the cyclic collector would rescan it over and over while it grows.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _translate_module(wasm, verify, only)
    finally:
        if paused:
            gc.enable()


def loop_closure(wasm: WasmModule) -> set[int]:
    """The defined functions the loop offload needs: those with a ``loop``, and every
    function a call inside a loop reaches (a kernel runs loop bodies and what they call,
    nothing else of a function)."""
    first = wasm.num_imported_funcs
    needed: set[int] = set()
    work: list[int] = []
    for n, code in enumerate(wasm.codes):
        body = code.body
        loops = [(i, ins.match) for i, ins in enumerate(body) if ins.op.name == "loop"]
        if not loops:
            continue
        needed.add(first + n)
        for i, ins in enumerate(body):
            if ins.op.name == "call" and ins.imm >= first and any(lo < i < hi for lo, hi in loops):
                work.append(ins.imm)
    while work:
        index = work.pop()
        if index in needed:
            continue
        needed.add(index)
        work.extend(
            ins.imm for ins in wasm.codes[index - first].body if ins.op.name == "call" and ins.imm >= first
        )
    return needed


def _translate_module(wasm: WasmModule, verify: bool, only: set[int] | None = None) -> Module:
    module = Module(types=list(wasm.types))
    for g_type in wasm.global_types():
        module.globals.append(GlobalDecl(g_type.type, g_type.mutable))
    module.table_funcs = referenced_functions(wasm)
    module.memories = [MemoryDecl(lim.min, lim.max) for lim in wasm.memory_limits()]
    module.tables = [TableDecl(t.elem, t.limits.min, t.limits.max) for t in wasm.table_types()]
    index = 0
    for imp in wasm.imports:
        if imp.kind != "func":
            continue
        sig = wasm.types[imp.desc]
        module.functions.append(
            Function(
                wasm.func_name(index), index, sig.params, sig.results,
                import_name=(imp.module, imp.name), exports=wasm.export_names("func", index),
            )
        )  # fmt: skip
        index += 1
    for _code in wasm.codes:
        if only is None or index in only:
            module.functions.append(translate_function(wasm, index, verify=verify))
        else:
            sig = wasm.func_sig(index)
            stub = Function(wasm.func_name(index), index, sig.params, sig.results,
                            exports=wasm.export_names("func", index))  # fmt: skip
            stub.attrs["untranslated"] = True
            module.functions.append(stub)
        index += 1
    return module


def referenced_functions(wasm: WasmModule) -> set[int]:
    """Functions that may end up in a table: in element segments or named by ref.func."""
    refs: set[int] = set()
    exprs = [item for seg in wasm.elements for item in seg.items]
    exprs += [g.init for g in wasm.globals]
    exprs += [code.body for code in wasm.codes]
    for expr in exprs:
        refs.update(i.imm for i in expr if i.op.name == "ref.func")
    return refs


def translate_function(wasm: WasmModule, index: int, *, verify: bool = True) -> Function:
    """Translate defined function ``index`` (in the function index space) and verify it."""
    sig: FuncSig = wasm.func_sig(index)
    code = wasm.codes[index - wasm.num_imported_funcs]
    func = Function(
        wasm.func_name(index), index, sig.params, sig.results, exports=wasm.export_names("func", index)
    )
    func.attrs["offset"] = code.offset
    func.attrs["instructions"] = len(code.body)
    FunctionTranslator(wasm, func, index).translate(sig.params, sig.results, code.locals, code.body)
    remove_dead_block_args(func)
    remove_dead_ops(func)
    if verify:
        try:
            verify_function(func)
        except TensorWasmError as exc:
            raise TranslateError(f"function {index} ({func.name}) failed verification: {exc}") from exc
    return func


def remove_dead_block_args(func: Function) -> None:
    """Drop block arguments nothing reads: merges carry every local whose value differs,
    and most of those are never read again. An argument is live when an op uses it or it
    flows into a live argument; entry arguments (the parameters) always stay."""
    incoming: dict[Value, list[Value]] = {}
    succs = [succ for op in func.ops() for succ in op.successors]
    for succ in succs:
        for arg, value in zip(succ.block.args, succ.args, strict=True):
            incoming.setdefault(arg, []).append(value)
    live: set[Value] = set(func.entry.args)
    work = [v for op in func.ops() for v in op.operands]
    while work:
        value = work.pop()
        if value in live:
            continue
        live.add(value)
        work.extend(incoming.get(value, ()))
    into: dict[Block, list[Successor]] = {}
    for succ in succs:
        into.setdefault(succ.block, []).append(succ)
    for block in func.blocks[1:]:
        keep = [i for i, arg in enumerate(block.args) if arg in live]
        if len(keep) == len(block.args):
            continue
        block.args = [block.args[i] for i in keep]
        for i, arg in enumerate(block.args):
            arg.index = i
        for succ in into.get(block, ()):
            succ.args = [succ.args[i] for i in keep]


def remove_dead_ops(func: Function) -> None:
    """Drop pure ops whose results are unused (left over by the i1 peephole and dead locals)."""
    uses: dict[Value, int] = {}
    for op in func.ops():
        for v in op.operands:
            uses[v] = uses.get(v, 0) + 1
        for s in op.successors:
            for v in s.args:
                uses[v] = uses.get(v, 0) + 1
    for block in func.blocks:
        kept: list[Op] = []
        for op in reversed(block.ops):
            if op.opdef.pure and op.results and not any(uses.get(r) for r in op.results):
                for v in op.operands:
                    uses[v] -= 1
                continue
            kept.append(op)
        kept.reverse()
        block.ops = kept
