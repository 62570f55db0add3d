"""The ``arith`` dialect: constants, integer and float arithmetic, comparisons, casts.

Every op has Wasm's semantics, not LLVM's: shifts take their count modulo the width,
``div``/``rem`` trap on zero and ``div_s`` on overflow, float ``min``/``max`` propagate NaN
and order -0 below +0, ``fptosi``/``fptoui`` trap on NaN and out-of-range values while the
``_sat`` forms saturate. The lowering owns the gap between these rules and the target's.
"""

from __future__ import annotations

from tensorwasm.dialect.opdef import (
    FLOATS,
    INTS,
    NUMBERS,
    Cast,
    Compare,
    Custom,
    Dialect,
    FloatBinary,
    FloatUnary,
    IntBinary,
    IntUnary,
    TrappingIntBinary,
)
from tensorwasm.dialect.types import F32, F64, I1, V128, Type


def _constant(op, operands, attrs):
    op.expect_count(operands, 0)
    ty = attrs.get("type")
    value = attrs.get("value")
    if ty not in NUMBERS and ty is not I1 and ty is not V128:
        raise op.fail(f"constant of type {ty} is not allowed")
    if not isinstance(value, int) or not 0 <= value < (1 << ty.bits):
        raise op.fail(f"value {value!r} is not a {ty.bits}-bit pattern")
    return (ty,)


def _select(op, operands, attrs):
    op.expect_count(operands, 3)
    cond, a, b = operands
    if cond is not I1:
        raise op.fail(f"condition must be i1, got {cond}")
    if a is not b:
        raise op.fail(f"arms have different types {a} and {b}")
    return (a,)


def _sext_inreg(op, operands, attrs):
    op.expect_count(operands, 1)
    (ty,) = operands
    bits = attrs.get("bits")
    if ty not in INTS or bits not in (8, 16, 32) or bits >= ty.bits:
        raise op.fail(f"cannot sign-extend the low {bits} bits of {ty}")
    return (ty,)


def _int_to_int_narrower(src: Type, dst: Type) -> bool:
    return src.is_int and dst.is_int and dst.bits < src.bits


def _int_to_int_wider(src: Type, dst: Type) -> bool:
    return src.is_int and dst.is_int and dst.bits > src.bits


def _float_to_int(src: Type, dst: Type) -> bool:
    return src in FLOATS and dst in INTS


def _int_to_float(src: Type, dst: Type) -> bool:
    return src in INTS and dst in FLOATS


def _same_width(src: Type, dst: Type) -> bool:
    return src in NUMBERS and dst in NUMBERS and src.bits == dst.bits and src is not dst


INT_PREDICATES = ("eq", "ne", "slt", "ult", "sgt", "ugt", "sle", "ule", "sge", "uge")
FLOAT_PREDICATES = ("oeq", "une", "olt", "ogt", "ole", "oge")

constant = Custom(
    "arith.constant",
    "A constant; ``value`` is the bit pattern (floats too, so NaN payloads survive; a v128's "
    "128 bits, lane 0 lowest). "
    "`%0 = arith.constant 42 : i32`",
    _constant,
    pure=True,
)
select = Custom(
    "arith.select", "`%3 = arith.select %c, %a, %b : i32` is %a if %c else %b.", _select, pure=True
)

add = IntBinary("arith.add", "Wrapping addition. `%2 = arith.add %0, %1 : i32`")
sub = IntBinary("arith.sub", "Wrapping subtraction. `%2 = arith.sub %0, %1 : i64`")
mul = IntBinary("arith.mul", "Wrapping multiplication (low half). `%2 = arith.mul %0, %1 : i32`")
div_s = TrappingIntBinary(
    "arith.div_s", "Signed division toward zero; traps on 0 and on MIN / -1. `arith.div_s %0, %1 : i32`"
)
div_u = TrappingIntBinary("arith.div_u", "Unsigned division; traps on 0. `arith.div_u %0, %1 : i32`")
rem_s = TrappingIntBinary(
    "arith.rem_s", "Signed remainder (sign of the dividend); traps on 0; MIN rem -1 is 0."
)
rem_u = TrappingIntBinary("arith.rem_u", "Unsigned remainder; traps on 0. `arith.rem_u %0, %1 : i64`")
and_ = IntBinary("arith.and", "Bitwise and. `%2 = arith.and %0, %1 : i32`")
or_ = IntBinary("arith.or", "Bitwise or. `%2 = arith.or %0, %1 : i32`")
xor = IntBinary("arith.xor", "Bitwise xor. `%2 = arith.xor %0, %1 : i32`")
shl = IntBinary("arith.shl", "Shift left by the count modulo the width. `arith.shl %0, %1 : i32`")
shr_s = IntBinary("arith.shr_s", "Arithmetic shift right, count modulo the width.")
shr_u = IntBinary("arith.shr_u", "Logical shift right, count modulo the width.")
rotl = IntBinary("arith.rotl", "Rotate left, count modulo the width. `arith.rotl %0, %1 : i64`")
rotr = IntBinary("arith.rotr", "Rotate right, count modulo the width.")
clz = IntUnary("arith.clz", "Leading zero bits (the width for 0). `%1 = arith.clz %0 : i32`")
ctz = IntUnary("arith.ctz", "Trailing zero bits (the width for 0). `%1 = arith.ctz %0 : i64`")
popcnt = IntUnary("arith.popcnt", "Number of one bits. `%1 = arith.popcnt %0 : i32`")
sext_inreg = Custom(
    "arith.sext_inreg",
    "Sign-extend the low ``bits`` bits in place. `%1 = arith.sext_inreg %0 {bits = 8} : i32`",
    _sext_inreg,
    pure=True,
)

