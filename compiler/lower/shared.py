"""Shared memory and barriers: ``gpu.shared_load``, ``gpu.shared_store``, ``gpu.barrier``,
``gpu.barrier_or``; ``gpu.issued``, which keeps loads where the kernel issues them; and
``gpu.prefetch``, a hint that brings a line of linear memory into the L2 cache.

A function declares its shared arrays in its ``shared`` attribute (name -> (element type,
count)). On the GPU each array is a module global in address space 3 (PTX ``.shared``),
one per thread block, left undefined (PTX has no initialisers for shared memory); on the
host, where a tiled kernel runs one thread per block, the array is a stack array of the
function, so host threads running different tiles at once never share one. An array a
function declares in its ``private`` attribute instead (the same form) is the function's
own on the GPU too: a copy per thread, in local memory (a privatised temporary,
``compiler.outline``). Elements are read and written at their full width, which keeps
every bit (a float's NaN payload too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from tensorwasm.compiler.errors import CompileError
from tensorwasm.compiler.lower.memory import inside_or_zero
from tensorwasm.compiler.lower.types import I32_T, I64_T, llvm_type
from tensorwasm.dialect.ir import Op

if TYPE_CHECKING:
    from tensorwasm.compiler.lower.function import FunctionLowering

SHARED_ADDRESS_SPACE = 3  # NVPTX's .shared


def shared_array(fl: FunctionLowering, name: str) -> tuple[ir.Value, ir.Type]:
    """A pointer to element 0 of shared array ``name`` of the function being lowered, and
    the element type."""
    found = fl.shared.get(name)
    if found is not None:
        return found
    private = fl.func.attrs.get("private", {}).get(name)
    declared = private or fl.func.attrs.get("shared", {}).get(name)
    if declared is None:
        raise CompileError(f"shared array {name!r} is not declared by function {fl.func.name}")
    elem_type, count = llvm_type(declared[0]), declared[1]
    if fl.target.is_gpu and private is None:
        array_type = ir.ArrayType(elem_type, count)
        symbol = f"tw_shared_{fl.func.index}_{name}"
        array = ir.GlobalVariable(fl.module, array_type, symbol, addrspace=SHARED_ADDRESS_SPACE)
        array.linkage = "internal"
        array.initializer = ir.Constant(array_type, ir.Undefined)
        array.align = 16
        first = array.gep([ir.Constant(I32_T, 0), ir.Constant(I32_T, 0)])
    else:
        entry = fl.fn.entry_basic_block
        with fl.b.goto_block(entry):
            fl.b.position_before(entry.terminator)
            first = fl.b.alloca(elem_type, size=ir.Constant(I32_T, count), name=f"shared.{name}")
            first.align = 16
    fl.shared[name] = (first, elem_type)
    return first, elem_type


def _element(fl: FunctionLowering, op: Op, index: ir.Value) -> ir.Value:
    first, elem_type = shared_array(fl, op.attrs["array"])
    return fl.b.gep(first, [index], inbounds=True, source_etype=elem_type)


def lower_shared_load(fl: FunctionLowering, op: Op, args) -> ir.Value:
    ty = llvm_type(op.attrs["type"])
    return fl.b.load(_element(fl, op, args[0]), typ=ty, align=op.attrs["type"].bits // 8)


def lower_shared_store(fl: FunctionLowering, op: Op, args) -> None:
    index, value = args
    fl.b.store(value, _element(fl, op, index), align=op.operands[1].type.bits // 8)


def lower_barrier_or(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """GPU: PTX ``barrier.red.or`` over the block (the non-aligned form, so that a copy of it
    the optimiser might make still meets the others), in inline PTX marked convergent: the
    intrinsic LLVM has for it changed its name and operands since libNVVM's LLVM 7. Host: a
    block is one thread, so its own vote."""
    b = fl.b
    if not fl.target.is_gpu:
        return b.zext(b.icmp_unsigned("!=", args[0], ir.Constant(I32_T, 0)), I32_T)
    text = (
        "{ .reg .pred %p, %q; setp.ne.u32 %p, $1, 0; barrier.red.or.pred %q, 0, %p; selp.u32 $0, 1, 0, %q; }"
    )
    asm = ir.InlineAsm(ir.FunctionType(I32_T, [I32_T]), text, "=r,r", side_effect=True)
    return b.call(asm, [args[0]], attrs=("convergent",))


def lower_barrier(fl: FunctionLowering, op: Op, args) -> None:
    """``barrier.sync 0`` (non-aligned, as ``barrier_or``), through the intrinsic that
    libNVVM also knows under its older name."""
    if not fl.target.is_gpu:
        raise CompileError("gpu.barrier has no meaning on the host target")
    name = "llvm.nvvm.barrier.cta.sync.all"
    fn = fl.module.globals.get(name)
    if fn is None:
        fn = ir.Function(fl.module, ir.FunctionType(ir.VoidType(), [I32_T]), name=name)
        fn.attributes.add("convergent")
    fl.b.call(fn, [ir.Constant(I32_T, 0)])


# PTX inline-asm constraints by LLVM type, for gpu.issued's operands (the dialect's numbers).
_CONSTRAINTS = {"i32": "r", "i64": "l", "float": "f", "double": "d"}


def lower_issued(fl: FunctionLowering, op: Op, args) -> None:
    """GPU: an empty inline asm with side effects that takes each value, so that the code
    generator keeps their computation (a load issued a stage ahead, in flight while the
    block computes: :mod:`compiler.tile`) before this point; LLVM's machine sinking would
    otherwise move such a load next to its use, past the work it is to overlap. It emits
    nothing, so no instruction waits for the value here. Host: nothing."""
    if not fl.target.is_gpu:
        return
    for value in args:
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [value.type]), "", _CONSTRAINTS[str(value.type)],
                           side_effect=True)  # fmt: skip
        fl.b.call(asm, [value])


def lower_prefetch(fl: FunctionLowering, op: Op, args) -> None:
    """GPU: PTX ``prefetch.global.L2`` of the address, where the line lies in linear memory
    (elsewhere of address 0, which a memory of a page holds: a hint never faults here); an
    asm with side effects, which LLVM neither drops nor moves. Host: nothing."""
    if not fl.target.is_gpu:
        return
    b = fl.b
    ptr = inside_or_zero(fl, args[0], op.attrs["offset"], 1, aligned=False)
    asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [I64_T]), "prefetch.global.L2 [$0];", "l",
                       side_effect=True)  # fmt: skip
    b.call(asm, [b.ptrtoint(ptr, I64_T)])


LOWERINGS = {
    "gpu.shared_load": lower_shared_load,
    "gpu.shared_store": lower_shared_store,
    "gpu.barrier_or": lower_barrier_or,
    "gpu.barrier": lower_barrier,
    "gpu.issued": lower_issued,
    "gpu.prefetch": lower_prefetch,
}
