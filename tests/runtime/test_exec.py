"""Whole-function execution against wasmtime: control flow, calls, memory, globals, tables,
traps and state across calls, on the host backend (everywhere) and the GPU (marker gpu)."""

from __future__ import annotations

import pytest

from tensorwasm.dialect.types import F32, F64, I32, I64
from tensorwasm.runtime.executor import GPUExecutor, HostExecutor
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]

PROGRAM = r"""
(module
  (type $ii (func (param i32) (result i32)))
  (type $v (func))
  (memory (export "memory") 1 4)
  (global $counter (mut i32) (i32.const 0))
  (global $g64 (mut i64) (i64.const -5))
  (global $gf (mut f64) (f64.const 2.5))
  (table $t 4 funcref)
  (elem (i32.const 0) $double $square)
  (elem (i32.const 3) $nothing)
  (data (i32.const 16) "\01\02\03\04\05\06\07\08")
  (data $passive "hello")

  (func $double (type $ii) local.get 0 i32.const 2 i32.mul)
  (func $square (type $ii) local.get 0 local.get 0 i32.mul)
  (func $nothing (type $v))

  (func (export "fib") (param i32) (result i32)
    local.get 0 i32.const 2 i32.lt_u
    if (result i32) local.get 0
    else local.get 0 i32.const 1 i32.sub call 3 local.get 0 i32.const 2 i32.sub call 3 i32.add end)

  (func (export "sum_to") (param $n i32) (result i64) (local $i i32) (local $s i64)
    (block $done (loop $l
      local.get $i local.get $n i32.ge_u br_if $done
      local.get $s local.get $i i64.extend_i32_u i64.add local.set $s
      local.get $i i32.const 1 i32.add local.set $i br $l))
    local.get $s)

  (func (export "classify") (param i32) (result i32)
    (block $c (block $b (block $a local.get 0 br_table $a $b $c)
      i32.const 100 return) i32.const 200 return) i32.const 300)

  (func (export "divmod") (param i32 i32) (result i32 i32)
    local.get 0 local.get 1 i32.div_u local.get 0 local.get 1 i32.rem_u)

  (func (export "swap_sum") (param i32 i32) (result i32)
    local.get 0 local.get 1 (block (param i32 i32) (result i32 i32) local.get 1 local.get 0
      br 0) i32.sub)

  (func (export "indirect") (param i32 i32) (result i32) local.get 1 local.get 0 call_indirect (type $ii))
  (func (export "indirect_void") (param i32) local.get 0 call_indirect (type $v))

  (func (export "load8") (param i32) (result i32) local.get 0 i32.load8_u)
  (func (export "load_s16") (param i32) (result i32) local.get 0 i32.load16_s offset=1)
  (func (export "load64") (param i32) (result i64) local.get 0 i64.load offset=16)
  (func (export "store") (param i32 i64) local.get 0 local.get 1 i64.store offset=3)
  (func (export "storef") (param i32 f32) local.get 0 local.get 1 f32.store)
  (func (export "loadf") (param i32) (result f32) local.get 0 f32.load)
  (func (export "size") (result i32) memory.size)
  (func (export "grow") (param i32) (result i32) local.get 0 memory.grow)
  (func (export "fill") (param i32 i32 i32) local.get 0 local.get 1 local.get 2 memory.fill)
  (func (export "copy") (param i32 i32 i32) local.get 0 local.get 1 local.get 2 memory.copy)
  (func (export "init") (param i32 i32 i32) local.get 0 local.get 1 local.get 2 memory.init $passive)
  (func (export "drop") data.drop $passive)

  (func (export "bump") (result i32)
    global.get $counter i32.const 1 i32.add global.set $counter global.get $counter)
  (func (export "globals") (result i64 f64)
    global.get $g64 i64.const 1 i64.add global.set $g64 global.get $g64
    global.get $gf global.get $gf f64.mul global.set $gf global.get $gf)

  (func (export "table_ops") (param i32) (result i32)
    local.get 0 table.get $t ref.is_null
    table.size $t i32.const 10 i32.mul i32.add)
  (func (export "table_grow") (param i32) (result i32) ref.null func local.get 0 table.grow $t)
  (func (export "table_set_and_call") (param i32) (result i32)
    i32.const 2 ref.func $square table.set $t local.get 0 i32.const 2 call_indirect (type $ii))

  (func (export "axpy1") (param i32 i32)
    local.get 1 f32.const 2 local.get 0 f32.load f32.mul local.get 1 f32.load f32.add f32.store)
  (func (export "daxpy1") (param i32 i32)
    local.get 1 f64.const 2 local.get 0 f64.load f64.mul local.get 1 f64.load f64.add f64.store)
  (func (export "sum_byte") (param i32 f32 f32)
    local.get 0 local.get 1 local.get 2 f32.add i32.reinterpret_f32 i32.store8)
  (func (export "trap_unreachable") unreachable)
  (func (export "nested_trap") (param i32) (result i32)
    local.get 0 i32.const 0 i32.div_s drop i32.const 1)
  (func (export "select_f") (param f64 f64 i32) (result f64) local.get 0 local.get 1 local.get 2 select)
)
"""

