"""The ``simd`` dialect: Wasm's fixed-width SIMD on the 128-bit ``v128`` type.

A handful of op shapes carry every SIMD operation: the Wasm name of the operation is the
``op`` attribute (``simd.binary {op = i32x4.add}``), and its lane shape, the part before
the dot, says how the 128 bits divide (``i8x16`` ... ``f64x2``; ``v128`` for bitwise ops).
So the dialect stays small while the lowering keeps one table keyed by those names, with
Wasm's semantics per lane: NaN rules, saturation, shift counts modulo the lane width and
out-of-range swizzle indices giving 0. Memory goes through ``mem.load``/``mem.store``
(a whole ``v128``, or a scalar combined with the ops below), constants through
``arith.constant`` (a 128-bit pattern, lane 0 in the low bits).
"""

from __future__ import annotations

from tensorwasm.dialect.opdef import Custom, Dialect
from tensorwasm.dialect.types import F32, F64, I32, I64, V128, Type

# Lane shape -> (lane count, lane bits, the scalar type a lane is read and written as).
SHAPES: dict[str, tuple[int, int, Type]] = {
    "i8x16": (16, 8, I32), "i16x8": (8, 16, I32), "i32x4": (4, 32, I32), "i64x2": (2, 64, I64),
    "f32x4": (4, 32, F32), "f64x2": (2, 64, F64), "v128": (1, 128, V128),
}  # fmt: skip


def shape_of(op, attrs) -> tuple[int, int, Type]:
    """The lane shape the ``op`` attribute names; an IRTypeError for anything else."""
    name = attrs.get("op")
    shape = SHAPES.get(name.split(".", 1)[0]) if isinstance(name, str) else None
    if shape is None or "." not in name:
        raise op.fail(f"op {name!r} does not name a SIMD operation (shape.operation)")
    return shape


def _signature(operands: tuple[Type, ...], results: tuple[Type, ...]):
    def rule(op, given, attrs):
        shape_of(op, attrs)
        if tuple(given) != operands:
            names = ", ".join(t.name for t in operands)
            raise op.fail(f"{attrs['op']} expects ({names}), got ({', '.join(t.name for t in given)})")
        return results

    return rule


def _lane_rule(takes_scalar: bool, gives_scalar: bool):
    def rule(op, given, attrs):
        count, _, scalar = shape_of(op, attrs)
        lane = attrs.get("lane")
        if not isinstance(lane, int) or not 0 <= lane < count:
            raise op.fail(f"lane {lane!r} is not below {count}")
        want = (V128, scalar) if takes_scalar else (V128,)
        if tuple(given) != want:
            raise op.fail(f"{attrs['op']} expects ({', '.join(t.name for t in want)})")
        return (scalar,) if gives_scalar else (V128,)

    return rule


def _splat(op, given, attrs):
    _, _, scalar = shape_of(op, attrs)
    if tuple(given) != (scalar,):
        raise op.fail(f"{attrs['op']} splats a {scalar}, got ({', '.join(t.name for t in given)})")
    return (V128,)


def _shuffle(op, given, attrs):
    lanes = attrs.get("lanes")
    if not (
        isinstance(lanes, tuple)
        and len(lanes) == 16
        and all(isinstance(i, int) and 0 <= i < 32 for i in lanes)
    ):
        raise op.fail(f"lanes {lanes!r} are not 16 byte indices below 32")
    if tuple(given) != (V128, V128):
        raise op.fail("takes two v128 operands")
    return (V128,)


splat = Custom(
    "simd.splat",
    "Every lane set to a scalar (i8x16/i16x8 keep its low bits). `%1 = simd.splat %0 {op = f32x4.splat}`",
    _splat,
    pure=True,
)
extract_lane = Custom(
    "simd.extract_lane",
    "One lane as a scalar, narrow lanes extended per the op's _s/_u. "
    "`%1 = simd.extract_lane %0 {op = i8x16.extract_lane_s, lane = 3}`",
    _lane_rule(False, True),
    pure=True,
)
replace_lane = Custom(
    "simd.replace_lane",
    "The vector with one lane replaced. `%2 = simd.replace_lane %0, %1 {op = i32x4.replace_lane, lane = 1}`",
    _lane_rule(True, False),
    pure=True,
)
shuffle = Custom(
    "simd.shuffle",
    "Bytes picked from the 32 of two vectors by constant indices. `%2 = simd.shuffle %0, %1 {lanes = (...)}`",
    _shuffle,
    pure=True,
)
unary = Custom(
    "simd.unary",
    "A lane-wise operation or conversion of one vector. `%1 = simd.unary %0 {op = f32x4.sqrt}`",
    _signature((V128,), (V128,)),
    pure=True,
)
binary = Custom(
    "simd.binary",
    "A lane-wise operation of two vectors (comparisons give all-ones lanes). "
    "`%2 = simd.binary %0, %1 {op = i16x8.add_sat_s}`",
    _signature((V128, V128), (V128,)),
    pure=True,
)
bitselect = Custom(
    "simd.bitselect",
    "Bits of the first where the third has ones, of the second elsewhere. "
    "`%3 = simd.bitselect %0, %1, %2 {op = v128.bitselect}`",
    _signature((V128, V128, V128), (V128,)),
    pure=True,
)
shift = Custom(
    "simd.shift",
    "Each lane shifted by an i32 count taken modulo the lane width. `simd.shift %0, %1 {op = i32x4.shr_s}`",
    _signature((V128, I32), (V128,)),
    pure=True,
)
test = Custom(
    "simd.test",
    "A vector summarised as an i32: any_true, all_true, bitmask. `%1 = simd.test %0 {op = i8x16.bitmask}`",
    _signature((V128,), (I32,)),
    pure=True,
)

SIMD = Dialect("simd", [splat, extract_lane, replace_lane, shuffle, unary, binary, bitselect, shift, test])
