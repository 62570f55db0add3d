"""The Wasm binary decoder: bytes to a :class:`WasmModule`, or a DecodeError with an offset.

It reads the whole core binary format (every section, the MVP instructions and the
sign-extension, non-trapping float-to-int, bulk memory, multi-value, reference-type and
fixed-width SIMD proposals), checks section order, sizes and LEB128 encodings, and stops
at the first problem with a message naming the cause and the byte offset. Instruction
immediates are read by the immediate kind of their opcode row (SIMD's too: 0xFD, v128,
lanes); opcodes of proposals TensorWasm does not compile raise :class:`UnsupportedFeature`
naming the proposal, so the bytes after them are never misread. Semantic validation
(types, stack discipline) is the validator's job, except for two rules where wasmtime's
validator, which accepts later proposals, is looser than the Wasm TensorWasm compiles
(:func:`_check_wasm2_rules`): one memory at most, and constant expressions that read
imported globals only.

Function bodies are the bulk of a module, so they can be read when first needed
(``lazy``): the sections are decoded, each body is only delimited, and
:func:`tensorwasm.compiler.frontend.load` has wasmtime validate the whole module before any
body becomes instructions (a 50 MB body is refused by the validator, not decoded into
gigabytes of objects first). ``degrade`` is how ``tensorwasm run`` reads a module that
wasmtime runs: an unsupported instruction or type inside a body marks that function
(:attr:`Code.unsupported`) and the body is read on where the proposal's encoding is known
(:data:`_FAMILY_IMMEDIATES`, :data:`_MORE_IMMEDIATES`), so the rewriter can still renumber
its calls; what the rewriter cannot carry through (a type section of the GC proposal, a
64-bit or shared memory, a body that cannot be read to its end) marks the whole module
instead (:attr:`WasmModule.blocked`): the program then runs on wasmtime as it is.
"""

from __future__ import annotations

import gc
import struct
from collections.abc import Callable

from tensorwasm.compiler.errors import DecodeError, UnsupportedFeature
from tensorwasm.compiler.frontend.module import (
    BodyParts,
    Code,
    CustomSection,
    DataSegment,
    ElementSegment,
    Export,
    Global,
    GlobalType,
    Import,
    Instr,
    Limits,
    TableType,
    WasmModule,
)
from tensorwasm.compiler.frontend.opcodes import (
    BY_NAME,
    MISC,
    PREFIX_FAMILIES,
    PREFIX_MISC,
    PREFIX_SIMD,
    PREFIX_THREADS,
    SIMD,
    SINGLE,
    UNSUPPORTED_ROWS,
    Feature,
    Imm,
    Opcode,
)
from tensorwasm.dialect.ir import FuncSig
from tensorwasm.dialect.types import EXTERNREF, F32, F64, FUNCREF, I32, I64, V128, Type

MAGIC = b"\0asm"
VERSION = b"\x01\0\0\0"

VALTYPES: dict[int, Type] = {
    0x7F: I32, 0x7E: I64, 0x7D: F32, 0x7C: F64, 0x7B: V128, 0x70: FUNCREF, 0x6F: EXTERNREF,
}  # fmt: skip
REFTYPES: dict[int, Type] = {0x70: FUNCREF, 0x6F: EXTERNREF}
# Value-type bytes of proposals we refuse, so that the error names the proposal.
UNSUPPORTED_VALTYPES = {
    0x64: Feature.FUNCTION_REFERENCES,
    0x63: Feature.FUNCTION_REFERENCES,
    0x6E: Feature.GC, 0x6D: Feature.GC, 0x6C: Feature.GC, 0x6B: Feature.GC, 0x6A: Feature.GC,
    0x71: Feature.GC, 0x72: Feature.GC, 0x73: Feature.GC, 0x74: Feature.GC,
    0x69: Feature.EXCEPTIONS,
}  # fmt: skip

