"""Integer and float arithmetic, comparisons and select.

Ops whose Wasm semantics match LLVM's are rows of ``DIRECT`` (op -> IRBuilder method).
Each gap between the two rule books has a helper named for it, with both rules stated:
shift counts, division traps, rotations, bit counts, NaN-propagating min/max, and the
sign-bit operations that must not touch a NaN's payload, and the NaN that float
arithmetic may return (:func:`wasm_nan_result`). No fast-math flag is ever set, so
LLVM neither contracts ``a * b + c`` into an FMA nor flushes subnormals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from tensorwasm.compiler.lower.types import I1_T, int_of
from tensorwasm.compiler.traps import TrapKind
from tensorwasm.dialect.ir import Op

if TYPE_CHECKING:
    from tensorwasm.compiler.lower.function import FunctionLowering

# Ops that are one LLVM instruction with the same semantics.
DIRECT = {
    "arith.add": "add", "arith.sub": "sub", "arith.mul": "mul",
    "arith.and": "and_", "arith.or": "or_", "arith.xor": "xor",
}  # fmt: skip
# Float arithmetic that is one LLVM instruction with the same semantics, but for the NaN
# it returns (see wasm_nan_result).
FLOAT_ARITHMETIC = {"arith.fadd": "fadd", "arith.fsub": "fsub", "arith.fmul": "fmul", "arith.fdiv": "fdiv"}
# Float ops that are one LLVM intrinsic with IEEE semantics (correctly rounded, no FTZ),
# but for the NaN they return (see wasm_nan_result).
INTRINSICS = {
    "arith.fceil": "llvm.ceil", "arith.ffloor": "llvm.floor", "arith.ftrunc": "llvm.trunc",
    "arith.fnearest": "llvm.roundeven", "arith.fsqrt": "llvm.sqrt",
}  # fmt: skip
SIGNED_PREDICATES = {"eq": "==", "ne": "!=", "slt": "<", "sgt": ">", "sle": "<=", "sge": ">="}
UNSIGNED_PREDICATES = {"ult": "<", "ugt": ">", "ule": "<=", "uge": ">="}
FLOAT_PREDICATES = {"oeq": "==", "olt": "<", "ogt": ">", "ole": "<=", "oge": ">="}


def intrinsic(fl: FunctionLowering, name: str, ty: ir.Type, args, extra_types=()) -> ir.Value:
    """Call the overloaded LLVM intrinsic ``name`` at type ``ty``."""
    suffix = {ir.FloatType: "f32", ir.DoubleType: "f64"}.get(type(ty)) or f"i{ty.width}"
    full = f"{name}.{suffix}"
    fn = fl.module.globals.get(full)
    if fn is None:
        arg_types = [ty] * (len(args) - len(extra_types)) + list(extra_types)
        fn = ir.Function(fl.module, ir.FunctionType(ty, arg_types), name=full)
    return fl.b.call(fn, args)


# The NaN an operation returns where no operand is one: canonical (only the quiet bit of the
# payload set), with the sign set, as x86's SSE returns it (its "default NaN"): wasmtime's.
DEFAULT_NAN_BITS = {32: 0xFFC00000, 64: 0xFFF8000000000000}
QUIET_BIT = {32: 1 << 22, 64: 1 << 51}
# The payload bits below the quiet bit, by width.
_PAYLOAD_BITS = {32: 22, 64: 51}


def _quiet_nan_bits(b: ir.IRBuilder, operand: ir.Value, ity: ir.IntType) -> ir.Value:
    """The bits of ``operand`` (a NaN) as an arithmetic NaN of the result's width ``ity``:
    its sign and the top of its payload kept, the quiet bit set (what x86's conversions do
    to a NaN, and its arithmetic to a NaN operand)."""
    width = int_of(operand.type).width
    bits = b.bitcast(operand, int_of(operand.type))
    if width != ity.width:
        sign = b.lshr(bits, ir.Constant(bits.type, width - 1))
        payload = b.and_(bits, ir.Constant(bits.type, (1 << _PAYLOAD_BITS[width]) - 1))
        shift = abs(_PAYLOAD_BITS[ity.width] - _PAYLOAD_BITS[width])
        if width < ity.width:
            payload = b.shl(b.zext(payload, ity), ir.Constant(ity, shift))
            sign = b.zext(sign, ity)
        else:
            payload = b.trunc(b.lshr(payload, ir.Constant(bits.type, shift)), ity)
            sign = b.trunc(sign, ity)
        exponent = ir.Constant(ity, DEFAULT_NAN_BITS[ity.width] & ~(1 << (ity.width - 1)))
        bits = b.or_(b.or_(b.shl(sign, ir.Constant(ity, ity.width - 1)), exponent), payload)
    return b.or_(bits, ir.Constant(ity, QUIET_BIT[ity.width]))


def wasm_nan_result(fl: FunctionLowering, value: ir.Value, operands, last_nan_wins: bool = False) -> ir.Value:
    """Wasm constrains the NaN a float operation returns: canonical where no operand is a
    NaN, arithmetic (quiet bit set) where one is. LLVM and PTX follow neither rule: PTX's
    f32 NaN is 0x7FFFFFFF, and LLVM folds ``x * 1``, ``x - 0``, ``x / 1``, ``-1 * x`` and
    ``fptrunc (fpext x)`` to ``x``, returning a signalling NaN operand as it is. So a NaN
    result becomes what x86 (and so wasmtime) returns: the first NaN operand, quieted (the
    last, for min and max, whose x86 instructions prefer their second operand), or the
    default NaN where no operand is one. The choice is made on the bits and passes
    through ``target.opaque``, so that LLVM, which holds all NaNs interchangeable, cannot
    fold it away."""
    b = fl.b
    ity = int_of(value.type)
    chosen = ir.Constant(ity, DEFAULT_NAN_BITS[ity.width])
    floats = [v for v in operands if isinstance(v.type, (ir.FloatType, ir.DoubleType))]
    for operand in floats if last_nan_wins else reversed(floats):
        is_nan = b.fcmp_unordered("uno", operand, operand)
        chosen = b.select(is_nan, _quiet_nan_bits(b, operand, ity), chosen)
    is_nan = b.fcmp_unordered("uno", value, value)
    bits = b.select(is_nan, chosen, b.bitcast(value, ity))
    return b.bitcast(fl.target.opaque(b, bits), value.type)


def wasm_nans(lower, last_nan_wins: bool = False):
    """``lower``, whose float result goes through :func:`wasm_nan_result`; except for an op
    marked ``nan_free``, whose caller checks the values it reaches for NaN and redoes the
    work with the unmarked ops where one is found (the tiled kernels, :mod:`compiler.tile`):
    IEEE results are Wasm's wherever no NaN arises, so such an op is the one instruction."""

    def lowered(fl: FunctionLowering, op: Op, args) -> ir.Value:
        if op.attrs.get("nan_free"):
            return lower(fl, op, args)
        return wasm_nan_result(fl, lower(fl, op, args), args, last_nan_wins)

    lowered.__name__ = lowered.__qualname__ = f"wasm_nans_{lower.__name__}"
    return lowered


