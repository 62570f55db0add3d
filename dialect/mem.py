"""The ``mem`` dialect: linear memory access.

Addresses are Wasm's: an ``i32`` byte offset into linear memory plus the static
``offset`` attribute, computed without wrapping (33 bits). Every access checks the whole
accessed range against the current memory size and traps when it leaves it; memory is
little-endian and accesses may be unaligned (``align`` is a hint, log2 bytes).
"""

from __future__ import annotations

from tensorwasm.dialect.opdef import INTS, NUMBERS, Custom, Dialect, Fixed
from tensorwasm.dialect.types import I32, V128

_WIDTHS = {8, 16, 32, 64, 128}
# What may be loaded and stored: the numbers, and a whole v128.
_VALUES = (*NUMBERS, V128)


def _check_memarg(op, attrs, bits):
    if bits not in _WIDTHS:
        raise op.fail(f"access width {bits} is not 8, 16, 32, 64 or 128")
    offset = attrs.get("offset", 0)
    if not isinstance(offset, int) or not 0 <= offset < (1 << 32):
        raise op.fail(f"offset {offset!r} is not a u32")


def _load(op, operands, attrs):
    op.expect_count(operands, 1)
    if operands[0] is not I32:
        raise op.fail(f"address must be i32, got {operands[0]}")
    ty, bits = attrs.get("type"), attrs.get("bits")
    if ty not in _VALUES:
        raise op.fail(f"cannot load a {ty}")
    _check_memarg(op, attrs, bits)
    if bits > ty.bits or (bits < ty.bits and ty not in INTS):
        raise op.fail(f"cannot load {bits} bits into {ty}")
    return (ty,)


def _store(op, operands, attrs):
    op.expect_count(operands, 2)
    addr, value = operands
    if addr is not I32:
        raise op.fail(f"address must be i32, got {addr}")
    if value not in _VALUES:
        raise op.fail(f"cannot store a {value}")
    bits = attrs.get("bits")
    _check_memarg(op, attrs, bits)
    if bits > value.bits or (bits < value.bits and value not in INTS):
        raise op.fail(f"cannot store {bits} bits of {value}")
    return ()


load = Custom(
    "mem.load",
    "Load ``bits`` bits at address + ``offset``, extended per ``signed``. "
    "`%1 = mem.load %0 {offset = 8, bits = 8, signed = true} : i32`",
    _load,
)
store = Custom(
    "mem.store",
    "Store the low ``bits`` bits of a value. `mem.store %0, %1 {offset = 4, bits = 32} : f32`",
    _store,
)
size = Fixed("mem.size", "Current size in 64 KiB pages. `%0 = mem.size : i32`", (), (I32,))
grow = Fixed(
    "mem.grow",
    "Grow by a number of pages; the old size, or -1 when it cannot. `%1 = mem.grow %0 : i32`",
    (I32,),
    (I32,),
)
copy = Fixed(
    "mem.copy", "`mem.copy %dst, %src, %n`: memmove within memory; traps out of bounds.", (I32,) * 3, ()
)
fill = Fixed("mem.fill", "`mem.fill %dst, %byte, %n`: memset; traps out of bounds.", (I32,) * 3, ())
init = Fixed(
    "mem.init",
    "`mem.init %dst, %src, %n {data = 1}`: copy from a passive data segment.",
    (I32,) * 3,
    (),
)
data_drop = Fixed("mem.data_drop", "`mem.data_drop {data = 1}`: forget a passive segment.", (), ())

MEM = Dialect("mem", [load, store, size, grow, copy, fill, init, data_drop])
