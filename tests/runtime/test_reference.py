"""The value encoding (runtime/values.py) and the wasmtime reference backend (runtime/reference.py)."""

from __future__ import annotations

import json
import re

import pytest
import wasmtime

from tensorwasm.dialect.types import EXTERNREF, F32, F64, FUNCREF, I32, I64, V128
from tensorwasm.runtime.reference import ReferenceBackendError, ReferenceInstance
from tensorwasm.runtime.values import (
    TRAP_MESSAGES,
    CallResult,
    NanPattern,
    TrapKind,
    ValueFormatError,
    format_result,
    matches,
    parse_call_line,
    parse_expected_value,
    parse_json_value,
    to_json_value,
    trap_kind_from_wasmtime,
    trap_message,
)
from tensorwasm.support.errors import TensorWasmError
from tests.conftest import wat

# --- the JSON codec ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "value"),
    [
        ({"type": "i32", "value": "4294967295"}, (I32, 0xFFFFFFFF)),
        ({"type": "i32", "value": "-1"}, (I32, 0xFFFFFFFF)),
        ({"type": "i32", "value": "-2147483648"}, (I32, 0x80000000)),
        ({"type": "i64", "value": "-1"}, (I64, (1 << 64) - 1)),
        ({"type": "i64", "value": 7}, (I64, 7)),
        ({"type": "f32", "value": "2141192193"}, (F32, 0x7FA00001)),
        ({"type": "f64", "value": str(0xFFF4000000000001)}, (F64, 0xFFF4000000000001)),
        ({"type": "funcref", "value": "null"}, (FUNCREF, 0)),
        ({"type": "funcref", "value": "3"}, (FUNCREF, 3)),
        ({"type": "externref", "value": "null"}, (EXTERNREF, 0)),
        ({"type": "externref", "value": "12"}, (EXTERNREF, 12)),
    ],
)
def test_parse_json_value(obj, value):
    assert parse_json_value(obj) == value


@pytest.mark.parametrize(
    "value",
    [
        (I32, 0),
        (I32, 0xFFFFFFFF),
        (I64, 1 << 63),
        (F32, 0x7FA00001),
        (F64, 0x7FF4000000000001),
        (FUNCREF, 0),
        (FUNCREF, 5),
        (EXTERNREF, 9),
    ],
)
def test_json_round_trip(value):
    obj = to_json_value(value)
    assert json.loads(json.dumps(obj)) == obj
    assert parse_json_value(obj) == value


def test_to_json_value_is_unsigned_and_null():
    assert to_json_value((I32, 0xFFFFFFFF)) == {"type": "i32", "value": "4294967295"}
    assert to_json_value((FUNCREF, 0)) == {"type": "funcref", "value": "null"}
    with pytest.raises(ValueFormatError, match="32-bit pattern"):
        to_json_value((I32, -1))


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"type": "i32", "value": "4294967296"}, "out of range for i32"),
        ({"type": "i32", "value": "-2147483649"}, "out of range for i32"),
        ({"type": "f32", "value": "-1"}, "out of range for f32"),
        ({"type": "f64", "value": str(1 << 64)}, "out of range for f64"),
        ({"type": "i32", "value": "0x10"}, "not a decimal i32"),
        ({"type": "i32", "value": "1.5"}, "not a decimal i32"),
        ({"type": "i32", "value": " 1"}, "not a decimal i32"),
        ({"type": "i32", "value": True}, "not a decimal i32"),
        ({"type": "i32", "value": "null"}, "not a decimal i32"),
        ({"type": "i32", "value": "nan:canonical"}, "not a decimal i32"),
        ({"type": "f32", "value": "nan:canonical"}, "can be expected, not passed"),
        ({"type": "f64", "value": "nan:arithmetic"}, "can be expected, not passed"),
        ({"type": "v128", "value": "0"}, "not a v128 value: 0x and 32 hex digits"),
        ({"type": "i1", "value": "0"}, "unknown value type 'i1'"),
        ({"type": "i32"}, "exactly the keys"),
        ({"type": "i32", "value": "1", "extra": 1}, "exactly the keys"),
        (["i32", "1"], "is an object"),
    ],
)
def test_parse_json_value_errors(obj, message):
    with pytest.raises(ValueFormatError, match=message) as info:
        parse_json_value(obj)
    assert isinstance(info.value, TensorWasmError)


