"""Every opcode row decodes, prints and translates, or is refused by design."""

from __future__ import annotations

import pytest

from tensorwasm.compiler.errors import UnsupportedFeature
from tensorwasm.compiler.frontend import load
from tensorwasm.compiler.frontend.decoder import decode
from tensorwasm.compiler.frontend.opcodes import OPCODES, PREFIX_MISC, PREFIX_SIMD, Feature, Imm, Opcode
from tensorwasm.compiler.frontend.printer import print_module
from tensorwasm.compiler.frontend.translate import HANDLERS, mapping, translate_module
from tensorwasm.dialect.types import V128
from tests.compiler.simd_snippets import PARAMS as SIMD_PARAMS
from tests.compiler.simd_snippets import simd_snippet
from tests.conftest import wat
from tests.wasmbin import module_with_body, uleb

PRELUDE = """
  (type $t (func (param i32) (result i32)))
  (type $mv (func (param i32) (result i32 i32)))
  (func $callee (type $t) local.get 0)
  (table $tab 2 funcref)
  (memory 1)
  (global $g (mut i32) (i32.const 0))
  (data $d "abc")
  (elem $e func $callee)
"""
PARAM_OF = {"i32": 0, "i64": 1, "f32": 2, "f64": 3}
IMM_TEXT = {Imm.I32: " 7", Imm.I64: " -7", Imm.F32: " 1.5", Imm.F64: " -2.5"}

# Snippets for rows whose stack effect depends on immediates or context.
SPECIAL = {
    "unreachable": "block unreachable end",
    "nop": "nop",
    "block": "block (result i32) i32.const 1 end drop",
    "loop": "loop $l local.get 0 i32.eqz br_if $l end",
    "if": "local.get 0 if (result i32) i32.const 1 else i32.const 2 end drop",
    "else": "local.get 0 if nop else nop end",
    "end": "block end",
    "br": "block br 0 end",
    "br_if": "block local.get 0 br_if 0 end",
    "br_table": "block block local.get 0 br_table 0 1 end end",
    "return": "i32.const 0 return",
    "call": "i32.const 1 call $callee drop",
    "call_indirect": "i32.const 1 i32.const 0 call_indirect (type $t) drop",
    "drop": "i32.const 1 drop",
    "select": "i32.const 1 i32.const 2 local.get 0 select drop",
    "select_t": "i32.const 1 i32.const 2 local.get 0 select (result i32) drop",
    "local.get": "local.get 0 drop",
    "local.set": "i32.const 3 local.set 0",
    "local.tee": "i32.const 3 local.tee 0 drop",
    "global.get": "global.get $g drop",
    "global.set": "i32.const 1 global.set $g",
    "table.get": "i32.const 0 table.get $tab drop",
    "table.set": "i32.const 0 ref.null func table.set $tab",
    "table.size": "table.size $tab drop",
    "table.grow": "ref.null func i32.const 1 table.grow $tab drop",
    "table.fill": "i32.const 0 ref.null func i32.const 1 table.fill $tab",
    "table.copy": "i32.const 0 i32.const 1 i32.const 1 table.copy",
    "table.init": "i32.const 0 i32.const 0 i32.const 1 table.init $e",
    "elem.drop": "elem.drop $e",
    "ref.null": "ref.null func drop",
    "ref.is_null": "ref.null extern ref.is_null drop",
    "ref.func": "ref.func $callee drop",
    "memory.size": "memory.size drop",
    "memory.grow": "i32.const 1 memory.grow drop",
    "memory.fill": "i32.const 0 i32.const 7 i32.const 4 memory.fill",
    "memory.copy": "i32.const 0 i32.const 4 i32.const 4 memory.copy",
    "memory.init": "i32.const 0 i32.const 0 i32.const 3 memory.init $d",
    "data.drop": "data.drop $d",
}

SUPPORTED = [op for op in OPCODES if op.supported]
UNSUPPORTED = [op for op in OPCODES if not op.supported]


