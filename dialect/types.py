"""The dialect's value types.

Scalars mirror Wasm's number types, ``i1`` is the result of comparisons and the
condition of branches, ``v128`` is SIMD's 128-bit vector (its lanes are the ops' business),
``ptr`` is a device or host address used by later stages (kernel parameters, memory
bases), and the two reference types mirror Wasm's.
Types are interned singletons: compare them with ``is``.
"""

from __future__ import annotations


class Type:
    """A dialect type; one instance per type."""

    __slots__ = ("bits", "is_float", "is_int", "is_ref", "name")

    def __init__(self, name: str, bits: int, *, is_int=False, is_float=False, is_ref=False):
        self.name = name
        self.bits = bits
        self.is_int = is_int
        self.is_float = is_float
        self.is_ref = is_ref

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    def __reduce__(self):
        return (by_name, (self.name,))


I1 = Type("i1", 1, is_int=True)
I32 = Type("i32", 32, is_int=True)
I64 = Type("i64", 64, is_int=True)
F32 = Type("f32", 32, is_float=True)
F64 = Type("f64", 64, is_float=True)
PTR = Type("ptr", 64)
FUNCREF = Type("funcref", 64, is_ref=True)
EXTERNREF = Type("externref", 64, is_ref=True)
V128 = Type("v128", 128)

ALL = (I1, I32, I64, F32, F64, PTR, FUNCREF, EXTERNREF, V128)
_BY_NAME = {t.name: t for t in ALL}
WASM_INTS = (I32, I64)
WASM_FLOATS = (F32, F64)


def by_name(name: str) -> Type:
    """The type called ``name`` (``"i32"``...); KeyError for an unknown name."""
    return _BY_NAME[name]
