"""Calls, globals, tables and references.

Direct calls are device (or host) calls between lowered functions; after each one the
caller checks the trap slot and leaves if the callee trapped. ``call_indirect`` checks the
three things Wasm checks, in Wasm's order: the slot is inside the table (else "undefined
element"), the entry is not null ("uninitialized element"), and the callee's type is the
expected one ("indirect call type mismatch"); it then dispatches with a switch over the
functions of that type that the module can put in a table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.lower.env import i64_const
from tensorwasm.compiler.lower.memory import memmove
from tensorwasm.compiler.lower.types import I64_T, PTR_T, from_slots, to_slots
from tensorwasm.compiler.traps import TrapKind
from tensorwasm.dialect.ir import Op
from tensorwasm.dialect.types import V128

if TYPE_CHECKING:
    from tensorwasm.compiler.lower.function import FunctionLowering


def _unpack(fl: FunctionLowering, value: ir.Value, count: int) -> list[ir.Value]:
    if count == 0:
        return []
    if count == 1:
        return [value]
    return [fl.b.extract_value(value, i) for i in range(count)]


def emit_call(fl: FunctionLowering, callee: int, args: list[ir.Value], n_results: int) -> list[ir.Value]:
    fn = fl.lowering.function_for(callee)
    value = fl.b.call(fn, [fl.ctx, *args])
    fl.env.check_trap()
    fl.env.reload_memory()  # the callee may have grown memory
    return _unpack(fl, value, n_results)


def lower_call(fl: FunctionLowering, op: Op, args) -> list[ir.Value]:
    return emit_call(fl, op.attrs["callee"], args, len(op.results))


def lower_call_indirect(fl: FunctionLowering, op: Op, args) -> list[ir.Value]:
    b, env = fl.b, fl.env
    *call_args, slot = args
    table = op.attrs["table"]
    size = b.load(env.table_field(table, abi.TABLE_SIZE), typ=I64_T)
    index = b.zext(slot, I64_T)
    env.trap_if(b.icmp_unsigned(">=", index, size), TrapKind.TABLE_OUT_OF_BOUNDS)
    entries = b.load(env.table_field(table, abi.TABLE_PTR), typ=PTR_T)
    entry = b.load(env.slot_in(entries, index), typ=I64_T)
    env.trap_if(b.icmp_unsigned("==", entry, i64_const(0)), TrapKind.INDIRECT_CALL_TO_NULL)
    candidates = fl.lowering.indirect_candidates(op.attrs["sig"])
    result_types = [fl.llvm_type(r.type) for r in op.results]
    join = fl.fn.append_basic_block("call_indirect.join")
    switch = b.switch(entry, env.trap_block(TrapKind.BAD_SIGNATURE))
    incoming: list[tuple[list[ir.Value], ir.Block]] = []
    for func_index in candidates:
        case = fl.fn.append_basic_block(f"call_indirect.f{func_index}")
        switch.add_case(ir.Constant(I64_T, func_index + 1), case)
        b.position_at_end(case)
        values = emit_call(fl, func_index, call_args, len(result_types))
        incoming.append((values, b.block))
        b.branch(join)
    b.position_at_end(join)
    if not candidates:
        b.unreachable()  # no function has this type: the switch always traps
        fl.b.position_at_end(fl.fn.append_basic_block("call_indirect.dead"))
        return [ir.Constant(t, None) for t in result_types]
    results = []
    for k, ty in enumerate(result_types):
        phi = b.phi(ty)
        for values, block in incoming:
            phi.add_incoming(values[k], block)
        results.append(phi)
    return results


def _global_slots(fl: FunctionLowering, op: Op) -> list[ir.Value]:
    """The slots of a global: its own, and for a v128 the one of its high half (see abi)."""
    index = op.attrs["index"]
    slots = [fl.env.global_slot(index)]
    if op.attrs["type"] is V128:
        names = [g.type.name for g in fl.lowering.dialect.globals]
        slots.append(fl.env.global_slot(abi.high_half_slot(names, index)))
    return slots


def lower_global_get(fl: FunctionLowering, op: Op, args) -> ir.Value:
    halves = [fl.b.load(slot, typ=I64_T) for slot in _global_slots(fl, op)]
    return from_slots(fl.b, halves, fl.llvm_type(op.attrs["type"]))


def lower_global_set(fl: FunctionLowering, op: Op, args) -> None:
    for half, slot in zip(to_slots(fl.b, args[0]), _global_slots(fl, op), strict=True):
        fl.b.store(half, slot)


def _table_entry(fl: FunctionLowering, table: int, index: ir.Value, count: ir.Value | int = 1) -> ir.Value:
    """The address of entry ``index``, trapping unless ``count`` entries from it are in the table."""
    b, env = fl.b, fl.env
    size = b.load(env.table_field(table, abi.TABLE_SIZE), typ=I64_T)
    start = b.zext(index, I64_T)
    n = i64_const(count) if isinstance(count, int) else count
    env.trap_if(b.icmp_unsigned(">", b.add(start, n), size), TrapKind.TABLE_OUT_OF_BOUNDS)
    entries = b.load(env.table_field(table, abi.TABLE_PTR), typ=PTR_T)
    return env.slot_in(entries, start)


def lower_table_get(fl: FunctionLowering, op: Op, args) -> ir.Value:
    return fl.b.load(_table_entry(fl, op.attrs["table"], args[0]), typ=I64_T)


def lower_table_set(fl: FunctionLowering, op: Op, args) -> None:
    index, ref = args
    fl.b.store(ref, _table_entry(fl, op.attrs["table"], index))


def lower_table_size(fl: FunctionLowering, op: Op, args) -> ir.Value:
    size = fl.b.load(fl.env.table_field(op.attrs["table"], abi.TABLE_SIZE), typ=I64_T)
    return fl.b.trunc(size, ir.IntType(32))


def lower_table_grow(fl: FunctionLowering, op: Op, args) -> ir.Value:
    """Old size, or -1 past the maximum or the reserved capacity; new entries get ``init``."""
    b, env = fl.b, fl.env
    init, delta = args
    table = op.attrs["table"]
    size_field = env.table_field(table, abi.TABLE_SIZE)
    size = b.load(size_field, typ=I64_T)
    new_size = b.add(size, b.zext(delta, I64_T))
    fits_max = b.icmp_unsigned("<=", new_size, b.load(env.table_field(table, abi.TABLE_MAX), typ=I64_T))
    fits_space = b.icmp_unsigned(
        "<=", new_size, b.load(env.table_field(table, abi.TABLE_CAPACITY), typ=I64_T)
    )
    ok = b.and_(fits_max, fits_space)
    with b.if_then(ok):
        entries = b.load(env.table_field(table, abi.TABLE_PTR), typ=PTR_T)
        fill_entries(fl, env.slot_in(entries, size), init, b.zext(delta, I64_T))
        b.store(new_size, size_field)
    return b.select(ok, b.trunc(size, ir.IntType(32)), ir.Constant(ir.IntType(32), -1))


def fill_entries(fl: FunctionLowering, start: ir.Value, value: ir.Value, count: ir.Value) -> None:
    """Store ``value`` into ``count`` consecutive 64-bit entries."""
    with fl.env.counted_loop(count) as i:
        fl.b.store(value, fl.env.slot_in(start, i))


def lower_table_fill(fl: FunctionLowering, op: Op, args) -> None:
    index, ref, n = args
    n64 = fl.b.zext(n, I64_T)
    fill_entries(fl, _table_entry(fl, op.attrs["table"], index, n64), ref, n64)


def lower_table_copy(fl: FunctionLowering, op: Op, args) -> None:
    dst, src, n = args
    n64 = fl.b.zext(n, I64_T)
    dst_ptr = _table_entry(fl, op.attrs["dst"], dst, n64)
    src_ptr = _table_entry(fl, op.attrs["src"], src, n64)
    memmove(fl, dst_ptr, src_ptr, fl.b.shl(n64, i64_const(3)))


def lower_table_init(fl: FunctionLowering, op: Op, args) -> None:
    b, env = fl.b, fl.env
    dst, src, n = args
    seg_ptr = env.checked_segment(abi.CTX_ELEMS, op.attrs["elem"], src, n, TrapKind.TABLE_OUT_OF_BOUNDS)
    n64 = b.zext(n, I64_T)
    src64 = b.zext(src, I64_T)
    dst_ptr = _table_entry(fl, op.attrs["table"], dst, n64)
    memmove(fl, dst_ptr, env.slot_in(seg_ptr, src64), b.shl(n64, i64_const(3)))


def lower_elem_drop(fl: FunctionLowering, op: Op, args) -> None:
    fl.b.store(i64_const(0), fl.env.segment_field(abi.CTX_ELEMS, op.attrs["elem"], abi.SEGMENT_LEN))


def lower_ref_null(fl: FunctionLowering, op: Op, args) -> ir.Value:
    return i64_const(0)


def lower_ref_is_null(fl: FunctionLowering, op: Op, args) -> ir.Value:
    return fl.b.icmp_unsigned("==", args[0], i64_const(0))


def lower_ref_func(fl: FunctionLowering, op: Op, args) -> ir.Value:
    return i64_const(op.attrs["func"] + 1)


def lower_gpu_index(fl: FunctionLowering, op: Op, args) -> ir.Value:
    return fl.target.thread_index(fl, op.name, op.attrs["dim"])


LOWERINGS = {
    "func.call": lower_call,
    "func.call_indirect": lower_call_indirect,
    "global.get": lower_global_get,
    "global.set": lower_global_set,
    "table.get": lower_table_get,
    "table.set": lower_table_set,
    "table.size": lower_table_size,
    "table.grow": lower_table_grow,
    "table.fill": lower_table_fill,
    "table.copy": lower_table_copy,
    "table.init": lower_table_init,
    "table.elem_drop": lower_elem_drop,
    "ref.null": lower_ref_null,
    "ref.is_null": lower_ref_is_null,
    "ref.func": lower_ref_func,
    "gpu.thread_id": lower_gpu_index,
    "gpu.block_id": lower_gpu_index,
    "gpu.block_dim": lower_gpu_index,
    "gpu.grid_dim": lower_gpu_index,
}