def test_expected_nan_patterns():
    canonical = parse_expected_value({"type": "f32", "value": "nan:canonical"})
    arithmetic = parse_expected_value({"type": "f64", "value": "nan:arithmetic"})
    assert canonical == (F32, NanPattern.CANONICAL)
    assert arithmetic == (F64, NanPattern.ARITHMETIC)
    assert parse_expected_value({"type": "i32", "value": "-1"}) == (I32, 0xFFFFFFFF)
    assert matches(canonical, (F32, 0x7FC00000))
    assert matches(canonical, (F32, 0xFFC00000))
    assert not matches(canonical, (F32, 0x7FC00001))
    assert not matches(canonical, (F64, 0x7FF8000000000000))
    assert matches(arithmetic, (F64, 0xFFF8000000000001))
    assert not matches(arithmetic, (F64, 0x7FF4000000000000))  # signalling
    assert not matches(arithmetic, (F64, 0x7FF0000000000000))  # infinity
    assert matches((I32, 5), (I32, 5))
    assert not matches((I32, 5), (I64, 5))


def test_parse_call_line():
    line = '{"func": "add", "args": [{"type": "i32", "value": "-1"}, {"type": "f32", "value": "0"}]}'
    assert parse_call_line(line) == ("add", [(I32, 0xFFFFFFFF), (F32, 0)])
    assert parse_call_line('{"func": "f"}') == ("f", [])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{func: 1}", "not valid JSON"),
        ("[1]", "is a JSON object"),
        ('{"args": []}', 'needs "func"'),
        ('{"func": 3, "args": []}', 'needs "func"'),
        ('{"func": "f", "args": {}}', '"args" is a list'),
        ('{"func": "f", "arg": []}', "unknown key"),
        (
            '{"func": "f", "args": [{"type": "i32", "value": "1"}, {"type": "i32", "value": "x"}]}',
            r"args\[1\]",
        ),
        ('{"func": "f", "args": [{"type": "f32", "value": "nan:canonical"}]}', r"args\[0\].*expected"),
    ],
)
def test_parse_call_line_errors(line, message):
    with pytest.raises(ValueFormatError, match=message):
        parse_call_line(line)


def test_format_result_is_one_json_line():
    results = format_result(CallResult(values=((I32, 0xFFFFFFFF), (FUNCREF, 0))))
    assert "\n" not in results
    assert json.loads(results) == {
        "results": [{"type": "i32", "value": "4294967295"}, {"type": "funcref", "value": "null"}]
    }
    assert json.loads(format_result(CallResult())) == {"results": []}
    assert json.loads(format_result(CallResult(trap="integer overflow"))) == {"trap": "integer overflow"}
    assert json.loads(format_result(CallResult(error="no\nexport"))) == {"error": "no\nexport"}
    assert "\n" not in format_result(CallResult(error="no\nexport"))


def test_call_result_is_one_outcome():
    with pytest.raises(ValueError):
        CallResult(trap="x", error="y")
    with pytest.raises(ValueError):
        CallResult(values=((I32, 1),), trap="x")


# --- traps ---------------------------------------------------------------------------------

