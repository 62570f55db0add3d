"""Wasm's NaN rule applied where a float value is observed, not at every op.

The lowering computes float add, subtract, multiply, divide, square root and rounding as
the one IEEE instruction and applies Wasm's (x86's) NaN rule only where a value's bits are
observed (returned, stored, passed to a block, reinterpreted, selected, min/max), rebuilding
the value's tree with the rule out of line where it came out NaN. These chains, with NaN
payloads at every position, must return wasmtime's bits exactly, and the hot path must hold
one NaN test per observed value (``FunctionLowering.exact``).
"""

from __future__ import annotations

import itertools
import re

import pytest

from tensorwasm.compiler import pipeline
from tensorwasm.compiler.target import nvptx_for_device
from tensorwasm.runtime.executor import GPUExecutor, HostExecutor
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat

CHAINS = (
    r"""
(module
  (memory 1)
  (func (export "chain") (param f32 f32 f32) (result f32)
    (f32.sub (f32.div (f32.add (f32.mul (local.get 0) (local.get 1)) (local.get 2)) (local.get 0))
             (local.get 1)))
  (func (export "stored") (param f32 f32 f32) (result i32)
    (f32.store (i32.const 8) (f32.add (f32.mul (local.get 0) (local.get 1)) (local.get 2)))
    (i32.load (i32.const 8)))
  (func (export "reinterpret") (param f32 f32 f32) (result i32)
    (i32.reinterpret_f32 (f32.mul (f32.sub (local.get 0) (local.get 2)) (local.get 1))))
  (func (export "carried") (param f32 f32 f32) (result f32)
    (local $i i32) (local $acc f32)
    (local.set $acc (local.get 2))
    (loop $l
      (local.set $acc (f32.add (f32.mul (local.get $acc) (local.get 0)) (local.get 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 3))))
    (local.get $acc))
  (func (export "compared") (param f32 f32 f32) (result f32)
    (select (f32.mul (local.get 0) (local.get 1)) (f32.add (local.get 2) (local.get 0))
            (f32.lt (f32.add (local.get 0) (local.get 1)) (local.get 2))))
  (func (export "rooted") (param f32 f32 f32) (result f32)
    (f32.add (f32.sqrt (f32.mul (local.get 0) (local.get 1))) (f32.floor (local.get 2))))
  (func (export "minimum") (param f32 f32 f32) (result f32)
    (f32.min (f32.add (local.get 0) (local.get 1)) (f32.mul (local.get 2) (f32.const 1))))
  (func (export "wide") (param f32 f32 f32) (result f64)
    (f64.add (f64.mul (f64.promote_f32 (local.get 0)) (f64.promote_f32 (local.get 1)))
             (f64.promote_f32 (f32.div (local.get 2) (local.get 0)))))
  (func (export "long") (param f32 f32 f32) (result f32)
    (local $x f32)
    (local.set $x (local.get 0))
    """
    + "(local.set $x (f32.add (f32.mul (local.get $x) (local.get 1)) (local.get 2)))\n" * 40
    + """
    (local.get $x))
  (func (export "chosen") (param f32 f32 f32) (result f32)
    (select (f32.mul (f32.sqrt (local.get 0)) (f32.const 2))
            (f32.sub (f32.mul (local.get 1) (local.get 1)) (local.get 2))
            (f32.gt (local.get 0) (f32.const 0))))
  (func (export "paired") (param f32 f32 f32) (result i64) (local f32 f32)
    (local.set 3 (f32.add (local.get 0) (local.get 1)))
    (local.set 4 (f32.mul (local.get 1) (local.get 2)))
    (f32.store (i32.const 8) (local.get 3))
    (f32.store (i32.const 12) (local.get 4))
    (i64.load (i32.const 8))))
"""
)
NAMES = ("chain", "stored", "reinterpret", "carried", "compared", "rooted", "minimum", "wide", "long",
         "chosen", "paired")  # fmt: skip
# Numbers, infinities, and NaNs: quiet and signalling, either sign, with payloads.
VALUES = (0x3FC00000, 0x80000000, 0x7F800000, 0xFF800000, 0x40400000,
          0x7FA00001, 0xFFC00123, 0x7FC00000, 0xFF812345)  # fmt: skip