CALLS = [
    ("fib", [(I32, 0)]), ("fib", [(I32, 1)]), ("fib", [(I32, 15)]),
    ("sum_to", [(I32, 0)]), ("sum_to", [(I32, 1000)]),
    ("classify", [(I32, 0)]), ("classify", [(I32, 1)]), ("classify", [(I32, 2)]),
    ("classify", [(I32, 0xFFFFFFFF)]),
    ("divmod", [(I32, 17), (I32, 5)]), ("divmod", [(I32, 1), (I32, 0)]),
    ("swap_sum", [(I32, 3), (I32, 10)]),
    ("indirect", [(I32, 0), (I32, 21)]), ("indirect", [(I32, 1), (I32, 9)]),
    ("indirect", [(I32, 2), (I32, 9)]), ("indirect", [(I32, 3), (I32, 9)]),
    ("indirect", [(I32, 4), (I32, 9)]), ("indirect", [(I32, 0xFFFFFFFF), (I32, 9)]),
    ("indirect_void", [(I32, 3)]), ("indirect_void", [(I32, 0)]),
    ("load8", [(I32, 16)]), ("load8", [(I32, 65535)]), ("load8", [(I32, 65536)]),
    ("load_s16", [(I32, 20)]), ("load_s16", [(I32, 65534)]), ("load64", [(I32, 0)]),
    ("load64", [(I32, 65520)]), ("load64", [(I32, 65521)]),
    ("store", [(I32, 100), (I64, 0x1122334455667788)]), ("load64", [(I32, 87)]),
    ("store", [(I32, 65528), (I64, 1)]), ("store", [(I32, 65525), (I64, 7)]),
    ("storef", [(I32, 200), (F32, 0x7FA00001)]), ("loadf", [(I32, 200)]),
    ("size", []), ("grow", [(I32, 1)]), ("size", []), ("load8", [(I32, 65536 + 10)]),
    ("grow", [(I32, 5)]), ("grow", [(I32, 2)]), ("size", []), ("grow", [(I32, 0)]),
    ("fill", [(I32, 300), (I32, 0xAB), (I32, 10)]), ("load64", [(I32, 288)]),
    ("fill", [(I32, 4 * 65536 - 4), (I32, 1), (I32, 5)]),
    ("copy", [(I32, 400), (I32, 16), (I32, 8)]), ("load64", [(I32, 384)]),
    ("copy", [(I32, 17), (I32, 16), (I32, 4)]), ("load64", [(I32, 0)]),
    ("copy", [(I32, 0), (I32, 4 * 65536 - 2), (I32, 3)]),
    ("init", [(I32, 500), (I32, 1), (I32, 4)]), ("load64", [(I32, 484)]),
    ("init", [(I32, 500), (I32, 3), (I32, 3)]), ("drop", []), ("init", [(I32, 500), (I32, 0), (I32, 1)]),
    ("init", [(I32, 500), (I32, 0), (I32, 0)]),
    ("bump", []), ("bump", []), ("globals", []), ("globals", []),
    ("table_ops", [(I32, 0)]), ("table_ops", [(I32, 2)]), ("table_ops", [(I32, 9)]),
    ("table_grow", [(I32, 2)]), ("table_ops", [(I32, 5)]), ("table_set_and_call", [(I32, 6)]),
    ("storef", [(I32, 600), (F32, 0x4289C4CC)]), ("storef", [(I32, 616), (F32, 0x40105102)]),
    ("axpy1", [(I32, 600), (I32, 616)]), ("loadf", [(I32, 616)]),
    ("store", [(I32, 629), (I64, 0x4051380000000000)]), ("daxpy1", [(I32, 632), (I32, 632)]),
    ("load64", [(I32, 616)]), ("sum_byte", [(I32, 640), (F32, 0x430C0000), (F32, 0x3F000000)]),
    ("load8", [(I32, 640)]),
    ("trap_unreachable", []), ("nested_trap", [(I32, 3)]), ("fib", [(I32, 10)]),
    ("select_f", [(F64, 0x7FF4000000000001), (F64, 0), (I32, 1)]),
    ("select_f", [(F64, 0x7FF4000000000001), (F64, 5), (I32, 0)]),
    ("nope", []), ("fib", [(I64, 1)]), ("fib", []),
]  # fmt: skip


