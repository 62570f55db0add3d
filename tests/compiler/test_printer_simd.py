"""``inspect --stage wasm`` prints SIMD immediates as WAT writes them: ``v128.const i32x4``
with four hex lanes, a lane op's memarg before its lane, shuffles' 16 lanes; the printed
instructions assemble back to the same instructions."""

from __future__ import annotations

import re

import wasmtime

from tensorwasm.compiler.frontend import decode
from tensorwasm.compiler.frontend.printer import print_module

BODY = """
    (drop (v128.const i32x4 1 2 3 0xffffffff))
    (drop (v128.const i64x2 0x8000000000000000 -1))
    (drop (v128.load8_lane offset=4 align=1 3 (local.get 0) (local.get 1)))
    (drop (v128.load32_lane 2 (local.get 0) (local.get 1)))
    (v128.store64_lane offset=65536 align=4 1 (local.get 0) (local.get 1))
    (v128.store16_lane 7 (local.get 0) (local.get 1))
    (drop (v128.load offset=16 (local.get 0)))
    (drop (v128.load32_zero align=2 (local.get 0)))
    (drop (i8x16.extract_lane_u 15 (local.get 1)))
    (i8x16.shuffle 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 31 (local.get 1)
      (i16x8.replace_lane 7 (local.get 1) (i32.const 3)))
"""


def _module(body: str) -> bytes:
    return bytes(wasmtime.wat2wasm(f"(module (memory 2) (func (param i32 v128) (result v128) {body}))"))


def _instructions(printed: str) -> list[str]:
    lines = printed.split("(func", 1)[1].splitlines()[1:]
    return [
        re.sub(r"^\s*[0-9a-f]+\s+", "", line).strip() for line in lines if re.match(r"^\s+[0-9a-f]+\s", line)
    ]


def test_simd_immediates_print_as_wat() -> None:
    printed = print_module(decode(_module(BODY)))
    lines = _instructions(printed)
    assert "v128.const i32x4 0x00000001 0x00000002 0x00000003 0xffffffff" in lines
    assert "v128.const i32x4 0x00000000 0x80000000 0xffffffff 0xffffffff" in lines
    assert "v128.load8_lane offset=4 align=1 3" in lines
    assert "v128.load32_lane align=4 2" in lines
    assert "v128.store64_lane offset=65536 align=4 1" in lines
    assert "v128.store16_lane align=2 7" in lines
    assert "v128.load32_zero align=2" in lines
    assert "i8x16.extract_lane_u 15" in lines
    assert "i8x16.shuffle 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 31" in lines


def test_printed_simd_instructions_assemble_to_the_same_code() -> None:
    first = decode(_module(BODY))
    lines = _instructions(print_module(first))
    again = decode(_module("\n".join(lines)))
    assert [(i.op.name, i.imm) for i in again.codes[0].body] == [
        (i.op.name, i.imm) for i in first.codes[0].body
    ]