TRAPS_WAT = """
(module
  (type $v (func))
  (type $i (func (param i32)))
  (memory 1)
  (table 2 funcref)
  (elem (i32.const 0) $nop)
  (func $nop)
  (func (export "unreachable") unreachable)
  (func (export "load") (drop (i32.load (i32.const 65534))))
  (func (export "fill") (memory.fill (i32.const 65530) (i32.const 0) (i32.const 10)))
  (func (export "div") (drop (i32.div_u (i32.const 1) (i32.const 0))))
  (func (export "rem") (drop (i64.rem_s (i64.const 1) (i64.const 0))))
  (func (export "overflow") (drop (i32.div_s (i32.const 0x80000000) (i32.const -1))))
  (func (export "trunc_range") (drop (i32.trunc_f32_s (f32.const 3e9))))
  (func (export "trunc_nan") (drop (i64.trunc_f64_u (f64.const nan))))
  (func (export "table") (call_indirect (type $v) (i32.const 2)))
  (func (export "table_get") (drop (table.get 0 (i32.const 7))))
  (func (export "null") (call_indirect (type $v) (i32.const 1)))
  (func (export "signature") (call_indirect (type $i) (i32.const 0) (i32.const 0)))
  (func $deep (export "stack") (param i32) (result i32)
    (i32.add (call $deep (i32.add (local.get 0) (i32.const 1))) (i32.const 1)))
  (func (export "call_ref") (call_ref $v (ref.null $v)))
  (func (export "as_non_null") (drop (ref.as_non_null (ref.null func))))
)
"""

TRAP_CASES = [
    ("unreachable", [], TrapKind.UNREACHABLE),
    ("load", [], TrapKind.MEMORY_OUT_OF_BOUNDS),
    ("fill", [], TrapKind.MEMORY_OUT_OF_BOUNDS),
    ("div", [], TrapKind.INTEGER_DIVIDE_BY_ZERO),
    ("rem", [], TrapKind.INTEGER_DIVIDE_BY_ZERO),
    ("overflow", [], TrapKind.INTEGER_OVERFLOW),
    ("trunc_range", [], TrapKind.INTEGER_OVERFLOW),
    ("trunc_nan", [], TrapKind.BAD_CONVERSION_TO_INTEGER),
    ("table", [], TrapKind.TABLE_OUT_OF_BOUNDS),
    ("table_get", [], TrapKind.TABLE_OUT_OF_BOUNDS),
    ("null", [], TrapKind.INDIRECT_CALL_TO_NULL),
    ("signature", [], TrapKind.BAD_SIGNATURE),
    ("stack", [(I32, 0)], TrapKind.STACK_OVERFLOW),
    ("call_ref", [], TrapKind.NULL_REFERENCE),
    ("as_non_null", [], TrapKind.NULL_REFERENCE),
]


@pytest.mark.parametrize(("export", "args", "kind"), TRAP_CASES, ids=[c[0] for c in TRAP_CASES])
def test_trap_messages_are_wasmtimes(export, args, kind):
    """The table's message is the one wasmtime itself gives, and its code maps to the kind."""
    store = wasmtime.Store()
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, wat(TRAPS_WAT)), [])
    with pytest.raises(wasmtime.Trap) as info:
        instance.exports(store)[export](store, *(bits for _, bits in args))
    assert trap_kind_from_wasmtime(info.value) is kind
    assert f"wasm trap: {TRAP_MESSAGES[kind]}" in info.value.message
    assert ReferenceInstance(wat(TRAPS_WAT)).call(export, args) == CallResult(trap=TRAP_MESSAGES[kind])


def test_every_trap_kind_is_covered():
    wasm_kinds = set(TrapKind) - {TrapKind.GATHER_CONFLICT}  # internal to loop kernels
    assert {kind for _, _, kind in TRAP_CASES} == wasm_kinds
    assert set(TRAP_MESSAGES) == set(TrapKind)


def test_trap_codes_are_stable():
    """The codes are the ABI of the compiled code's trap slot: changing one is a breaking change."""
    assert {kind.name: int(kind) for kind in TrapKind} == {
        "UNREACHABLE": 1,
        "MEMORY_OUT_OF_BOUNDS": 2,
        "INTEGER_DIVIDE_BY_ZERO": 3,
        "INTEGER_OVERFLOW": 4,
        "BAD_CONVERSION_TO_INTEGER": 5,
        "TABLE_OUT_OF_BOUNDS": 6,
        "INDIRECT_CALL_TO_NULL": 7,
        "BAD_SIGNATURE": 8,
        "STACK_OVERFLOW": 9,
        "NULL_REFERENCE": 10,
        "GATHER_CONFLICT": 100,
    }
    assert trap_message(2) == "out of bounds memory access"
    assert trap_message(99) == "unknown trap code 99"