def _mismatches(backend, reference) -> list[str]:
    failures = []
    for name in NAMES:
        for args in itertools.product(VALUES, repeat=3):
            typed = [("f32", v) for v in args]
            expected, actual = reference.call(name, typed), backend.call(name, typed)
            if (expected.trap, expected.values) != (actual.trap, actual.values):
                failures.append(f"{name}{[hex(v) for v in args]}: wasmtime {expected}, got {actual}")
    return failures


@pytest.fixture(scope="module")
def module_bytes() -> bytes:
    return wat(CHAINS)


def test_deferred_nan_rule_gives_wasmtimes_bits_on_the_host(module_bytes) -> None:
    failures = _mismatches(HostExecutor(module_bytes), ReferenceInstance(module_bytes))
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


@pytest.mark.gpu
def test_deferred_nan_rule_gives_wasmtimes_bits_on_the_gpu(module_bytes) -> None:
    failures = _mismatches(GPUExecutor(module_bytes), ReferenceInstance(module_bytes))
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


def _blocks(llvm_ir: str, function: str) -> dict[str, str]:
    """The lowered (unoptimised) function's basic blocks by label."""
    body = llvm_ir[llvm_ir.index(f'@"{function}"') :]
    body = body[: body.index("\n}\n")]
    parts = re.split(r'^"?([\w.]+)"?:\s*$', body, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_one_nan_test_per_observed_value_with_the_rule_out_of_line(module_bytes) -> None:
    """``stored``: a multiply and an add observed by one store. The path to the store has
    the two instructions and one NaN test; the rule (a NaN test of each operand and a
    select) is in the out-of-line block alone."""
    request = pipeline.Request(
        module_bytes, entries=pipeline.FUNCTIONS, target=nvptx_for_device((9, 0), 13000)
    )
    state = pipeline.run(request, "llvm")
    blocks = _blocks(state.llvm.text, "wasm_f1")
    rule = [text for label, text in blocks.items() if label.startswith("nan.rule")]
    hot = [text for label, text in blocks.items() if not label.startswith("nan.rule")]
    assert len(rule) == 1
    assert sum(t.count("fcmp uno") for t in hot) == 1
    assert sum(t.count("select") for t in hot) == 0
    assert sum(t.count(" fmul ") + t.count(" fadd ") for t in hot) == 2
    assert rule[0].count("fcmp uno") >= 4 and rule[0].count("select") >= 4


def test_a_select_of_deferred_values_is_tested_once_for_what_it_picked(module_bytes) -> None:
    """``chosen``: a select between two deferred trees (condmap's body), returned. The hot
    path holds the four instructions, the select and one NaN test (of what it picked), not
    one test per arm; the rule for both arms is out of line."""
    request = pipeline.Request(
        module_bytes, entries=pipeline.FUNCTIONS, target=nvptx_for_device((9, 0), 13000)
    )
    state = pipeline.run(request, "llvm")
    blocks = _blocks(state.llvm.text, "wasm_f9")
    hot = [text for label, text in blocks.items() if not label.startswith("nan.rule")]
    rule = [text for label, text in blocks.items() if label.startswith("nan.rule")]
    assert sum(t.count("fcmp uno") for t in hot) == 1
    assert sum(t.count(" fmul ") + t.count(" fsub ") for t in hot) == 3
    assert len(rule) == 1 and rule[0].count("fcmp uno") >= 4


def test_a_run_of_stores_takes_one_nan_test_of_all_it_stores(module_bytes) -> None:
    """``paired``: two deferred values stored one after the other (an address between). One
    test of both, a branch to the one out-of-line block that rebuilds them."""
    request = pipeline.Request(
        module_bytes, entries=pipeline.FUNCTIONS, target=nvptx_for_device((9, 0), 13000)
    )
    state = pipeline.run(request, "llvm")
    blocks = _blocks(state.llvm.text, "wasm_f10")
    rule = [text for label, text in blocks.items() if label.startswith("nan.rule")]
    hot = "".join(text for label, text in blocks.items() if not label.startswith("nan.rule"))
    assert len(rule) == 1 and hot.count('label %"nan.rule') == 1
    assert hot.count("fcmp uno") == 2 and hot.count("fadd") + hot.count("fmul") == 2
