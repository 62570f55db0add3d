"""Every PTX the compiler emits for the test programs assembles with ptxas, for each target,
and keeps Wasm's float rules visible in the instructions."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tensorwasm.compiler import pipeline
from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.errors import CompileError
from tensorwasm.compiler.target import ARCH_PTX, ARCHES, NVPTXTarget, nvptx_for_device
from tests.conftest import CORPUS, wat
from tests.numeric_cases import numeric_module_wat
from tests.runtime.test_exec import PROGRAM

PROGRAMS = {
    "numeric": lambda: wat(numeric_module_wat()),
    "exec": lambda: wat(PROGRAM),
    **{p.name: p.read_bytes for p in CORPUS if ".O2." in p.name or ".O0." in p.name},
}


def compile_ptx(data: bytes, arch: str) -> str:
    """The PTX of every defined function of ``data`` whose calls stay in the module."""
    state = pipeline.run(pipeline.Request(data, target=NVPTXTarget(arch, ARCH_PTX[arch])))
    return state.ptx.text or ""


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_ptx_assembles(name: str, arch: str, ptxas: str, tmp_path: Path) -> None:
    ptx = compile_ptx(PROGRAMS[name](), arch)
    if not ptx:
        pytest.fail(f"{name}: nothing compiled")
    assert ptx.isascii()
    assert f".target {arch}" in ptx
    # Wasm forbids contraction and flush-to-zero; IEEE rounding is spelled out as .rn.
    assert "fma." not in ptx and ".ftz" not in ptx and ".approx" not in ptx
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    proc = subprocess.run(
        [ptxas, f"-arch={arch}", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_min_uses_min_nan_only_from_sm80() -> None:
    data = wat('(module (func (export "m") (param f32 f32) (result f32) local.get 0 local.get 1 f32.min))')
    assert re.search(r"min\.NaN\.f32", compile_ptx(data, "sm_80"))
    assert "min.NaN" not in compile_ptx(data, "sm_75")


def test_target_choice_by_capability_and_driver() -> None:
    assert nvptx_for_device((9, 0), 13000).arch == "sm_90"
    assert nvptx_for_device((8, 9), 12040).arch == "sm_80"
    assert nvptx_for_device((7, 5), 11040).ptx_isa == "7.0"
    with pytest.raises(CompileError, match=r"compute capability 7\.0 is not supported"):
        nvptx_for_device((7, 0), 13000)
    with pytest.raises(CompileError, match="update the driver"):
        nvptx_for_device((9, 0), 11040)  # CUDA 11.4 accepts PTX 7.4 only


REDUCTIONS_LOOP = """(module (memory (export "memory") 1)
  (func (export "r") (param $n i32) (result f64 i64) (local $i i32) (local $p f64) (local $s i64)
    (local.set $p (f64.const 1)) (local.set $s (i64.const 0))
    (loop $l
      (local.set $p (f64.mul (local.get $p) (f64.load (i32.shl (local.get $i) (i32.const 3)))))
      (local.set $s (i64.add (local.get $s) (i64.load (i32.shl (local.get $i) (i32.const 3)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $p) (local.get $s)))"""


def test_loop_entry_reductions_assemble_and_start_from_constant_identities(
    ptxas: str, tmp_path: Path
) -> None:
    """A float multiply reduction folds by compare-and-swap of its bits (LLVM has no cmpxchg
    of a double), and every thread starts from the identities as constants: reading them
    from the output slots would pick up the partials of blocks that finished earlier."""
    target = nvptx_for_device((9, 0), 13000)
    request = pipeline.Request(
        wat(REDUCTIONS_LOOP),
        entries=pipeline.LOOPS,
        options=AnalysisOptions(relaxed_float=True),
        target=target,
    )
    state = pipeline.run(request, "llvm")
    (report,) = state.loops.reports
    assert report.verdict == "offload", report.reason
    ops = [r.op for r in report.plan.reductions]
    assert sorted(ops) == ["add", "fmul"]
    (entry,) = state.llvm.entries.values()
    llvm_ir = state.llvm.text
    body = llvm_ir[llvm_ir.index(f'@"{entry}"') :]
    before_loop = body[body.index("entry:") : body.index("head:")]
    assert '%".4"' not in before_loop  # the output slots (argument 4) are not read first
    src = tmp_path / "r.ptx"
    src.write_text(pipeline.run(request, state=state).ptx.text)
    done = subprocess.run(
        [ptxas, "-arch=sm_90", str(src), "-o", str(tmp_path / "r.cubin")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_memory_init_from_a_segment_copies_its_bytes_on_the_gpu() -> None:
    """memory.init moves bytes from a data segment (a generic pointer) into linear memory (the
    global space): NVPTX cannot expand a memmove across address spaces and LLVM dropped it,
    leaving only the bounds checks; the PTX must hold the copy loop."""
    data = wat(
        '(module (memory 1) (data "hello") (func (export "init") (param i32 i32 i32)'
        " local.get 0 local.get 1 local.get 2 memory.init 0))"
    )
    ptx = compile_ptx(data, "sm_90")
    assert re.search(r"ld\.global\.(b|u)8", ptx) and re.search(r"st\.global\.(b|u)8", ptx), ptx
