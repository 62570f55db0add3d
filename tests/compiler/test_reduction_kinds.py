"""Every reduction kind has an identity, a lowering and a fold on the host, and the analysis
recognises it: each row of ``ReductionKind`` is checked from the Wasm loop that makes it
to the combined result, so a kind cannot lose one of its parts unnoticed."""

from __future__ import annotations

import ctypes
import re
import struct

import pytest
from llvmlite import ir

from tensorwasm.compiler.analysis.loops import AnalysisOptions, analyze_module
from tensorwasm.compiler.analysis.plan import ReductionKind
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.compiler.lower.reduction import combine, fold_atomic, fold_block
from tensorwasm.compiler.lower.types import F32_T, F64_T, I32_T, I64_T, PTR_T
from tensorwasm.compiler.target import ARCH_PTX, HostTarget, NVPTXTarget
from tensorwasm.runtime.offload import OffloadModule
from tests.conftest import wat
from tests.offload_cases import instantiate

# Each kind at each width it reduces: (kind, bits), floats as f32/f64.
ROWS = [(kind, bits) for kind in ReductionKind for bits in (32, 64)]
FLOAT_TYPE = {32: F32_T, 64: F64_T}
INT_TYPE = {32: I32_T, 64: I64_T}
CTYPE = {32: ctypes.c_uint32, 64: ctypes.c_uint64}


def row_id(row: tuple[ReductionKind, int]) -> str:
    kind, bits = row
    return f"{kind}-{'f' if kind.is_float else 'i'}{bits}"


def samples(kind: ReductionKind, bits: int) -> list[int]:
    """Bit patterns that reach each kind's edge cases: signs, extremes, zeros (both for
    floats), infinities and subnormals (no NaN: its payload is the implementation's)."""
    if kind.is_float:
        fmt, ifmt = ("<f", "<I") if bits == 32 else ("<d", "<Q")
        values = [0.0, -0.0, 1.0, -1.5, 3.25, 1e30, -1e-30, float("inf"), float("-inf")]
        out = [struct.unpack(ifmt, struct.pack(fmt, v))[0] for v in values]
        return [*out, 1, (1 << (bits - 1)) | 5]  # the smallest subnormals
    top = 1 << (bits - 1)
    return [0, 1, 2, 7, top - 1, top, top + 1, (1 << bits) - 1, (1 << bits) - 2, 0x5A5A5A5A]


def _native(kind: ReductionKind, bits: int, build) -> ir.Module:
    """A module of one function ``f(a, b)`` over ``bits``-bit patterns, its body ``build``."""
    module = ir.Module("kinds")
    module.triple = HostTarget().triple
    ty = INT_TYPE[bits]
    fn = ir.Function(module, ir.FunctionType(ty, [ty, ty]), "f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    value_type = FLOAT_TYPE[bits] if kind.is_float else ty
    x, y = (b.bitcast(a, value_type) if kind.is_float else a for a in fn.args)
    result = build(b, x, y)
    b.ret(b.bitcast(result, ty) if kind.is_float else result)
    return module


def _call(module: ir.Module, bits: int):
    code = HostTarget().jit(str(module))
    ctype = CTYPE[bits]
    fn = ctypes.CFUNCTYPE(ctype, ctype, ctype)(code.address("f"))
    return lambda a, b: (code, fn(a, b))[1]  # (the code stays alive with the function)


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_the_identity_leaves_every_value_unchanged(row) -> None:
    kind, bits = row
    identity = kind.identity(bits)
    assert 0 <= identity < 1 << bits
    lowered = _call(_native(kind, bits, lambda b, x, y: combine(b, kind, x, y)), bits)
    for x in samples(kind, bits):
        assert kind.fold_bits(identity, x, bits) == x, hex(x)
        assert kind.fold_bits(x, identity, bits) == x, hex(x)
        assert lowered(identity, x) == x, hex(x)
        assert lowered(x, identity) == x, hex(x)


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_the_lowering_and_the_host_fold_agree(row) -> None:
    """``combine`` (the kernels' fold) and ``fold_bits`` (the launch's fold of the threads'
    partials) compute the same operation on every pair of samples."""
    kind, bits = row
    lowered = _call(_native(kind, bits, lambda b, x, y: combine(b, kind, x, y)), bits)
    for x in samples(kind, bits):
        for y in samples(kind, bits):
            assert lowered(x, y) == kind.fold_bits(x, y, bits), (hex(x), hex(y))


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_the_atomic_fold_into_a_slot_is_the_same_operation(row) -> None:
    """``fold_atomic`` (an atomicrmw, or compare-and-swap where the kind has none), run on
    the host: ``f(a, b)`` stores ``a`` in a slot, folds ``b`` into it and returns the slot."""
    kind, bits = row

    def through_a_slot(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
        slot = b.alloca(x.type)
        b.store(x, slot)
        fold_atomic(b, kind, slot, y)
        return b.load(slot, typ=x.type)

    folded = _call(_native(kind, bits, through_a_slot), bits)
    for x in samples(kind, bits):
        for y in samples(kind, bits)[::3]:
            assert folded(x, y) == kind.fold_bits(x, y, bits), (hex(x), hex(y))


# The PTX atomic instruction of each kind (PTX ISA, "atom"): the operation and its type
# suffix; a kind without one folds by compare-and-swap of the bits.
PTX_ATOM = {
    ReductionKind.ADD: "add.u", ReductionKind.AND: "and.b", ReductionKind.OR: "or.b",
    ReductionKind.XOR: "xor.b", ReductionKind.MIN_S: "min.s", ReductionKind.MIN_U: "min.u",
    ReductionKind.MAX_S: "max.s", ReductionKind.MAX_U: "max.u", ReductionKind.FADD: "add.f",
    ReductionKind.MUL: "cas.b", ReductionKind.FMUL: "cas.b",
}  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_the_gpu_lowering_folds_a_block_with_the_kinds_atomic(row) -> None:
    kind, bits = row
    target = NVPTXTarget("sm_80", ARCH_PTX["sm_80"])
    module = ir.Module("kinds")
    module.triple, module.data_layout = target.triple, target.data_layout
    value_type = FLOAT_TYPE[bits] if kind.is_float else INT_TYPE[bits]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T, value_type]), "fold")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    slot, partial = fn.args
    identity = ir.Constant(INT_TYPE[bits], kind.identity(bits))
    fold_block(module, b, [kind], [partial], [b.bitcast(identity, value_type)], [slot])
    b.ret_void()
    ptx = target.emit_ptx(str(module))
    # atom[.qualifiers].OP.TYPE: the last two parts name the operation and the type.
    atoms = {".".join(atom.split(".")[-2:]) for atom in re.findall(r"\batom\.[\w.]+", ptx)}
    assert atoms == {f"{PTX_ATOM[kind]}{bits}"}, atoms


