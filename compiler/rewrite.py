"""Rewriting a Wasm module around its offloadable loops (the encoder of the offload path).

Before each chosen loop the rewriter inserts a call to an imported host function,
``tensorwasm.loop_<n>``, that takes the loop's live-in locals (and globals) plus the
current values of the locals the loop assigns, and returns a flag and those locals' new
values. The flag says whether the host ran the loop (then the inserted code skips it) or
declined (then the original loop runs unchanged). A loop that is left by falling off its
``end`` is wrapped in a block so the skip has a target; branches inside it that leave the
loop are renumbered for the extra label. Adding imports shifts the index of every defined
function, so calls, ``ref.func``, exports, element segments and the start function are
renumbered; the "name" section, which would go stale, is dropped.

The loops' host calls go through a table of the module's own, exported as
``tensorwasm:hooks`` and filled with the imports by an element segment, so the host can
replace a loop's host function while the instance runs (with native code: see
:mod:`runtime.replay`); a ``call_indirect`` costs a few nanoseconds more than a ``call``.
The table and the segment come after the module's own, so no table or segment index moves.

The host calls take and return i32/i64 values only. A v128 live-in crosses as its two
64-bit halves: before the call they are read out into scratch i64 locals (``moves``) that
the call passes. A v128 reduction comes back as one partial result per lane, in scratch
locals of the lanes' type that start at the identity (``folds``): after the call the lanes
are put together and combined with the vector's value at loop entry by the loop's own
SIMD operation, so a declined loop (all identities) leaves it as it was. Scratch locals
are declared after the function's own, so no local index moves.

Where control lands after leaving a device-resident region (:mod:`compiler.analysis.regions`):
after its loop's ``end``, after the ``end`` of a block a branch leaves it for, at the top
of a loop one does, it inserts a call to ``tensorwasm.region_<n>``, which takes and returns
nothing: the host brings the device's results back into linear memory there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorwasm.dialect.types import EXTERNREF, F32, F64, FUNCREF, I32, I64, V128, Type
from tensorwasm.support.records import field, record

# A warm start reads only the declarations here (the host module's name, Insertion,
# Filter); the IR's signatures load with the functions that build them.
if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.plan import LoopPlan
    from tensorwasm.compiler.frontend.module import Instr, WasmModule
    from tensorwasm.dialect.ir import FuncSig

VALTYPE_BYTES = {I32: 0x7F, I64: 0x7E, F32: 0x7D, F64: 0x7C, V128: 0x7B, FUNCREF: 0x70, EXTERNREF: 0x6F}
HOST_MODULE = "tensorwasm"
MEMORY_EXPORT = "tensorwasm:memory"  # memory 0, for the host functions
FILTER_EXPORT = "tensorwasm:"  # then min_<n> / skipped_<n> / wait_<n>: see Filter and Insertion.gate
HOOKS_EXPORT = "tensorwasm:hooks"  # the table through which the loops' host calls go
# The instructions whose immediate is a function index, which the new imports shift (the
# tail call is in a function that stays on wasmtime: see compiler.degrade).
FUNC_INDEX_OPS = frozenset({"call", "return_call", "ref.func"})


def uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def sleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40):
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def vec(items: list[bytes]) -> bytes:
    return uleb(len(items)) + b"".join(items)


def section(sid: int, payload: bytes) -> bytes:
    return bytes([sid]) + uleb(len(payload)) + payload


def name(text: str) -> bytes:
    raw = text.encode()
    return uleb(len(raw)) + raw


def functype(sig: FuncSig) -> bytes:
    return (
        b"\x60"
        + vec([bytes([VALTYPE_BYTES[t]]) for t in sig.params])
        + vec([bytes([VALTYPE_BYTES[t]]) for t in sig.results])
    )


# An affine i32 expression of the values at the loop's entry: (coefficient, "const" |
# "local" | "global", index) terms, computed with Wasm's wrapping i32 arithmetic.
Affine = list[tuple[int, str, int]]


@record
class Filter:
    """A test in Wasm before the host call: how far the loop's counter has to go, as an i64
    (``bound - start``, or ``start - bound`` for a counter that steps down; one more where
    the bound is inclusive; for ``ne``, the distance modulo 2^32). Below the threshold held
    in the exported global ``tensorwasm:min_<n>`` the host is not asked (it would decline
    the launch as too little work) and ``tensorwasm:skipped_<n>`` counts the arrival."""

    start: Affine
    bound: Affine
    signed: bool  # how the i32 values compare (ignored for "ne")
    down: bool
    inclusive: bool
    modular: bool  # "ne": the distance modulo 2^32


def loop_filter(plan: LoopPlan) -> Filter | None:
    """The Wasm-side test before the host call (:class:`Filter`), where the
    loop's work per iteration is fixed (no inner loop repeats any of it) and its counter an
    i32 running towards a bound, both affine in i32 live-ins."""
    trip = plan.trip
    if any(around for _, around in plan.work) or trip.bits != 32 or trip.pred == "eq":
        return None
    up = trip.step > 0
    if trip.pred != "ne" and (trip.pred[1:] in ("lt", "le")) != up:
        return None  # it moves away from its bound: the guards decline it
    where = {sym: (kind, index, value.type) for value, sym, kind, index in plan.live_ins}

    def affine(poly) -> Affine | None:
        terms = []
        for monomial, coefficient in poly.terms.items():
            if not monomial:
                terms.append((coefficient, "const", 0))
                continue
            if len(monomial) != 1 or monomial[0] not in where:
                return None
            kind, index, ty = where[monomial[0]]
            if ty.name != "i32":
                return None
            terms.append((coefficient, kind, index))
        return terms

    start, bound = affine(trip.start), affine(trip.bound)
    if start is None or bound is None:
        return None
    return Filter(start, bound, signed=trip.pred.startswith("s"), down=not up,
                  inclusive=trip.pred[1:] in ("le", "ge"), modular=trip.pred == "ne")  # fmt: skip


# The initial threshold: every arrival asks the host (a distance is never below it).
NEVER_SKIP = -(1 << 63)


@record
class Insertion:
    """One loop to guard: where it is and what the inserted call passes and receives."""

    func_index: int  # in the original module's function index space
    start: int  # index of the loop instruction in the body
    end: int  # index of its end
    live_in_locals: list[int]
    live_in_globals: list[int]
    assigned: list[int]
    local_types: list[Type]  # every local of the function, parameters first, then scratch locals
    import_name: str
    filter: Filter | None = None
    # A gate before the host call (every loop; see runtime.planning.ArrivalGate): while the
    # exported i64 global ``tensorwasm:wait_<n>`` is not zero an arrival stays in Wasm, counts
    # in ``skipped_<n>`` and takes one off it. The host sets it after a loop declined again
    # and again, or for a reason that lasts, so later arrivals cost no host call.
    gate: bool = False
    # Before the call: (scratch i64 local, "local" or "global", index of a v128, its half).
    moves: list[tuple[int, str, int, int]] = field(default_factory=list)
    # A v128 reduction's result: (its local, the local holding it at loop entry, the SIMD
    # operation, the scratch locals of its lanes, the lanes' identity).
    folds: list[tuple[int, int, str, tuple[int, ...], int]] = field(default_factory=list)
    own_locals: int = -1  # the function's own locals in local_types (-1: all of them)

    def __post_init__(self) -> None:
        if self.own_locals < 0:
            self.own_locals = len(self.local_types)


@record
class RegionExit:
    """Where control lands after a region: the instructions of the function's body after
    which the host call goes."""

    func_index: int  # in the original module's function index space
    after: tuple[int, ...]
    import_name: str


# Floats cross into the host as their bits: a trip through a host language's float would
# quiet signalling NaNs.
AS_BITS = {F32: I32, F64: I64}
TO_BITS = {F32: b"\xbc", F64: b"\xbd"}  # i32.reinterpret_f32, i64.reinterpret_f64
FROM_BITS = {F32: b"\xbe", F64: b"\xbf"}  # f32.reinterpret_i32, f64.reinterpret_i64


def host_signature(ins: Insertion, global_types: list[Type]) -> FuncSig:
    from tensorwasm.dialect.ir import FuncSig

    params = [ins.local_types[i] for i in ins.live_in_locals]
    params += [global_types[g] for g in ins.live_in_globals]
    params += [ins.local_types[i] for i in ins.assigned]
    results = [I32, *(ins.local_types[i] for i in ins.assigned)]
    return FuncSig(tuple(AS_BITS.get(t, t) for t in params), tuple(AS_BITS.get(t, t) for t in results))


def rewrite(wasm: WasmModule, insertions: list[Insertion], exits: list[RegionExit] = ()) -> bytes:
    """The module with a guarded host call before each loop of ``insertions``, and a host
    call after each region's end in ``exits``."""
    from tensorwasm.dialect.ir import FuncSig

    data = wasm.raw
    exits = list(exits)
    shift = len(insertions) + len(exits)
    first_defined = wasm.num_imported_funcs
    global_types = [g.type for g in wasm.global_types()]
    sigs = [host_signature(ins, global_types) for ins in insertions] + [FuncSig((), ())] * len(exits)
    new_types = list(wasm.types)
    type_index = []
    for sig in sigs:
        if sig not in new_types:
            new_types.append(sig)
        type_index.append(new_types.index(sig))

    def func_index(old: int) -> int:
        return old if old < first_defined else old + shift

    # Globals per gated or filtered loop, after the module's own (no index moves): the
    # filter's threshold (where it has a filter), its count of arrivals kept from the host,
    # and the gate's wait (see Insertion.gate).
    filters: dict[int, FilterGlobals] = {}  # insertion number -> its globals
    extra_globals: list[bytes] = []
    extra_exports = []
    zero = b"\x7e\x01\x42\x00\x0b"
    for n, ins in enumerate(insertions):
        if ins.filter is None and not ins.gate:
            continue
        at = len(global_types) + len(extra_globals)
        if ins.filter is not None:
            extra_globals.append(b"\x7e\x01\x42" + sleb(NEVER_SKIP) + b"\x0b")
            extra_exports.append(name(f"{FILTER_EXPORT}min_{n}") + b"\x03" + uleb(at))
            at += 1
        extra_globals.append(zero)
        extra_exports.append(name(f"{FILTER_EXPORT}skipped_{n}") + b"\x03" + uleb(at))
        wait = None
        if ins.gate:
            extra_globals.append(zero)
            extra_exports.append(name(f"{FILTER_EXPORT}wait_{n}") + b"\x03" + uleb(at + 1))
            wait = at + 1
        filters[n] = FilterGlobals(at - 1 if ins.filter is not None else None, at, wait)
    # The hooks table: entry n holds insertion n's import until the host replaces it.
    hooks = len(wasm.table_types())
    if insertions:
        extra_exports.append(name(HOOKS_EXPORT) + b"\x01" + uleb(hooks))
    hook_table = b"\x70\x01" + uleb(len(insertions)) * 2
    hook_segment = (
        b"\x02"
        + uleb(hooks)
        + b"\x41\x00\x0b\x00"
        + vec([uleb(first_defined + n) for n in range(len(insertions))])
    )
    by_func: dict[int, list[tuple[bytes, Insertion, list[Type], int | None]]] = {}
    for n, ins in enumerate(insertions):
        call = b"\x41" + sleb(n) + b"\x11" + uleb(type_index[n]) + uleb(hooks)  # i32.const n; call_indirect
        by_func.setdefault(ins.func_index, []).append((call, ins, global_types, filters.get(n)))

    exits_by_func: dict[int, dict[int, list[int]]] = {}
    for n, ex in enumerate(exits):
        calls = exits_by_func.setdefault(ex.func_index, {})
        for i in ex.after:
            calls.setdefault(i, []).append(first_defined + len(insertions) + n)

    names = [ins.import_name for ins in insertions] + [ex.import_name for ex in exits]
    # The host functions find linear memory through an export of their own (the module's
    # memory may be imported and not exported, or exported under another name).
    exported = bool(names and wasm.memory_limits() and all(e.name != MEMORY_EXPORT for e in wasm.exports))
    out = bytearray(data[:8])
    emitted_imports = False
    emitted_globals = False
    emitted_exports = False
    present = {sid for sid, _, _ in wasm.sections}
    for sid, start, end in wasm.sections:
        payload = data[start:end]
        if insertions and 4 not in present and sid in (5, 13, 6, 7, 8, 9, 12, 10, 11):
            if not emitted_imports:
                out += section(2, _imports(wasm, names, type_index))
                emitted_imports = True
            out += section(4, vec([hook_table]))
            present.add(4)
        if sid in (7, 8, 9, 10, 11, 12) and extra_globals and not emitted_globals:
            if not emitted_imports and names:
                out += section(2, _imports(wasm, names, type_index))
                emitted_imports = True
            out += section(6, vec(extra_globals))  # the module has no global section
            emitted_globals = True
        if sid in (8, 9, 10, 11, 12) and (exported or extra_exports) and not emitted_exports:
            out += section(7, _exports(wasm, func_index, exported, extra_exports))
            emitted_exports = True
        if insertions and 9 not in present and sid in (12, 10, 11):  # no element section
            out += section(9, vec([hook_segment]))
            present.add(9)
        if sid == 0:
            if wasm.raw[start:end].startswith(name("name")):
                continue  # function indices in it would be stale
            out += section(0, payload)
        elif sid == 1:
            out += section(1, vec([functype(t) for t in new_types]))
        elif sid == 2:
            out += section(2, _imports(wasm, names, type_index))
            emitted_imports = True
        elif sid == 4 and insertions:
            out += section(4, _appended(payload, hook_table))
        elif sid in (6, 7, 8, 9, 10):
            if sid >= 6 and not emitted_imports and names:
                out += section(2, _imports(wasm, names, type_index))
                emitted_imports = True
            if sid == 6:
                out += section(6, _globals(wasm, func_index, extra_globals))
                emitted_globals = True
            elif sid == 7:
                out += section(7, _exports(wasm, func_index, exported, extra_exports))
                emitted_exports = True
            elif sid == 8:
                out += section(8, uleb(func_index(wasm.start)))
            elif sid == 9:
                out += section(9, _elements(wasm, func_index, [hook_segment] if insertions else []))
            else:
                out += section(10, _code(wasm, func_index, by_func, exits_by_func))
        else:
            if sid in (3, 4, 5) and not emitted_imports and names:
                out += section(2, _imports(wasm, names, type_index))
                emitted_imports = True
            out += section(sid, payload)
    if extra_globals and not emitted_globals:  # no section from the export section on
        if not emitted_imports and names:
            out += section(2, _imports(wasm, names, type_index))
        out += section(6, vec(extra_globals))
    if (exported or extra_exports) and not emitted_exports:
        out += section(7, _exports(wasm, func_index, exported, extra_exports))
    return bytes(out)


