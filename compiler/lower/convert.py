"""Conversions between number types.

Float-to-int is where Wasm and LLVM disagree most: LLVM's fptosi/fptoui give poison for NaN
and out-of-range inputs, Wasm traps (``trunc``) or saturates (``trunc_sat``). Both helpers
test the input against the exact bounds of the target range first; the bounds are floats
of the source type, exclusive where the neighbouring integer is representable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from tensorwasm.compiler.lower.numeric import wasm_nans
from tensorwasm.compiler.traps import TrapKind
from tensorwasm.dialect.ir import Op

if TYPE_CHECKING:
    from tensorwasm.compiler.lower.function import FunctionLowering


def float_bounds(src: ir.Type, bits: int, signed: bool) -> tuple[float, bool, float]:
    """(low, low_inclusive, high) such that trunc(x) fits iff low <(=) x < high."""
    mantissa = 24 if isinstance(src, ir.FloatType) else 53
    if not signed:
        return -1.0, False, float(2**bits)
    low = -(2 ** (bits - 1))
    # low - 1 is representable (so the test can be exclusive) only when it fits the mantissa.
    if bits - 1 < mantissa:
        return float(low - 1), False, float(2 ** (bits - 1))
    return float(low), True, float(2 ** (bits - 1))


def _in_range_tests(fl: FunctionLowering, x: ir.Value, bits: int, signed: bool):
    low, inclusive, high = float_bounds(x.type, bits, signed)
    b = fl.b
    above_low = b.fcmp_ordered(">=" if inclusive else ">", x, ir.Constant(x.type, low))
    below_high = b.fcmp_ordered("<", x, ir.Constant(x.type, high))
    return above_low, below_high


def lower_trapping_truncation(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Wasm trunc: NaN traps as an invalid conversion, out of range as integer overflow."""
    (x,) = args
    b = fl.b
    to = fl.llvm_type(op.attrs["to"])
    signed = op.name == "arith.fptosi"
    fl.env.trap_if(b.fcmp_unordered("uno", x, x), TrapKind.BAD_CONVERSION_TO_INTEGER)
    above_low, below_high = _in_range_tests(fl, x, to.width, signed)
    fl.env.trap_if(b.not_(b.and_(above_low, below_high)), TrapKind.INTEGER_OVERFLOW)
    return b.fptosi(x, to) if signed else b.fptoui(x, to)


def lower_saturating_truncation(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Wasm trunc_sat: NaN gives 0, values below/above the range give its MIN/MAX."""
    (x,) = args
    b = fl.b
    to = fl.llvm_type(op.attrs["to"])
    signed = op.name == "arith.fptosi_sat"
    above_low, below_high = _in_range_tests(fl, x, to.width, signed)
    in_range = b.and_(above_low, below_high)
    # Convert a value known to be in range, so the conversion itself is always defined.
    safe = b.select(in_range, x, ir.Constant(x.type, 0.0))
    converted = b.fptosi(safe, to) if signed else b.fptoui(safe, to)
    lo = ir.Constant(to, (1 << (to.width - 1)) if signed else 0)
    hi = ir.Constant(to, ((1 << (to.width - 1)) - 1) if signed else (1 << to.width) - 1)
    is_nan = b.fcmp_unordered("uno", x, x)
    saturated = b.select(above_low, hi, lo)
    result = b.select(in_range, converted, saturated)
    return b.select(is_nan, ir.Constant(to, 0), result)


def _cast(method: str):
    def lower(fl: FunctionLowering, op: Op, args) -> ir.Value:
        return getattr(fl.b, method)(args[0], fl.llvm_type(op.attrs["to"]))

    return lower


def lower_bitcast(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Reinterpretation is free, but float-to-int goes through the target so an integer use
    of a float result is never mistaken for a conversion (see NVPTXTarget.float_bits)."""
    (x,) = args
    to = fl.llvm_type(op.attrs["to"])
    if isinstance(to, ir.IntType):
        return fl.target.float_bits(fl.b, x, to)
    return fl.b.bitcast(x, to)


# int<->int, int->float (round to nearest even, as Wasm) and bit casts agree; f32<->f64
# agree but for the NaN they return (LLVM folds a promotion and demotion pair away).
LOWERINGS = {
    "arith.trunc": _cast("trunc"),
    "arith.zext": _cast("zext"),
    "arith.sext": _cast("sext"),
    "arith.sitofp": _cast("sitofp"),
    "arith.uitofp": _cast("uitofp"),
    "arith.fptrunc": wasm_nans(_cast("fptrunc")),
    "arith.fpext": wasm_nans(_cast("fpext")),
    "arith.bitcast": lower_bitcast,
    "arith.fptosi": lower_trapping_truncation,
    "arith.fptoui": lower_trapping_truncation,
    "arith.fptosi_sat": lower_saturating_truncation,
    "arith.fptoui_sat": lower_saturating_truncation,
}
