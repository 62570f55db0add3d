"""Reductions of a loop kernel: each thread's partials folded into the launch's result slots.

A thread of a loop kernel folds the partials of its iterations in registers (``combine``).
On the host each host thread owns its result slots and stores its partials there. On the
GPU tens of thousands of threads share the slots, and one atomic per thread would queue
millions of read-modify-writes on a handful of addresses; so a block folds its partials
first: within each warp by butterfly shuffles (every lane ends with the warp's value),
then across the warps through shared memory, and one thread per block folds the block's
value into the slot, by ``atomicrmw`` or, for a float multiply, by compare-and-swap.

Integer operators give the same result in any order; float ones are reductions only
under relaxed float semantics, which allow the order to change.
"""

from __future__ import annotations

from llvmlite import ir

from tensorwasm.compiler.analysis.plan import ReductionKind
from tensorwasm.compiler.lower.types import I32_T, I64_T, int_of

WARP = 32
LANE_BITS = 5  # log2(WARP): a thread's warp is tid >> LANE_BITS
# Partials of a block in shared memory: one per warp, for the largest block CUDA allows
# (1024 threads), so any launch fits without the runtime and the kernel agreeing on a size.
MAX_WARPS = 1024 // WARP
FULL_MASK = ir.Constant(I32_T, 0xFFFFFFFF)


