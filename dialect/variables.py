"""The ``global``, ``table`` and ``ref`` dialects: module-level state other than memory.

Globals are addressed by index and carry their type as an attribute, so an op can be
checked without the module at hand; tables hold references (``funcref``/``externref``).
"""

from __future__ import annotations

from tensorwasm.dialect.opdef import Custom, Dialect, Fixed
from tensorwasm.dialect.types import FUNCREF, I1, I32


def _global_get(op, operands, attrs):
    op.expect_count(operands, 0)
    return (attrs["type"],)


def _global_set(op, operands, attrs):
    op.expect_count(operands, 1)
    if operands[0] is not attrs["type"]:
        raise op.fail(f"cannot set a {attrs['type']} global to a {operands[0]}")
    return ()


def _ref_typed(shape):
    """A table/ref op whose operands follow ``shape``; 'r' stands for the reference type."""

    def rule(op, operands, attrs):
        ref = attrs["type"]
        expected = tuple(ref if s == "r" else I32 for s in shape[0])
        if tuple(operands) != expected:
            raise op.fail(f"expects ({', '.join(map(str, expected))})")
        return tuple(ref if s == "r" else (I1 if s == "b" else I32) for s in shape[1])

    return rule


global_get = Custom("global.get", "`%0 = global.get {index = 0} : i32`", _global_get, pure=True)
global_set = Custom("global.set", "`global.set %0 {index = 0} : i32`", _global_set)

table_get = Custom("table.get", "`%r = table.get %i {table = 0} : funcref`; traps out of range.",
                   _ref_typed(("i", "r")))  # fmt: skip
table_set = Custom("table.set", "`table.set %i, %r {table = 0}`; traps out of range.",
                   _ref_typed(("ir", "")))  # fmt: skip
table_size = Custom("table.size", "`%n = table.size {table = 0}`", _ref_typed(("", "i")))
table_grow = Custom("table.grow", "`%old = table.grow %init, %n {table = 0}`; -1 on failure.",
                    _ref_typed(("ri", "i")))  # fmt: skip
table_fill = Custom("table.fill", "`table.fill %i, %r, %n {table = 0}`", _ref_typed(("iri", "")))
table_copy = Fixed("table.copy", "`table.copy %d, %s, %n {dst = 0, src = 1}`", (I32,) * 3, ())
table_init = Fixed("table.init", "`table.init %d, %s, %n {elem = 0, table = 0}`", (I32,) * 3, ())
elem_drop = Fixed("table.elem_drop", "`table.elem_drop {elem = 0}`", (), ())

ref_null = Custom("ref.null", "`%r = ref.null : funcref`", _ref_typed(("", "r")), pure=True)
ref_is_null = Custom("ref.is_null", "`%b = ref.is_null %r : funcref` gives an i1.",
                     _ref_typed(("r", "b")), pure=True)  # fmt: skip
ref_func = Fixed("ref.func", "`%r = ref.func {func = 3}`", (), (FUNCREF,), pure=True)

GLOBAL = Dialect("global", [global_get, global_set])
TABLE = Dialect(
    "table", [table_get, table_set, table_size, table_grow, table_fill, table_copy, table_init,
              elem_drop]
)  # fmt: skip
REF = Dialect("ref", [ref_null, ref_is_null, ref_func])
