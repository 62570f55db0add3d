"""SIMD128: the ``simd`` dialect's ops as LLVM vector IR, with Wasm's semantics per lane.

A v128 is ``<2 x i64>`` between ops; each op bitcasts it to the integer vector of its lane
shape (``<16 x i8>`` ... ``<2 x i64>``). The tables below are keyed by the Wasm operation
(the part of the name after the shape), and say how each lowers:

* ``VECTOR_BINARY``: one LLVM vector instruction whose semantics are Wasm's (add, sub,
  mul, bitwise ops);
* float arithmetic, rounding, square root, abs/neg and the float conversions go lane by
  lane through the scalar lowering of the same Wasm op (:mod:`numeric`, :mod:`convert`),
  which owns the NaN rule (the first NaN operand quieted, else the default NaN), the
  sign-bit operations and the saturating truncation, so the vector and the scalar op can
  never differ; a float lane is moved into the integer vector through the target's
  ``float_bits`` (see ``NVPTXTarget.float_bits``);
* the rest has a function named for the gap between Wasm and LLVM: shift counts modulo
  the lane width (LLVM: poison), swizzle indices past 15 giving 0 (LLVM: poison), narrowing
  and saturating add/sub (widened and clamped), integer ``neg``/``abs`` of narrow lanes on a
  GPU (see ``_negate``), ``q15mulr_sat_s`` (rounding, and the one product that overflows),
  ``min``/``max`` of float lanes (wasmtime on x86 gives a canonical NaN in every NaN lane,
  not an operand's payload as its scalar ``min`` does), and ``pmin``/``pmax``, which select
  an operand's bits exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from llvmlite import ir

from tensorwasm.compiler.errors import CompileError
from tensorwasm.compiler.lower import convert, numeric
from tensorwasm.compiler.lower.types import F32_T, F64_T, I8_T, I32_T, I64_T, I128_T, V128_T
from tensorwasm.dialect.ir import Op
from tensorwasm.dialect.types import F32, F64, I32

if TYPE_CHECKING:
    from tensorwasm.compiler.lower.function import FunctionLowering

# Lane shape -> (lane count, lane bits, float type of a float lane or None).
SHAPES: dict[str, tuple[int, int, ir.Type | None]] = {
    "i8x16": (16, 8, None), "i16x8": (8, 16, None), "i32x4": (4, 32, None), "i64x2": (2, 64, None),
    "f32x4": (4, 32, F32_T), "f64x2": (2, 64, F64_T),
}  # fmt: skip


class LaneOp(NamedTuple):
    """The scalar op a lane-by-lane lowering hands to the scalar lowering (name and attrs)."""

    name: str
    attrs: dict


def _split(op: Op) -> tuple[str, str]:
    shape, _, name = op.attrs["op"].partition(".")
    return shape, name


def vector(shape: str) -> ir.VectorType:
    """The integer vector of a lane shape (float lanes travel as their bits)."""
    count, bits, _ = SHAPES[shape]
    return ir.VectorType(ir.IntType(bits), count)


def lanes_of(fl: FunctionLowering, value: ir.Value, shape: str) -> ir.Value:
    return fl.b.bitcast(value, vector(shape))


def v128(fl: FunctionLowering, value: ir.Value) -> ir.Value:
    return fl.b.bitcast(value, V128_T)


def _i32(i: int) -> ir.Constant:
    return ir.Constant(I32_T, i)


def _splat_const(shape_vec: ir.VectorType, value: int) -> ir.Constant:
    return ir.Constant(shape_vec, [ir.Constant(shape_vec.element, value)] * shape_vec.count)


def _shuffle(fl: FunctionLowering, a: ir.Value, b: ir.Value, indices) -> ir.Value:
    mask = ir.Constant(ir.VectorType(I32_T, len(indices)), [_i32(i) for i in indices])
    return fl.b.shuffle_vector(a, b, mask)


def _vector_intrinsic(fl: FunctionLowering, name: str, args: list[ir.Value]) -> ir.Value:
    """Call the LLVM intrinsic ``name`` overloaded on the integer vector type of ``args``."""
    ty = args[0].type
    full = f"{name}.v{ty.count}i{ty.element.width}"
    fn = fl.module.globals.get(full)
    if fn is None:
        fn = ir.Function(fl.module, ir.FunctionType(ty, [a.type for a in args]), name=full)
    return fl.b.call(fn, args)


# -- lane by lane through the scalar lowering ------------------------------------------------


def _lane(fl: FunctionLowering, vec: ir.Value, i: int, float_type: ir.Type | None) -> ir.Value:
    value = fl.b.extract_element(vec, _i32(i))
    return fl.b.bitcast(value, float_type) if float_type is not None else value


def _gather(fl: FunctionLowering, values: list[ir.Value], shape: str) -> ir.Value:
    """A v128 of ``shape`` from lane values (floats moved to integers through the target);
    lanes past ``values`` are zero."""
    ty = vector(shape)
    out = ir.Constant(ty, None)
    for i, value in enumerate(values):
        if not isinstance(value.type, ir.IntType):
            value = fl.target.float_bits(fl.b, value, ty.element)
        out = fl.b.insert_element(out, value, _i32(i))
    return v128(fl, out)


def per_lane(scalar: str, count: int | None = None, **attrs) -> Callable:
    """A lowering that applies the scalar lowering of ``scalar`` (with ``attrs``) to each
    lane: of the shape the op's name reads from where it names one (a conversion), else of
    its own; the first ``count`` lanes where given, the result's other lanes zero."""
    lower_scalar = {**numeric.LOWERINGS, **convert.LOWERINGS}[scalar]

    def lower(fl: FunctionLowering, op: Op, args) -> ir.Value:
        shape, name = _split(op)
        src = next((s for s in SHAPES if s in name), shape)
        n = count or SHAPES[src][0]
        float_type = SHAPES[src][2]
        vecs = [lanes_of(fl, a, src) for a in args]
        lane_op = LaneOp(scalar, attrs)
        results = [lower_scalar(fl, lane_op, [_lane(fl, v, i, float_type) for v in vecs]) for i in range(n)]
        return _gather(fl, results, shape)

    lower.__name__ = f"per_lane_{scalar.replace('.', '_')}"
    return lower