def combine(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """x OP y for a reduction operator (a :class:`ReductionKind` or its name): the kind's
    builder method (integer ops wrap; float ops round as IEEE), or for a minimum or maximum
    a select on its compare."""
    traits = ReductionKind(op).traits
    if traits.compare:
        cmp = b.icmp_signed if traits.signed else b.icmp_unsigned
        return b.select(cmp(traits.compare, x, y), x, y)
    return getattr(b, traits.builder)(x, y)


def read_sreg(module: ir.Module, b: ir.IRBuilder, name: str) -> ir.Value:
    """A PTX special register (``tid.x``, ``ntid.x``, ...) as an i32."""
    return b.call(_intrinsic(module, f"llvm.nvvm.read.ptx.sreg.{name}", I32_T, []), [])


def fold_atomic(b: ir.IRBuilder, op: str, ptr: ir.Value, value: ir.Value) -> None:
    """``*ptr = *ptr OP value``, atomically with respect to every other thread."""
    atomic = ReductionKind(op).traits.atomic
    if atomic is not None:
        b.atomic_rmw(atomic, ptr, value, "monotonic")
        return
    # No atomicrmw for the kind (a multiply): compare-and-swap (of the bits, as LLVM has
    # no float cmpxchg) until no other thread wrote in between.
    fn = b.function
    bits_type = int_of(value.type)
    retry = fn.append_basic_block("cas")
    after = fn.append_basic_block("cas.done")
    before = b.block
    old0 = b.load(ptr, typ=bits_type)
    b.branch(retry)
    b.position_at_end(retry)
    old = b.phi(bits_type)
    old.add_incoming(old0, before)
    new = combine(b, op, b.bitcast(old, value.type), value)
    pair = b.cmpxchg(ptr, old, b.bitcast(new, bits_type), "monotonic", "monotonic")
    old.add_incoming(b.extract_value(pair, 0), retry)
    b.cbranch(b.extract_value(pair, 1), after, retry)
    b.position_at_end(after)


def fold_block(module: ir.Module, b: ir.IRBuilder, ops: list[str], partials: list[ir.Value],
               identities: list[ir.Constant], slots: list[ir.Value]) -> None:  # fmt: skip
    """Fold every thread's ``partials`` into ``slots`` with one atomic per block and slot.

    Every thread of the block must arrive here, and none may leave before: the warps meet
    at shuffles of the full mask and at a block barrier. That barrier is ``barrier.sync``,
    not ``bar.sync`` (= ``barrier.sync.aligned``): the threads come from a loop they leave
    at different iterations, and the aligned form requires every warp to arrive converged.
    A block whose size is not a multiple of the warp size (no such launch exists today:
    the runtime launches 256 threads) has a partial warp that cannot shuffle with the full
    mask; its threads fold one by one, as the condition is the same in the whole block.
    """
    tid = read_sreg(module, b, "tid.x")
    ntid = read_sreg(module, b, "ntid.x")
    whole_warps = b.icmp_unsigned("==", b.and_(ntid, ir.Constant(I32_T, WARP - 1)), ir.Constant(I32_T, 0))
    with b.if_else(whole_warps, likely=True) as (by_block, by_thread):
        with by_block:
            _fold_by_block(module, b, ops, partials, identities, slots, tid, ntid)
        with by_thread:
            for op, value, slot in zip(ops, partials, slots, strict=True):
                fold_atomic(b, op, slot, value)


def _fold_by_block(module: ir.Module, b: ir.IRBuilder, ops: list[str], partials: list[ir.Value],
                   identities: list[ir.Constant], slots: list[ir.Value], tid: ir.Value,
                   ntid: ir.Value) -> None:  # fmt: skip
    """Warps fold by shuffles, lane 0 of each puts its warp's value in shared memory, and
    after the barrier warp 0 folds those values and its lane 0 (thread 0) does the atomics."""
    lane = b.and_(tid, ir.Constant(I32_T, WARP - 1))
    warp = b.lshr(tid, ir.Constant(I32_T, LANE_BITS))
    first_lane = b.icmp_unsigned("==", lane, ir.Constant(I32_T, 0))
    shared = [_shared_array(module, value.type) for value in partials]
    warp_values = [_fold_warp(module, b, op, value) for op, value in zip(ops, partials, strict=True)]
    with b.if_then(first_lane):
        for array, value in zip(shared, warp_values, strict=True):
            b.store(value, _element(b, array, warp))
    b.call(
        _intrinsic(module, "llvm.nvvm.barrier.cta.sync.all", ir.VoidType(), [I32_T]), [ir.Constant(I32_T, 0)]
    )
    with b.if_then(b.icmp_unsigned("==", warp, ir.Constant(I32_T, 0))):
        # Warp 0 folds the warps' values; lanes past the last warp bring the identity (the
        # load stays inside the array, which has a slot for every lane).
        present = b.icmp_unsigned("<", lane, b.lshr(ntid, ir.Constant(I32_T, LANE_BITS)))
        block_values = [
            _fold_warp(
                module,
                b,
                op,
                b.select(present, b.load(_element(b, array, lane), typ=identity.type), identity),
            )
            for op, array, identity in zip(ops, shared, identities, strict=True)
        ]
        with b.if_then(first_lane):
            for op, value, slot in zip(ops, block_values, slots, strict=True):
                fold_atomic(b, op, slot, value)


def _fold_warp(module: ir.Module, b: ir.IRBuilder, op: str, value: ir.Value) -> ir.Value:
    """The warp's fold of ``value``, in every lane: five butterfly steps, each lane
    combining its value with that of the lane whose index differs in one bit."""
    for distance in (16, 8, 4, 2, 1):
        value = combine(b, op, value, _shuffle_xor(module, b, value, distance))
    return value


def _shuffle_xor(module: ir.Module, b: ir.IRBuilder, value: ir.Value, distance: int) -> ir.Value:
    """``value`` of lane ``lane ^ distance``. The shuffle moves 32 bits: a float goes as its
    bits, a 64-bit value as two halves."""
    shfl = _intrinsic(module, "llvm.nvvm.shfl.sync.bfly.i32", I32_T, [I32_T] * 4)
    args = [ir.Constant(I32_T, distance), ir.Constant(I32_T, WARP - 1)]
    bits = b.bitcast(value, int_of(value.type)) if value.type != int_of(value.type) else value
    if bits.type.width == 32:
        moved = b.call(shfl, [FULL_MASK, bits, *args])
    else:
        low = b.call(shfl, [FULL_MASK, b.trunc(bits, I32_T), *args])
        high = b.call(shfl, [FULL_MASK, b.trunc(b.lshr(bits, ir.Constant(I64_T, 32)), I32_T), *args])
        moved = b.or_(b.zext(low, I64_T), b.shl(b.zext(high, I64_T), ir.Constant(I64_T, 32)))
    return moved if moved.type == value.type else b.bitcast(moved, value.type)


def _shared_array(module: ir.Module, ty: ir.Type) -> ir.GlobalVariable:
    """A fresh array of ``MAX_WARPS`` values in the block's shared memory."""
    array_type = ir.ArrayType(ty, MAX_WARPS)
    name = module.get_unique_name("tw_partials")
    array = ir.GlobalVariable(module, array_type, name, addrspace=3)
    array.linkage = "internal"
    array.initializer = ir.Constant(array_type, ir.Undefined)  # shared memory has no initial value
    array.align = 8
    return array


def _element(b: ir.IRBuilder, array: ir.GlobalVariable, index: ir.Value) -> ir.Value:
    return b.gep(array, [ir.Constant(I32_T, 0), index], inbounds=True)


def _intrinsic(module: ir.Module, name: str, ret: ir.Type, params: list[ir.Type]) -> ir.Function:
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, params), name=name)
    return fn