def _imports(wasm: WasmModule, names: list[str], type_index: list[int]) -> bytes:
    items = []
    for sid, start, end in wasm.sections:
        if sid == 2:
            from tensorwasm.compiler.frontend.decoder import Reader

            r = Reader(wasm.raw, start, end)
            count = r.u32()
            body = wasm.raw[r.pos : end]
            items_raw = body
            items.append((count, items_raw))
    count, raw = items[0] if items else (0, b"")
    extra = b"".join(
        name(HOST_MODULE) + name(n) + b"\x00" + uleb(t) for n, t in zip(names, type_index, strict=True)
    )
    return uleb(count + len(names)) + raw + extra


def _expr(instrs: list[Instr], data: bytes, end: int, func_index) -> bytes:
    out = bytearray()
    for i, instr in enumerate(instrs):
        stop = instrs[i + 1].offset if i + 1 < len(instrs) else end
        if instr.op.name in FUNC_INDEX_OPS:
            out += data[instr.offset : instr.offset + 1] + uleb(func_index(instr.imm))
        else:
            out += data[instr.offset : stop]
    return bytes(out)


def _expr_end(instrs: list[Instr], data: bytes) -> int:
    """Byte after a constant expression's final end."""
    return instrs[-1].offset + 1


def _globals(wasm: WasmModule, func_index, extra: list[bytes]) -> bytes:
    items = []
    for g in wasm.globals:
        header = bytes([VALTYPE_BYTES[g.type.type], 1 if g.type.mutable else 0])
        items.append(header + _expr(g.init, wasm.raw, _expr_end(g.init, wasm.raw), func_index))
    return vec(items + extra)


