"""Edge values and a module with one exported function per scalar Wasm op, for the
differential tests of every backend against wasmtime."""

from __future__ import annotations

import itertools
import struct

from tensorwasm.compiler.frontend.opcodes import Opcode
from tensorwasm.dialect.types import F32, F64, I32, I64, by_name
from tensorwasm.oracle.compare import same_value
from tensorwasm.oracle.generators import numeric_ops


def f32(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f64(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


EDGES = {
    I32: [0, 1, 2, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x80000001, 0xFFFFFFFE, 16, 31, 32, 33,
          0x12345678, 0x00010000, 0xFFFF8000],
    I64: [0, 1, 2, (1 << 64) - 1, 1 << 63, (1 << 63) - 1, (1 << 63) + 1, 31, 32, 63, 64, 65,
          0x123456789ABCDEF0, 0xFFFFFFFF, 0x80000000, 1 << 32],
    F32: [f32(0.0), f32(-0.0), f32(1.0), f32(-1.0), f32(0.5), f32(1.5), f32(2.5), f32(-2.5), f32(-0.9),
          0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FA00000, 0x7FC00001, 0x00000001,
          0x007FFFFF, 0x00800000, 0x7F7FFFFF, f32(2.0**31), f32(-(2.0**31)), 0x4EFFFFFF, f32(2.0**32),
          f32(2.0**63), f32(-(2.0**63)), f32(2.0**64), f32(4294967040.0), f32(3.0e9)],
    F64: [f64(0.0), f64(-0.0), f64(1.0), f64(-1.0), f64(0.5), f64(1.5), f64(2.5), f64(-2.5), f64(-0.9),
          0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000, 0xFFF8000000000000,
          0x7FF4000000000000, 0x7FF8000000000001, 1, 0x000FFFFFFFFFFFFF, 0x0010000000000000,
          0x7FEFFFFFFFFFFFFF, f64(2.0**31), f64(-(2.0**31)), f64(2147483647.9), f64(-2147483648.9),
          f64(2.0**32), f64(4294967295.5), f64(2.0**63), f64(-(2.0**63)), f64(2.0**64), f64(-1.5e300)],
}  # fmt: skip

# Ops whose NaN results Wasm fixes to the bit (no NaN canonicalisation allowed).
BIT_EXACT = ("abs", "neg", "copysign", "reinterpret")

# Float expressions that are the identity or a negation in real arithmetic, which LLVM
# folds to their operand; Wasm still requires their NaN results to be arithmetic NaNs
# (quiet bit set), so a signalling NaN operand must come back quieted.
FOLDABLE = {
    "mul_one": "({t}.mul (local.get 0) ({t}.const 1))",
    "sub_zero": "({t}.sub (local.get 0) ({t}.const 0))",
    "div_one": "({t}.div (local.get 0) ({t}.const 1))",
    "div_minus_one": "({t}.div (local.get 0) ({t}.const -1))",
    "minus_zero_sub": "({t}.sub ({t}.const -0) (local.get 0))",
    "minus_one_mul": "({t}.mul ({t}.const -1) (local.get 0))",
}
FOLDABLE_F32_ONLY = {"demote_promote": "(f32.demote_f64 (f64.promote_f32 (local.get 0)))"}


def foldable_exports() -> list[tuple[str, object]]:
    """The export name and parameter type of every foldable expression."""
    names = [(f"{t.name}_{name}", t) for t in (F32, F64) for name in FOLDABLE]
    return names + [(f"f32_{name}", F32) for name in FOLDABLE_F32_ONLY]


def foldable_module_wat() -> str:
    funcs = [
        f'(func (export "{t}_{name}") (param {t}) (result {t}) {body.format(t=t)})'
        for t in ("f32", "f64")
        for name, body in FOLDABLE.items()
    ]
    funcs += [
        f'(func (export "f32_{name}") (param f32) (result f32) {body})'
        for name, body in FOLDABLE_F32_ONLY.items()
    ]
    return "(module\n" + "\n".join(funcs) + ")"


def export_name(op: Opcode) -> str:
    return op.name.replace(".", "_")


def numeric_module_wat() -> str:
    funcs = []
    for op in numeric_ops():
        params = " ".join(op.operand_types)
        gets = " ".join(f"local.get {i}" for i in range(len(op.operand_types)))
        funcs.append(
            f'(func (export "{export_name(op)}") (param {params}) (result {op.result_types[0]}) {gets} {op.name})'
        )
    return "(module\n" + "\n".join(funcs) + ")"


def cases(op: Opcode) -> list[list[tuple]]:
    types = [by_name(t) for t in op.operand_types]
    pools = [[(t, v) for v in EDGES[t]] for t in types]
    return [list(args) for args in itertools.product(*pools)]


def same_result(name: str, expected, actual) -> bool:
    """Results equal bit for bit, except that where the op ``name`` computes its result by
    float arithmetic, a NaN is judged by Wasm's rules against wasmtime's (canonical where
    wasmtime's is canonical, else arithmetic: see ``oracle.compare.same_value``)."""
    if expected.trap or actual.trap or expected.error or actual.error:
        return (expected.trap, expected.error) == (actual.trap, actual.error)
    if len(expected.values) != len(actual.values):
        return False
    exact = any(k in name for k in BIT_EXACT)
    return all(same_value(w, g, exact) for w, g in zip(expected.values, actual.values, strict=True))
