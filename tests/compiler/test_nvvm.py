"""libNVVM as the second PTX code generator: the lowering's IR in NVVM's LLVM 7 dialect,
exact-math PTX that ptxas takes for every architecture, the choice of code generator and
its place in cache keys, and what libNVVM cannot take, refused by name. The same kernels
run both ways on a GPU, their memory compared bit for bit (marker gpu)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tensorwasm.compiler import pipeline
from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.target import ARCH_PTX, ARCHES, NVPTXTarget, describe, nvvm
from tensorwasm.support import config
from tensorwasm.support.errors import ConfigError
from tests.conftest import wat

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((ROOT / "benchmarks/suite/build").glob("*.wasm")) + sorted(
    p for p in (ROOT / "examples").rglob("*.wasm") if ".O0." not in p.name
)


def loop_kernels_llvm(data: bytes, arch: str) -> pipeline.LLVMModule:
    request = pipeline.Request(data, entries=pipeline.LOOPS, translate=pipeline.LOOP_CLOSURE,
                               options=AnalysisOptions(relaxed_float=True),
                               target=NVPTXTarget(arch, ARCH_PTX[arch]))  # fmt: skip
    return pipeline.run(request, "llvm").llvm


def assemble(ptxas: str, ptx: str, arch: str, tmp_path: Path) -> None:
    source = tmp_path / f"{arch}.ptx"
    source.write_text(ptx)
    done = subprocess.run([ptxas, f"-arch={arch}", str(source), "-o", str(tmp_path / f"{arch}.cubin")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def assert_exact_math(ptx: str) -> None:
    """No fused or approximate float arithmetic, no flush to zero; every float add, sub,
    mul, div and sqrt rounds to nearest explicitly (which also keeps ptxas from fusing)."""
    assert not re.search(r"\bfma\.", ptx)
    assert not re.search(r"\bmad\.[a-z.]*f(32|64)\b", ptx)
    assert ".ftz" not in ptx and ".approx" not in ptx
    for op in re.findall(r"(?<![.\w])(?:add|sub|mul|div|sqrt|rcp)\.[a-z0-9.]*f(?:32|64)\b", ptx):
        assert ".rn." in op, op


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_kernel_compiles_through_libnvvm_to_exact_ptx_that_ptxas_takes(
    path: Path, ptxas: str, tmp_path: Path
) -> None:
    data = path.read_bytes()
    for arch in ARCHES:
        module = loop_kernels_llvm(data, arch)
        if not module.entries:
            continue
        ptx = nvvm.emit_ptx(NVPTXTarget(arch, ARCH_PTX[arch], "nvvm"), module.text)
        assert "NVVM Compiler" in ptx
        assert f".target {arch}" in ptx and f".version {NVPTXTarget(arch, ARCH_PTX[arch]).ptx_isa}\n" in ptx
        for entry in module.entries.values():
            assert f".entry {entry}(" in ptx, entry
        assert_exact_math(ptx)
        assemble(ptxas, ptx, arch, tmp_path)


F32_OPS = """(module (memory (export "memory") 1)
  (func (export "ops") (param $n i32) (local $i i32) (local $a f32) (local $b f32)
    (loop $l
      (local.set $a (f32.load (i32.shl (local.get $i) (i32.const 2))))
      (local.set $b (f32.load offset=4096 (i32.shl (local.get $i) (i32.const 2))))
      (f32.store offset=8192 (i32.shl (local.get $i) (i32.const 2))
        (f32.add (f32.mul (local.get $a) (local.get $b)) (f32.min (local.get $a) (local.get $b))))
      (f32.store offset=12288 (i32.shl (local.get $i) (i32.const 2))
        (f32.div (f32.sqrt (local.get $a)) (f32.nearest (local.get $b))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


@pytest.mark.parametrize("arch", ARCHES)
def test_float_ops_keep_wasm_rules_through_libnvvm(arch: str, ptxas: str, tmp_path: Path) -> None:
    """A multiply feeding an add stays two rounded operations; division and square root
    are IEEE; min is PTX's min.NaN where the target has it (renamed from llvm.minimum,
    which LLVM 7 lacks), and nearest is cvt.rni (roundeven is LLVM 7's rint)."""
    module = loop_kernels_llvm(wat(F32_OPS), arch)
    ptx = nvvm.emit_ptx(NVPTXTarget(arch, ARCH_PTX[arch], "nvvm"), module.text)
    assert_exact_math(ptx)
    assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx
    assert "div.rn.f32" in ptx and "sqrt.rn.f32" in ptx
    assert "cvt.rni.f32.f32" in ptx
    assert ("min.NaN.f32" in ptx) == (arch != "sm_75")
    assemble(ptxas, ptx, arch, tmp_path)


TYPED = """target triple = "nvptx64-nvidia-cuda"
@table = internal addrspace(3) global [4 x i32] zeroinitializer, align 4
declare void @llvm.memset.p1.i64(ptr addrspace(1), i8, i64, i1)
define internal i32 @callee(ptr %p, i32 %x) {
  ret i32 %x
}
define ptx_kernel void @k(ptr noalias nonnull align 8 %ctx, i32 %i, ptr %fp) {
  %slot = alloca { i32, i64 }, align 8
  %field = getelementptr inbounds { i32, i64 }, ptr %slot, i32 0, i32 1
  store i64 7, ptr %field, align 8
  %base = load ptr, ptr %ctx, align 8
  %g = addrspacecast ptr %base to ptr addrspace(1)
  %cell = getelementptr [4 x i32], ptr addrspace(3) @table, i64 0, i32 %i
  %v = load i32, ptr addrspace(3) %cell, align 4
  %old = atomicrmw add ptr addrspace(1) %g, i32 %v monotonic, align 4
  %pair = cmpxchg ptr addrspace(1) %g, i32 %old, i32 %v monotonic monotonic, align 4
  %r = call i32 %fp(ptr %ctx, i32 %old)
  %d = call i32 @callee(ptr %ctx, i32 %r)
  call void @llvm.memset.p1.i64(ptr addrspace(1) %g, i8 0, i64 16, i1 false)
  store i32 %d, ptr addrspace(1) %g, align 4
  ret void
}
"""


def test_the_dialect_has_typed_pointers_llvm7_names_and_a_kernel_annotation(tmp_path: Path) -> None:
    """Pointers become i8* of their address space, cast to what each access reads; globals
    are cast where used; intrinsic overloads are LLVM 7's; the kernel is annotated. libNVVM
    compiles the result (the check that it reads it as LLVM 7)."""
    text = nvvm.to_nvvm_ir(TYPED)
    assert re.search(r"define void @k\(i8\* noalias nonnull align 8 %ctx, i32 %i, i8\* %fp\)", text)
    assert "bitcast i8 addrspace(1)* %g to i32 addrspace(1)*" in text
    assert "bitcast ([4 x i32] addrspace(3)* @table to i8 addrspace(3)*)" in text
    assert "@llvm.memset.p1i8.i64(i8 addrspace(1)* %g" in text
    assert re.search(r"bitcast i8\* %fp to i32 \(i8\*, i32\)\*", text)
    assert re.search(r'!\{void \(i8\*, i32, i8\*\)\* @k, !"kernel", i32 1\}', text)
    assert "align 4\n" not in "".join(line for line in text.splitlines(True) if "atomicrmw" in line)
    assert " ptr" not in text and "ptx_kernel" not in text
    assert f'target datalayout = "{nvvm.NVVM_DATA_LAYOUT}"' in text
    ptx = nvvm.emit_ptx(NVPTXTarget("sm_90", ARCH_PTX["sm_90"], "nvvm"), TYPED)
    assert ".entry k(" in ptx and "atom.global.add.u32" in ptx


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ("%y = fneg float %x", "fneg"),
        ("%y = freeze float %x", "freeze"),
        ("%y = call float @llvm.maximum.f64(double 1.0, double 2.0)", "llvm.maximum.f64"),
        ("%y = call i32 @llvm.smax.i32(i32 1, i32 2)", "llvm.smax.i32"),
        ("%y = atomicrmw fmax ptr %p, float %x monotonic", "atomicrmw fmax"),
    ],
)
def test_what_llvm7_lacks_is_refused_by_name(body: str, name: str) -> None:
    declares = {"llvm.maximum.f64": "declare double @llvm.maximum.f64(double, double)\n",
                "llvm.smax.i32": "declare i32 @llvm.smax.i32(i32, i32)\n"}  # fmt: skip
    module = f"{declares.get(name, '')}define void @f(float %x, ptr %p) {{\n  {body}\n  ret void\n}}\n"
    with pytest.raises(nvvm.NVVMUnsupported, match=re.escape(name)):
        nvvm.to_nvvm_ir(module)


def test_an_nvvm_intrinsic_libnvvm_does_not_know_is_refused_by_name() -> None:
    """libNVVM leaves an unknown intrinsic as a call to an external function; the module is
    whole, so that is an error naming it, not PTX that fails to link on the device."""
    module = """declare i32 @llvm.nvvm.no.such.thing()
define ptx_kernel void @k(ptr %p) {
  %v = call i32 @llvm.nvvm.no.such.thing()
  store i32 %v, ptr %p
  ret void
}
"""
    with pytest.raises(nvvm.NVVMUnsupported, match=r"intrinsic llvm\.nvvm\.no\.such\.thing"):
        nvvm.emit_ptx(NVPTXTarget("sm_90", ARCH_PTX["sm_90"], "nvvm"), module)


def test_the_options_are_exact_math_at_o3_for_the_targets_architecture() -> None:
    assert nvvm.options(NVPTXTarget("sm_75", ARCH_PTX["sm_75"])) == [
        "-arch=compute_75", "-opt=3", "-fma=0", "-prec-div=1", "-prec-sqrt=1", "-ftz=0"
    ]  # fmt: skip
    assert nvvm.options(NVPTXTarget("sm_90", ARCH_PTX["sm_90"]))[0] == "-arch=compute_90"


def test_the_choice_of_code_generator_comes_from_the_environment_and_keys_the_cache(monkeypatch) -> None:
    monkeypatch.delenv(config.PTX_BACKEND, raising=False)
    assert config.ptx_backend() == "auto"
    target = NVPTXTarget("sm_90", ARCH_PTX["sm_90"])
    assert target.backend == "llvm"  # auto: nvvm.AUTO_BACKEND's choice for sm_90
    assert {arch: NVPTXTarget(arch, ARCH_PTX[arch]).backend for arch in ARCH_PTX} == nvvm.AUTO_BACKEND
    monkeypatch.setitem(nvvm.AUTO_BACKEND, "sm_80", "nvvm")  # the table decides, per target
    assert NVPTXTarget("sm_80", ARCH_PTX["sm_80"]).backend == "nvvm" and target.backend == "llvm"
    llvm_key = describe(target)
    monkeypatch.setenv(config.PTX_BACKEND, "NVVM")
    assert config.ptx_backend() == "nvvm" and target.backend == "nvvm"
    assert describe(target) != llvm_key and nvvm.version() in describe(target)
    assert NVPTXTarget("sm_90", ARCH_PTX["sm_90"], "llvm").backend == "llvm"  # the target's own choice wins
    monkeypatch.setenv(config.PTX_BACKEND, "gcc")
    with pytest.raises(ConfigError, match="TENSORWASM_PTX_BACKEND='gcc'"):
        config.ptx_backend()


def test_the_pipeline_ptx_stage_uses_the_chosen_code_generator(monkeypatch) -> None:
    data = (ROOT / "benchmarks/suite/build/saxpy.wasm").read_bytes()
    request = pipeline.Request(data, entries=pipeline.LOOPS, translate=pipeline.LOOP_CLOSURE,
                               options=AnalysisOptions(), target=NVPTXTarget("sm_80", ARCH_PTX["sm_80"]))  # fmt: skip
    monkeypatch.setenv(config.PTX_BACKEND, "nvvm")
    assert "NVVM Compiler" in pipeline.run(request, "ptx").ptx.text
    monkeypatch.setenv(config.PTX_BACKEND, "llvm")
    assert "NVVM Compiler" not in pipeline.run(request, "ptx").ptx.text


def test_an_unknown_code_generator_is_refused() -> None:
    with pytest.raises(Exception, match="unknown PTX code generator 'gcc'"):
        NVPTXTarget("sm_90", ARCH_PTX["sm_90"], "gcc")


def test_a_missing_libnvvm_is_named(monkeypatch) -> None:
    """cuda-python's loader failing to find libnvvm.so is an error that names libNVVM and
    says how to get it or how to do without."""
    from cuda.bindings import nvvm as binding

    def not_found():
        raise RuntimeError("Unable to load libnvvm.so")

    monkeypatch.setattr(binding, "version", not_found)
    nvvm._bindings.cache_clear()
    try:
        with pytest.raises(
            nvvm.NVVMError, match=r"libNVVM \(libnvvm.so\) was not found.*TENSORWASM_PTX_BACKEND=llvm"
        ):
            nvvm.emit_ptx(NVPTXTarget("sm_90", ARCH_PTX["sm_90"], "nvvm"), TYPED)
    finally:
        nvvm._bindings.cache_clear()


SUITE = ("saxpy", "reduce", "dot", "gemv", "gemm", "stencil2d", "stencil3d", "condmap")


def _run_suite_program(name: str, device: str = "gpu") -> tuple[bytes, int, int]:
    """The suite program at its first small size on ``device``, every loop offloaded: its
    final linear memory, exit status and number of launches."""
    import wasmtime

    import tensorwasm
    from benchmarks.programs import PROGRAMS

    program = PROGRAMS[name]
    params = program.bind(program.sizes["small"][0])
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    wasi = wasmtime.WasiConfig()
    wasi.argv = [str(program.wasm), *program.argv(params)]
    store.set_wasi(wasi)
    instance = tensorwasm.instantiate(store, program.wasm.read_bytes(), linker=linker, device=device,
                                      offload="always", relaxed_float=program.relaxed_float)  # fmt: skip
    status = 0
    try:
        instance.exports(store)["_start"](store)
    except wasmtime.ExitTrap as exc:
        status = exc.code
    memory = instance.exports(store)["memory"]
    launches = sum(loop.offloaded for loop in tensorwasm.report(instance).loops)
    return bytes(memory.read(store, 0, memory.data_len(store))), status, launches


@pytest.mark.gpu
@pytest.mark.parametrize("name", SUITE)
def test_the_suites_kernels_leave_the_same_memory_from_llvm_and_libnvvm_ptx(
    name: str, monkeypatch, tmp_path: Path
) -> None:
    """Each program of the suite, its loops offloaded with PTX from LLVM and then from
    libNVVM (caches apart), leaves linear memory identical bit for bit; the first
    differing byte is named."""
    results = {}
    for codegen in ("llvm", "nvvm"):
        monkeypatch.setenv(config.PTX_BACKEND, codegen)
        monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / codegen))
        assert NVPTXTarget().backend == codegen
        results[codegen] = _run_suite_program(name)
    (llvm_memory, llvm_status, llvm_launches), (nvvm_memory, nvvm_status, nvvm_launches) = results.values()
    assert llvm_launches > 0 and nvvm_launches == llvm_launches
    assert llvm_status == nvvm_status
    assert len(llvm_memory) == len(nvvm_memory)
    if llvm_memory != nvvm_memory:
        first = next(i for i, (a, b) in enumerate(zip(llvm_memory, nvvm_memory, strict=True)) if a != b)
        pytest.fail(
            f"memory differs at byte 0x{first:x}: LLVM {llvm_memory[first]:#x}, NVVM {nvvm_memory[first]:#x}"
        )