def _exports(wasm: WasmModule, func_index, memory: bool, extra: list[bytes]) -> bytes:
    kinds = {"func": 0, "table": 1, "memory": 2, "global": 3, "tag": 4}
    items = [
        name(e.name) + bytes([kinds[e.kind]]) + uleb(func_index(e.index) if e.kind == "func" else e.index)
        for e in wasm.exports
    ]  # fmt: skip
    if memory:
        items.append(name(MEMORY_EXPORT) + bytes([kinds["memory"]]) + uleb(0))
    return vec(items + extra)


def _appended(payload: bytes, item: bytes) -> bytes:
    """A section's vector ``payload`` with ``item`` added at its end."""
    count, at = read_uleb(payload, 0)
    return uleb(count + 1) + payload[at:] + item


def read_uleb(data: bytes, at: int) -> tuple[int, int]:
    """The unsigned LEB128 number at ``data[at]``, and where the next field starts."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _elements(wasm: WasmModule, func_index, extra: list[bytes]) -> bytes:
    items = []
    for seg in wasm.elements:
        # Always written in the general form: flags 4/5/6/7 with expressions.
        exprs = vec([_expr(e, wasm.raw, _expr_end(e, wasm.raw), func_index) if e[0].offset >= 0 and e[-1].op.name == "end"
                     else _ref_func(e, func_index) for e in seg.items])  # fmt: skip
        ref = bytes([VALTYPE_BYTES[seg.type]])
        if seg.mode == "active":
            offset = _expr(seg.offset_expr, wasm.raw, _expr_end(seg.offset_expr, wasm.raw), func_index)
            items.append(uleb(6) + uleb(seg.table) + offset + ref + exprs)
        elif seg.mode == "passive":
            items.append(uleb(5) + ref + exprs)
        else:
            items.append(uleb(7) + ref + exprs)
    return vec(items + extra)


def _ref_func(expr: list[Instr], func_index) -> bytes:
    (instr,) = expr  # a bare function index in the binary: ref.func with it, then end
    return b"\xd2" + uleb(func_index(instr.imm)) + b"\x0b"


def _code(wasm: WasmModule, func_index, by_func, exits_by_func) -> bytes:
    data = wasm.raw
    bodies = []
    first = wasm.num_imported_funcs
    for i, code in enumerate(wasm.codes):
        index = first + i
        locals_raw = _with_scratch(data[code.offset : code.body[0].offset], by_func.get(index, []))
        body_end = code.offset + code.size
        body = _body(
            code.body, data, body_end, func_index, by_func.get(index, []), exits_by_func.get(index, {})
        )
        content = locals_raw + body
        bodies.append(uleb(len(content)) + content)
    return vec(bodies)


def _with_scratch(locals_raw: bytes, insertions) -> bytes:
    """A function's local declarations with its insertions' scratch locals after its own
    (each insertion's ``local_types`` extends the one before it in the function)."""
    longest = max((ins for _, ins, _, _ in insertions), key=lambda ins: len(ins.local_types), default=None)
    if longest is None or len(longest.local_types) == longest.own_locals:
        return locals_raw
    extra = longest.local_types[longest.own_locals :]
    count, at = read_uleb(locals_raw, 0)
    return (
        uleb(count + len(extra))
        + locals_raw[at:]
        + b"".join(b"\x01" + bytes([VALTYPE_BYTES[t]]) for t in extra)
    )


def _body(
    instrs: list[Instr], data: bytes, end: int, func_index, insertions, exits: dict[int, list[int]]
) -> bytes:
    starts = {ins.start: (host, ins, gtypes, at) for host, ins, gtypes, at in insertions}
    out = bytearray()
    wrapped: list[tuple[int, int]] = []  # (loop end index, nesting depth at the loop start)
    depth = 0
    for i, instr in enumerate(instrs):
        stop = instrs[i + 1].offset if i + 1 < len(instrs) else end
        if i in starts:
            host, ins, gtypes, at = starts[i]
            types = ins.local_types
            exit_label = _exit_label(instrs, ins)
            if exit_label is None:
                out += b"\x02\x40"  # block: the skip lands after the loop
            if at is not None:  # ask the host only past the threshold; else count and run it
                out += _asks(ins, at) + b"\x04\x7f"  # if (result i32)
            out += _v128_moves(ins)
            for n in ins.live_in_locals:
                out += b"\x20" + uleb(n) + TO_BITS.get(types[n], b"")
            for g in ins.live_in_globals:
                out += b"\x23" + uleb(g) + TO_BITS.get(gtypes[g], b"")
            for n in ins.assigned:
                out += b"\x20" + uleb(n) + TO_BITS.get(types[n], b"")
            out += host
            for n in reversed(ins.assigned):
                out += FROM_BITS.get(types[n], b"") + b"\x21" + uleb(n)
            out += _v128_folds(ins)
            if at is not None:  # else: skipped += 1; wait -= (wait != 0); the flag 0 (the loop runs here)
                counter = uleb(at.skipped)
                out += b"\x05\x23" + counter + b"\x42\x01\x7c\x24" + counter
                if at.wait is not None:
                    wait = uleb(at.wait)
                    # global.get w; global.get w; i64.const 0; i64.ne; i64.extend_i32_u; i64.sub; global.set w
                    out += b"\x23" + wait + b"\x23" + wait + b"\x42\x00\x52\xad\x7d\x24" + wait
                out += b"\x41\x00\x0b"
            out += b"\x0d" + uleb(0 if exit_label is None else _fix(exit_label, depth, wrapped))
            if exit_label is None:
                wrapped.append((ins.end, depth))
        name_ = instr.op.name
        if name_ in FUNC_INDEX_OPS:
            out += data[instr.offset : instr.offset + 1] + uleb(func_index(instr.imm))
        elif name_ in ("br", "br_if", "br_table") and wrapped:
            out += _relabel(instr, depth, wrapped)
        else:
            out += data[instr.offset : stop]
        if name_ in ("block", "loop", "if"):
            depth += 1
        elif name_ == "end":
            depth -= 1
            if wrapped and wrapped[-1][0] == i:
                out += b"\x0b"
                wrapped.pop()
        for host in exits.get(i, ()):
            out += b"\x10" + uleb(host)
    return bytes(out)


@record
class FilterGlobals:
    """The globals of one loop's test before its host call (indices in the rewritten module)."""

    threshold: int | None  # the filter's (None: no filter)
    skipped: int
    wait: int | None  # the gate's (None: no gate)


def _asks(ins: Insertion, at: FilterGlobals) -> bytes:
    """Code leaving the i32 condition under which the host is asked: the distance reaches
    the threshold (where there is a filter) and the wait is zero (where there is a gate)."""
    out = b""
    if ins.filter is not None:
        out += _distance(ins.filter) + b"\x23" + uleb(at.threshold) + b"\x59"  # i64.ge_s
    if at.wait is not None:
        out += b"\x23" + uleb(at.wait) + b"\x50"  # global.get wait; i64.eqz
        if ins.filter is not None:
            out += b"\x71"  # i32.and
    return out


def _simd(name: str, *immediates: int) -> bytes:
    """The encoding of SIMD instruction ``name`` with its lane immediates."""
    from tensorwasm.compiler.frontend.opcodes import BY_NAME

    prefix, code = BY_NAME[name].code
    return bytes([prefix]) + uleb(code) + bytes(immediates)


def _v128_moves(ins: Insertion) -> bytes:
    """Code putting the v128 live-ins' halves and the v128 reductions' lane identities in
    their scratch locals."""
    out = bytearray()
    for scratch, kind, index, lane in ins.moves:
        out += (b"\x20" if kind == "local" else b"\x23") + uleb(index)
        out += _simd("i64x2.extract_lane", lane) + b"\x21" + uleb(scratch)
    for _, _, _, lanes, identity in ins.folds:
        for scratch in lanes:
            wide = ins.local_types[scratch] is I64
            out += (b"\x42" if wide else b"\x41") + sleb(_signed(identity, 64 if wide else 32))
            out += b"\x21" + uleb(scratch)
    return bytes(out)


def _v128_folds(ins: Insertion) -> bytes:
    """Code combining each v128 reduction's lane results (its scratch locals) with the
    vector's value at loop entry, into its local."""
    out = bytearray()
    for local, init, operation, lanes, _ in ins.folds:
        shape = operation.split(".", 1)[0]
        shape = "i64x2" if shape == "v128" else shape
        out += b"\x20" + uleb(init)
        for lane, scratch in enumerate(lanes):
            out += b"\x20" + uleb(scratch)
            out += _simd(f"{shape}.splat") if lane == 0 else _simd(f"{shape}.replace_lane", lane)
        out += _simd(operation) + b"\x21" + uleb(local)
    return bytes(out)


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _affine(terms: Affine) -> bytes:
    """Code leaving the i32 value of ``terms`` (wrapping, as Wasm computes)."""
    out = bytearray(b"\x41\x00")  # i32.const 0
    for coefficient, kind, index in terms:
        c = _signed32(coefficient)
        if kind == "const":
            out += b"\x41" + sleb(c)
        else:
            out += (b"\x20" if kind == "local" else b"\x23") + uleb(index)
            if c != 1:
                out += b"\x41" + sleb(c) + b"\x6c"  # i32.mul
        out += b"\x6a"  # i32.add
    return bytes(out)


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >> 31 else value


def _distance(f: Filter) -> bytes:
    """Code leaving the filter's i64 distance (see :class:`Filter`)."""
    first, second = (f.start, f.bound) if f.down else (f.bound, f.start)
    if f.modular:  # (first - second) mod 2^32
        return _affine(first) + _affine(second) + b"\x6b\xad"  # i32.sub; i64.extend_i32_u
    extend = b"\xac" if f.signed else b"\xad"  # i64.extend_i32_s / _u
    out = _affine(first) + extend + _affine(second) + extend + b"\x7d"  # i64.sub
    if f.inclusive:
        out += b"\x42\x01\x7c"  # i64.const 1; i64.add
    return out


def _fix(label: int, depth: int, wrapped: list[tuple[int, int]]) -> int:
    """A label at ``depth`` that leaves wrapped loops passes one more block for each."""
    return label + sum(1 for _, at in wrapped if label > depth - at - 1)


def _relabel(instr: Instr, depth: int, wrapped: list[tuple[int, int]]) -> bytes:
    """Labels that leave a wrapped loop pass one more block."""
    if instr.op.name == "br_table":
        labels, default = instr.imm
        return (
            b"\x0e"
            + vec([uleb(_fix(x, depth, wrapped)) for x in labels])
            + uleb(_fix(default, depth, wrapped))
        )
    return bytes([0x0C if instr.op.name == "br" else 0x0D]) + uleb(_fix(instr.imm, depth, wrapped))


def _exit_label(instrs: list[Instr], ins: Insertion) -> int | None:
    """The label, counted from just before the loop, that the loop's exit branch targets;
    None when the loop is left by falling off its end."""
    depth = 0
    for instr in instrs[ins.start + 1 : ins.end]:
        name_ = instr.op.name
        if name_ in ("block", "loop", "if"):
            depth += 1
        elif name_ == "end":
            depth -= 1
        elif name_ in ("br", "br_if", "br_table"):
            labels = instr.imm[0] + (instr.imm[1],) if name_ == "br_table" else (instr.imm,)
            for label in labels:
                if label > depth:  # leaves the loop (label == depth is the loop itself)
                    return label - depth - 1
    return None
