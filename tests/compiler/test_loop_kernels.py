"""The code of loop kernels' launch entries: reductions folded a block at a time on the GPU,
the context read once before the loop, full-width memory accesses where the address is
aligned (byte-wise ones where not), and results equal to wasmtime's for large launches."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import AnalysisOptions, analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.compiler.lower.function import FunctionLowering, ModuleLowering, lower_loop_entry, reachable
from tensorwasm.compiler.outline import outline
from tensorwasm.compiler.target import ARCH_PTX, ARCHES, HostTarget, NVPTXTarget
from tensorwasm.dialect.types import I32
from tensorwasm.runtime.executor import HostExecutor
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat

N = 5_000_000  # iterations: ~20k blocks of 256 threads on the GPU
I64_AT, F64_AT, F32_AT = 20_000_000, 60_000_000, 100_000_000  # arrays after the i32 one at 0

FILL = f"""
  (func $fill (param $n i32) (local $i i32) (local $h i32) (local $f f32)
    (loop $l
      (local.set $h (i32.mul (local.get $i) (i32.const 0x9E3779B1)))
      (local.set $h (i32.xor (local.get $h) (i32.shr_u (local.get $h) (i32.const 15))))
      (i32.store (i32.shl (local.get $i) (i32.const 2)) (local.get $h))
      (i64.store (i32.add (i32.const {I64_AT}) (i32.shl (local.get $i) (i32.const 3)))
        (i64.mul (i64.extend_i32_u (local.get $h)) (i64.const 0x9E3779B97F4A7C15)))
      ;; factors whose products are exact in any order: -1, and a few 2 and 0.5
      (local.set $f (f32.const 1))
      (if (i32.eqz (i32.rem_u (local.get $i) (i32.const 7))) (then (local.set $f (f32.const -1))))
      (if (i32.eq (i32.and (local.get $i) (i32.const 0xffff)) (i32.const 1)) (then (local.set $f (f32.const 2))))
      (if (i32.eq (i32.and (local.get $i) (i32.const 0xffff)) (i32.const 2)) (then (local.set $f (f32.const 0.5))))
      (f32.store (i32.add (i32.const {F32_AT}) (i32.shl (local.get $i) (i32.const 2))) (local.get $f))
      ;; small integers: sums exact in any order
      (f64.store (i32.add (i32.const {F64_AT}) (i32.shl (local.get $i) (i32.const 3)))
        (f64.convert_i32_s (i32.sub (i32.and (local.get $h) (i32.const 1023)) (i32.const 512))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))"""

REDUCTIONS = f"""(module (memory (export "memory") 1900)
{FILL}
  (func (export "ints") (param $n i32) (result i32 i32 i32 i32 i64 i64 i64 i64)
    (local $i i32) (local $x i32) (local $y i64)
    (local $s i32) (local $lo i32) (local $hi i32) (local $xr i32)
    (local $s64 i64) (local $lo64 i64) (local $hi64 i64) (local $xr64 i64)
    (call $fill (local.get $n))
    (local.set $lo (i32.const 0x7fffffff)) (local.set $hi (i32.const 0x80000000))
    (local.set $lo64 (i64.const -1)) (local.set $hi64 (i64.const 0x8000000000000000))
    (loop $l
      (local.set $x (i32.load (i32.shl (local.get $i) (i32.const 2))))
      (local.set $y (i64.load (i32.add (i32.const {I64_AT}) (i32.shl (local.get $i) (i32.const 3)))))
      (local.set $s (i32.add (local.get $s) (local.get $x)))
      (local.set $lo (select (local.get $x) (local.get $lo) (i32.lt_s (local.get $x) (local.get $lo))))
      (local.set $hi (select (local.get $x) (local.get $hi) (i32.gt_s (local.get $x) (local.get $hi))))
      (local.set $xr (i32.xor (local.get $xr) (local.get $x)))
      (local.set $s64 (i64.add (local.get $s64) (local.get $y)))
      (local.set $lo64 (select (local.get $y) (local.get $lo64) (i64.lt_u (local.get $y) (local.get $lo64))))
      (local.set $hi64 (select (local.get $y) (local.get $hi64) (i64.gt_s (local.get $y) (local.get $hi64))))
      (local.set $xr64 (i64.xor (local.get $xr64) (local.get $y)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $s) (local.get $lo) (local.get $hi) (local.get $xr)
    (local.get $s64) (local.get $lo64) (local.get $hi64) (local.get $xr64))
  (func (export "floats") (param $n i32) (result f32 f32 f64 f64)
    (local $i i32) (local $p f32) (local $s f32) (local $pd f64) (local $sd f64) (local $f f32)
    (call $fill (local.get $n))
    (local.set $p (f32.const 1)) (local.set $pd (f64.const 1))
    (loop $l
      (local.set $f (f32.load (i32.add (i32.const {F32_AT}) (i32.shl (local.get $i) (i32.const 2)))))
      (local.set $p (f32.mul (local.get $p) (local.get $f)))
      (local.set $s (f32.add (local.get $s) (f32.convert_i32_s
        (i32.sub (i32.and (i32.load (i32.shl (local.get $i) (i32.const 2))) (i32.const 3)) (i32.const 1)))))
      (local.set $pd (f64.mul (local.get $pd) (f64.promote_f32 (local.get $f))))
      (local.set $sd (f64.add (local.get $sd)
        (f64.load (i32.add (i32.const {F64_AT}) (i32.shl (local.get $i) (i32.const 3))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $p) (local.get $s) (local.get $pd) (local.get $sd)))"""

SAXPY = """(module (memory (export "memory") 1)
  (func (export "saxpy") (param $n i32) (param $a f32) (param $x i32) (param $y i32) (local $i i32)
    (loop $l
      (f32.store (i32.add (local.get $y) (i32.shl (local.get $i) (i32.const 2)))
        (f32.add (f32.mul (local.get $a) (f32.load (i32.add (local.get $x) (i32.shl (local.get $i) (i32.const 2)))))
                 (f32.load (i32.add (local.get $y) (i32.shl (local.get $i) (i32.const 2))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


def loop_kernels_ptx(text: str, arch: str) -> str:
    """The PTX of the launch entries of every loop the analysis offloads in ``text``."""
    module = translate_module(load(wat(text)))
    plans = [
        r.plan for r in analyze_module(module, AnalysisOptions(relaxed_float=True)) if r.verdict == "offload"
    ]
    return plans_ptx(module, plans, arch)


def plans_ptx(module, plans, arch: str) -> str:
    """The PTX of the launch entries of ``plans``' loops in ``module`` (translated)."""
    target = NVPTXTarget(arch, ARCH_PTX[arch])
    lowering = ModuleLowering(module, target)
    kernels = [outline(module, plan) for plan in plans]
    for index in reachable(module, [k.index for k in kernels]):
        FunctionLowering(lowering, module.functions[index]).lower()
    for kernel, plan in zip(kernels, plans, strict=True):
        lower_loop_entry(lowering, kernel.index, [r.op for r in plan.reductions])
    return target.emit_ptx(str(lowering.llvm))


def kernels(ptx: str) -> dict[str, str]:
    """Each ``.entry``'s body by name."""
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)[1:]
    return dict(zip(parts[::2], parts[1::2], strict=True))


def assemble(ptxas: str, ptx: str, arch: str, tmp_path: Path) -> None:
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    done = subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("arch", ARCHES)
def test_reductions_fold_a_block_at_a_time_before_their_atomics(
    arch: str, ptxas: str, tmp_path: Path
) -> None:
    """Each warp folds by shuffles, the warps meet at one barrier, and only then do atomics
    (or the compare-and-swap of a float multiply) touch the result slots: one per block,
    where there used to be one per thread, queued on the same few addresses."""
    ptx = loop_kernels_ptx(REDUCTIONS, arch)
    assemble(ptxas, ptx, arch, tmp_path)
    folding = {name: body for name, body in kernels(ptx).items() if "atom." in body}
    assert len(folding) == 2  # the integer and the float reduction loops; not the fill loop
    for name, body in folding.items():
        assert body.count("barrier.sync") == 1, name
        assert "bar.sync" not in body, name  # the aligned form needs converged warps
        barrier = body.index("barrier.sync")
        assert "shfl.sync.bfly.b32" in body[:barrier], name  # warps fold before the barrier
        assert "shfl.sync.bfly.b32" in body[barrier:], name  # warp 0 folds the warps' values
        atomics = [m.start() for m in re.finditer(r"\batom\.", body)]
        assert min(atomics) > barrier, name
    floats = next(body for body in folding.values() if "add.f64" in body)
    assert re.search(r"atom\.[\w.]*cas\.b32", floats) and re.search(r"atom\.[\w.]*cas\.b64", floats)


@pytest.mark.parametrize("arch", ARCHES)
def test_loop_reads_the_context_once_and_accesses_memory_at_full_width(
    arch: str, ptxas: str, tmp_path: Path
) -> None:
    """Memory base and size come from the context before the loop, and no iteration reads
    the trap slot (slot 6, byte 48) back: the thread's trap code is a register of its own.
    An aligned f32 is one ld.global.b32 / st.global.b32, not four byte accesses."""
    ptx = loop_kernels_ptx(SAXPY, arch)
    assemble(ptxas, ptx, arch, tmp_path)
    ((name, body),) = kernels(ptx).items()
    ctx = re.search(rf"ld\.param\.b64\s+(%rd\d+), \[{name}_param_0\];", body).group(1)
    ctx = re.search(rf"cvta\.to\.global\.u64\s+(%rd\d+), {ctx};", body).group(1)
    first_label = re.search(r"^\$L__BB\w+:", body, re.M).start()
    reads = [m.start() for m in re.finditer(rf"\bld\.[\w.]+\s+%\w+, \[{re.escape(ctx)}(\+\d+)?\]", body)]
    assert reads and max(reads) < first_label, "the context is read inside the loop"
    assert not re.search(rf"\bld\.[\w.]+\s+%\w+, \[{re.escape(ctx)}\+48\]", body)
    assert re.search(r"ld\.global\.b32", body) and re.search(r"st\.global\.b32", body)


@pytest.mark.parametrize("arch", ARCHES)
def test_proven_accesses_carry_no_bounds_or_alignment_test(arch: str) -> None:
    """saxpy's accesses are affine: the guards prove them inside memory and aligned before a
    launch, so its loops (whole chunks of a thread's iterations, then the rest: see
    compiler.stream) test nothing but their counters against the trip count (no trap
    branch, no byte-wise call)."""
    ptx = loop_kernels_ptx(SAXPY, arch)
    ((name, body),) = kernels(ptx).items()
    trip = re.search(rf"ld\.param\.[bus]64\s+(%rd\d+), \[{name}_param_2\];", body).group(1)
    loop = body[re.search(r"^\$L__BB\w+:", body, re.M).start() :]
    loop = loop[: loop.index("ret;")]
    # Besides the counters, at most one NaN test per stored float (Wasm's NaN rule, out of
    # line where it is a NaN: FunctionLowering.exact; a run of stores tests its values at
    # once, which LLVM may fold into setp.nan of two values); setp.nan also picks the NaN in
    # that rule, a select.
    tests = re.findall(r"\bsetp\.(?!nan|num)\S+\s+%p\d+, %rd\d+, (%rd\d+);", body)
    assert tests and set(tests) == {trip}, body
    assert len(re.findall(r"\bsetp\.(?!nan|num)", body)) == len(tests), body
    assert len(re.findall(r"\bsetp\.num", loop)) <= len(re.findall(r"\bst\.global", loop)), loop
    assert "call" not in loop and "_bytes" not in ptx


UNALIGNED = """(module (memory (export "memory") 1)
  (data (i32.const 0) "\\01\\82\\03\\f4\\05\\06\\87\\08\\09\\0a\\fb\\0c\\0d\\8e\\0f\\10")
  (func (export "loads") (param $a i32) (result i32 i32 i64 i64 f32 f64 i64)
    (i32.load (local.get $a)) (i32.load16_s offset=1 (local.get $a)) (i64.load (local.get $a))
    (i64.load32_s offset=3 (local.get $a)) (f32.load (local.get $a)) (f64.load offset=1 (local.get $a))
    (i64.load16_u (local.get $a)))
  (func (export "stores") (param $a i32) (param $v i64)
    (i64.store offset=32 (local.get $a) (local.get $v))
    (i32.store offset=48 (local.get $a) (i32.wrap_i64 (local.get $v)))
    (f64.store offset=64 (local.get $a) (f64.reinterpret_i64 (local.get $v)))
    (f32.store offset=80 (local.get $a) (f32.reinterpret_i32 (i32.wrap_i64 (local.get $v))))
    (i64.store16 offset=96 (local.get $a) (local.get $v))
    (i64.store32 offset=112 (local.get $a) (local.get $v))))"""


@dataclass(frozen=True)
class StrictHost(HostTarget):
    """The host, lowered as for a target that faults on misaligned accesses (the GPU)."""

    strict_alignment = True


class StrictHostExecutor(HostExecutor):
    def target(self):
        return StrictHost()


def test_strict_alignment_accesses_match_wasmtime_at_every_offset(monkeypatch) -> None:
    """The aligned and the byte-wise path of each access width, run natively: every offset
    from 0 to 8 (and one where the access runs off the end of memory) loads and stores the
    bytes wasmtime does."""
    from tensorwasm.dialect.types import I64

    monkeypatch.setenv("TENSORWASM_CACHE", "off")  # the strict code must not meet the host's
    data = wat(UNALIGNED)
    strict, reference = StrictHostExecutor(data), ReferenceInstance(data)
    assert (
        "tw_load64_bytes" in strict.compilation.llvm_ir and "tw_store32_bytes" in strict.compilation.llvm_ir
    )
    for a in [*range(9), 65530]:
        assert strict.call("loads", [(I32, a)]) == reference.call("loads", [(I32, a)]), a
        args = [(I32, a), (I64, 0x8877665544332211 + a)]
        assert strict.call("stores", args) == reference.call("stores", args), a
    assert strict.memory() == reference.memory("memory")


def _offloaded(wasm: bytes, device: str):
    """wasmtime running the rewritten module, its loops offloaded with relaxed float."""
    from tensorwasm.compiler.rewrite import HOST_MODULE

    offload = OffloadModule(wasm, device=device, mode="always", options=AnalysisOptions(relaxed_float=True))

    def host_funcs(store):
        return {(HOST_MODULE, name): f for name, f in offload.host_functions(store).items()}

    return offload, ReferenceInstance(offload.rewritten, host_funcs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("export", ["ints", "floats"])
def test_large_reductions_match_wasmtime(device: str, export: str) -> None:
    """5M iterations of add, min, max and xor on i32 and i64 (signed and unsigned), and of
    f32/f64 products and sums whose exact results do not depend on the order: every block
    folds its threads' partials, then the blocks fold into the slots."""
    data = wat(REDUCTIONS)
    offload, instance = _offloaded(data, device)
    expected = ReferenceInstance(data).call(export, [(I32, N)])
    assert not expected.trap and not expected.error
    assert instance.call(export, [(I32, N)]) == expected
    reduced = [lp for lp in offload.loops if lp.plan.reductions and lp.stats.offloaded]
    assert len(reduced) == 1, "the reduction loop did not run as a kernel"
    offload.close()
