"""Dialect types as LLVM types, and the bit-pattern conversions every family needs."""

from __future__ import annotations

from llvmlite import ir

from tensorwasm.dialect.types import EXTERNREF, F32, F64, FUNCREF, I1, I32, I64, PTR, V128, Type

I1_T = ir.IntType(1)
I8_T = ir.IntType(8)
I16_T = ir.IntType(16)
I32_T = ir.IntType(32)
I64_T = ir.IntType(64)
F32_T = ir.FloatType()
F64_T = ir.DoubleType()
PTR_T = ir.PointerType()
VOID_T = ir.VoidType()
I128_T = ir.IntType(128)
# A v128 travels as two i64 lanes (phis, calls, selects, memory); each SIMD op bitcasts it
# to the lane shape it works on. Two 64-bit halves are also how it crosses the 64-bit slots
# of arguments, results and globals (see to_slots).
V128_T = ir.VectorType(I64_T, 2)

LLVM_TYPES: dict[Type, ir.Type] = {
    I1: I1_T, I32: I32_T, I64: I64_T, F32: F32_T, F64: F64_T, PTR: PTR_T,
    FUNCREF: I64_T, EXTERNREF: I64_T, V128: V128_T,
}  # fmt: skip
INT_OF_WIDTH = {1: I1_T, 8: I8_T, 16: I16_T, 32: I32_T, 64: I64_T, 128: I128_T}


def llvm_type(ty: Type) -> ir.Type:
    return LLVM_TYPES[ty]


def int_of(ty: ir.Type) -> ir.IntType:
    """The integer type of the same width as a float type (or the type itself)."""
    if isinstance(ty, ir.FloatType):
        return I32_T
    if isinstance(ty, ir.DoubleType):
        return I64_T
    if isinstance(ty, ir.VectorType):
        return I128_T
    return ty


def constant(ty: Type, bits: int) -> ir.Constant:
    """A constant from its bit pattern; floats through a bitcast so NaN payloads survive."""
    lt = LLVM_TYPES[ty]
    if ty is V128:
        return ir.Constant(lt, [ir.Constant(I64_T, bits & (2**64 - 1)), ir.Constant(I64_T, bits >> 64)])
    if ty is F32 or ty is F64:
        return ir.Constant(int_of(lt), bits).bitcast(lt)
    return ir.Constant(lt, bits)


def slot_count(ty: Type) -> int:
    """How many 64-bit slots a value of dialect type ``ty`` takes (a v128: two, low half first)."""
    return 2 if ty is V128 else 1


def to_slots(b: ir.IRBuilder, value: ir.Value) -> list[ir.Value]:
    """A value as the 64-bit slots that hold its bits: a v128 as its two halves."""
    if isinstance(value.type, ir.VectorType):
        return [b.extract_element(value, ir.Constant(I32_T, i)) for i in range(2)]
    return [to_slot(b, value)]


def from_slots(b: ir.IRBuilder, slots: list[ir.Value], ty: ir.Type) -> ir.Value:
    """The value of type ``ty`` held in ``slots`` (see :func:`to_slots`)."""
    if isinstance(ty, ir.VectorType):
        vector = ir.Constant(ty, None)
        for i, half in enumerate(slots):
            vector = b.insert_element(vector, half, ir.Constant(I32_T, i))
        return vector
    return from_slot(b, slots[0], ty)


def to_slot(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """A value as the 64-bit slot that holds its bit pattern (args, results, globals)."""
    ty = value.type
    if isinstance(ty, (ir.FloatType, ir.DoubleType)):
        value = b.bitcast(value, int_of(ty))
        ty = value.type
    if ty.width < 64:
        value = b.zext(value, I64_T)
    return value


def from_slot(b: ir.IRBuilder, slot: ir.Value, ty: ir.Type) -> ir.Value:
    """The value of type ``ty`` held in a 64-bit slot."""
    bits = int_of(ty)
    value = slot if bits.width == 64 else b.trunc(slot, bits)
    return b.bitcast(value, ty) if bits is not ty else value
