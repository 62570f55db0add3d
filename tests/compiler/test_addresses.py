"""Addresses of loop kernels' accesses: where the guards prove an affine access inside linear
memory, the outliner computes its address in 64 bits from its polynomial
(``compiler.outline.exact_address``), so neighbour loads share one base register and differ
by an immediate offset; where nothing is proven (a gathered load, a whole function) the
i32 address keeps its bounds test. Results stay wasmtime's, an address whose i32 arithmetic
wraps on the way included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensorwasm.compiler.analysis.loops import AnalysisOptions, analyze_module
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.compiler.lower.function import FunctionLowering, ModuleLowering
from tensorwasm.compiler.outline import outline
from tensorwasm.compiler.target import ARCHES, HostTarget
from tensorwasm.dialect.ir import Function
from tensorwasm.dialect.types import I32, I64
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.reference import ReferenceInstance
from tests.compiler.test_loop_kernels import assemble, kernels, loop_kernels_ptx
from tests.conftest import wat

# b[i] = a[i-1] + a[i] + a[i+1] for i in [0, n): a[i-1] as a + ((i - 1) << 2), whose i32
# arithmetic wraps at i = 0 (0xfffffffc) and comes back into memory when a >= 4.
BLUR = """(module (memory (export "memory") 1)
  (func (export "init") (param $n i32) (local $i i32)
    (loop $l
      (f32.store (i32.shl (local.get $i) (i32.const 2))
        (f32.convert_i32_s (i32.mul (local.get $i) (i32.const 7))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))
  (func (export "blur") (param $n i32) (param $a i32) (param $b i32) (local $i i32)
    (loop $l
      (f32.store (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))
        (f32.add
          (f32.add
            (f32.load (i32.add (local.get $a) (i32.shl (i32.sub (local.get $i) (i32.const 1)) (i32.const 2))))
            (f32.load (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2)))))
          (f32.load offset=4 (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""

# b[i] = a[idx[i]]: the gathered load is not affine, so the kernel tests it itself.
GATHER = """(module (memory (export "memory") 1)
  (func (export "gather") (param $n i32) (param $a i32) (param $idx i32) (param $b i32) (local $i i32)
    (loop $l
      (i32.store (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))
        (i32.load (i32.add (local.get $a) (i32.shl
          (i32.load (i32.add (local.get $idx) (i32.shl (local.get $i) (i32.const 2)))) (i32.const 2)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


# b[i] = a[i] - a[i-1] with a[i-1] carried from the previous iteration: the kernel reloads
# it (an access of the same load op at the previous iteration's address).
CARRIED = """(module (memory (export "memory") 1)
  (func (export "init") (param $n i32) (param $a i32) (local $i i32)
    (loop $l
      (i32.store (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2)))
        (i32.mul (i32.mul (local.get $i) (local.get $i)) (i32.const 7)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))
  (func (export "diff") (param $n i32) (param $a i32) (param $b i32) (local $i i32) (local $prev i32) (local $v i32)
    (local.set $prev (i32.load (local.get $a)))
    (local.set $i (i32.const 1))
    (loop $l
      (local.set $v (i32.load (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2)))))
      (i32.store (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))
        (i32.sub (local.get $v) (local.get $prev)))
      (local.set $prev (local.get $v))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


def _kernel_ir(text: str, func: str) -> tuple[Function, str]:
    """The outlined kernel of the loop of ``text``'s function ``func`` and its LLVM IR for
    the host, as lowered (before LLVM optimises it)."""
    module = translate_module(load(wat(text)))
    (plan,) = [
        r.plan
        for r in analyze_module(module, AnalysisOptions())
        if r.verdict == "offload" and r.plan.func.name == func
    ]
    lowering = ModuleLowering(module, HostTarget())
    kernel = outline(module, plan)
    FunctionLowering(lowering, kernel).lower()
    return kernel, _function_ir(lowering, kernel)


def _function_ir(lowering: ModuleLowering, func: Function) -> str:
    name = lowering.function_for(func.index).name
    match = re.search(rf'define [^\n]*@"?{re.escape(name)}"?\(.*?\n}}\n', str(lowering.llvm), re.S)
    assert match, name
    return match.group(0)


def test_proven_neighbour_loads_get_exact_64_bit_addresses() -> None:
    """Each of the stencil's accesses is proven: its address operand is the ``trunc`` of an
    i64 sum (``wide_address``), and the three loads' sums differ only in their constants."""
    kernel, _ = _kernel_ir(BLUR, "blur")
    accesses = [op for op in kernel.ops() if op.name in ("mem.load", "mem.store")]
    assert len(accesses) == 4
    constants = []
    for op in accesses:
        assert op.attrs.get("proven") and op.attrs.get("wide_address"), op
        trunc = op.operands[0].owner
        assert trunc.name == "arith.trunc" and trunc.operands[0].type is I64
        total = trunc.operands[0].owner
        if op.name == "mem.load":
            assert total.name == "arith.add"
            last = total.operands[1].owner
            constants.append(last.attrs["value"] if last.name == "arith.constant" else 0)
    # a + 4i - 4, a + 4i, and a + 4i with the static offset 4 (added by the lowering)
    assert sorted(c - (1 << 64) if c >> 63 else c for c in constants) == [-4, 0, 0]


def test_unproven_accesses_keep_their_bounds_tests() -> None:
    """The gathered load of a kernel has no proven address: it keeps its i32 operand and its
    test against the memory size (a branch to the out-of-bounds trap); the kernel's affine
    accesses (``idx[i]``, ``b[i]``) have none."""
    kernel, body = _kernel_ir(GATHER, "gather")
    loads = [op for op in kernel.ops() if op.name == "mem.load"]
    gathered = [op for op in loads if op.attrs.get("gather")]
    assert len(gathered) == 1 and not gathered[0].attrs.get("wide_address")
    assert gathered[0].operands[0].owner.name != "arith.trunc"
    assert len(re.findall(r"br i1 [^\n]*label %\"?trap\.memory_out_of_bounds", body)) == 1, body


def test_whole_functions_keep_their_bounds_tests() -> None:
    """Outside a loop kernel nothing is proven: each access of ``blur`` run as a whole
    function tests its range, three loads and a store."""
    module = translate_module(load(wat(BLUR)))
    lowering = ModuleLowering(module, HostTarget())
    blur = next(f for f in module.functions if f.name == "blur")
    FunctionLowering(lowering, blur).lower()
    body = _function_ir(lowering, blur)
    assert len(re.findall(r"br i1 [^\n]*label %\"?trap\.memory_out_of_bounds", body)) == 4, body
    assert not any(op.attrs.get("wide_address") for op in blur.ops())


@pytest.mark.parametrize("arch", ARCHES)
def test_neighbour_loads_share_a_base_with_immediate_offsets(arch: str, ptxas: str, tmp_path: Path) -> None:
    """In the PTX, a[i-1], a[i] and a[i+1] are one base register and the offsets -4, 0 and
    +4 (``ld.global.b32 %r1, [%rd4+-4]``), where the i32 address took an add, a
    zero-extension and a 64-bit add per load."""
    ptx = loop_kernels_ptx(BLUR, arch)
    assemble(ptxas, ptx, arch, tmp_path)
    blur = [body for body in kernels(ptx).values() if body.count("ld.global.b32") >= 3]
    assert len(blur) == 1
    offsets: dict[str, set[int]] = {}
    for base, offset in re.findall(r"ld\.global\.b32\s+%r\d+, \[(%rd\d+)(?:\+(-?\d+))?\]", blur[0]):
        offsets.setdefault(base, set()).add(int(offset or 0))
    assert any({-4, 4} <= found for found in offsets.values()), offsets


def _offloaded(wasm: bytes, device: str) -> tuple[OffloadModule, ReferenceInstance]:
    from tensorwasm.compiler.rewrite import HOST_MODULE

    offload = OffloadModule(wasm, device=device, mode="always")

    def host_funcs(store):
        return {(HOST_MODULE, name): f for name, f in offload.host_functions(store).items()}

    return offload, ReferenceInstance(offload.rewritten, host_funcs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_wrapping_i32_address_matches_wasmtime(device: str) -> None:
    """With ``a`` at 1024, a[i-1] at i = 0 wraps in i32 arithmetic and lands at 1020: the
    kernel runs (the guards prove every access inside memory) and writes what wasmtime
    writes. With ``a`` at 0 it lands at 0xfffffffc: the guards decline, and the loop traps
    on wasmtime's side as Wasm says."""
    data = wat(BLUR)
    n = 3000
    offload, instance = _offloaded(data, device)
    reference = ReferenceInstance(data)
    for target in (instance, reference):
        assert not target.call("init", [(I32, 16384)]).trap
    args = [(I32, n), (I32, 1024), (I32, 32768)]
    expected = reference.call("blur", args)
    assert not expected.trap
    assert instance.call("blur", args) == expected
    assert instance.memory("memory") == reference.memory("memory")
    blur = [lp for lp in offload.loops if lp.plan.func.name == "blur"]
    assert len(blur) == 1 and blur[0].stats.offloaded, "the stencil did not run as a kernel"
    args = [(I32, n), (I32, 0), (I32, 32768)]
    expected = reference.call("blur", args)
    assert expected.trap
    assert instance.call("blur", args) == expected
    offload.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_carried_load_reads_its_own_address(device: str) -> None:
    """A load whose value the next iteration reuses has two accesses in the plan, its own
    and the reload of the previous iteration's: the load in the body takes its own address
    (it took the reload's once, and every b[i] came out 0)."""
    data = wat(CARRIED)
    offload, instance = _offloaded(data, device)
    reference = ReferenceInstance(data)
    for target in (instance, reference):
        assert not target.call("init", [(I32, 2000), (I32, 1024)]).trap
    args = [(I32, 2000), (I32, 1024), (I32, 16384)]
    expected = reference.call("diff", args)
    assert not expected.trap
    assert instance.call("diff", args) == expected
    assert instance.memory("memory") == reference.memory("memory")
    diff = [lp for lp in offload.loops if lp.plan.func.name == "diff"]
    assert len(diff) == 1 and diff[0].plan.rotations and diff[0].stats.offloaded
    offload.close()