fadd = FloatBinary("arith.fadd", "IEEE addition, round to nearest even. `arith.fadd %0, %1 : f32`")
fsub = FloatBinary("arith.fsub", "IEEE subtraction. `%2 = arith.fsub %0, %1 : f64`")
fmul = FloatBinary("arith.fmul", "IEEE multiplication, never fused. `arith.fmul %0, %1 : f32`")
fdiv = FloatBinary("arith.fdiv", "IEEE division, correctly rounded. `arith.fdiv %0, %1 : f64`")
fmin = FloatBinary("arith.fmin", "Minimum: NaN if either is NaN; -0 < +0. `arith.fmin %0, %1 : f32`")
fmax = FloatBinary("arith.fmax", "Maximum: NaN if either is NaN; +0 > -0. `arith.fmax %0, %1 : f64`")
fcopysign = FloatBinary("arith.fcopysign", "Magnitude of the first, sign bit of the second.")
fabs = FloatUnary("arith.fabs", "Clear the sign bit (NaN payload kept). `%1 = arith.fabs %0 : f32`")
fneg = FloatUnary("arith.fneg", "Flip the sign bit (NaN payload kept). `%1 = arith.fneg %0 : f64`")
fceil = FloatUnary("arith.fceil", "Round toward +inf. `%1 = arith.fceil %0 : f32`")
ffloor = FloatUnary("arith.ffloor", "Round toward -inf. `%1 = arith.ffloor %0 : f64`")
ftrunc = FloatUnary("arith.ftrunc", "Round toward zero. `%1 = arith.ftrunc %0 : f32`")
fnearest = FloatUnary("arith.fnearest", "Round to nearest, ties to even. `arith.fnearest %0 : f64`")
fsqrt = FloatUnary("arith.fsqrt", "IEEE square root, correctly rounded. `arith.fsqrt %0 : f32`")

cmpi = Compare("arith.cmpi", "`%2 = arith.cmpi slt, %0, %1 : i32` gives an i1.", INTS, INT_PREDICATES)
cmpf = Compare(
    "arith.cmpf",
    "`%2 = arith.cmpf olt, %0, %1 : f64`; ordered predicates are false on NaN, une is true.",
    FLOATS,
    FLOAT_PREDICATES,
)

trunc = Cast("arith.trunc", "Keep the low bits. `%1 = arith.trunc %0 : i64 to i32`", _int_to_int_narrower)
zext = Cast("arith.zext", "Zero-extend (i1 to i32 too). `%1 = arith.zext %0 : i32 to i64`", _int_to_int_wider)
sext = Cast("arith.sext", "Sign-extend. `%1 = arith.sext %0 : i32 to i64`", _int_to_int_wider)
fptosi = Cast(
    "arith.fptosi",
    "Truncate toward zero to signed; traps on NaN or out of range. `arith.fptosi %0 : f32 to i32`",
    _float_to_int,
    traps=True,
)
fptoui = Cast(
    "arith.fptoui",
    "Truncate toward zero to unsigned; traps on NaN or out of range.",
    _float_to_int,
    traps=True,
)
fptosi_sat = Cast("arith.fptosi_sat", "Truncate to signed, saturating; NaN gives 0.", _float_to_int)
fptoui_sat = Cast("arith.fptoui_sat", "Truncate to unsigned, saturating; NaN gives 0.", _float_to_int)
sitofp = Cast("arith.sitofp", "Signed integer to float, round to nearest even.", _int_to_float)
uitofp = Cast("arith.uitofp", "Unsigned integer to float, round to nearest even.", _int_to_float)
fptrunc = Cast("arith.fptrunc", "f64 to f32, round to nearest even.", lambda s, d: s is F64 and d is F32)
fpext = Cast("arith.fpext", "f32 to f64, exact.", lambda s, d: s is F32 and d is F64)
bitcast = Cast("arith.bitcast", "Reinterpret the bits. `arith.bitcast %0 : f32 to i32`", _same_width)

ARITH = Dialect(
    "arith",
    [
        constant, select, add, sub, mul, div_s, div_u, rem_s, rem_u, and_, or_, xor, shl,
        shr_s, shr_u, rotl, rotr, clz, ctz, popcnt, sext_inreg, fadd, fsub, fmul, fdiv, fmin,
        fmax, fcopysign, fabs, fneg, fceil, ffloor, ftrunc, fnearest, fsqrt, cmpi, cmpf,
        trunc, zext, sext, fptosi, fptoui, fptosi_sat, fptoui_sat, sitofp, uitofp, fptrunc,
        fpext, bitcast,
    ],
)  # fmt: skip


def division_cannot_trap(op) -> bool:
    """Whether ``op`` is an integer division or remainder by a constant that never traps
    (clang's ``s / 9``, PolyBench's ``(i + j) % n`` once ``n`` is inlined): ``div_*`` and
    ``rem_*`` trap on a zero divisor, ``div_s`` also on MIN / -1 (``rem_s`` of MIN by -1 is 0)."""
    if op.opdef not in (div_u, div_s, rem_u, rem_s):
        return False
    owner = op.operands[1].owner
    if getattr(owner, "opdef", None) is not constant:
        return False
    bits, width = owner.attrs["value"], owner.attrs["type"].bits
    return bits != 0 and not (op.opdef is div_s and bits == (1 << width) - 1)
