"""Linear memory: bounds-checked little-endian loads and stores, size, grow, bulk ops.

Wasm computes an effective address as the zero-extended i32 address plus the static
offset, without wrapping, and traps unless every accessed byte lies below the memory
size. Accesses may be unaligned, so they are emitted with alignment 1 (the target splits
them where it must). ``memory.grow`` fails (-1) past the declared maximum or the space the
runtime reserved; reserved space is zero, so grown pages need no clearing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from compiler.lower import abi
from compiler.lower.env import i32_const, i64_const
from compiler.lower.types import I8_T, I64_T, INT_OF_WIDTH, PTR_T
from compiler.traps import TrapKind
from dialect.ir import Op

if TYPE_CHECKING:
    from compiler.lower.function import FunctionLowering


def checked_address(fl: FunctionLowering, addr: ir.Value, offset: int, nbytes: ir.Value | int) -> ir.Value:
    """The host/device pointer of ``addr + offset``, trapping unless ``nbytes`` fit below the size."""
    b = fl.b
    ea = b.zext(addr, I64_T)
    if offset:
        ea = b.add(ea, i64_const(offset))
    n = i64_const(nbytes) if isinstance(nbytes, int) else nbytes
    end = b.add(ea, n)
    fl.env.trap_if(b.icmp_unsigned(">", end, fl.env.mem_size()), TrapKind.MEMORY_OUT_OF_BOUNDS)
    return b.gep(fl.env.mem_base(), [ea], source_etype=I8_T)


def gather_check(fl: FunctionLowering, addr: ir.Value, offset: int, nbytes: int) -> None:
    """A gathered load in a loop kernel may not read bytes the loop writes: compare its range
    with each written range in the context and stop the kernel with GATHER_CONFLICT if it
    meets one (the runtime then runs the loop on the CPU)."""
    b, env = fl.b, fl.env
    lo = b.add(b.zext(addr, I64_T), i64_const(offset))
    hi = b.add(lo, i64_const(nbytes))
    count = env.load_ctx(abi.CTX_WRITTEN_COUNT)
    ranges = env.load_ctx(abi.CTX_WRITTEN, PTR_T)
    with env.counted_loop(count) as i:
        w_lo = b.load(env.slot_in(ranges, b.shl(i, i64_const(1))), typ=I64_T)
        w_hi = b.load(env.slot_in(ranges, b.add(b.shl(i, i64_const(1)), i64_const(1))), typ=I64_T)
        overlap = b.and_(b.icmp_unsigned("<", lo, w_hi), b.icmp_unsigned("<", w_lo, hi))
        env.trap_if(overlap, TrapKind.GATHER_CONFLICT, "gather.ok")


def lower_load(fl: FunctionLowering, op: Op, args) -> ir.Value:
    bits = op.attrs["bits"]
    result_type = fl.llvm_type(op.results[0].type)
    if op.attrs.get("gather"):
        gather_check(fl, args[0], op.attrs["offset"], bits // 8)
    ptr = checked_address(fl, args[0], op.attrs["offset"], bits // 8)
    if bits == getattr(result_type, "width", bits) and not isinstance(result_type, ir.IntType):
        return fl.b.load(ptr, typ=result_type, align=1)
    value = fl.b.load(ptr, typ=INT_OF_WIDTH[bits], align=1)
    if bits == result_type.width:
        return value
    return fl.b.sext(value, result_type) if op.attrs["signed"] else fl.b.zext(value, result_type)


def lower_store(fl: FunctionLowering, op: Op, args) -> None:
    addr, value = args
    bits = op.attrs["bits"]
    ptr = checked_address(fl, addr, op.attrs["offset"], bits // 8)
    if isinstance(value.type, ir.IntType) and value.type.width != bits:
        value = fl.b.trunc(value, INT_OF_WIDTH[bits])
    elif not isinstance(value.type, ir.IntType):
        value = fl.target.float_bits(fl.b, value, INT_OF_WIDTH[bits])
    fl.b.store(value, ptr, align=1)


def lower_size(fl: FunctionLowering, op: Op, args) -> ir.Value:
    pages = fl.b.lshr(fl.env.mem_size(), i64_const(16))
    return fl.b.trunc(pages, ir.IntType(32))


def lower_grow(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Old size in pages on success, -1 when the maximum or the reserved space is exceeded."""
    b, env = fl.b, fl.env
    size = env.mem_size()
    old_pages = b.lshr(size, i64_const(16))
    new_pages = b.add(old_pages, b.zext(args[0], I64_T))
    new_size = b.shl(new_pages, i64_const(16))
    fits_max = b.icmp_unsigned("<=", new_pages, env.load_ctx(abi.CTX_MEM_MAX_PAGES))
    fits_space = b.icmp_unsigned("<=", new_size, env.load_ctx(abi.CTX_MEM_CAPACITY))
    ok = b.and_(fits_max, fits_space)
    with b.if_then(ok):
        env.store_ctx(abi.CTX_MEM_SIZE, new_size)
        b.store(new_size, env.mem_size_slot)
    return b.select(ok, b.trunc(old_pages, ir.IntType(32)), i32_const(-1))


