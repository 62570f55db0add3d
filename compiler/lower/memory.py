"""Linear memory: bounds-checked little-endian loads and stores, size, grow, bulk ops.

Wasm computes an effective address as the zero-extended i32 address plus the static
offset, without wrapping, and traps unless every accessed byte lies below the memory
size. Accesses may be unaligned: on the host they are emitted with alignment 1 (the CPU
takes any address); where an unaligned access faults (the GPU) the address is tested, and
an aligned one gets one load or store of the full width, the others a byte-wise access. ``memory.grow`` fails (-1) past the declared maximum or the space the
runtime reserved; reserved space is zero, so grown pages need no clearing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from llvmlite import ir

from tensorwasm.compiler.analysis.plan import proven_alignment
from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.lower.env import i32_const, i64_const
from tensorwasm.compiler.lower.types import I8_T, I64_T, INT_OF_WIDTH, PTR_T, int_of
from tensorwasm.compiler.traps import TrapKind
from tensorwasm.dialect.ir import Op

if TYPE_CHECKING:
    from tensorwasm.compiler.lower.function import FunctionLowering

T = TypeVar("T")


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


def proven_address(fl: FunctionLowering, op: Op, addr: ir.Value) -> ir.Value:
    """The pointer of ``addr + offset`` for a loop kernel's affine access, which the launch's
    guards proved inside linear memory (and, on a strict-alignment target, aligned) for
    every iteration: no test here (see :func:`runtime.guards.check`).

    Where the outliner gave the access its address in 64 bits (``wide_address``: the i32
    operand is the ``trunc`` of a sum that the guards proved exact, see
    :func:`compiler.outline.exact_address`), that sum is the index, with nothing to wrap:
    neighbour accesses then differ by a constant, which LLVM folds into an immediate offset
    of one shared base (``ld.global.f32 %f1, [%rd4+-4]``). Otherwise the zero-extended i32
    operand, whose wrapping add keeps LLVM from folding the offsets."""
    b = fl.b
    ea = _exact_index(fl, op)
    if ea is None:
        ea = b.zext(addr, I64_T)
    offset = op.attrs["offset"]
    if offset:
        ea = b.add(ea, i64_const(offset))
    return b.gep(fl.env.mem_base(), [ea], source_etype=I8_T, inbounds=True)


def _exact_index(fl: FunctionLowering, op: Op) -> ir.Value | None:
    """The 64-bit value whose ``trunc`` is ``op``'s address operand, where the outliner
    marked it exact (``wide_address``); None elsewhere."""
    if not op.attrs.get("wide_address"):
        return None
    owner = op.operands[0].owner
    if not isinstance(owner, Op) or owner.name != "arith.trunc":
        return None
    return fl.values[owner.operands[0]]


# The largest ``offset + size`` that a speculative access outside memory may read at
# (address ``offset``): inside a memory of one page, which address 0 assumes as well.
SAFE_OFFSET = 65536


def speculative_load(fl: FunctionLowering, addr: ir.Value, offset: int, ty: ir.Type, nbytes: int) -> ir.Value:
    """A load that never traps: the value at ``addr + offset`` where it lies in linear
    memory, else whatever :func:`inside_or_zero`'s stand-in address holds. For the
    tiled kernels' staging (:mod:`compiler.tile`), which reads ahead of the loop: a value
    read out of range is one that no iteration of the loop uses, so it need not be zero,
    and nothing after the load waits for it (a kernel issues a stage's loads while it
    computes the stage before).

    On a strict-alignment target (the GPU) a misaligned address reads the aligned address
    below it (or at address 0, where the offset is not a multiple of the width), with one
    load of the full width and no byte-wise path: the staged loads stand for proven loads,
    which the guards checked aligned on every iteration, so a misaligned address is not
    one an iteration reads (the byte-wise call in the staging loop cost the tiled kernel
    its registers and a stack frame)."""
    b = fl.b
    aligned = fl.target.strict_alignment and nbytes > 1
    ptr = inside_or_zero(fl, addr, offset, nbytes, aligned)
    if aligned:
        return b.load(ptr, typ=ty, align=nbytes)
    return by_alignment(
        fl, ptr, nbytes, lambda align: b.load(ptr, typ=ty, align=align), lambda: load_bytes(fl, ptr, ty)
    )


def inside_or_zero(fl: FunctionLowering, addr: ir.Value, offset: int, nbytes: int, aligned: bool) -> ir.Value:
    """A pointer to ``addr + offset`` where its ``nbytes`` lie in linear memory (and, with
    ``aligned``, the address is a multiple of ``nbytes``), else to address ``offset`` (0
    where the offset reaches past the first page, :data:`SAFE_OFFSET`): what a speculative
    load or a prefetch hint reads, which never faults.

    The test is on the 32-bit ``addr`` against a limit that only the memory's size and the
    constants set, so a loop computes the limit once and each access costs one comparison
    (and a mask or a test for the alignment) and a 32-bit select, and the offset stays a
    constant of the address."""
    b = fl.b
    i32 = ir.IntType(32)
    # The addresses below ``limit`` are inside: the memory's size less the access's end,
    # clamped to the 32-bit range (no address of 2^32 - 1 is inside a 4 GiB memory).
    room = b.sub(fl.env.mem_size(), i64_const(offset + nbytes - 1))
    room = b.select(b.icmp_signed("<", room, i64_const(0)), i64_const(0), room)
    room = b.select(b.icmp_unsigned("<", room, i64_const(0xFFFFFFFF)), room, i64_const(0xFFFFFFFF))
    inside = b.icmp_unsigned("<", addr, b.trunc(room, i32))
    if aligned and offset % nbytes == 0:  # a misaligned address reads the aligned one below it
        addr = b.and_(addr, i32_const(-nbytes))
    elif aligned:
        low_bits = b.and_(addr, i32_const(nbytes - 1))
        inside = b.and_(inside, b.icmp_unsigned("==", low_bits, i32_const(-offset & (nbytes - 1))))
    if offset + nbytes <= SAFE_OFFSET:
        ea = b.add(b.zext(b.select(inside, addr, i32_const(0)), I64_T), i64_const(offset))
    else:
        ea = b.select(inside, b.add(b.zext(addr, I64_T), i64_const(offset)), i64_const(0))
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


def by_alignment(fl: FunctionLowering, ptr: ir.Value, nbytes: int, wide: Callable[[int], T],
                 bytewise: Callable[[], T]) -> T:  # fmt: skip
    """An access of ``nbytes`` at ``ptr``: ``wide(align)`` is one access of the full width,
    ``bytewise()`` the same access a byte at a time. Wasm allows any address; a target with
    strict alignment faults on a misaligned wide access, so there the address is tested and
    only a multiple of ``nbytes`` (the usual case) takes the wide access."""
    if nbytes == 1 or not fl.target.strict_alignment:
        return wide(1)
    b = fl.b
    low_bits = b.and_(b.ptrtoint(ptr, I64_T), i64_const(nbytes - 1))
    with b.if_else(b.icmp_unsigned("==", low_bits, i64_const(0)), likely=True) as (then, otherwise):
        with then:
            fast, fast_block = wide(nbytes), b.block
        with otherwise:
            slow, slow_block = bytewise(), b.block
    if fast is None:
        return None
    value = b.phi(fast.type)
    value.add_incoming(fast, fast_block)
    value.add_incoming(slow, slow_block)
    return value


def load_bytes(fl: FunctionLowering, ptr: ir.Value, ty: ir.Type) -> ir.Value:
    """A little-endian load of ``ty`` from ``ptr``, one byte at a time (out of line)."""
    value = fl.b.call(_bytewise(fl, "load", ptr.type, int_of(ty)), [ptr])
    return value if value.type == ty else fl.b.bitcast(value, ty)


def store_bytes(fl: FunctionLowering, ptr: ir.Value, value: ir.Value) -> None:
    """A little-endian store of the integer ``value`` to ``ptr``, one byte at a time (out of line)."""
    fl.b.call(_bytewise(fl, "store", ptr.type, value.type), [ptr, value])


def _bytewise(fl: FunctionLowering, kind: str, ptr_type: ir.Type, int_type: ir.IntType) -> ir.Function:
    """``tw_load<N>_bytes(ptr) -> iN`` or ``tw_store<N>_bytes(ptr, iN)``: a misaligned access,
    a byte at a time. A function of its own (never inlined) keeps it out of the hot path: in
    line, ptxas predicates its byte accesses into every access of the aligned path."""
    name = f"tw_{kind}{int_type.width}_bytes"
    fn = fl.module.globals.get(name)
    if fn is not None:
        return fn
    load = kind == "load"
    fnty = ir.FunctionType(int_type if load else ir.VoidType(), [ptr_type] if load else [ptr_type, int_type])
    fn = ir.Function(fl.module, fnty, name=name)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("cold")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ptr = fn.args[0]
    value = ir.Constant(int_type, 0)
    for i in range(int_type.width // 8):
        at = b.gep(ptr, [i64_const(i)], source_etype=I8_T)
        if load:
            value = b.or_(value, b.shl(b.zext(b.load(at, typ=I8_T), int_type), ir.Constant(int_type, 8 * i)))
        else:
            b.store(b.trunc(b.lshr(fn.args[1], ir.Constant(int_type, 8 * i)), I8_T), at)
    if load:
        b.ret(value)
    else:
        b.ret_void()
    return fn


def lower_load(fl: FunctionLowering, op: Op, args) -> ir.Value:
    bits = op.attrs["bits"]
    result_type = fl.llvm_type(op.results[0].type)
    if op.attrs.get("gather"):
        gather_check(fl, args[0], op.attrs["offset"], bits // 8)
    # A float of its own width loads as a float; anything else as an integer of ``bits``.
    ty = result_type if bits == getattr(result_type, "width", bits) and not isinstance(result_type, ir.IntType) \
        else INT_OF_WIDTH[bits]  # fmt: skip
    if op.attrs.get("speculative"):
        value = speculative_load(fl, args[0], op.attrs["offset"], ty, bits // 8)
    elif op.attrs.get("proven"):
        ptr = proven_address(fl, op, args[0])
        if bits == 128 and fl.target.strict_alignment:  # any address (see simd.proven_load)
            from tensorwasm.compiler.lower.simd import proven_load

            value = proven_load(fl, ptr, ty)
        else:
            value = fl.b.load(ptr, typ=ty, align=_proven_alignment(fl, bits))
            mark_aliasing(fl, op, value)
    else:
        ptr = checked_address(fl, args[0], op.attrs["offset"], bits // 8)
        value = by_alignment(
            fl,
            ptr,
            bits // 8,
            lambda align: fl.b.load(ptr, typ=ty, align=align),
            lambda: load_bytes(fl, ptr, ty),
        )
    if ty == result_type or bits == result_type.width:
        return value
    return fl.b.sext(value, result_type) if op.attrs["signed"] else fl.b.zext(value, result_type)


def lower_store(fl: FunctionLowering, op: Op, args) -> None:
    addr, value = args
    bits = op.attrs["bits"]
    proven = op.attrs.get("proven")
    ptr = proven_address(fl, op, addr) if proven else checked_address(fl, addr, op.attrs["offset"], bits // 8)
    if isinstance(value.type, ir.VectorType):  # a v128: its bytes as they are
        pass
    elif isinstance(value.type, ir.IntType) and value.type.width != bits:
        value = fl.b.trunc(value, INT_OF_WIDTH[bits])
    elif not isinstance(value.type, ir.IntType):
        value = fl.target.float_bits(fl.b, value, INT_OF_WIDTH[bits])
    if proven and bits == 128 and fl.target.strict_alignment:  # any address (see simd.proven_store)
        from tensorwasm.compiler.lower.simd import proven_store

        proven_store(fl, ptr, value)
        return
    if proven:
        mark_aliasing(fl, op, fl.b.store(value, ptr, align=_proven_alignment(fl, bits)))
        return
    by_alignment(fl, ptr, bits // 8, lambda align: fl.b.store(value, ptr, align=align) and None,
                 lambda: store_bytes(fl, ptr, _as_int(fl, value)))  # fmt: skip


def mark_aliasing(fl: FunctionLowering, op: Op, access: ir.Instruction) -> None:
    """Scoped no-alias metadata on a kernel's load or store, from the op's ``alias_scope``
    (a store's scope) and ``noalias`` (the scopes of stores it never meets in one call of
    the kernel: :func:`compiler.distribute._task_scopes`), in one domain per module."""
    names = ([("alias.scope", (op.attrs["alias_scope"],))] if "alias_scope" in op.attrs else []) + (
        [("noalias", op.attrs["noalias"])] if "noalias" in op.attrs else []
    )
    if not names:
        return
    module = fl.module
    domain = module.add_metadata([ir.MetaDataString(module, "tw.tasks")])
    for kind, scopes in names:
        nodes = [module.add_metadata([ir.MetaDataString(module, name), domain]) for name in scopes]
        access.set_metadata(kind, module.add_metadata(nodes))


def _as_int(fl: FunctionLowering, value: ir.Value) -> ir.Value:
    """An integer or a v128 as the integer of its width, for a byte-wise store."""
    return value if isinstance(value.type, ir.IntType) else fl.b.bitcast(value, int_of(value.type))


def _proven_alignment(fl: FunctionLowering, bits: int) -> int:
    """A proven access is aligned where the target needs it (the guards checked
    :func:`~compiler.analysis.plan.proven_alignment`); elsewhere nothing is known about its
    address."""
    return proven_alignment(bits // 8) if fl.target.strict_alignment else 1


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


def _intrinsic(fl: FunctionLowering, name: str, args: list[ir.Value]) -> ir.Function:
    """``llvm.<name>`` overloaded on the address spaces of its pointer arguments."""
    spaces = "".join(f".p{a.type.addrspace}" for a in args if isinstance(a.type, ir.PointerType))
    full = f"llvm.{name}{spaces}.i64"
    fn = fl.module.globals.get(full)
    if fn is None:
        fn = ir.Function(fl.module, ir.FunctionType(ir.VoidType(), [a.type for a in args]), name=full)
    return fn


def memmove(fl: FunctionLowering, dst: ir.Value, src: ir.Value, n: ir.Value) -> None:
    """``llvm.memmove`` with both pointers in ``dst``'s address space: NVPTX cannot expand a
    memmove between two spaces (it would compare the pointers) and LLVM 22 silently drops
    it. A data segment is device memory, so a generic pointer to it casts to the global space.

    The length goes through an opaque value: LLVM 22's optimiser deletes a memmove whose
    source starts inside a range just memset to a value and runs past its end (memory.fill
    of [0, 17) then memory.copy of [8, 25) to 0 left bytes 9 to 16 set, not copied)."""
    if src.type.addrspace != dst.type.addrspace:
        src = fl.b.addrspacecast(src, dst.type)
    args = [dst, src, fl.target.opaque(fl.b, n), ir.Constant(ir.IntType(1), 0)]
    fl.b.call(_intrinsic(fl, "memmove", args), args)


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
    args = [ptr, fl.b.trunc(value, I8_T), n64, ir.Constant(ir.IntType(1), 0)]
    fl.b.call(_intrinsic(fl, "memset", args), args)


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