def test_instance_survives_a_stack_overflow():
    instance = ReferenceInstance(wat(TRAPS_WAT))
    assert instance.call("stack", [(I32, 0)]).trap == "call stack exhausted"
    assert instance.call("div", []).trap == "integer divide by zero"


# --- bit-exact values ----------------------------------------------------------------------

BITS_WAT = """
(module
  (func (export "id32") (param f32) (result f32) local.get 0)
  (func (export "id64") (param f64) (result f64) local.get 0)
  (func (export "snan32") (result f32) (f32.reinterpret_i32 (i32.const 0x7fa00001)))
  (func (export "snan64") (result f64) (f64.reinterpret_i64 (i64.const 0xfff4000000000001)))
  (func (export "bits32") (param f32) (result i32) (i32.reinterpret_f32 (local.get 0)))
  (func (export "swap") (param i32 i64 f32 f64) (result f64 f32 i64 i32)
    local.get 3 local.get 2 local.get 1 local.get 0)
  (func (export "neg") (param i32) (result i32) (i32.sub (i32.const 0) (local.get 0)))
  (global (export "g32") (mut f32) (f32.const nan:0x200001))
  (global (export "g64") f64 (f64.const -nan:0x4000000000001))
  (global (export "gi") i64 (i64.const -1))
)
"""


@pytest.fixture(scope="module")
def bits() -> ReferenceInstance:
    return ReferenceInstance(wat(BITS_WAT))


@pytest.mark.parametrize("pattern", [0x7FA00001, 0xFFA00000, 0x7F800001, 0x7FC00000, 0x80000000, 0x00000001])
def test_f32_bits_survive(bits, pattern):
    assert bits.call("id32", [(F32, pattern)]) == CallResult(values=((F32, pattern),))
    assert bits.call("bits32", [(F32, pattern)]) == CallResult(values=((I32, pattern),))


@pytest.mark.parametrize("pattern", [0x7FF4000000000001, 0xFFF0000000000001, 0x7FF8000000000000, 1 << 63])
def test_f64_bits_survive(bits, pattern):
    assert bits.call("id64", [(F64, pattern)]) == CallResult(values=((F64, pattern),))


def test_signalling_nan_results(bits):
    assert bits.call("snan32", []) == CallResult(values=((F32, 0x7FA00001),))
    assert bits.call("snan64", []) == CallResult(values=((F64, 0xFFF4000000000001),))


def test_multiple_values_and_unsigned_ints(bits):
    args = [(I32, 0xFFFFFFFF), (I64, 1 << 63), (F32, 0x7FA00000), (F64, 0x7FF0000000000001)]
    assert bits.call("swap", args).values == tuple(reversed(args))
    assert bits.call("neg", [(I32, 1)]).values == ((I32, 0xFFFFFFFF),)


def test_globals_keep_their_bits(bits):
    assert bits.globals() == {
        "g32": (F32, 0x7FA00001),
        "g64": (F64, 0xFFF4000000000001),
        "gi": (I64, (1 << 64) - 1),
    }


# --- memory, references, imports -----------------------------------------------------------


def test_memory_accessor():
    instance = ReferenceInstance(
        wat(
            """(module (memory (export "memory") 1) (memory (export "other") 0)
                 (func (export "store") (i32.store (i32.const 8) (i32.const 0x11223344))))"""
        )
    )
    assert instance.call("store", []) == CallResult()
    data = instance.memory()
    assert len(data) == 65536
    assert data[8:12] == bytes.fromhex("44332211")
    assert instance.memory("other") == b""
    assert instance.memory("store") is None
    assert instance.memory("absent") is None