SECTION_NAMES = {
    0: "custom", 1: "type", 2: "import", 3: "function", 4: "table", 5: "memory", 6: "global",
    7: "export", 8: "start", 9: "element", 10: "code", 11: "data", 12: "data count", 13: "tag",
}  # fmt: skip
# The order non-custom sections must appear in (the tag section sits after memory).
SECTION_RANK = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13}
EXTERN_KINDS = {0: "func", 1: "table", 2: "memory", 3: "global", 4: "tag"}
# Guards against absurd counts in hostile input, well above anything a real module has.
MAX_LOCALS = 50_000
# The largest function body wasmtime (wasmparser) accepts: where it refused the module,
# ``check`` does not read a larger one for a message of its own (wasmtime's says why).
WASMTIME_MAX_BODY = 7_654_321
MAX_PAGES = 65_536
CONST_OPS = frozenset(
    {"i32.const", "i64.const", "f32.const", "f64.const", "v128.const", "global.get", "ref.null", "ref.func",
     "i32.add", "i32.sub", "i32.mul", "i64.add", "i64.sub", "i64.mul", "end"}
)  # fmt: skip
_END = BY_NAME["end"]
_ELSE = BY_NAME["else"]
_IF = BY_NAME["if"]
_OPENERS = frozenset({BY_NAME["block"], BY_NAME["loop"], _IF, BY_NAME["try_table"]})
# A lane access's memarg reads as a plain memory access's does (multi-memory refused alike).
_MEMARG_OF = {op: BY_NAME["v128.load"] for op in SIMD.values() if op.imm is Imm.MEMARG_LANE}


# Value-type bytes followed by a heap type: a body that holds one cannot be read on.
_HEAP_TYPED = frozenset({0x63, 0x64})