def make(backend: str, wasm: bytes):
    return HostExecutor(wasm) if backend == "cpu" else GPUExecutor(wasm)


@pytest.mark.parametrize("backend", BACKENDS)
def test_call_sequence_matches_wasmtime(backend: str) -> None:
    wasm = wat(PROGRAM)
    reference, executor = ReferenceInstance(wasm), make(backend, wasm)
    for i, (name, args) in enumerate(CALLS):
        expected = reference.call(name, args)
        actual = executor.call(name, args)
        if expected.error:
            assert actual.error, (i, name, args, actual)
            continue
        assert actual == expected, (i, name, args)
    assert executor.memory() == reference.memory()


@pytest.mark.parametrize("backend", BACKENDS)
def test_function_calling_an_import_is_not_compilable(backend: str) -> None:
    wasm = wat(
        '(module (import "env" "log" (func $log (param i32)))'
        " (func $helper (param i32) local.get 0 call $log)"
        ' (func (export "uses") (param i32) local.get 0 call $helper)'
        ' (func (export "pure") (result i32) i32.const 7))'
    )
    executor = make(backend, wasm)
    result = executor.call("uses", [(I32, 1)])
    assert result.error and "env.log" in result.error
    assert executor.call("pure", []).values == ((I32, 7),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_start_function_and_recursion_limit(backend: str) -> None:
    wasm = wat(
        "(module (global $g (mut i32) (i32.const 1))"
        " (func $start global.get $g i32.const 41 i32.add global.set $g)"
        " (start $start)"
        ' (func (export "g") (result i32) global.get $g)'
        ' (func $inf (export "inf") (param i32) (result i32) local.get 0 call $inf))'
    )
    executor = make(backend, wasm)
    assert executor.call("g", []).values == ((I32, 42),)
    assert executor.call("inf", [(I32, 0)]).trap == "call stack exhausted"
    assert executor.call("g", []).values == ((I32, 42),)  # usable after the trap


@pytest.mark.gpu
def test_gpu_trap_leaves_context_usable_for_next_call() -> None:
    wasm = wat(
        "(module (memory 1)"
        ' (func (export "oob") (result i32) i32.const 70000 i32.load)'
        ' (func (export "ok") (param i32) (result i32) local.get 0 i32.const 1 i32.add))'
    )
    executor = GPUExecutor(wasm)
    for _ in range(3):
        assert executor.call("oob", []).trap == "out of bounds memory access"
        assert executor.call("ok", [(I32, 41)]).values == ((I32, 42),)
