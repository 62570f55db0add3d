"""WebAssembly text that uses each SIMD opcode row once, for the coverage and PTX tests."""

from __future__ import annotations

from tensorwasm.compiler.frontend.opcodes import OPCODES, Feature, Imm, Opcode

SIMD_ROWS = [op for op in OPCODES if op.feature is Feature.SIMD]
# The test function's parameters: one of each scalar type, then three vectors.
PARAMS = "(param i32 i64 f32 f64 v128 v128 v128)"
_SCALAR_PARAM = {"i32": 0, "i64": 1, "f32": 2, "f64": 3}
# A shuffle that takes bytes of both operands.
_SHUFFLE = " ".join(str(i) for i in (0, 17, 2, 19, 4, 21, 6, 23, 31, 30, 29, 28, 11, 10, 9, 8))
IMM_TEXT = {Imm.LANE: " 1", Imm.SHUFFLE: f" {_SHUFFLE}", Imm.V128: " i32x4 1 -2 0x7fc00001 4",
             Imm.MEMARG_LANE: " offset=3 1", Imm.MEMARG: " offset=5 align=1"}  # fmt: skip


def simd_snippet(op: Opcode) -> str:
    """The instructions that push ``op``'s operands, run it and drop its results."""
    vectors = iter((4, 5, 6))
    pushes = [f"local.get {next(vectors) if t == 'v128' else _SCALAR_PARAM[t]}" for t in op.operand_types]
    drops = " drop" * len(op.result_types)
    return f"{' '.join(pushes)} {op.name}{IMM_TEXT.get(op.imm, '')}{drops}"


def simd_module_wat(rows: list[Opcode] = SIMD_ROWS) -> str:
    """A module with one exported function per row (``f<sub-opcode>``), each returning a v128."""
    funcs = "\n".join(
        f'  (func (export "f{op.code[1]}") {PARAMS} (result v128) {simd_snippet(op)} local.get 4)'
        for op in rows
    )
    return f"(module (memory 1)\n{funcs})"