def test_references():
    instance = ReferenceInstance(
        wat(
            """(module
                 (import "env" "f" (func))
                 (func $a (export "a") (result funcref) (ref.func $a))
                 (func $hidden)
                 (elem declare func $hidden)
                 (func (export "hidden") (result funcref) (ref.func $hidden))
                 (func (export "is_null") (param funcref) (result i32) (ref.is_null (local.get 0)))
                 (func (export "ext") (param externref) (result externref) (local.get 0)))"""
        )
    )
    assert instance.call("a", []).values == ((FUNCREF, 2),)  # function 1 (after the import), + 1
    assert instance.call("is_null", [(FUNCREF, 0)]).values == ((I32, 1),)
    assert instance.call("is_null", [(FUNCREF, 2)]).values == ((I32, 0),)
    assert "only reaches exported functions" in instance.call("is_null", [(FUNCREF, 3)]).error
    assert "not exported" in instance.call("hidden", []).error
    assert instance.call("ext", [(EXTERNREF, 0)]).values == ((EXTERNREF, 0),)
    assert instance.call("ext", [(EXTERNREF, 42)]).values == ((EXTERNREF, 42),)


def test_import_stubs():
    instance = ReferenceInstance(
        wat(
            """(module
                 (import "env" "log" (func $log (param i32)))
                 (import "env" "g" (global $g (mut f64)))
                 (import "env" "h" (global $h i32))
                 (import "env" "mem" (memory 2 3))
                 (import "env" "tab" (table 4 funcref))
                 (func (export "call_log") (call $log (i32.const 1)))
                 (func (export "get") (result f64 i32) (global.get $g) (global.get $h))
                 (func (export "set") (global.set $g (f64.const 1)))
                 (func (export "pages") (result i32) (memory.size))
                 (func (export "grow") (result i32) (memory.grow (i32.const 5)))
                 (func (export "tsize") (result i32) (table.size)))"""
        )
    )
    assert instance.call("call_log", []) == CallResult(error="host import env.log is not available")
    assert instance.call("get", []).values == ((F64, 0), (I32, 0))
    assert instance.call("set", []) == CallResult()
    assert instance.call("get", []).values == ((F64, 0x3FF0000000000000), (I32, 0))
    assert instance.call("pages", []).values == ((I32, 2),)
    assert instance.call("grow", []).values == ((I32, 0xFFFFFFFF),)  # past the declared maximum
    assert instance.call("tsize", []).values == ((I32, 4),)


def test_start_function_calling_an_import():
    module = wat('(module (import "m" "f" (func $f)) (start $f))')
    with pytest.raises(ReferenceBackendError, match=r"host import m\.f is not available"):
        ReferenceInstance(module)


def test_start_function_trap_and_bad_module():
    with pytest.raises(ReferenceBackendError, match="instantiation trapped: wasm `unreachable`"):
        ReferenceInstance(wat("(module (func $s unreachable) (start $s))"))
    with pytest.raises(ReferenceBackendError, match="wasmtime rejected the module"):
        ReferenceInstance(b"\0asm\x01\0\0\0\x05")


# --- bad calls -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("export", "args", "message"),
    [
        ("nope", [], r"no export named 'nope' \(exports: add, memory, table\)"),
        ("memory", [], "export 'memory' is a memory, not a function"),
        ("table", [], "export 'table' is a table, not a function"),
        ("add", [(I32, 1)], r"add takes 2 argument\(s\) \(i32, i32\), given 1"),
        ("add", [(I32, 1), (I32, 2), (I32, 3)], "given 3"),
        ("add", [(I32, 1), (F32, 2)], "argument 1 of add is i32, given f32"),
        ("add", [(I32, 1), (I32, 1 << 32)], "argument 1 of add: 4294967296 is not a 32-bit pattern"),
        ("add", [(I32, -1), (I32, 0)], "argument 0 of add: -1 is not a 32-bit pattern"),
    ],
)
def test_bad_calls_are_errors(export, args, message):
    instance = ReferenceInstance(
        wat(
            """(module (memory (export "memory") 1) (table (export "table") 1 funcref)
                 (func (export "add") (param i32 i32) (result i32) (i32.add (local.get 0) (local.get 1))))"""
        )
    )
    result = instance.call(export, args)
    assert result.values == () and result.trap is None
    assert result.error is not None
    assert re.search(message, result.error), result.error
    assert instance.call("add", [(I32, 2), (I32, 0xFFFFFFFF)]).values == ((I32, 1),)