# The update of the running value ``$acc`` by the element ``$x``, per kind.
UPDATE = {
    ReductionKind.ADD: "({t}.add (local.get $acc) (local.get $x))",
    ReductionKind.MUL: "({t}.mul (local.get $acc) (local.get $x))",
    ReductionKind.AND: "({t}.and (local.get $acc) (local.get $x))",
    ReductionKind.OR: "({t}.or (local.get $acc) (local.get $x))",
    ReductionKind.XOR: "({t}.xor (local.get $acc) (local.get $x))",
    ReductionKind.MIN_S: "(select (local.get $x) (local.get $acc) ({t}.lt_s (local.get $x) (local.get $acc)))",
    ReductionKind.MIN_U: "(select (local.get $x) (local.get $acc) ({t}.lt_u (local.get $x) (local.get $acc)))",
    ReductionKind.MAX_S: "(select (local.get $x) (local.get $acc) ({t}.gt_s (local.get $x) (local.get $acc)))",
    ReductionKind.MAX_U: "(select (local.get $x) (local.get $acc) ({t}.gt_u (local.get $x) (local.get $acc)))",
    ReductionKind.FADD: "({t}.add (local.get $acc) (local.get $x))",
    ReductionKind.FMUL: "({t}.mul (local.get $acc) (local.get $x))",
}
N = 3000


def reduce_module(kind: ReductionKind, bits: int) -> tuple[bytes, str]:
    """A module whose ``reduce(n, init)`` folds ``n`` elements of memory into ``init``."""
    t = f"{'f' if kind.is_float else 'i'}{bits}"
    shift = 2 if bits == 32 else 3
    return wat(f"""(module (memory (export "memory") 1)
      (func (export "reduce") (param $n i32) (param $init {t}) (result {t})
        (local $i i32) (local $acc {t}) (local $x {t})
        (local.set $acc (local.get $init))
        (loop $l
          (local.set $x ({t}.load (i32.shl (local.get $i) (i32.const {shift}))))
          (local.set $acc {UPDATE[kind].format(t=t)})
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
        (local.get $acc)))"""), t


def elements(kind: ReductionKind, bits: int) -> tuple[bytes, int | float]:
    """``N`` elements and an initial value whose fold is exact in any order (floats: small
    integers to add; factors -1, 2 and 0.5 to multiply), and varied enough that a wrong
    operation gives another result."""
    if kind.is_float:
        if kind is ReductionKind.FMUL:
            values = [(-1.0, 2.0, 0.5, 1.0, 2.0)[i % 5] for i in range(N)]
        else:
            values = [float((i * 37) % 101 - 50) for i in range(N)]
        return struct.pack(f"<{N}{'f' if bits == 32 else 'd'}", *values), 1.5
    mask = (1 << bits) - 1
    values = [((i + 1) * 0x9E3779B97F4A7C15 >> (64 - bits)) & mask for i in range(N)]
    if kind is ReductionKind.MUL:
        values = [v | 1 for v in values]  # odd: a product that does not reach 0
    init = 0x1234567 if kind not in (ReductionKind.AND, ReductionKind.MIN_U) else -2
    return struct.pack(f"<{N}{'I' if bits == 32 else 'Q'}", *values), init


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_the_analysis_recognises_each_kind_and_the_offloaded_loop_matches_wasmtime(row) -> None:
    kind, bits = row
    wasm, _ = reduce_module(kind, bits)
    (report,) = analyze_module(translate_module(load(wasm)), AnalysisOptions(relaxed_float=True))
    assert report.verdict == "offload", report.reason
    assert [r.op for r in report.plan.reductions] == [kind]
    assert report.plan.reductions[0].op is kind
    assert report.reason.endswith(f"reductions: {kind.value}")
    if kind.is_float:
        (strict,) = analyze_module(translate_module(load(wasm)))
        assert strict.verdict == "reject" and "needs --relaxed-float" in strict.reason

    data, init = elements(kind, bits)
    results = []
    for offload in (None, OffloadModule(wasm, device="cpu", options=AnalysisOptions(relaxed_float=True))):
        store, instance = instantiate(wasm if offload is None else offload.rewritten, offload)
        exports = instance.exports(store)
        exports["memory"].write(store, data, 0)
        results.append(exports["reduce"](store, N, init))
    assert sum(lp.stats.offloaded for lp in offload.loops) == 1, "the loop did not run as a kernel"
    assert results[1] == results[0]
