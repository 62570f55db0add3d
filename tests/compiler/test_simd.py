"""SIMD128 through the compiler: every row lowers, the PTX of every op assembles, and the
LLVM IR keeps the gaps between Wasm and LLVM closed (shift masks, swizzle range, saturation)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tensorwasm.compiler import pipeline
from tensorwasm.compiler.lower import simd
from tensorwasm.compiler.target import ARCH_PTX, ARCHES, HostTarget, NVPTXTarget
from tests.compiler.simd_snippets import SIMD_ROWS, simd_module_wat
from tests.conftest import wat


def test_every_simd_row_has_a_lowering() -> None:
    rows = [op for op in SIMD_ROWS if op.dialect and op.dialect.startswith("simd.")]
    assert len(rows) == len(SIMD_ROWS) - 23  # the 22 memory rows and v128.const: mem and arith ops
    missing = [op.name for op in rows if simd.lowering_of(op.dialect, op.name) is None]
    assert not missing, missing
    # And no table holds an operation no row names (a typo would go unnoticed otherwise).
    names = {op.name for op in SIMD_ROWS}
    for table in (simd.UNARY, simd.BINARY, simd.SHIFT, simd.TEST):
        assert set(table) <= names, set(table) - names


def _compile(data: bytes, target, stop: str | None = None) -> pipeline.CompileState:
    return pipeline.run(pipeline.Request(data, target=target), stop)


@pytest.mark.parametrize("arch", ARCHES)
def test_ptx_of_every_simd_op_assembles(arch: str, ptxas: str, tmp_path: Path) -> None:
    ptx = _compile(wat(simd_module_wat()), NVPTXTarget(arch, ARCH_PTX[arch])).ptx.text or ""
    assert ptx.count(".entry tw_call_") == len(SIMD_ROWS)
    assert ptx.isascii()
    assert "fma." not in ptx and ".ftz" not in ptx and ".approx" not in ptx
    src = tmp_path / "simd.ptx"
    src.write_text(ptx)
    proc = subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(tmp_path / "simd.cubin")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def _llvm_of(body: str, params: str = "(param v128 v128)") -> str:
    data = wat(f'(module (func (export "f") {params} (result v128) {body}))')
    return _compile(data, HostTarget(), "llvm").llvm.text


def test_lane_shift_count_is_masked_to_the_lane_width() -> None:
    text = _llvm_of("local.get 0 local.get 1 i8x16.shl", "(param v128 i32)")
    assert re.search(r"and i32 %\S+, 7\n", text), text


def test_swizzle_tests_the_index_range() -> None:
    text = _llvm_of("local.get 0 local.get 1 i8x16.swizzle")
    assert "icmp ult i8" in text and ", 16" in text


@pytest.mark.parametrize("body", ["local.get 0 i16x8.neg", "local.get 0 i16x8.abs", "local.get 0 i8x16.neg"])
def test_gpu_negates_narrow_lanes_in_32_bits(body: str) -> None:
    # ptxas's neg.s16 of -32768 leaves +32768 in its register for a later compare or
    # sign extension to read (simd_i16x8_sat_arith's sat-add_s-neg on sm_90).
    data = wat(
        f'(module (func (export "f") (param v128 v128) (result v128) {body} local.get 1 i16x8.add_sat_s))'
    )
    ptx = _compile(data, NVPTXTarget("sm_90", ARCH_PTX["sm_90"])).ptx.text
    assert "neg.s16" not in ptx and "sub.s16" not in ptx, ptx
    assert "neg.s32" in ptx or "sub.s32" in ptx