def snippet(op: Opcode) -> str:
    if op.name in SPECIAL:
        return SPECIAL[op.name]
    if op.dialect == "mem.load":
        return f"i32.const 0 {op.name} drop"
    if op.dialect == "mem.store":
        return f"i32.const 0 local.get {PARAM_OF[op.operand_types[1]]} {op.name}"
    pushes = " ".join(f"local.get {PARAM_OF[t]}" for t in op.operand_types)
    drops = " drop" * len(op.result_types)
    return f"{pushes} {op.name}{IMM_TEXT.get(op.imm, '')}{drops}"


def module_for(op: Opcode) -> bytes:
    if op.feature is Feature.SIMD:  # assembled by name: the decoder must find this very row
        params, body = SIMD_PARAMS, simd_snippet(op)
    else:
        params, body = "(param i32 i64 f32 f64)", snippet(op)
    return wat(f'(module {PRELUDE} (func $test (export "test") {params} (result i32) {body} i32.const 0))')


@pytest.mark.parametrize("op", SUPPORTED, ids=lambda op: op.name)
def test_supported_row_decodes_prints_and_translates(op: Opcode) -> None:
    data = module_for(op)
    module = load(data)
    body = module.codes[-1].body
    assert any(instr.op is op for instr in body), f"{op.name} not decoded from its own snippet"
    listing = print_module(module)
    assert f" {op.name}" in listing
    translated = translate_module(module)  # verifies every function
    assert translated.function("test").blocks
    assert mapping(op.name)
    if op.name != "loop":
        assert op in HANDLERS


def test_every_supported_row_has_a_handler_and_every_dialect_name_exists() -> None:
    from tensorwasm import dialect

    for op in SUPPORTED:
        assert op.name == "loop" or op in HANDLERS, op.name
        if op.dialect is not None:
            assert op.dialect.split()[0] in dialect.OPS, op.dialect


def _bytes_of(op: Opcode) -> bytes:
    if isinstance(op.code, tuple):
        prefix, sub = op.code
        return bytes([prefix]) + uleb(max(sub, 0))
    return bytes([op.code])


@pytest.mark.parametrize("op", UNSUPPORTED, ids=lambda op: op.name)
def test_unsupported_row_is_reported_with_its_proposal(op: Opcode) -> None:
    # The opcode followed by bytes that would misdecode as something else if read on.
    code = _bytes_of(op) + b"\x00\x00\x00\x0b"
    data = module_with_body(code)
    with pytest.raises(UnsupportedFeature) as info:
        decode(data)
    message = str(info.value)
    assert op.feature.value in message
    assert "function 0" in message
    assert f"offset 0x{len(data) - len(code):x}" in message


def test_simd_value_type_decodes_as_v128() -> None:
    module = decode(wat("(module (func (param v128) (result v128) local.get 0))"))
    assert module.types[0].params == (V128,) and module.types[0].results == (V128,)


def test_simd_rows_cover_the_proposal() -> None:
    """236 opcodes, the holes of the sub-opcode numbering being those the proposal dropped."""
    subs = sorted(op.code[1] for op in OPCODES if isinstance(op.code, tuple) and op.code[0] == PREFIX_SIMD)
    assert len(subs) == 236
    assert set(range(256)) - set(subs) == {154, 162, 165, 166, 175, 176, 178, 179, 180, 187, 194, 197, 198,
                                            207, 208, 210, 211, 212, 226, 238}  # fmt: skip


def test_unknown_simd_opcode_is_a_decode_error() -> None:
    from tensorwasm.compiler.errors import DecodeError

    with pytest.raises(DecodeError, match="unknown opcode 0xfd 154"):
        decode(module_with_body(bytes([PREFIX_SIMD]) + uleb(154) + b"\x0b"))


def test_shared_memory_is_threads() -> None:
    data = wat("(module (memory 1 1 shared))")
    with pytest.raises(UnsupportedFeature, match="threads"):
        decode(data)


def test_misc_prefix_rows_are_contiguous() -> None:
    subs = sorted(op.code[1] for op in OPCODES if isinstance(op.code, tuple) and op.code[0] == PREFIX_MISC)
    assert subs == list(range(18))