class Reader:
    """A cursor over a byte range with the primitive decoders of the binary format.

    A ``lenient`` reader (``decode(degrade=True)``) reads on past an unsupported
    instruction or value type inside a function body, keeping the first in ``found``,
    where the encoding says how many bytes it takes; at module level it reads tag imports
    and exports; everything else unsupported still raises."""

    __slots__ = ("data", "end", "found", "func_index", "lenient", "pos")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None, lenient: bool = False):
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end
        self.func_index: int | None = None
        self.lenient = lenient
        self.found: UnsupportedFeature | None = None

    def error(self, message: str, offset: int | None = None) -> DecodeError:
        return DecodeError(message, self.pos if offset is None else offset, self.func_index)

    def unsupported(self, feature: Feature, what: str, offset: int) -> UnsupportedFeature:
        return UnsupportedFeature(
            f"{what} needs the {feature.value} proposal, which TensorWasm does not support",
            offset,
            self.func_index,
            proposal=feature.value,
            what=what,
        )

    def note(self, exc: UnsupportedFeature) -> None:
        """An unsupported construct whose bytes are known: raised, or (lenient, in a body)
        remembered while the body is read on."""
        if not self.lenient or self.func_index is None:
            raise exc
        if self.found is None:
            self.found = exc

    def u8(self) -> int:
        if self.pos >= self.end:
            raise self.error("unexpected end of section or function")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def bytes(self, n: int) -> bytes:
        if n > self.end - self.pos:
            raise self.error(f"unexpected end: {n} bytes needed, {self.end - self.pos} left")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def _leb(self, bits: int, signed: bool) -> int:
        start = pos = self.pos
        data, end = self.data, self.end
        result = shift = b = 0
        for _ in range((bits + 6) // 7):
            if pos >= end:
                raise self.error("unexpected end of LEB128 integer", start)
            b = data[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        else:
            raise self.error(f"LEB128 integer too long for {bits} bits", start)
        self.pos = pos
        extra = shift - bits
        if extra > 0:
            # The bits of the last byte beyond the width must extend the value: zeros for
            # unsigned, copies of the sign bit for signed.
            top = (b & 0x7F) >> (7 - extra - (1 if signed else 0))
            if top != 0 and not (signed and top == (1 << (extra + 1)) - 1):
                kind = "s" if signed else "u"
                raise self.error(f"LEB128 integer out of range for {kind}{bits}", start)
        if signed and result >> (shift - 1) & 1:
            result -= 1 << shift
        return result

    def u32(self) -> int:
        data, pos = self.data, self.pos
        if pos < self.end and data[pos] < 0x80:
            self.pos = pos + 1
            return data[pos]
        return self._leb(32, False)

    def s32(self) -> int:
        return self._leb(32, True)

    def s33(self) -> int:
        return self._leb(33, True)

    def s64(self) -> int:
        return self._leb(64, True)

    def name(self) -> str:
        start = self.pos
        raw = self.bytes(self.u32())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error("name is not valid UTF-8", start) from None

    def valtype(self) -> Type | None:
        """A value type; None only for an unsupported one a lenient body reader reads on."""
        pos = self.pos
        b = self.u8()
        ty = VALTYPES.get(b)
        if ty is None:
            return self._unsupported_type(b, "value", pos)
        return ty

    def reftype(self) -> Type | None:
        pos = self.pos
        b = self.u8()
        ty = REFTYPES.get(b)
        if ty is None:
            return self._unsupported_type(b, "reference", pos)
        return ty

    def _unsupported_type(self, b: int, kind: str, pos: int) -> None:
        feature = UNSUPPORTED_VALTYPES.get(b)
        if feature is None:
            raise self.error(f"invalid {kind} type 0x{b:02x}", pos)
        exc = self.unsupported(feature, f"{kind} type 0x{b:02x}", pos)
        if b in _HEAP_TYPED:
            raise exc
        self.note(exc)

    def limits(self, what: str) -> Limits:
        pos = self.pos
        flags = self.u8()
        if flags in (2, 3):
            raise self.unsupported(Feature.THREADS, f"shared {what}", pos)
        if 4 <= flags <= 7:
            raise UnsupportedFeature(
                f"64-bit {what} (memory64) is not supported",
                pos,
                self.func_index,
                proposal="memory64",
                what=f"a 64-bit {what}",
            )
        if flags not in (0, 1):
            raise self.error(f"invalid limits flags 0x{flags:02x}", pos)
        lo = self.u32()
        hi = self.u32() if flags == 1 else None
        return Limits(lo, hi)


def decode(data: bytes, *, lazy: bool = False, degrade: bool = False) -> WasmModule:
    """Decode a whole module; raises DecodeError (or UnsupportedFeature) on bad input.

    ``lazy``: function bodies are delimited, and decoded when first read (then they raise).
    ``degrade`` (lazy too): what TensorWasm does not support is marked, not raised, in a
    module wasmtime has validated (see the module docstring)."""
    return _paused_gc(_decode, bytes(data), "lazy" if lazy or degrade else "eager", degrade)


def check(data: bytes, degrade: bool = False) -> None:
    """Raise the first problem :func:`decode` finds, in the order of the bytes, without
    keeping any instruction: the bodies are read and dropped. With ``degrade``, what a
    degrading decode marks is not a problem (nor is anything inside a body)."""
    _paused_gc(_decode, bytes(data), "check", degrade)


def _paused_gc(fn, *args):
    # Decoding allocates one object per instruction and frees none: pause the cyclic
    # collector, which would otherwise walk the growing lists again and again.
    paused = gc.isenabled()
    gc.disable()
    try:
        return fn(*args)
    finally:
        if paused:
            gc.enable()


def _decode(data: bytes, bodies: str, degrade: bool) -> WasmModule:
    """``bodies``: "eager" (decoded now), "lazy" (when first read) or "check" (read now,
    kept nowhere)."""
    if len(data) < 4 or data[:4] != MAGIC:
        raise DecodeError("not a WebAssembly module: bad magic number", 0)
    if len(data) < 8:
        raise DecodeError("unexpected end: the version field is cut", len(data))
    if data[4:8] != VERSION:
        if data[6:8] == b"\x01\x00":
            raise UnsupportedFeature("this is a component (component model), not a core module", 4)
        raise DecodeError(f"unknown binary version {data[4:8].hex()}", 4)
    module = WasmModule(size=len(data), raw=data)
    r = Reader(data, 8)
    last_rank = 0
    func_count: int | None = None
    while r.pos < len(data):
        section_start = r.pos
        sid = r.u8()
        size = r.u32()
        body_start = r.pos
        if size > len(data) - body_start:
            raise DecodeError(
                f"{SECTION_NAMES.get(sid, 'unknown')} section size {size} runs past the end of "
                f"the module ({len(data) - body_start} bytes left)",
                section_start,
            )
        if sid not in SECTION_NAMES:
            raise DecodeError(f"unknown section id {sid}", section_start)
        if sid != 0:
            rank = SECTION_RANK[sid]
            if rank == last_rank:
                raise DecodeError(f"duplicate {SECTION_NAMES[sid]} section", section_start)
            if rank < last_rank:
                raise DecodeError(f"{SECTION_NAMES[sid]} section out of order", section_start)
            last_rank = rank
        s = Reader(data, body_start, body_start + size, lenient=degrade)
        module.sections.append((sid, body_start, body_start + size))
        try:
            _section(s, sid, section_start, module, bodies)
        except UnsupportedFeature as exc:
            if not degrade:
                raise
            module.blocked = exc  # the rest is wasmtime's alone: nothing of it is offloaded
            return module
        if sid == 3:
            func_count = len(module.funcs)
        if s.pos != s.end:
            raise DecodeError(
                f"{SECTION_NAMES[sid]} section size mismatch: {s.end - s.pos} bytes left unread",
                s.pos,
            )
        r.pos = body_start + size
    if len(module.codes) != (func_count or 0):
        raise DecodeError(
            f"function and code section have inconsistent lengths "
            f"({func_count or 0} functions, {len(module.codes)} bodies)",
            len(data),
        )
    if module.data_count is not None and module.data_count != len(module.data):
        raise DecodeError(
            f"data count section says {module.data_count} segments, data section has {len(module.data)}",
            len(data),
        )
    if not degrade:  # (wasmtime, which validated the module, runs what these rules refuse)
        _check_wasm2_rules(module)
    return module


def _section(s: Reader, sid: int, section_start: int, module: WasmModule, bodies: str) -> None:
    """Decode the payload of section ``sid`` into ``module``."""
    if sid == 0:
        _custom(s, module)
    elif sid == 1:
        module.types = _vec(s, _functype)
    elif sid == 2:
        module.imports = _vec(s, _import)
    elif sid == 3:
        module.funcs = _vec(s, Reader.u32)
    elif sid == 4:
        module.tables = _vec(s, _table)
    elif sid == 5:
        module.memories = _vec(s, _memory)
    elif sid == 6:
        module.globals = _vec(s, _global)
    elif sid == 7:
        module.exports = _vec(s, _export)
    elif sid == 8:
        module.start = s.u32()
    elif sid == 9:
        module.elements = _vec(s, _element)
    elif sid == 12:
        module.data_count = s.u32()
    elif sid == 10:
        module.codes = _code_section(s, module.num_imported_funcs, bodies)
    elif sid == 11:
        module.data = _vec(s, _data)
    elif sid == 13:
        if not s.lenient:
            raise s.unsupported(Feature.EXCEPTIONS, "the tag section", section_start)
        s.pos = s.end  # the tags are wasmtime's: the rewriter copies the section as it is


def _check_wasm2_rules(module: WasmModule) -> None:
    """Refuse what Wasm 2.0 makes invalid and wasmtime's validator accepts (it enables
    multi-memory, and GC's constant expressions that read any earlier global): a second
    memory, and a ``global.get`` in a constant expression of a global that is not imported
    (the spec's "unknown global": only imports are defined when those expressions run)."""
    memories = module.memory_limits()
    if len(memories) > 1:
        where = next((start for sid, start, _ in module.sections if sid == 5), None)
        raise UnsupportedFeature(
            f"{len(memories)} memories: more than one needs the multi-memory proposal, "
            "which TensorWasm does not support",
            where,
        )
    imported = len(module.imported("global"))
    exprs = [g.init for g in module.globals]
    exprs += [seg.offset_expr for seg in module.data if seg.offset_expr is not None]
    for seg in module.elements:
        exprs += [*seg.items, *([seg.offset_expr] if seg.offset_expr is not None else [])]
    for expr in exprs:
        for instr in expr:
            if instr.op.name == "global.get" and instr.imm >= imported:
                raise DecodeError(
                    f"unknown global {instr.imm} in a constant expression: it may read "
                    f"imported globals only ({imported} here)",
                    instr.offset,
                )


def _vec(r: Reader, item) -> list:
    count = r.u32()
    if count > r.end - r.pos:
        raise r.error(f"vector length {count} exceeds the {r.end - r.pos} bytes left")
    return [item(r) for _ in range(count)]


def _functype(r: Reader) -> FuncSig:
    pos = r.pos
    form = r.u8()
    if form != 0x60:
        if form in (0x4E, 0x4F, 0x50, 0x5E, 0x5F):
            raise r.unsupported(Feature.GC, f"type form 0x{form:02x}", pos)
        raise r.error(f"invalid function type form 0x{form:02x}", pos)
    params = tuple(_vec(r, Reader.valtype))
    results = tuple(_vec(r, Reader.valtype))
    return FuncSig(params, results)


def _import(r: Reader) -> Import:
    module, name = r.name(), r.name()
    pos = r.pos
    kind = EXTERN_KINDS.get(r.u8())
    if kind == "func":
        return Import(module, name, kind, r.u32())
    if kind == "table":
        return Import(module, name, kind, _table(r))
    if kind == "memory":
        return Import(module, name, kind, _memory(r))
    if kind == "global":
        return Import(module, name, kind, _globaltype(r))
    if kind == "tag":
        if not r.lenient:
            raise r.unsupported(Feature.EXCEPTIONS, f"tag import {module}.{name}", pos)
        return Import(module, name, kind, _tagtype(r))
    raise r.error(f"invalid import kind 0x{r.data[pos]:02x}", pos)


def _table(r: Reader) -> TableType:
    pos = r.pos
    if r.data[pos : pos + 2] == b"\x40\x00" if pos + 1 < r.end else False:
        raise r.unsupported(Feature.FUNCTION_REFERENCES, "a table with an initialiser", pos)
    elem = r.reftype()
    return TableType(elem, r.limits("table"))


def _memory(r: Reader) -> Limits:
    pos = r.pos
    limits = r.limits("memory")
    if limits.min > MAX_PAGES or (limits.max is not None and limits.max > MAX_PAGES):
        raise r.error("memory size must be at most 65536 pages (4 GiB)", pos)
    return limits


def _globaltype(r: Reader) -> GlobalType:
    ty = r.valtype()
    pos = r.pos
    mut = r.u8()
    if mut not in (0, 1):
        raise r.error(f"invalid global mutability 0x{mut:02x}", pos)
    return GlobalType(ty, bool(mut))


def _global(r: Reader) -> Global:
    return Global(_globaltype(r), _const_expr(r))


def _export(r: Reader) -> Export:
    name = r.name()
    pos = r.pos
    kind = EXTERN_KINDS.get(r.u8())
    if kind is None:
        raise r.error(f"invalid export kind 0x{r.data[pos]:02x}", pos)
    if kind == "tag" and not r.lenient:
        raise r.unsupported(Feature.EXCEPTIONS, f"tag export {name}", pos)
    return Export(name, kind, r.u32())


def _tagtype(r: Reader) -> int:
    """A tag's type (attribute 0, exceptions, then a type index): the type index."""
    pos = r.pos
    if r.u8() != 0:
        raise r.error("invalid tag attribute", pos)
    return r.u32()


def _const_expr(r: Reader) -> list[Instr]:
    body = _instructions(r, const=True)
    return body


def _elemkind(r: Reader) -> Type:
    pos = r.pos
    kind = r.u8()
    if kind != 0x00:
        raise r.error(f"invalid element kind 0x{kind:02x}", pos)
    return FUNCREF


def _func_index_expr(r: Reader) -> list[Instr]:
    pos = r.pos
    return [Instr(BY_NAME["ref.func"], r.u32(), pos)]


def _element(r: Reader) -> ElementSegment:
    pos = r.pos
    flags = r.u32()
    if flags > 7:
        raise r.error(f"invalid element segment flags {flags}", pos)
    table = 0
    offset = None
    if flags & 1 == 0:  # active
        if flags & 2:
            table = r.u32()
        offset = _const_expr(r)
        mode = "active"
    else:
        mode = "declarative" if flags & 2 else "passive"
    uses_exprs = bool(flags & 4)
    if flags in (0, 4):
        ty = FUNCREF
    elif uses_exprs:
        ty = r.reftype()
    else:
        ty = _elemkind(r)
    items = _vec(r, _const_expr if uses_exprs else _func_index_expr)
    return ElementSegment(mode, ty, items, table, offset)


def _data(r: Reader) -> DataSegment:
    pos = r.pos
    flags = r.u32()
    if flags == 0:
        offset = _const_expr(r)
        return DataSegment("active", r.bytes(r.u32()), 0, offset)
    if flags == 1:
        return DataSegment("passive", r.bytes(r.u32()))
    if flags == 2:
        memory = r.u32()
        offset = _const_expr(r)
        return DataSegment("active", r.bytes(r.u32()), memory, offset)
    raise r.error(f"invalid data segment flags {flags}", pos)


def _code_section(r: Reader, first_index: int, bodies: str) -> list[Code]:
    count = r.u32()
    if count > r.end - r.pos:
        raise r.error(f"code section claims {count} bodies in {r.end - r.pos} bytes")
    codes = []
    lenient = r.lenient
    for i in range(count):
        size_pos = r.pos
        size = r.u32()
        start = r.pos
        if size > r.end - start:
            raise r.error(f"function body size {size} runs past the code section", size_pos)
        code = Code.deferred(start, size, first_index + i, _body_reader(r.data, lenient))
        if bodies == "eager":
            code.load()
        elif bodies == "check" and size <= WASMTIME_MAX_BODY:  # (degrading, only a malformed body raises)
            parts = _read_body(r.data, code, lenient, keep=False)
            if not parts.readable and not isinstance(parts.unsupported, UnsupportedFeature):
                raise parts.unsupported
        codes.append(code)
        r.pos = start + size
    return codes


def _body_reader(data: bytes, lenient: bool) -> Callable[[Code], BodyParts]:
    return lambda code: _read_body(data, code, lenient)


def _read_body(data: bytes, code: Code, lenient: bool, keep: bool = True) -> BodyParts:
    """A body's locals and instructions (none kept without ``keep``). A lenient read gives
    what keeps the function on wasmtime instead of raising it, and where the body cannot
    be read to its end (an encoding this decoder does not know), no instructions."""
    body = Reader(data, code.offset, code.offset + code.size, lenient)
    body.func_index = code.func_index
    locals_: list[Type] = []
    try:
        declared = 0
        for _ in range(body.u32()):
            pos = body.pos
            n = body.u32()
            ty = body.valtype()
            declared += n
            if declared > MAX_LOCALS:
                raise body.error(f"too many locals (more than {MAX_LOCALS})", pos)
            if keep:
                locals_.extend([ty] * n)
        instrs = _instructions(body, keep=keep)
        if body.pos != body.end:
            raise body.error("function body size mismatch: bytes left after the final end")
    except DecodeError as exc:
        if not lenient:
            raise
        return BodyParts(locals_, [], exc, readable=False)
    return BodyParts(locals_, instrs, body.found, readable=True)


def _read_imm(r: Reader, op: Opcode, pos: int):
    """Read the immediates of ``op`` by its immediate kind."""
    kind = op.imm
    if kind is Imm.NONE:
        return None
    if kind is Imm.LABEL or kind is Imm.LOCAL or kind is Imm.GLOBAL or kind is Imm.FUNC:
        return r.u32()
    if kind is Imm.I32:
        return r.s32()
    if kind is Imm.MEMARG:
        return _memarg(r, op.name, pos)
    if kind is Imm.BLOCKTYPE:
        b = r.data[r.pos] if r.pos < r.end else None
        if b == 0x40:
            r.pos += 1
            return None
        if b is not None and (b in VALTYPES or b in UNSUPPORTED_VALTYPES):
            return r.valtype()
        index = r.s33()
        if index < 0:
            raise r.error(f"invalid block type {index}", pos + 1)
        return ("type", index)
    if kind is Imm.I64:
        return r.s64()
    if kind is Imm.F32:
        return int.from_bytes(r.bytes(4), "little")
    if kind is Imm.F64:
        return int.from_bytes(r.bytes(8), "little")
    if kind is Imm.BR_TABLE:
        labels = tuple(_vec(r, Reader.u32))
        return (labels, r.u32())
    if kind is Imm.CALL_INDIRECT:
        return (r.u32(), r.u32())
    if kind is Imm.MEMORY:
        at = r.pos
        index = r.u32()
        if index != 0:
            r.note(_other_memory(r, op.name, index, pos))
            return index
        if r.pos != at + 1:  # a longer encoding of 0 is multi-memory's memory index
            raise r.error(f"zero byte expected: {op.name}'s reserved byte is one byte 0x00", at)
        return 0
    if kind is Imm.SELECT_T:
        types = tuple(_vec(r, Reader.valtype))
        if len(types) != 1:
            raise r.error(f"typed select must name exactly one type, got {len(types)}", pos)
        return types[0]
    if kind is Imm.REFTYPE:
        return r.reftype()
    if kind is Imm.TABLE or kind is Imm.ELEM or kind is Imm.DATA:
        return r.u32()
    if kind is Imm.TABLE_INIT or kind is Imm.TABLE_COPY:
        return (r.u32(), r.u32())
    if kind is Imm.MEMORY_COPY or kind is Imm.MEMORY_INIT:
        first, second = r.u32(), r.u32()
        for index in (first, second) if kind is Imm.MEMORY_COPY else (second,):
            if index != 0:
                r.note(_other_memory(r, op.name, index, pos))
        return (first, second)
    if kind is Imm.V128:
        return int.from_bytes(r.bytes(16), "little")
    if kind is Imm.SHUFFLE or kind is Imm.LANE:
        lanes = tuple(r.bytes(16 if kind is Imm.SHUFFLE else 1))
        return lanes if kind is Imm.SHUFFLE else lanes[0]
    if kind is Imm.MEMARG_LANE:
        align, offset = _read_imm(r, _MEMARG_OF[op], pos)
        return (align, offset, r.u8())
    raise AssertionError(f"no immediate reader for {kind}")


def _memarg(r: Reader, name: str, pos: int) -> tuple[int, int]:
    """A memory access's (alignment, offset); bit 6 of the alignment flags a memory index."""
    align = r.u32()
    if align & 0x40:
        index = r.u32()
        if index != 0 or not r.lenient:
            r.note(
                UnsupportedFeature(
                    f"{name} names a memory index (multi-memory), which is not supported",
                    pos,
                    r.func_index,
                    proposal="multi-memory",
                    what=f"{name} on memory {index}",
                )
            )
        align &= ~0x40
    return (align, r.u32())


def _other_memory(r: Reader, name: str, index: int, pos: int) -> UnsupportedFeature:
    return UnsupportedFeature(
        f"{name} on memory {index} (multi-memory) is not supported",
        pos,
        r.func_index,
        proposal="multi-memory",
        what=f"{name} on memory {index}",
    )


def _atomic_immediates(r: Reader, sub: int, pos: int) -> tuple[int, int] | None:
    """The immediates of a threads instruction (0xFE ``sub``): ``atomic.fence`` has one zero
    byte, every other (notify, wait, loads, stores, read-modify-writes) a memarg."""
    if sub == 0x03:
        at = r.pos
        if r.u8() != 0:
            raise r.error("zero byte expected: atomic.fence's reserved byte is 0x00", at)
        return None
    if sub > 0x4E or 0x03 < sub < 0x10:
        raise r.error(f"unknown opcode 0xfe {sub}", pos)
    return _memarg(r, f"instruction 0xfe {sub}", pos)


def _catch_clauses(r: Reader, pos: int) -> tuple:
    """``try_table``'s clauses after its block type: (kind, tag, label) each, kinds 0 and 1
    catching one tag, 2 and 3 any."""
    clauses = []
    for _ in range(r.u32()):
        at = r.pos
        kind = r.u8()
        if kind > 3:
            raise r.error(f"invalid catch clause kind {kind}", at)
        tag = r.u32() if kind < 2 else None
        clauses.append((kind, tag, r.u32()))
    return tuple(clauses)


# How a lenient reader reads on past the unsupported instructions whose encoding it knows:
# a prefixed family's by sub-opcode, and the rows whose immediates say less than the bytes.
_FAMILY_IMMEDIATES = {PREFIX_THREADS: _atomic_immediates}
_MORE_IMMEDIATES = {"try_table": _catch_clauses}
# The legacy exception instructions (wasmtime refuses them unless asked): their blocks end
# in ways the nesting count does not follow.
_UNREADABLE = frozenset({"try", "catch", "catch_all", "delegate", "rethrow"})


def _instructions(r: Reader, const: bool = False, keep: bool = True) -> list[Instr]:
    """Decode instructions up to and including the ``end`` that closes the body (none are
    kept without ``keep``: the bytes are checked, and nothing grows with their number)."""
    out: list[Instr] = []
    append = out.append
    opens: list[tuple[int, Opcode]] = []  # the open blocks: (index in out, opener)
    data = r.data
    single = SINGLE
    unsupported = UNSUPPORTED_ROWS
    count = 0
    while True:
        pos = r.pos
        if pos >= r.end:
            raise r.error("unexpected end: the expression has no final end")
        b = data[pos]
        r.pos = pos + 1
        op = single.get(b)
        imm = None
        family = False  # an instruction of a prefixed family, its immediates read
        if op is None:
            if b == PREFIX_MISC:
                sub = r.u32()
                op = MISC.get(sub)
                if op is None:
                    raise r.error(f"unknown opcode 0xfc {sub}", pos)
            elif b == PREFIX_SIMD:
                sub = r.u32()
                op = SIMD.get(sub)
                if op is None:
                    raise r.error(f"unknown opcode 0xfd {sub}", pos)
            elif b in PREFIX_FAMILIES:
                op = PREFIX_FAMILIES[b]
                sub = r.u32()
                exc = r.unsupported(op.feature, f"instruction 0x{b:02x} {sub}", pos)
                reader = _FAMILY_IMMEDIATES.get(b)
                if reader is None:
                    raise exc
                r.note(exc)
                imm = reader(r, sub, pos)
                family = True
            else:
                raise r.error(f"unknown opcode 0x{b:02x}", pos)
        if not family and op in unsupported:
            exc = r.unsupported(op.feature, f"instruction {op.name}", pos)
            if op.name in _UNREADABLE:
                raise exc
            r.note(exc)
        if const and op.name not in CONST_OPS:
            raise r.error(f"{op.name} is not allowed in a constant expression", pos)
        if not family and op.imm is not Imm.NONE:
            imm = _read_imm(r, op, pos)
            more = _MORE_IMMEDIATES.get(op.name)
            if more is not None:
                imm = (imm, more(r, pos))
        if op is _END:
            if not opens:
                if keep:
                    append(Instr(op, imm, pos))
                return out
            at, _ = opens.pop()
            if keep:
                out[at].match = len(out)
        elif op in _OPENERS:
            opens.append((count, op))
        elif op is _ELSE and (not opens or opens[-1][1] is not _IF):
            raise r.error("else without a matching if", pos)
        if keep:
            append(Instr(op, imm, pos))
        count += 1


def _custom(r: Reader, module: WasmModule) -> None:
    start = r.pos
    name = r.name()
    payload = r.bytes(r.end - r.pos)
    module.customs.append(CustomSection(name, payload, start))
    if name == "name":
        module.func_names = _function_names(payload)


def _function_names(payload: bytes) -> dict[int, str]:
    """Function names of the "name" custom section; a malformed one is ignored, as the spec allows."""
    names: dict[int, str] = {}
    r = Reader(payload)
    try:
        while r.pos < r.end:
            sub = r.u8()
            size = r.u32()
            end = r.pos + size
            if sub == 1:
                for _ in range(r.u32()):
                    index = r.u32()
                    names[index] = r.name()
            r.pos = end
    except DecodeError:
        return {}
    return names


def float_from_bits(bits: int, double: bool) -> float:
    """The float a bit pattern encodes (helper for printers)."""
    return struct.unpack("<d" if double else "<f", bits.to_bytes(8 if double else 4, "little"))[0]