def shift_count_mask(b: ir.IRBuilder, count: ir.Value) -> ir.Value:
    """Wasm takes shift counts modulo the width; LLVM gives poison for counts >= width."""
    return b.and_(count, ir.Constant(count.type, count.type.width - 1))


def lower_shift(fl: FunctionLowering, op: Op, args) -> ir.Value:
    x, count = args
    method = {"arith.shl": "shl", "arith.shr_s": "ashr", "arith.shr_u": "lshr"}[op.name]
    return getattr(fl.b, method)(x, shift_count_mask(fl.b, count))


def lower_rotate(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Wasm rotates modulo the width; LLVM's funnel shifts do too, with x as both halves."""
    x, count = args
    name = "llvm.fshl" if op.name == "arith.rotl" else "llvm.fshr"
    return intrinsic(fl, name, x.type, [x, x, count])


def lower_bit_count(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """clz/ctz of 0 is the width in Wasm; LLVM's ctlz/cttz agree when told zero is not poison."""
    (x,) = args
    if op.name == "arith.popcnt":
        return intrinsic(fl, "llvm.ctpop", x.type, [x])
    name = "llvm.ctlz" if op.name == "arith.clz" else "llvm.cttz"
    return intrinsic(fl, name, x.type, [x, ir.Constant(I1_T, 0)], extra_types=[I1_T])


def division_trap_checks(fl: FunctionLowering, x: ir.Value, y: ir.Value, signed_overflow: bool) -> None:
    """Wasm traps on a zero divisor and on MIN / -1; LLVM makes both undefined behaviour."""
    b, ty = fl.b, x.type
    fl.env.trap_if(b.icmp_unsigned("==", y, ir.Constant(ty, 0)), TrapKind.INTEGER_DIVIDE_BY_ZERO)
    if signed_overflow:
        is_min = b.icmp_unsigned("==", x, ir.Constant(ty, 1 << (ty.width - 1)))
        is_neg1 = b.icmp_unsigned("==", y, ir.Constant(ty, -1))
        fl.env.trap_if(b.and_(is_min, is_neg1), TrapKind.INTEGER_OVERFLOW)


def lower_division(fl: FunctionLowering, op: Op, args) -> ir.Value:
    x, y = args
    b = fl.b
    if op.name == "arith.div_s":
        division_trap_checks(fl, x, y, signed_overflow=True)
        return b.sdiv(x, y)
    division_trap_checks(fl, x, y, signed_overflow=False)
    if op.name == "arith.div_u":
        return b.udiv(x, y)
    if op.name == "arith.rem_u":
        return b.urem(x, y)
    # rem_s: Wasm gives 0 for MIN rem -1, where LLVM's srem overflows; x rem 1 is that 0.
    is_neg1 = b.icmp_unsigned("==", y, ir.Constant(y.type, -1))
    return b.srem(x, b.select(is_neg1, ir.Constant(y.type, 1), y))


def lower_sign_bit_op(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """abs, neg and copysign are bit operations in Wasm, NaN payload included. LLVM would
    turn the integer form back into fabs/fneg/copysign, and PTX abs.f64/neg.f64 do not keep
    a NaN's sign; so the target emits the bit operations in a form it cannot rewrite."""
    b = fl.b
    ty = args[0].type
    ity = int_of(ty)
    sign = ir.Constant(ity, 1 << (ity.width - 1))
    magnitude_mask = ir.Constant(ity, (1 << (ity.width - 1)) - 1)
    bit_op = fl.target.opaque_bit_op
    x = b.bitcast(args[0], ity)
    if op.name == "arith.fabs":
        bits = bit_op(b, "and", x, magnitude_mask)
    elif op.name == "arith.fneg":
        bits = bit_op(b, "xor", x, sign)
    else:
        y = b.bitcast(args[1], ity)
        bits = b.or_(bit_op(b, "and", x, magnitude_mask), bit_op(b, "and", y, sign))
    return b.bitcast(bits, ty)


def wasm_min_max(fl: FunctionLowering, a: ir.Value, c: ir.Value, is_min: bool) -> ir.Value:
    """Wasm min/max: NaN if either operand is NaN, and -0 < +0. IEEE minNum and PTX's plain
    min return the other operand for one NaN, and may return either zero; so: NaN goes
    first, equal operands (only +0/-0 differ in bits) combine their bits (or: -0 wins for
    min; and: +0 wins for max), otherwise an ordered compare picks."""
    b = fl.b
    ity = int_of(a.type)
    nan = b.fcmp_unordered("uno", a, c)
    equal = b.fcmp_ordered("==", a, c)
    ia, ic = b.bitcast(a, ity), b.bitcast(c, ity)
    combined = b.bitcast(b.or_(ia, ic) if is_min else b.and_(ia, ic), a.type)
    first = b.fcmp_ordered("<" if is_min else ">", a, c)
    picked = b.select(equal, combined, b.select(first, a, c))
    return b.select(nan, b.fadd(a, c), picked)  # a NaN (made canonical by lower_min_max)


def lower_min_max(fl: FunctionLowering, op: Op, args) -> ir.Value:
    a, c = args
    is_min = op.name == "arith.fmin"
    if fl.target.native_min_max(a.type):
        # llvm.minimum/maximum have exactly Wasm's rules; PTX min.NaN/max.NaN (sm_80+, f32).
        return intrinsic(fl, "llvm.minimum" if is_min else "llvm.maximum", a.type, [a, c])
    return wasm_min_max(fl, a, c, is_min)


def lower_cmpi(fl: FunctionLowering, op: Op, args) -> ir.Value:
    pred = op.attrs["pred"]
    if pred in UNSIGNED_PREDICATES:
        return fl.b.icmp_unsigned(UNSIGNED_PREDICATES[pred], *args)
    return fl.b.icmp_signed(SIGNED_PREDICATES[pred], *args)


def lower_cmpf(fl: FunctionLowering, op: Op, args) -> ir.Value:
    pred = op.attrs["pred"]
    if pred == "une":
        return fl.b.fcmp_unordered("!=", *args)
    return fl.b.fcmp_ordered(FLOAT_PREDICATES[pred], *args)


def lower_select(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Wasm's select returns one operand bit for bit; LLVM may replace a float select whose
    arms it deems equal up to NaN payload (``select(x != x, NaN, x)`` becomes ``x``). Floats
    are therefore selected as integers hidden from that reasoning."""
    cond, a, c = args
    if not isinstance(a.type, (ir.FloatType, ir.DoubleType)):
        return fl.b.select(cond, a, c)
    b = fl.b
    ity = int_of(a.type)
    bits_a = fl.target.opaque(b, b.bitcast(a, ity))
    bits_c = fl.target.opaque(b, b.bitcast(c, ity))
    return b.bitcast(b.select(cond, bits_a, bits_c), a.type)


def lower_sext_inreg(fl: FunctionLowering, op: Op, args) -> ir.Value:
    (x,) = args
    narrow = fl.b.trunc(x, ir.IntType(op.attrs["bits"]))
    return fl.b.sext(narrow, x.type)


def _direct(method: str):
    def lower(fl: FunctionLowering, op: Op, args) -> ir.Value:
        return getattr(fl.b, method)(*args)

    return lower


def _intrinsic(name: str):
    def lower(fl: FunctionLowering, op: Op, args) -> ir.Value:
        return intrinsic(fl, name, args[0].type, args)

    return lower


def lower_sqrt(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """IEEE's square root. On the GPU, ``sqrt.rn`` calls an out-of-line slow path for any
    input outside the normal positive range, negative ones included, so a root whose NaN
    is discarded (clang's branch-free ``x > 0 ? sqrt(x) * 2 : x * x - 0.25``, which takes
    the root of every element) ran that call for every negative element: there the root
    is of 1.0 (fast), and a NaN takes its place where the input is not ``>= 0`` (negative,
    or a NaN), which is where IEEE's is a NaN. The NaN's payload is not IEEE's; Wasm's rule
    replaces it (:func:`wasm_nan_result`, or the deferred rule's rebuild). The input passes
    through an opaque move, so that LLVM does not fold the root back into one of ``x``."""
    (x,) = args
    if not fl.target.is_gpu:
        return intrinsic(fl, "llvm.sqrt", x.type, args)
    b = fl.b
    ity = int_of(x.type)
    inside = b.fcmp_ordered(">=", x, ir.Constant(x.type, 0.0))
    safe = b.select(inside, b.bitcast(x, ity), b.bitcast(ir.Constant(x.type, 1.0), ity))
    root = intrinsic(fl, "llvm.sqrt", x.type, [b.bitcast(fl.target.opaque(b, safe), x.type)])
    return b.select(inside, root, ir.Constant(x.type, float("nan")))


# Float ops whose result differs from IEEE's only where it is a NaN (its payload), and
# is a NaN exactly where IEEE's is: without Wasm's NaN rule, one instruction each. The
# function lowering defers the rule to where a value's bits are observed (a store, a
# reinterpretation, a branch argument, ...): see ``FunctionLowering.exact``.
PLAIN_FLOAT = {
    **{name: _direct(method) for name, method in FLOAT_ARITHMETIC.items()},
    **{name: _intrinsic(intr) for name, intr in INTRINSICS.items()},
    "arith.fsqrt": lower_sqrt,
}
# Ops that read no NaN payload of their float operands, only whether one is a NaN: they
# take a deferred value as it is.
NAN_BLIND = frozenset({"arith.cmpf", *PLAIN_FLOAT})

LOWERINGS = {
    **{name: _direct(method) for name, method in DIRECT.items()},
    **{name: wasm_nans(lower) for name, lower in PLAIN_FLOAT.items()},
    "arith.shl": lower_shift, "arith.shr_s": lower_shift, "arith.shr_u": lower_shift,
    "arith.rotl": lower_rotate, "arith.rotr": lower_rotate,
    "arith.clz": lower_bit_count, "arith.ctz": lower_bit_count, "arith.popcnt": lower_bit_count,
    "arith.div_s": lower_division, "arith.div_u": lower_division,
    "arith.rem_s": lower_division, "arith.rem_u": lower_division,
    "arith.fabs": lower_sign_bit_op, "arith.fneg": lower_sign_bit_op,
    "arith.fcopysign": lower_sign_bit_op,
    "arith.fmin": wasm_nans(lower_min_max, last_nan_wins=True),
    "arith.fmax": wasm_nans(lower_min_max, last_nan_wins=True),
    "arith.cmpi": lower_cmpi, "arith.cmpf": lower_cmpf,
    "arith.select": lower_select, "arith.sext_inreg": lower_sext_inreg,
}  # fmt: skip
