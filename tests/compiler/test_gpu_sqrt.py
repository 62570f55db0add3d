"""The GPU's square root keeps inputs whose root is a NaN off ``sqrt.rn``'s slow path.

ptxas expands ``sqrt.rn`` into a fast sequence for normal positive inputs and a call to an
out-of-line slow path for every other input, negative ones included. clang's branch-free
``x > 0 ? sqrt(x) * 2 : x * x - 0.25`` takes the root of every element, so the suite's
condmap called that slow path for each negative one (its kernel under Nsight Compute on an
H200: 181 us, 159.6 us with the root of 1.0 taken there instead). The NaN that replaces it
is a NaN exactly where IEEE's root is one, and Wasm's rule gives its bits.
"""

from __future__ import annotations

import re

import pytest

from tensorwasm.compiler import pipeline
from tensorwasm.compiler.target import HostTarget, nvptx_for_device
from tensorwasm.runtime.executor import GPUExecutor
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat

ROOTS = r"""
(module
  (memory 1)
  (func (export "root32") (param f32) (result f32) (f32.sqrt (local.get 0)))
  (func (export "root64") (param f64) (result f64) (f64.sqrt (local.get 0)))
  (func (export "stored32") (param f32) (result i32)
    (f32.store (i32.const 8) (f32.mul (f32.sqrt (local.get 0)) (f32.const 2)))
    (i32.load (i32.const 8))))
"""

# Zeros of both signs, subnormals, normals either side of one, infinities, the largest
# finite values, negatives, and NaNs quiet and signalling with payloads, of both signs.
F32 = (0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x3F800000, 0x40000000,
       0x3E800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0xBF800000, 0xC0490FDB, 0x7FC00000,
       0xFFC00000, 0x7FA00001, 0xFF812345, 0x7FC00123)  # fmt: skip
F64 = (0x0, 0x8000000000000000, 0x1, 0x800FFFFFFFFFFFFF, 0x0010000000000000, 0x3FF0000000000000,
       0x4000000000000000, 0x7FEFFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000,
       0xBFF0000000000000, 0x7FF8000000000000, 0xFFF8000000000000, 0x7FF4000000000001,
       0xFFF0000000012345)  # fmt: skip


def _ptx(target) -> str:
    request = pipeline.Request(wat(ROOTS), entries=pipeline.FUNCTIONS, target=target)
    return pipeline.run(request, "ptx").ptx.text


def _entry(ptx: str, index: int) -> str:
    """The PTX of the entry that calls function ``index`` (the function inlined into it)."""
    body = ptx[ptx.index(f".entry tw_call_{index}(") :]
    return body[: body.index("\n}\n")]


def test_the_gpus_root_is_of_the_input_where_it_is_at_least_zero_and_of_one_elsewhere() -> None:
    """In the PTX (which ptxas assembles in the pipeline), each ``sqrt.rn`` reads a
    register that a compare ``>= 0`` chose between the input and 1.0 (through an opaque
    move), and the same compare picks the root or a NaN."""
    ptx = _ptx(nvptx_for_device((9, 0), 13000))
    for index, (width, reg, one, nan) in enumerate(
        ((32, "r", "1065353216", "0f7FC00000"), (64, "rd", "4607182418800017408", "0d7FF8000000000000"))
    ):
        body = _entry(ptx, index)
        (compare, x) = re.search(rf"setp\.ge\.f{width}\s+(%p\d+), (%{reg}\d+), 0[df]0+;", body).groups()
        (chosen,) = re.findall(rf"selp\.b{width}\s+(%{reg}\d+), {x}, {one}, {compare};", body)
        (moved,) = re.findall(rf"mov\.b{width} (%{reg}\d+), {chosen};", body)
        (root,) = re.findall(rf"sqrt\.rn\.f{width}\s+(%{reg}\d+), {moved};", body)
        assert re.search(rf"selp\.f{width}\s+%{reg}\d+, {root}, {nan}, {compare};", body)


def test_the_host_takes_the_root_of_the_input_as_it_is() -> None:
    """On the CPU a negative input costs nothing more: every ``llvm.sqrt`` (the fast one and
    the rule's) takes the argument itself."""
    request = pipeline.Request(wat(ROOTS), entries=pipeline.FUNCTIONS, target=HostTarget())
    text = pipeline.run(request, "llvm").llvm.text
    body = text[text.index('@"wasm_f0"') :]
    body = body[: body.index("\n}\n")]
    roots = re.findall(r'call float @"llvm\.sqrt\.f32"\(float (%"[^"]+")\)', body)
    assert roots and set(roots) == {'%".2"'}


@pytest.mark.gpu
def test_the_gpus_roots_are_wasmtimes_bit_for_bit() -> None:
    """Every input class above, returned and stored, on the GPU against wasmtime."""
    data = wat(ROOTS)
    gpu, reference = GPUExecutor(data), ReferenceInstance(data)
    failures = []
    for name, kind, values in (("root32", "f32", F32), ("stored32", "f32", F32), ("root64", "f64", F64)):
        for v in values:
            expected, actual = reference.call(name, [(kind, v)]), gpu.call(name, [(kind, v)])
            if (expected.trap, expected.values) != (actual.trap, actual.values):
                failures.append(f"{name}({v:#x}): wasmtime {expected}, got {actual}")
    assert not failures, "\n".join(failures)