def memmove(fl: FunctionLowering, dst: ir.Value, src: ir.Value, n: ir.Value) -> None:
    fn = fl.module.globals.get("llvm.memmove.p0.p0.i64")
    if fn is None:
        fnty = ir.FunctionType(ir.VoidType(), [PTR_T, PTR_T, I64_T, ir.IntType(1)])
        fn = ir.Function(fl.module, fnty, name="llvm.memmove.p0.p0.i64")
    fl.b.call(fn, [dst, src, n, ir.Constant(ir.IntType(1), 0)])


def lower_copy(fl: FunctionLowering, op: Op, args) -> None:
    dst, src, n = args
    n64 = fl.b.zext(n, I64_T)
    # Both ranges are checked before any byte moves, as Wasm requires.
    dst_ptr = checked_address(fl, dst, 0, n64)
    src_ptr = checked_address(fl, src, 0, n64)
    memmove(fl, dst_ptr, src_ptr, n64)


def lower_fill(fl: FunctionLowering, op: Op, args) -> None:
    dst, value, n = args
    n64 = fl.b.zext(n, I64_T)
    ptr = checked_address(fl, dst, 0, n64)
    fn = fl.module.globals.get("llvm.memset.p0.i64")
    if fn is None:
        fnty = ir.FunctionType(ir.VoidType(), [PTR_T, I8_T, I64_T, ir.IntType(1)])
        fn = ir.Function(fl.module, fnty, name="llvm.memset.p0.i64")
    fl.b.call(fn, [ptr, fl.b.trunc(value, I8_T), n64, ir.Constant(ir.IntType(1), 0)])


def lower_init(fl: FunctionLowering, op: Op, args) -> None:
    """Copy from a passive data segment; a dropped segment has length 0."""
    b = fl.b
    dst, src, n = args
    seg_ptr = fl.env.checked_segment(abi.CTX_DATA, op.attrs["data"], src, n, TrapKind.MEMORY_OUT_OF_BOUNDS)
    n64 = b.zext(n, I64_T)
    dst_ptr = checked_address(fl, dst, 0, n64)
    memmove(fl, dst_ptr, b.gep(seg_ptr, [b.zext(src, I64_T)], source_etype=I8_T), n64)


def lower_data_drop(fl: FunctionLowering, op: Op, args) -> None:
    field = fl.env.segment_field(abi.CTX_DATA, op.attrs["data"], abi.SEGMENT_LEN)
    fl.b.store(i64_const(0), field)


LOWERINGS = {
    "mem.load": lower_load,
    "mem.store": lower_store,
    "mem.size": lower_size,
    "mem.grow": lower_grow,
    "mem.copy": lower_copy,
    "mem.fill": lower_fill,
    "mem.init": lower_init,
    "mem.data_drop": lower_data_drop,
}
