"""The Wasm opcode table: one row per opcode, the single source of truth.

Each row gives the opcode's bytes, its text name, the kind of its immediates, its stack
signature, the proposal it belongs to and, for the ops the translator maps one to one,
the dialect op it becomes. The decoder dispatches on these rows, the printer prints them,
the translator picks its handler from them and ``docs/opcodes.md`` is generated from
them, so adding an opcode is adding a row.

The fixed-width SIMD proposal's rows (prefix 0xFD) come from :func:`_simd_rows`: each
names the dialect op of its family (``simd.binary``, ``simd.splat``...), and the op carries
the Wasm name, which the lowering's tables are keyed by.

Opcodes of proposals TensorWasm does not compile (threads, exception handling, GC, tail
calls, typed function references) have rows too, marked unsupported, so the decoder
names them in its error instead of mis-decoding the bytes that follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Imm(Enum):
    """The kind of immediate operands that follow an opcode."""

    NONE = "none"
    BLOCKTYPE = "blocktype"
    LABEL = "labelidx"
    BR_TABLE = "vec(labelidx) labelidx"
    FUNC = "funcidx"
    CALL_INDIRECT = "typeidx tableidx"
    LOCAL = "localidx"
    GLOBAL = "globalidx"
    TABLE = "tableidx"
    MEMARG = "memarg"
    MEMORY = "memidx"
    I32 = "i32"
    I64 = "i64"
    F32 = "f32"
    F64 = "f64"
    SELECT_T = "vec(valtype)"
    REFTYPE = "reftype"
    TABLE_INIT = "elemidx tableidx"
    ELEM = "elemidx"
    TABLE_COPY = "tableidx tableidx"
    MEMORY_INIT = "dataidx memidx"
    DATA = "dataidx"
    MEMORY_COPY = "memidx memidx"
    V128 = "i128"
    SHUFFLE = "16 x laneidx"
    LANE = "laneidx"
    MEMARG_LANE = "memarg laneidx"


class Feature(Enum):
    """The Wasm proposal an opcode comes from."""

    MVP = "mvp"
    SIGN_EXT = "sign-extension"
    SAT_TRUNC = "non-trapping float-to-int"
    BULK_MEMORY = "bulk memory"
    REFERENCE_TYPES = "reference types"
    SIMD = "SIMD"
    THREADS = "threads"
    EXCEPTIONS = "exception handling"
    GC = "GC"
    TAIL_CALL = "tail calls"
    FUNCTION_REFERENCES = "typed function references"


UNSUPPORTED_FEATURES = frozenset(
    {
        Feature.THREADS,
        Feature.EXCEPTIONS,
        Feature.GC,
        Feature.TAIL_CALL,
        Feature.FUNCTION_REFERENCES,
    }
)

# The one-byte prefixes that introduce a LEB128 sub-opcode.
PREFIX_MISC = 0xFC
PREFIX_SIMD = 0xFD
PREFIX_THREADS = 0xFE
PREFIX_GC = 0xFB


@dataclass(frozen=True, slots=True, eq=False)  # rows are unique: hash by identity
class Opcode:
    """One row of the table.

    ``code`` is the opcode byte, or ``(prefix, sub)`` for prefixed opcodes. ``sig`` is the
    stack signature as text (``"i32 i32 -> i32"``), or a short description where it depends
    on immediates. ``dialect`` is the dialect op for ops the translator maps one to one
    (``"arith.cmpi slt"`` names a predicate too); ``None`` means a dedicated handler.
    """

    code: int | tuple[int, int]
    name: str
    imm: Imm = Imm.NONE
    sig: str = ""
    feature: Feature = Feature.MVP
    dialect: str | None = None

    @property
    def supported(self) -> bool:
        return self.feature not in UNSUPPORTED_FEATURES

    @property
    def hex(self) -> str:
        if isinstance(self.code, tuple):
            return f"0x{self.code[0]:02x} {self.code[1]}"
        return f"0x{self.code:02x}"

    @property
    def operand_types(self) -> tuple[str, ...]:
        """The fixed operand types of a plain signature, left to right."""
        params, _, _ = self.sig.partition("->")
        return tuple(params.split())

    @property
    def result_types(self) -> tuple[str, ...]:
        _, _, results = self.sig.partition("->")
        return tuple(results.split())


def _rows() -> list[Opcode]:
    rows: list[Opcode] = []
    add = rows.append

    # Control. Signatures that depend on immediates are described, not typed.
    add(Opcode(0x00, "unreachable", sig="polymorphic"))
    add(Opcode(0x01, "nop", sig="->"))
    add(Opcode(0x02, "block", Imm.BLOCKTYPE, "blocktype"))
    add(Opcode(0x03, "loop", Imm.BLOCKTYPE, "blocktype"))
    add(Opcode(0x04, "if", Imm.BLOCKTYPE, "i32 + blocktype"))
    add(Opcode(0x05, "else", sig="structural"))
    add(Opcode(0x06, "try", Imm.BLOCKTYPE, "blocktype", Feature.EXCEPTIONS))
    add(Opcode(0x07, "catch", Imm.LABEL, "structural", Feature.EXCEPTIONS))
    add(Opcode(0x08, "throw", Imm.LABEL, "polymorphic", Feature.EXCEPTIONS))
    add(Opcode(0x09, "rethrow", Imm.LABEL, "polymorphic", Feature.EXCEPTIONS))
    add(Opcode(0x0A, "throw_ref", sig="polymorphic", feature=Feature.EXCEPTIONS))
    add(Opcode(0x0B, "end", sig="structural"))
    add(Opcode(0x0C, "br", Imm.LABEL, "polymorphic"))
    add(Opcode(0x0D, "br_if", Imm.LABEL, "label types + i32 -> label types"))
    add(Opcode(0x0E, "br_table", Imm.BR_TABLE, "polymorphic"))
    add(Opcode(0x0F, "return", sig="polymorphic"))
    add(Opcode(0x10, "call", Imm.FUNC, "function type"))
    add(Opcode(0x11, "call_indirect", Imm.CALL_INDIRECT, "type + i32"))
    add(Opcode(0x12, "return_call", Imm.FUNC, "polymorphic", Feature.TAIL_CALL))
    add(Opcode(0x13, "return_call_indirect", Imm.CALL_INDIRECT, "polymorphic", Feature.TAIL_CALL))
    add(Opcode(0x14, "call_ref", Imm.FUNC, "function type", Feature.FUNCTION_REFERENCES))
    add(Opcode(0x15, "return_call_ref", Imm.FUNC, "polymorphic", Feature.FUNCTION_REFERENCES))
    add(Opcode(0x18, "delegate", Imm.LABEL, "structural", Feature.EXCEPTIONS))
    add(Opcode(0x19, "catch_all", sig="structural", feature=Feature.EXCEPTIONS))
    add(Opcode(0x1F, "try_table", Imm.BLOCKTYPE, "blocktype", Feature.EXCEPTIONS))

    # Parametric and variable access.
    add(Opcode(0x1A, "drop", sig="t ->"))
    add(Opcode(0x1B, "select", sig="t t i32 -> t", dialect="arith.select"))
    add(Opcode(0x1C, "select_t", Imm.SELECT_T, "t t i32 -> t", dialect="arith.select"))
    add(Opcode(0x20, "local.get", Imm.LOCAL, "-> t"))
    add(Opcode(0x21, "local.set", Imm.LOCAL, "t ->"))
    add(Opcode(0x22, "local.tee", Imm.LOCAL, "t -> t"))
    add(Opcode(0x23, "global.get", Imm.GLOBAL, "-> t", dialect="global.get"))
    add(Opcode(0x24, "global.set", Imm.GLOBAL, "t ->", dialect="global.set"))
    add(Opcode(0x25, "table.get", Imm.TABLE, "i32 -> ref", Feature.REFERENCE_TYPES, "table.get"))
    add(Opcode(0x26, "table.set", Imm.TABLE, "i32 ref ->", Feature.REFERENCE_TYPES, "table.set"))

    # Memory.
    loads = [
        (0x28, "i32.load", "i32"), (0x29, "i64.load", "i64"), (0x2A, "f32.load", "f32"),
        (0x2B, "f64.load", "f64"), (0x2C, "i32.load8_s", "i32"), (0x2D, "i32.load8_u", "i32"),
        (0x2E, "i32.load16_s", "i32"), (0x2F, "i32.load16_u", "i32"),
        (0x30, "i64.load8_s", "i64"), (0x31, "i64.load8_u", "i64"),
        (0x32, "i64.load16_s", "i64"), (0x33, "i64.load16_u", "i64"),
        (0x34, "i64.load32_s", "i64"), (0x35, "i64.load32_u", "i64"),
    ]  # fmt: skip
    for code, name, ty in loads:
        add(Opcode(code, name, Imm.MEMARG, f"i32 -> {ty}", dialect="mem.load"))
    stores = [
        (0x36, "i32.store", "i32"), (0x37, "i64.store", "i64"), (0x38, "f32.store", "f32"),
        (0x39, "f64.store", "f64"), (0x3A, "i32.store8", "i32"), (0x3B, "i32.store16", "i32"),
        (0x3C, "i64.store8", "i64"), (0x3D, "i64.store16", "i64"), (0x3E, "i64.store32", "i64"),
    ]  # fmt: skip
    for code, name, ty in stores:
        add(Opcode(code, name, Imm.MEMARG, f"i32 {ty} ->", dialect="mem.store"))
    add(Opcode(0x3F, "memory.size", Imm.MEMORY, "-> i32", dialect="mem.size"))
    add(Opcode(0x40, "memory.grow", Imm.MEMORY, "i32 -> i32", dialect="mem.grow"))

    # Constants.
    add(Opcode(0x41, "i32.const", Imm.I32, "-> i32", dialect="arith.constant"))
    add(Opcode(0x42, "i64.const", Imm.I64, "-> i64", dialect="arith.constant"))
    add(Opcode(0x43, "f32.const", Imm.F32, "-> f32", dialect="arith.constant"))
    add(Opcode(0x44, "f64.const", Imm.F64, "-> f64", dialect="arith.constant"))

    # Comparisons: the dialect compares to i1, the translator widens to i32.
    int_cmp = ["eq", "ne", "lt_s", "lt_u", "gt_s", "gt_u", "le_s", "le_u", "ge_s", "ge_u"]
    int_pred = ["eq", "ne", "slt", "ult", "sgt", "ugt", "sle", "ule", "sge", "uge"]
    float_cmp = ["eq", "ne", "lt", "gt", "le", "ge"]
    float_pred = ["oeq", "une", "olt", "ogt", "ole", "oge"]
    for base, ty in ((0x45, "i32"), (0x50, "i64")):
        add(Opcode(base, f"{ty}.eqz", sig=f"{ty} -> i32", dialect="arith.cmpi eq"))
        for i, (op, pred) in enumerate(zip(int_cmp, int_pred, strict=True)):
            add(Opcode(base + 1 + i, f"{ty}.{op}", sig=f"{ty} {ty} -> i32", dialect=f"arith.cmpi {pred}"))
    for base, ty in ((0x5B, "f32"), (0x61, "f64")):
        for i, (op, pred) in enumerate(zip(float_cmp, float_pred, strict=True)):
            add(Opcode(base + i, f"{ty}.{op}", sig=f"{ty} {ty} -> i32", dialect=f"arith.cmpf {pred}"))

    # Integer arithmetic.
    int_unary = ["clz", "ctz", "popcnt"]
    int_binary = ["add", "sub", "mul", "div_s", "div_u", "rem_s", "rem_u", "and", "or", "xor",
                  "shl", "shr_s", "shr_u", "rotl", "rotr"]  # fmt: skip
    for base, ty in ((0x67, "i32"), (0x79, "i64")):
        for i, op in enumerate(int_unary):
            add(Opcode(base + i, f"{ty}.{op}", sig=f"{ty} -> {ty}", dialect=f"arith.{op}"))
        for i, op in enumerate(int_binary):
            add(Opcode(base + 3 + i, f"{ty}.{op}", sig=f"{ty} {ty} -> {ty}", dialect=f"arith.{op}"))

    # Float arithmetic.
    float_unary = ["abs", "neg", "ceil", "floor", "trunc", "nearest", "sqrt"]
    float_binary = ["add", "sub", "mul", "div", "min", "max", "copysign"]
    for base, ty in ((0x8B, "f32"), (0x99, "f64")):
        for i, op in enumerate(float_unary):
            add(Opcode(base + i, f"{ty}.{op}", sig=f"{ty} -> {ty}", dialect=f"arith.f{op}"))
        for i, op in enumerate(float_binary):
            add(Opcode(base + 7 + i, f"{ty}.{op}", sig=f"{ty} {ty} -> {ty}", dialect=f"arith.f{op}"))

    # Conversions.
    conversions = [
        (0xA7, "i32.wrap_i64", "i64", "i32", "arith.trunc"),
        (0xA8, "i32.trunc_f32_s", "f32", "i32", "arith.fptosi"),
        (0xA9, "i32.trunc_f32_u", "f32", "i32", "arith.fptoui"),
        (0xAA, "i32.trunc_f64_s", "f64", "i32", "arith.fptosi"),
        (0xAB, "i32.trunc_f64_u", "f64", "i32", "arith.fptoui"),
        (0xAC, "i64.extend_i32_s", "i32", "i64", "arith.sext"),
        (0xAD, "i64.extend_i32_u", "i32", "i64", "arith.zext"),
        (0xAE, "i64.trunc_f32_s", "f32", "i64", "arith.fptosi"),
        (0xAF, "i64.trunc_f32_u", "f32", "i64", "arith.fptoui"),
        (0xB0, "i64.trunc_f64_s", "f64", "i64", "arith.fptosi"),
        (0xB1, "i64.trunc_f64_u", "f64", "i64", "arith.fptoui"),
        (0xB2, "f32.convert_i32_s", "i32", "f32", "arith.sitofp"),
        (0xB3, "f32.convert_i32_u", "i32", "f32", "arith.uitofp"),
        (0xB4, "f32.convert_i64_s", "i64", "f32", "arith.sitofp"),
        (0xB5, "f32.convert_i64_u", "i64", "f32", "arith.uitofp"),
        (0xB6, "f32.demote_f64", "f64", "f32", "arith.fptrunc"),
        (0xB7, "f64.convert_i32_s", "i32", "f64", "arith.sitofp"),
        (0xB8, "f64.convert_i32_u", "i32", "f64", "arith.uitofp"),
        (0xB9, "f64.convert_i64_s", "i64", "f64", "arith.sitofp"),
        (0xBA, "f64.convert_i64_u", "i64", "f64", "arith.uitofp"),
        (0xBB, "f64.promote_f32", "f32", "f64", "arith.fpext"),
        (0xBC, "i32.reinterpret_f32", "f32", "i32", "arith.bitcast"),
        (0xBD, "i64.reinterpret_f64", "f64", "i64", "arith.bitcast"),
        (0xBE, "f32.reinterpret_i32", "i32", "f32", "arith.bitcast"),
        (0xBF, "f64.reinterpret_i64", "i64", "f64", "arith.bitcast"),
    ]
    for code, name, src, dst, op in conversions:
        add(Opcode(code, name, sig=f"{src} -> {dst}", dialect=op))
    for code, name, ty in ((0xC0, "i32.extend8_s", "i32"), (0xC1, "i32.extend16_s", "i32"),
                           (0xC2, "i64.extend8_s", "i64"), (0xC3, "i64.extend16_s", "i64"),
                           (0xC4, "i64.extend32_s", "i64")):  # fmt: skip
        add(Opcode(code, name, sig=f"{ty} -> {ty}", feature=Feature.SIGN_EXT, dialect="arith.sext_inreg"))

    # Reference types.
    refs = Feature.REFERENCE_TYPES
    add(Opcode(0xD0, "ref.null", Imm.REFTYPE, "-> ref", refs, "ref.null"))
    add(Opcode(0xD1, "ref.is_null", sig="ref -> i32", feature=refs, dialect="ref.is_null"))
    add(Opcode(0xD2, "ref.func", Imm.FUNC, "-> funcref", refs, "ref.func"))
    add(Opcode(0xD3, "ref.eq", sig="eqref eqref -> i32", feature=Feature.GC))
    fref = Feature.FUNCTION_REFERENCES
    add(Opcode(0xD4, "ref.as_non_null", sig="ref -> ref", feature=fref))
    add(Opcode(0xD5, "br_on_null", Imm.LABEL, "polymorphic", fref))
    add(Opcode(0xD6, "br_on_non_null", Imm.LABEL, "polymorphic", fref))

    # The 0xFC prefix: saturating truncation, bulk memory, table ops.
    sat = [("i32.trunc_sat_f32_s", "f32", "i32", "s"), ("i32.trunc_sat_f32_u", "f32", "i32", "u"),
           ("i32.trunc_sat_f64_s", "f64", "i32", "s"), ("i32.trunc_sat_f64_u", "f64", "i32", "u"),
           ("i64.trunc_sat_f32_s", "f32", "i64", "s"), ("i64.trunc_sat_f32_u", "f32", "i64", "u"),
           ("i64.trunc_sat_f64_s", "f64", "i64", "s"), ("i64.trunc_sat_f64_u", "f64", "i64", "u")]  # fmt: skip
    for sub, (name, src, dst, sign) in enumerate(sat):
        op = "arith.fptosi_sat" if sign == "s" else "arith.fptoui_sat"
        add(Opcode((PREFIX_MISC, sub), name, sig=f"{src} -> {dst}", feature=Feature.SAT_TRUNC, dialect=op))
    bulk = Feature.BULK_MEMORY
    add(Opcode((PREFIX_MISC, 8), "memory.init", Imm.MEMORY_INIT, "i32 i32 i32 ->", bulk, "mem.init"))
    add(Opcode((PREFIX_MISC, 9), "data.drop", Imm.DATA, "->", bulk, "mem.data_drop"))
    add(Opcode((PREFIX_MISC, 10), "memory.copy", Imm.MEMORY_COPY, "i32 i32 i32 ->", bulk, "mem.copy"))
    add(Opcode((PREFIX_MISC, 11), "memory.fill", Imm.MEMORY, "i32 i32 i32 ->", bulk, "mem.fill"))
    add(Opcode((PREFIX_MISC, 12), "table.init", Imm.TABLE_INIT, "i32 i32 i32 ->", bulk, "table.init"))
    add(Opcode((PREFIX_MISC, 13), "elem.drop", Imm.ELEM, "->", bulk, "table.elem_drop"))
    add(Opcode((PREFIX_MISC, 14), "table.copy", Imm.TABLE_COPY, "i32 i32 i32 ->", bulk, "table.copy"))
    add(Opcode((PREFIX_MISC, 15), "table.grow", Imm.TABLE, "ref i32 -> i32", refs, "table.grow"))
    add(Opcode((PREFIX_MISC, 16), "table.size", Imm.TABLE, "-> i32", refs, "table.size"))
    add(Opcode((PREFIX_MISC, 17), "table.fill", Imm.TABLE, "i32 ref i32 ->", refs, "table.fill"))

    rows.extend(_simd_rows())

    # Whole families that are recognised by their prefix and refused.
    add(Opcode((PREFIX_THREADS, -1), "atomic.*", sig="atomic", feature=Feature.THREADS))
    add(Opcode((PREFIX_GC, -1), "gc.*", sig="gc", feature=Feature.GC))
    return rows


def _simd_rows() -> list[Opcode]:
    """The fixed-width SIMD proposal, by sub-opcode of the 0xFD prefix."""
    rows: list[Opcode] = []
    simd = Feature.SIMD

    def add(sub: int, name: str, sig: str, dialect: str | None, imm: Imm = Imm.NONE) -> None:
        rows.append(Opcode((PREFIX_SIMD, sub), name, imm, sig, simd, dialect))

    # Memory (no dialect op of their own: mem.load/mem.store with splats, lanes and extends).
    add(0, "v128.load", "i32 -> v128", None, Imm.MEMARG)
    for i, name in enumerate(["8x8_s", "8x8_u", "16x4_s", "16x4_u", "32x2_s", "32x2_u",
                              "8_splat", "16_splat", "32_splat", "64_splat"]):  # fmt: skip
        add(1 + i, f"v128.load{name}", "i32 -> v128", None, Imm.MEMARG)
    add(11, "v128.store", "i32 v128 ->", None, Imm.MEMARG)
    add(12, "v128.const", "-> v128", "arith.constant", Imm.V128)
    add(13, "i8x16.shuffle", "v128 v128 -> v128", "simd.shuffle", Imm.SHUFFLE)
    add(14, "i8x16.swizzle", "v128 v128 -> v128", "simd.binary")
    scalar = {"i8x16": "i32", "i16x8": "i32", "i32x4": "i32", "i64x2": "i64", "f32x4": "f32", "f64x2": "f64"}
    for i, (shape, ty) in enumerate(scalar.items()):
        add(15 + i, f"{shape}.splat", f"{ty} -> v128", "simd.splat")
    sub = 21
    for shape, ty in scalar.items():
        extracts = ["extract_lane_s", "extract_lane_u"] if shape in ("i8x16", "i16x8") else ["extract_lane"]
        for name in extracts:
            add(sub, f"{shape}.{name}", f"v128 -> {ty}", "simd.extract_lane", Imm.LANE)
            sub += 1
        add(sub, f"{shape}.replace_lane", f"v128 {ty} -> v128", "simd.replace_lane", Imm.LANE)
        sub += 1
    binary, unary = "v128 v128 -> v128", "v128 -> v128"
    int_cmp = ["eq", "ne", "lt_s", "lt_u", "gt_s", "gt_u", "le_s", "le_u", "ge_s", "ge_u"]
    for base, shape in ((35, "i8x16"), (45, "i16x8"), (55, "i32x4")):
        for i, op in enumerate(int_cmp):
            add(base + i, f"{shape}.{op}", binary, "simd.binary")
    for base, shape in ((65, "f32x4"), (71, "f64x2")):
        for i, op in enumerate(["eq", "ne", "lt", "gt", "le", "ge"]):
            add(base + i, f"{shape}.{op}", binary, "simd.binary")
    add(77, "v128.not", unary, "simd.unary")
    for i, op in enumerate(["and", "andnot", "or", "xor"]):
        add(78 + i, f"v128.{op}", binary, "simd.binary")
    add(82, "v128.bitselect", "v128 v128 v128 -> v128", "simd.bitselect")
    add(83, "v128.any_true", "v128 -> i32", "simd.test")
    for i, bits in enumerate((8, 16, 32, 64)):
        add(84 + i, f"v128.load{bits}_lane", "i32 v128 -> v128", None, Imm.MEMARG_LANE)
        add(88 + i, f"v128.store{bits}_lane", "i32 v128 ->", None, Imm.MEMARG_LANE)
    add(92, "v128.load32_zero", "i32 -> v128", None, Imm.MEMARG)
    add(93, "v128.load64_zero", "i32 -> v128", None, Imm.MEMARG)
    add(94, "f32x4.demote_f64x2_zero", unary, "simd.unary")
    add(95, "f64x2.promote_low_f32x4", unary, "simd.unary")
    # The rest, in sub-opcode order: (sub, name, family) where the family is not plain
    # binary; holes in the numbering are opcodes the proposal dropped.
    rest = {
        96: "i8x16.abs u", 97: "i8x16.neg u", 98: "i8x16.popcnt u", 99: "i8x16.all_true t",
        100: "i8x16.bitmask t", 101: "i8x16.narrow_i16x8_s", 102: "i8x16.narrow_i16x8_u",
        103: "f32x4.ceil u", 104: "f32x4.floor u", 105: "f32x4.trunc u", 106: "f32x4.nearest u",
        107: "i8x16.shl s", 108: "i8x16.shr_s s", 109: "i8x16.shr_u s", 110: "i8x16.add",
        111: "i8x16.add_sat_s", 112: "i8x16.add_sat_u", 113: "i8x16.sub", 114: "i8x16.sub_sat_s",
        115: "i8x16.sub_sat_u", 116: "f64x2.ceil u", 117: "f64x2.floor u", 118: "i8x16.min_s",
        119: "i8x16.min_u", 120: "i8x16.max_s", 121: "i8x16.max_u", 122: "f64x2.trunc u",
        123: "i8x16.avgr_u", 124: "i16x8.extadd_pairwise_i8x16_s u",
        125: "i16x8.extadd_pairwise_i8x16_u u", 126: "i32x4.extadd_pairwise_i16x8_s u",
        127: "i32x4.extadd_pairwise_i16x8_u u", 128: "i16x8.abs u", 129: "i16x8.neg u",
        130: "i16x8.q15mulr_sat_s", 131: "i16x8.all_true t", 132: "i16x8.bitmask t",
        133: "i16x8.narrow_i32x4_s", 134: "i16x8.narrow_i32x4_u",
        135: "i16x8.extend_low_i8x16_s u", 136: "i16x8.extend_high_i8x16_s u",
        137: "i16x8.extend_low_i8x16_u u", 138: "i16x8.extend_high_i8x16_u u",
        139: "i16x8.shl s", 140: "i16x8.shr_s s", 141: "i16x8.shr_u s", 142: "i16x8.add",
        143: "i16x8.add_sat_s", 144: "i16x8.add_sat_u", 145: "i16x8.sub", 146: "i16x8.sub_sat_s",
        147: "i16x8.sub_sat_u", 148: "f64x2.nearest u", 149: "i16x8.mul", 150: "i16x8.min_s",
        151: "i16x8.min_u", 152: "i16x8.max_s", 153: "i16x8.max_u", 155: "i16x8.avgr_u",
        156: "i16x8.extmul_low_i8x16_s", 157: "i16x8.extmul_high_i8x16_s",
        158: "i16x8.extmul_low_i8x16_u", 159: "i16x8.extmul_high_i8x16_u",
        160: "i32x4.abs u", 161: "i32x4.neg u", 163: "i32x4.all_true t", 164: "i32x4.bitmask t",
        167: "i32x4.extend_low_i16x8_s u", 168: "i32x4.extend_high_i16x8_s u",
        169: "i32x4.extend_low_i16x8_u u", 170: "i32x4.extend_high_i16x8_u u",
        171: "i32x4.shl s", 172: "i32x4.shr_s s", 173: "i32x4.shr_u s", 174: "i32x4.add",
        177: "i32x4.sub", 181: "i32x4.mul", 182: "i32x4.min_s", 183: "i32x4.min_u",
        184: "i32x4.max_s", 185: "i32x4.max_u", 186: "i32x4.dot_i16x8_s",
        188: "i32x4.extmul_low_i16x8_s", 189: "i32x4.extmul_high_i16x8_s",
        190: "i32x4.extmul_low_i16x8_u", 191: "i32x4.extmul_high_i16x8_u",
        192: "i64x2.abs u", 193: "i64x2.neg u", 195: "i64x2.all_true t", 196: "i64x2.bitmask t",
        199: "i64x2.extend_low_i32x4_s u", 200: "i64x2.extend_high_i32x4_s u",
        201: "i64x2.extend_low_i32x4_u u", 202: "i64x2.extend_high_i32x4_u u",
        203: "i64x2.shl s", 204: "i64x2.shr_s s", 205: "i64x2.shr_u s", 206: "i64x2.add",
        209: "i64x2.sub", 213: "i64x2.mul", 214: "i64x2.eq", 215: "i64x2.ne", 216: "i64x2.lt_s",
        217: "i64x2.gt_s", 218: "i64x2.le_s", 219: "i64x2.ge_s",
        220: "i64x2.extmul_low_i32x4_s", 221: "i64x2.extmul_high_i32x4_s",
        222: "i64x2.extmul_low_i32x4_u", 223: "i64x2.extmul_high_i32x4_u",
        224: "f32x4.abs u", 225: "f32x4.neg u", 227: "f32x4.sqrt u", 228: "f32x4.add",
        229: "f32x4.sub", 230: "f32x4.mul", 231: "f32x4.div", 232: "f32x4.min", 233: "f32x4.max",
        234: "f32x4.pmin", 235: "f32x4.pmax", 236: "f64x2.abs u", 237: "f64x2.neg u",
        239: "f64x2.sqrt u", 240: "f64x2.add", 241: "f64x2.sub", 242: "f64x2.mul",
        243: "f64x2.div", 244: "f64x2.min", 245: "f64x2.max", 246: "f64x2.pmin", 247: "f64x2.pmax",
        248: "i32x4.trunc_sat_f32x4_s u", 249: "i32x4.trunc_sat_f32x4_u u",
        250: "f32x4.convert_i32x4_s u", 251: "f32x4.convert_i32x4_u u",
        252: "i32x4.trunc_sat_f64x2_s_zero u", 253: "i32x4.trunc_sat_f64x2_u_zero u",
        254: "f64x2.convert_low_i32x4_s u", 255: "f64x2.convert_low_i32x4_u u",
    }  # fmt: skip
    families = {"": (binary, "simd.binary"), "u": (unary, "simd.unary"),
                "s": ("v128 i32 -> v128", "simd.shift"), "t": ("v128 -> i32", "simd.test")}  # fmt: skip
    for sub, text in rest.items():
        name, _, family = text.partition(" ")
        sig, dialect = families[family]
        add(sub, name, sig, dialect)
    return rows


OPCODES: tuple[Opcode, ...] = tuple(_rows())

# Decoder dispatch: one-byte opcodes by byte, 0xFC opcodes by sub-opcode.
SINGLE: dict[int, Opcode] = {op.code: op for op in OPCODES if isinstance(op.code, int)}
MISC: dict[int, Opcode] = {
    op.code[1]: op for op in OPCODES if isinstance(op.code, tuple) and op.code[0] == PREFIX_MISC
}
SIMD: dict[int, Opcode] = {
    op.code[1]: op for op in OPCODES if isinstance(op.code, tuple) and op.code[0] == PREFIX_SIMD
}
PREFIX_FAMILIES: dict[int, Opcode] = {
    op.code[0]: op
    for op in OPCODES
    if isinstance(op.code, tuple) and op.code[0] not in (PREFIX_MISC, PREFIX_SIMD)
}
BY_NAME: dict[str, Opcode] = {op.name: op for op in OPCODES}
# The rows of proposals the compiler does not translate (tested per instruction as it is
# decoded: a set of rows hashed by identity, not each row's feature looked up).
UNSUPPORTED_ROWS: frozenset[Opcode] = frozenset(op for op in OPCODES if not op.supported)