def _source_shape(op: Op) -> str:
    """The shape a conversion reads: named at the end of the op (``convert_i32x4_s``)."""
    _, name = _split(op)
    for shape in SHAPES:
        if shape in name:
            return shape
    raise CompileError(f"{op.attrs['op']} names no source shape")


# -- operations with a gap between Wasm and LLVM ----------------------------------------------


def wasm_vector_min_max(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Float lanes' min/max: NaN if either lane is NaN, -0 < +0 (Wasm). Which NaN: wasmtime
    on x86 runs ``minps``/``maxps`` both ways and combines the two, so a NaN lane of ``min``
    is the default NaN (sign set, quiet bit only) and one of ``max`` the canonical NaN with
    the sign bit of the operands' bits or-ed, whatever their payloads; the scalar ops keep a
    payload instead. Lanes without a NaN follow the scalar rule."""
    shape, name = _split(op)
    count, bits, float_type = SHAPES[shape]
    b = fl.b
    ity = ir.IntType(bits)
    vecs = [lanes_of(fl, a, shape) for a in args]
    default = ir.Constant(ity, numeric.DEFAULT_NAN_BITS[bits])
    sign = ir.Constant(ity, 1 << (bits - 1))
    canonical = ir.Constant(ity, numeric.DEFAULT_NAN_BITS[bits] & ~(1 << (bits - 1)))
    results = []
    for i in range(count):
        x_bits, y_bits = (b.extract_element(v, _i32(i)) for v in vecs)
        x, y = b.bitcast(x_bits, float_type), b.bitcast(y_bits, float_type)
        picked = numeric.wasm_min_max(fl, x, y, name == "min")
        nan = default if name == "min" else b.or_(b.and_(b.or_(x_bits, y_bits), sign), canonical)
        is_nan = b.fcmp_unordered("uno", x, y)
        bits_picked = fl.target.float_bits(b, picked, ity)
        results.append(b.select(is_nan, nan, fl.target.opaque(b, bits_picked)))
    return _gather(fl, results, shape)


def lower_pseudo_min_max(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """pmin is ``b < a ? b : a`` and pmax ``a < b ? b : a``: an operand's bits exactly, NaN
    or not (selected as integers, so LLVM cannot treat NaNs as interchangeable)."""
    shape, name = _split(op)
    _, _, float_type = SHAPES[shape]
    a, c = (lanes_of(fl, x, shape) for x in args)
    fa, fc = (fl.b.bitcast(x, ir.VectorType(float_type, x.type.count)) for x in (a, c))
    take_c = fl.b.fcmp_ordered("<", fc, fa) if name == "pmin" else fl.b.fcmp_ordered("<", fa, fc)
    return v128(fl, fl.b.select(take_c, c, a))


def shift_count_mask(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Wasm shifts each lane by the count modulo the lane width; LLVM's vector shifts give
    poison for a count of the lane width or more."""
    shape, name = _split(op)
    x, count = args
    ty = vector(shape)
    masked = fl.b.and_(count, _i32(ty.element.width - 1))
    if ty.element.width < 32:
        masked = fl.b.trunc(masked, ty.element)
    elif ty.element.width > 32:
        masked = fl.b.zext(masked, ty.element)
    counts = _shuffle(fl, fl.b.insert_element(ir.Constant(ty, None), masked, _i32(0)), ir.Constant(ty, None),
                      [0] * ty.count)  # fmt: skip
    method = {"shl": "shl", "shr_s": "ashr", "shr_u": "lshr"}[name]
    return v128(fl, getattr(fl.b, method)(lanes_of(fl, x, shape), counts))


def swizzle_out_of_range_zero(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """``i8x16.swizzle``: lane i is byte ``s[i]`` of the first vector, or 0 where ``s[i]`` is
    16 or more; LLVM's extractelement past the end gives poison, so the index is masked and
    the lane chosen afterwards."""
    b = fl.b
    a, s = (lanes_of(fl, x, "i8x16") for x in args)
    out = ir.Constant(vector("i8x16"), None)
    for i in range(16):
        index = b.extract_element(s, _i32(i))
        byte = b.extract_element(a, b.zext(b.and_(index, ir.Constant(index.type, 15)), I32_T))
        inside = b.icmp_unsigned("<", index, ir.Constant(index.type, 16))
        out = b.insert_element(out, b.select(inside, byte, ir.Constant(byte.type, 0)), _i32(i))
    return v128(fl, out)


def _clamp(fl: FunctionLowering, x: ir.Value, low: int, high: int) -> ir.Value:
    b = fl.b
    lo, hi = _splat_const(x.type, low), _splat_const(x.type, high)
    x = b.select(b.icmp_signed("<", x, lo), lo, x)
    return b.select(b.icmp_signed(">", x, hi), hi, x)


def narrow_saturate(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """``narrow``: both inputs' signed lanes, saturated to the narrow signed (``_s``) or
    unsigned (``_u``) range; LLVM's trunc would keep the low bits instead."""
    shape, name = _split(op)
    count, bits, _ = SHAPES[shape]
    wide = _source_shape(op)
    a, c = (lanes_of(fl, x, wide) for x in args)
    both = _shuffle(fl, a, c, range(count))
    if name.endswith("_s"):
        clamped = _clamp(fl, both, -(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    else:
        clamped = _clamp(fl, both, 0, (1 << bits) - 1)
    return v128(fl, fl.b.trunc(clamped, vector(shape)))


def q15mulr_saturate(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """``(a * b + 0x4000) >> 15`` per 16-bit lane, saturated: only -32768 * -32768 leaves
    the range, and gives 32767 (LLVM has no such op; done in 32 bits)."""
    b = fl.b
    wide = ir.VectorType(I32_T, 8)
    a, c = (b.sext(lanes_of(fl, x, "i16x8"), wide) for x in args)
    product = b.ashr(b.add(b.mul(a, c), _splat_const(wide, 0x4000)), _splat_const(wide, 15))
    return v128(fl, b.trunc(_clamp(fl, product, -32768, 32767), vector("i16x8")))


def _half(fl: FunctionLowering, value: ir.Value, shape: str, high: bool) -> ir.Value:
    count = SHAPES[shape][0]
    start = count // 2 if high else 0
    vec = lanes_of(fl, value, shape)
    return _shuffle(fl, vec, vec, range(start, start + count // 2))


def _extend(fl: FunctionLowering, value: ir.Value, signed: bool, to: ir.VectorType) -> ir.Value:
    return fl.b.sext(value, to) if signed else fl.b.zext(value, to)


def lower_extend(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """``extend_{low,high}``: half the lanes, sign- or zero-extended to twice the width."""
    shape, name = _split(op)
    half = _half(fl, args[0], _source_shape(op), "_high_" in name)
    return v128(fl, _extend(fl, half, name.endswith("_s"), vector(shape)))


def lower_extmul(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """``extmul_{low,high}``: the halves extended, then multiplied (exact in the wide lanes)."""
    shape, name = _split(op)
    src, signed = _source_shape(op), name.endswith("_s")
    a, c = (_extend(fl, _half(fl, x, src, "_high_" in name), signed, vector(shape)) for x in args)
    return v128(fl, fl.b.mul(a, c))


def lower_extadd_pairwise(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """``extadd_pairwise``: lanes extended to twice the width, neighbours added."""
    shape, name = _split(op)
    src = _source_shape(op)
    wide = ir.VectorType(vector(shape).element, SHAPES[src][0])
    x = _extend(fl, lanes_of(fl, args[0], src), name.endswith("_s"), wide)
    return v128(fl, _sum_pairs(fl, x))


def _sum_pairs(fl: FunctionLowering, x: ir.Value) -> ir.Value:
    """Lanes 2i and 2i+1 of ``x`` added, as a vector of half as many lanes."""
    n = x.type.count // 2
    even = _shuffle(fl, x, x, [2 * i for i in range(n)])
    odd = _shuffle(fl, x, x, [2 * i + 1 for i in range(n)])
    return fl.b.add(even, odd)


def lower_dot(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """``i32x4.dot_i16x8_s``: signed 16-bit products, 32-bit sums of neighbours (wrapping)."""
    wide = ir.VectorType(I32_T, 8)
    a, c = (fl.b.sext(lanes_of(fl, x, "i16x8"), wide) for x in args)
    return v128(fl, _sum_pairs(fl, fl.b.mul(a, c)))


def lower_avgr(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """``avgr_u``: ``(a + b + 1) / 2`` unsigned, without the overflow of the narrow lanes."""
    shape, _ = _split(op)
    ty = vector(shape)
    wide = ir.VectorType(ir.IntType(2 * ty.element.width), ty.count)
    a, c = (fl.b.zext(lanes_of(fl, x, shape), wide) for x in args)
    total = fl.b.add(fl.b.add(a, c), _splat_const(wide, 1))
    return v128(fl, fl.b.trunc(fl.b.lshr(total, _splat_const(wide, 1)), ty))


def lower_int_min_max(fl: FunctionLowering, op: Op, args) -> ir.Value:
    shape, name = _split(op)
    a, c = (lanes_of(fl, x, shape) for x in args)
    pred = "<" if name.startswith("min") else ">"
    test = fl.b.icmp_signed(pred, a, c) if name.endswith("_s") else fl.b.icmp_unsigned(pred, a, c)
    return v128(fl, fl.b.select(test, a, c))


_INT_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "gt": ">", "le": "<=", "ge": ">="}


def lower_compare(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Comparisons give all ones in a lane where true; float lanes compare ordered (false on
    NaN) but for ``ne``, which is true on NaN."""
    shape, name = _split(op)
    ty = vector(shape)
    a, c = (lanes_of(fl, x, shape) for x in args)
    b = fl.b
    float_type = SHAPES[shape][2]
    pred, _, sign = name.partition("_")
    if float_type is not None:
        fa, fc = (b.bitcast(x, ir.VectorType(float_type, ty.count)) for x in (a, c))
        test = b.fcmp_unordered("!=", fa, fc) if pred == "ne" else b.fcmp_ordered(_INT_COMPARE[pred], fa, fc)
    elif sign == "u":
        test = b.icmp_unsigned(_INT_COMPARE[pred], a, c)
    else:
        test = b.icmp_signed(_INT_COMPARE[pred], a, c)
    return v128(fl, b.sext(test, ty))


def _direct(method: str) -> Callable:
    def lower(fl: FunctionLowering, op: Op, args) -> ir.Value:
        shape, _ = _split(op)
        if shape == "v128":
            return getattr(fl.b, method)(*args)
        return v128(fl, getattr(fl.b, method)(*(lanes_of(fl, a, shape) for a in args)))

    lower.__name__ = f"vector_{method}"
    return lower


def lower_saturating(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """``add_sat``/``sub_sat``: the lanes widened to twice their width, added or subtracted
    there (no overflow), clamped to the signed (``_s``) or unsigned (``_u``) range and
    narrowed."""
    b = fl.b
    shape, name = _split(op)
    count, bits, _ = SHAPES[shape]
    signed = name.endswith("_s")
    wide = ir.VectorType(ir.IntType(2 * bits), count)
    a, c = (_extend(fl, lanes_of(fl, x, shape), signed, wide) for x in args)
    total = b.add(a, c) if name.startswith("add") else b.sub(a, c)
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return v128(fl, b.trunc(_clamp(fl, total, low, high), vector(shape)))


def lower_andnot(fl: FunctionLowering, op: Op, args) -> ir.Value:
    a, c = args
    return fl.b.and_(a, fl.b.not_(c))


# -- unary -------------------------------------------------------------------------------------


def lower_not(fl: FunctionLowering, op: Op, args) -> ir.Value:
    return fl.b.not_(args[0])


def _negate(fl: FunctionLowering, x: ir.Value) -> ir.Value:
    """``0 - x`` per lane, wrapping. On a GPU, lanes narrower than 32 bits are negated in
    32-bit lanes, each through the target's opaque move before it is truncated (so LLVM
    cannot narrow the negation back): ptxas's ``neg.s16`` of -32768 leaves +32768 in its register, which a later
    sign extension or compare then reads (``i16x8.add_sat_s(i16x8.neg(-32768), 32767)``
    gave 32767 on sm_90, not -1)."""
    b = fl.b
    zero = ir.Constant(x.type, None)
    if not fl.target.is_gpu or x.type.element.width >= 32:
        return b.sub(zero, x)
    wide = b.sext(x, ir.VectorType(I32_T, x.type.count))
    negated = b.sub(ir.Constant(wide.type, None), wide)
    for k in range(x.type.count):
        lane = fl.target.opaque(b, b.extract_element(negated, ir.Constant(I32_T, k)))
        negated = b.insert_element(negated, lane, ir.Constant(I32_T, k))
    return b.trunc(negated, x.type)


def lower_int_abs(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Wasm's abs wraps (abs of MIN is MIN), as ``select(x < 0, 0 - x, x)`` does."""
    shape, _ = _split(op)
    x = lanes_of(fl, args[0], shape)
    zero = ir.Constant(x.type, None)
    return v128(fl, fl.b.select(fl.b.icmp_signed("<", x, zero), _negate(fl, x), x))


def lower_int_neg(fl: FunctionLowering, op: Op, args) -> ir.Value:
    shape, _ = _split(op)
    return v128(fl, _negate(fl, lanes_of(fl, args[0], shape)))


def lower_popcnt(fl: FunctionLowering, op: Op, args) -> ir.Value:
    return v128(fl, _vector_intrinsic(fl, "llvm.ctpop", [lanes_of(fl, args[0], "i8x16")]))


# Unary float ops and conversions, lane by lane through the scalar op of the same rules
# (with the lanes they read, where not all, and the scalar op's attributes).
def _unary_per_lane() -> dict[str, Callable]:
    table: dict[str, Callable] = {}
    for shape in ("f32x4", "f64x2"):
        for name in ("abs", "neg", "sqrt", "ceil", "floor", "trunc", "nearest"):
            table[f"{shape}.{name}"] = per_lane(f"arith.f{name}")
    table["i32x4.trunc_sat_f32x4_s"] = per_lane("arith.fptosi_sat", to=I32)
    table["i32x4.trunc_sat_f32x4_u"] = per_lane("arith.fptoui_sat", to=I32)
    table["i32x4.trunc_sat_f64x2_s_zero"] = per_lane("arith.fptosi_sat", 2, to=I32)
    table["i32x4.trunc_sat_f64x2_u_zero"] = per_lane("arith.fptoui_sat", 2, to=I32)
    table["f32x4.convert_i32x4_s"] = per_lane("arith.sitofp", to=F32)
    table["f32x4.convert_i32x4_u"] = per_lane("arith.uitofp", to=F32)
    table["f64x2.convert_low_i32x4_s"] = per_lane("arith.sitofp", 2, to=F64)
    table["f64x2.convert_low_i32x4_u"] = per_lane("arith.uitofp", 2, to=F64)
    table["f32x4.demote_f64x2_zero"] = per_lane("arith.fptrunc", 2, to=F32)
    table["f64x2.promote_low_f32x4"] = per_lane("arith.fpext", 2, to=F64)
    return table


def _unary_table() -> dict[str, Callable]:
    table = {"v128.not": lower_not, "i8x16.popcnt": lower_popcnt}
    for shape in ("i8x16", "i16x8", "i32x4", "i64x2"):
        table[f"{shape}.abs"] = lower_int_abs
        table[f"{shape}.neg"] = lower_int_neg
    for wide, narrow in (("i16x8", "i8x16"), ("i32x4", "i16x8"), ("i64x2", "i32x4")):
        for half in ("low", "high"):
            for sign in ("s", "u"):
                table[f"{wide}.extend_{half}_{narrow}_{sign}"] = lower_extend
        if wide != "i64x2":
            for sign in ("s", "u"):
                table[f"{wide}.extadd_pairwise_{narrow}_{sign}"] = lower_extadd_pairwise
    return {**table, **_unary_per_lane()}


def _binary_table() -> dict[str, Callable]:
    table: dict[str, Callable] = {
        "v128.and": _direct("and_"), "v128.or": _direct("or_"), "v128.xor": _direct("xor"),
        "v128.andnot": lower_andnot, "i8x16.swizzle": swizzle_out_of_range_zero,
        "i16x8.q15mulr_sat_s": q15mulr_saturate, "i32x4.dot_i16x8_s": lower_dot,
        "i8x16.narrow_i16x8_s": narrow_saturate, "i8x16.narrow_i16x8_u": narrow_saturate,
        "i16x8.narrow_i32x4_s": narrow_saturate, "i16x8.narrow_i32x4_u": narrow_saturate,
    }  # fmt: skip
    ints = ("i8x16", "i16x8", "i32x4", "i64x2")
    for shape in ints:
        table[f"{shape}.add"] = _direct("add")
        table[f"{shape}.sub"] = _direct("sub")
        for pred in ("eq", "ne", "lt_s", "gt_s", "le_s", "ge_s"):
            table[f"{shape}.{pred}"] = lower_compare
        if shape != "i64x2":
            for pred in ("lt_u", "gt_u", "le_u", "ge_u"):
                table[f"{shape}.{pred}"] = lower_compare
    for shape in ("i16x8", "i32x4", "i64x2"):
        table[f"{shape}.mul"] = _direct("mul")
    for shape in ("i8x16", "i16x8"):
        for name in ("add_sat_s", "add_sat_u", "sub_sat_s", "sub_sat_u"):
            table[f"{shape}.{name}"] = lower_saturating
        table[f"{shape}.avgr_u"] = lower_avgr
    for shape in ("i8x16", "i16x8", "i32x4"):
        for name in ("min_s", "min_u", "max_s", "max_u"):
            table[f"{shape}.{name}"] = lower_int_min_max
    for wide, narrow in (("i16x8", "i8x16"), ("i32x4", "i16x8"), ("i64x2", "i32x4")):
        for half in ("low", "high"):
            for sign in ("s", "u"):
                table[f"{wide}.extmul_{half}_{narrow}_{sign}"] = lower_extmul
    for shape in ("f32x4", "f64x2"):
        for name in ("eq", "ne", "lt", "gt", "le", "ge"):
            table[f"{shape}.{name}"] = lower_compare
        for name in ("add", "sub", "mul", "div"):
            table[f"{shape}.{name}"] = per_lane(f"arith.f{name}")
        table[f"{shape}.min"] = table[f"{shape}.max"] = wasm_vector_min_max
        table[f"{shape}.pmin"] = table[f"{shape}.pmax"] = lower_pseudo_min_max
    return table


# -- lanes, constants, tests -------------------------------------------------------------------


def _scalar_to_lane(fl: FunctionLowering, value: ir.Value, ty: ir.VectorType) -> ir.Value:
    if not isinstance(value.type, ir.IntType):
        return fl.target.float_bits(fl.b, value, ty.element)
    if value.type.width > ty.element.width:
        return fl.b.trunc(value, ty.element)
    return value


def lower_splat(fl: FunctionLowering, op: Op, args) -> ir.Value:
    shape, _ = _split(op)
    ty = vector(shape)
    one = fl.b.insert_element(ir.Constant(ty, None), _scalar_to_lane(fl, args[0], ty), _i32(0))
    return v128(fl, _shuffle(fl, one, ir.Constant(ty, None), [0] * ty.count))


def lower_extract_lane(fl: FunctionLowering, op: Op, args) -> ir.Value:
    shape, name = _split(op)
    _, bits, float_type = SHAPES[shape]
    lane = fl.b.extract_element(lanes_of(fl, args[0], shape), _i32(op.attrs["lane"]))
    if float_type is not None:
        return fl.b.bitcast(lane, float_type)
    if bits < 32:
        return fl.b.sext(lane, I32_T) if name.endswith("_s") else fl.b.zext(lane, I32_T)
    return lane


def lower_replace_lane(fl: FunctionLowering, op: Op, args) -> ir.Value:
    shape, _ = _split(op)
    ty = vector(shape)
    vec, value = args
    lane = _scalar_to_lane(fl, value, ty)
    return v128(fl, fl.b.insert_element(lanes_of(fl, vec, shape), lane, _i32(op.attrs["lane"])))


def lower_shuffle(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Indices 0-31 pick a byte of the two vectors; the validator refuses any larger."""
    a, c = (lanes_of(fl, x, "i8x16") for x in args)
    return v128(fl, _shuffle(fl, a, c, op.attrs["lanes"]))


def lower_bitselect(fl: FunctionLowering, op: Op, args) -> ir.Value:
    a, c, mask = args
    b = fl.b
    return b.or_(b.and_(a, mask), b.and_(c, b.not_(mask)))


def lower_test(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """any_true: some bit set; all_true: no lane zero; bitmask: the lanes' sign bits. The
    lanes are combined one by one (LLVM turns that into a movemask where there is one)."""
    shape, name = _split(op)
    b = fl.b
    if name == "any_true":
        whole = b.bitcast(args[0], I128_T)
        return b.zext(b.icmp_unsigned("!=", whole, ir.Constant(I128_T, 0)), I32_T)
    x = lanes_of(fl, args[0], shape)
    zero = ir.Constant(x.type, None)
    flags = b.icmp_signed("<", x, zero) if name == "bitmask" else b.icmp_unsigned("!=", x, zero)
    result: ir.Value = ir.Constant(I32_T, 0 if name == "bitmask" else 1)
    for i in range(x.type.count):
        flag = b.zext(b.extract_element(flags, _i32(i)), I32_T)
        result = b.or_(result, b.shl(flag, _i32(i))) if name == "bitmask" else b.and_(result, flag)
    return result


UNARY = _unary_table()
BINARY = _binary_table()
INT_SHAPES = ("i8x16", "i16x8", "i32x4", "i64x2")
SHIFT = {f"{shape}.{name}": shift_count_mask for shape in INT_SHAPES for name in ("shl", "shr_s", "shr_u")}
TEST = {
    "v128.any_true": lower_test,
    **{f"{shape}.{name}": lower_test for shape in INT_SHAPES for name in ("all_true", "bitmask")},
}
LANE_OPS = {
    "simd.splat": lower_splat,
    "simd.extract_lane": lower_extract_lane,
    "simd.replace_lane": lower_replace_lane,
}
# -- a loop kernel's proven v128 accesses on a strict-alignment target ------------------------


def proven_load(fl: FunctionLowering, ptr: ir.Value, ty: ir.Type) -> ir.Value:
    """A loop kernel's v128 load that the guards proved inside linear memory, on a target
    where a misaligned access faults (the GPU). Wasm allows any address, and a vectorised
    loop over bytes loads at every offset (a blur's ``in[x - 1]``, ``in[x + 1]``), so the
    guards do not ask for alignment: the load reads the five aligned 32-bit words around its
    16 bytes and funnel-shifts each lane's bytes out of two neighbours, with no branch. The
    fifth word is read only where the address is misaligned (else the fourth again): its
    first byte is then one the access reads, and memory ends on a page, so the word lies
    inside it too."""
    b = fl.b
    offset = b.and_(b.ptrtoint(ptr, I64_T), ir.Constant(I64_T, 3))
    line = b.gep(ptr, [b.neg(offset)], source_etype=I8_T)
    words = [_word(fl, line, ir.Constant(I64_T, 4 * i)) for i in range(4)]
    aligned = b.icmp_unsigned("==", offset, ir.Constant(I64_T, 0))
    words.append(_word(fl, line, b.select(aligned, ir.Constant(I64_T, 12), ir.Constant(I64_T, 16))))
    shift = b.trunc(b.shl(offset, ir.Constant(I64_T, 3)), I32_T)
    fshr = fl.module.globals.get("llvm.fshr.i32")
    if fshr is None:
        fshr = ir.Function(fl.module, ir.FunctionType(I32_T, [I32_T] * 3), name="llvm.fshr.i32")
    out = ir.Constant(ir.VectorType(I32_T, 4), None)
    for i in range(4):  # lane i: bytes offset..offset+3 of words i (low) and i+1 (high)
        out = b.insert_element(out, b.call(fshr, [words[i + 1], words[i], shift]), _i32(i))
    return b.bitcast(out, ty)


def _word(fl: FunctionLowering, line: ir.Value, at: ir.Value) -> ir.Value:
    return fl.b.load(fl.b.gep(line, [at], source_etype=I8_T), typ=I32_T, align=4)


def proven_store(fl: FunctionLowering, ptr: ir.Value, value: ir.Value) -> None:
    """A loop kernel's v128 store that the guards proved inside linear memory, on a target
    where a misaligned access faults (the GPU): four aligned 32-bit stores where the address
    is a multiple of 4 (a vectorised loop over 32-bit lanes), else a byte at a time, out of
    line. (A store cannot merge its bytes into the words around it: another thread may
    write their other bytes.)"""
    from tensorwasm.compiler.lower.memory import store_bytes

    b = fl.b
    low = b.and_(b.ptrtoint(ptr, I64_T), ir.Constant(I64_T, 3))
    with b.if_else(b.icmp_unsigned("==", low, ir.Constant(I64_T, 0)), likely=True) as (then, otherwise):
        with then:
            b.store(value, ptr, align=4)
        with otherwise:
            store_bytes(fl, ptr, b.bitcast(value, I128_T))


# The dialect op -> its table of Wasm operations (None: one lowering for all).
FAMILIES: dict[str, dict[str, Callable] | None] = {
    "simd.unary": UNARY, "simd.binary": BINARY, "simd.shift": SHIFT, "simd.test": TEST,
}  # fmt: skip


def _by_operation(table: dict[str, Callable]) -> Callable:
    def lower(fl: FunctionLowering, op: Op, args) -> ir.Value:
        chosen = table.get(op.attrs["op"])
        if chosen is None:
            raise CompileError(f"no lowering for SIMD operation {op.attrs['op']}")
        return chosen(fl, op, args)

    return lower


def lowering_of(dialect_op: str, wasm_name: str) -> Callable | None:
    """The function that lowers Wasm SIMD op ``wasm_name`` (carried by ``dialect_op``)."""
    table = FAMILIES.get(dialect_op)
    if table is not None:
        return table.get(wasm_name)
    return LOWERINGS.get(dialect_op)


LOWERINGS = {
    "simd.shuffle": lower_shuffle,
    "simd.bitselect": lower_bitselect,
    **LANE_OPS,
    **{name: _by_operation(table) for name, table in FAMILIES.items()},
}