def test_types_the_reference_cannot_carry_are_refused_not_fatal():
    """wasmtime's C API aborts the process on a typed-reference value type (and when asked
    the kind of a v128 type): never ask it."""
    instance = ReferenceInstance(
        wat(
            """(module
                 (type $t (func))
                 (rec (type $s (struct (field i8) (field (mut f32)))) (type $a (array i16)))
                 (type $u (sub (func (param i32) (result i32))))
                 (global (export "gv") v128 (v128.const i32x4 1 2 3 4))
                 (global (export "gr") (ref null $t) (ref.null $t))
                 (global (export "gi") i32 (i32.const 7))
                 (func (export "typed") (result (ref null $t)) (ref.null $t))
                 (func (export "null_func") (param (ref null func)) (result i32) (ref.is_null (local.get 0)))
                 (func (export "sub") (type $u) (local.get 0))
                 (func (export "lane") (result i32) (i32x4.extract_lane 1 (v128.const i32x4 1 2 3 4))))"""
        )
    )
    assert "a typed reference" in instance.call("typed", []).error
    assert instance.call("null_func", [(FUNCREF, 0)]).values == ((I32, 1),)
    assert instance.call("sub", [(I32, 5)]).values == ((I32, 5),)
    assert instance.call("lane", []).values == ((I32, 2),)
    assert instance.globals() == {
        "gv": (V128, 4 << 96 | 3 << 64 | 2 << 32 | 1),
        "gr": (FUNCREF, 0),
        "gi": (I32, 7),
    }
    with pytest.raises(ReferenceBackendError, match=r"import a\.b holds values of a type"):
        ReferenceInstance(wat('(module (type $t (func)) (import "a" "b" (global (ref null $t))))'))


V128_MODULE = """(module
  (import "m" "x" (global $x v128))
  (global $g (export "g") (mut v128) (v128.const i32x4 0x7fa00000 0xffc00001 3 0x80000000))
  (func (export "mix") (param v128 i32 v128) (result v128 i32 v128)
    (global.set $g (v128.xor (global.get $g) (local.get 2)))
    (i32x4.add (local.get 0) (global.get $x)) (local.get 1) (global.get $g))
  (func (export "f32x4_neg") (param v128) (result v128) (f32x4.neg (local.get 0))))"""


@pytest.mark.parametrize(
    "vector",
    [0, (1 << 128) - 1, 0x7FA00000_FFA00001_7F800001_80000000, 0x0123456789ABCDEF_FEDCBA9876543210],
)
def test_v128_arguments_results_and_globals_keep_their_bits(vector):
    """v128 values cross wasmtime's C API as 16 bytes: a signalling NaN lane stays one, and
    an imported v128 global is a zero stand-in; the host backend gives the same bits."""
    from tensorwasm.runtime.executor import HostExecutor

    wasm = wat(V128_MODULE)
    reference, host = ReferenceInstance(wasm), HostExecutor(wasm)
    other = vector ^ 0x5555_AAAA_0000_FFFF_1234_5678_9ABC_DEF0
    for target in (reference, host):
        mix = target.call("mix", [(V128, vector), (I32, 0xFFFFFFFF), (V128, other)])
        neg = target.call("f32x4_neg", [(V128, vector)])
        assert mix.error is None and neg.error is None, (mix, neg)
        start = 0x80000000_00000003_FFC00001_7FA00000
        assert mix.values == ((V128, vector), (I32, 0xFFFFFFFF), (V128, start ^ other))
        assert neg.values == ((V128, vector ^ (0x80000000 * 0x00000001_00000001_00000001_00000001)),)
    assert reference.globals()["g"] == (V128, host.globals()[1])  # (index 0: the import)


def test_signatures_past_one_leb_byte():
    """More than 127 functions and exports: their counts and indices take two LEB128 bytes."""
    funcs = "\n".join(
        f'(func (export "f{i}") (param {"i64 " * (i % 3)}f32) (result i32) (i32.const {i}))'
        for i in range(200)
    )
    instance = ReferenceInstance(wat(f"(module {funcs})"))
    assert instance.call("f199", [(I64, 0), (F32, 0)]).values == ((I32, 199),)
    assert "takes 2 argument(s) (i64, f32)" in instance.call("f199", []).error
