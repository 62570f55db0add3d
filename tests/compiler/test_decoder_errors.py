"""Malformed modules: one clear error naming the cause and the byte offset."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorwasm.compiler.errors import DecodeError, UnsupportedFeature
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.compiler.frontend.decoder import decode
from tensorwasm.support.errors import TensorWasmError
from tests.conftest import CORPUS, wat
from tests.wasmbin import FUNC_SECTION, HEADER, TYPE_SECTION, body, module_with_body, section, vec

CASES = [
    ("empty", b"", "bad magic number", 0),
    ("bad magic", b"\0asn\x01\0\0\0", "bad magic number", 0),
    ("cut version", b"\0asm\x01\0", "version field is cut", 6),
    ("bad version", b"\0asm\x02\0\0\0", "unknown binary version", 4),
    ("component", b"\0asm\x0d\0\x01\0", "component model", 4),
    ("unknown section", HEADER + section(14, b""), "unknown section id 14", 8),
    ("section past end", HEADER + b"\x01\x10\x00", "runs past the end", 8),
    ("duplicate section", HEADER + TYPE_SECTION + TYPE_SECTION, "duplicate type section", 14),
    ("out of order", HEADER + FUNC_SECTION + TYPE_SECTION, "type section out of order", 12),
    ("bad LEB in section size", HEADER + b"\x01\x80\x80\x80\x80\x80\x00", "LEB128 integer too long", 9),
    ("LEB unused bits", HEADER + b"\x01\xff\xff\xff\xff\x7f", "out of range for u32", 9),
    ("section size mismatch", HEADER + section(1, vec([b"\x60\x00\x00"]) + b"\x00"),
     "size mismatch", 14),
    ("bad type form", HEADER + section(1, vec([b"\x61\x00\x00"])), "invalid function type form", 11),
    ("bad value type", HEADER + section(1, vec([b"\x60\x01\x01\x00"])), "invalid value type 0x01", 13),
    ("gc type", HEADER + section(1, vec([b"\x5f\x00"])), "GC proposal", 11),
    ("function/code mismatch", HEADER + TYPE_SECTION + FUNC_SECTION, "inconsistent lengths", 18),
    ("truncated body", HEADER + TYPE_SECTION + FUNC_SECTION + section(10, vec([body(b"\x01")])),
     "no final end", 24),
    ("unknown opcode", module_with_body(b"\x27\x0b"), "unknown opcode 0x27", 23),
    ("bytes after end", module_with_body(b"\x0b\x01"), "bytes left after the final end", 24),
    ("else without if", module_with_body(b"\x05\x0b"), "else without a matching if", 23),
    ("tag section", HEADER + TYPE_SECTION + section(13, b"\x00"), "exception handling", 14),
    ("memory64", HEADER + section(5, vec([b"\x04\x01"])), "memory64", 11),
    ("memory too large", HEADER + section(5, vec([b"\x00\x81\x80\x04"])), "at most 65536 pages", 11),
    # Wasm 2.0 rules that wasmtime's validator (with later proposals on) does not enforce.
    ("two memories", HEADER + section(5, vec([b"\x00\x01", b"\x00\x01"])), "multi-memory", 10),
    ("imported and defined memory", HEADER + section(2, vec([b"\x01m\x01n\x02\x00\x01"]))
     + section(5, vec([b"\x00\x01"])), "2 memories", 20),
    ("constant reads a defined global", HEADER + section(6, vec([b"\x7f\x00\x41\x00\x0b", b"\x7f\x00\x23\x00\x0b"])),
     "unknown global 0", 18),
    ("memory.grow reserved byte as a long zero", module_with_body(b"\x41\x00\x40\x80\x00\x1a\x0b"),
     "zero byte expected", 26),
    ("memory.size reserved byte as a long zero", module_with_body(b"\x3f\x80\x80\x00\x1a\x0b"),
     "zero byte expected", 24),
]  # fmt: skip


@pytest.mark.parametrize(("data", "reason", "offset"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_module_names_cause_and_offset(data: bytes, reason: str, offset: int) -> None:
    with pytest.raises(DecodeError) as info:
        decode(data)
    assert reason in str(info.value)
    assert info.value.offset == offset, str(info.value)
    assert "\n" not in str(info.value)


def test_error_inside_code_names_the_function_index() -> None:
    imports = section(2, vec([b"\x03env\x01f\x00\x00"]))  # one imported function
    funcs = section(3, vec([b"\x00", b"\x00"]))
    code = section(10, vec([body(b"\x0b"), body(b"\xfe\x00\x0b")]))
    with pytest.raises(UnsupportedFeature) as info:
        decode(HEADER + TYPE_SECTION + imports + funcs + code)
    assert info.value.func_index == 2
    assert "function 2" in str(info.value) and "threads" in str(info.value)


def test_inspect_refuses_what_wasm2_makes_invalid(tmp_path, capsys) -> None:
    # wasmtime accepts both (multi-memory and GC are on): the decoder must refuse them.
    from tensorwasm.runtime.cli import main

    for text, cause in [
        ("(module (memory 1) (memory 1))", "multi-memory"),
        ("(module (global i32 (i32.const 0)) (global i32 (global.get 0)))", "unknown global 0"),
    ]:
        path = tmp_path / "m.wasm"
        path.write_bytes(wat(text))
        assert main(["inspect", str(path)]) == 2
        err = capsys.readouterr().err
        assert cause in err and "at offset 0x" in err, err


def test_constants_may_read_imported_globals() -> None:
    load(wat('(module (global (import "m" "g") i32) (global i32 (global.get 0)))'))


def test_invalid_but_well_formed_module_is_a_validation_error() -> None:
    data = wat("(module (func (result i32) i64.const 1))")
    decode(data)  # well-formed
    with pytest.raises(TensorWasmError, match="type mismatch"):
        load(data)


SEEDS = [p.read_bytes() for p in CORPUS if p.stat().st_size < 8000]


@st.composite
def mutated_modules(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        kind = draw(st.sampled_from(["flip", "cut", "splice", "insert", "delete"]))
        pos = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[pos:]
        elif kind == "splice":
            other = draw(st.sampled_from(SEEDS))
            start = draw(st.integers(0, len(other) - 1))
            data[pos:] = other[start : start + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[pos : pos + draw(st.integers(1, 8))]
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_modules())
def test_mutated_modules_raise_only_our_errors(data: bytes) -> None:
    try:
        module = load(data)
    except TensorWasmError:
        return
    translate_module(module)  # a module that validates must translate and verify
