"""The environment of a lowered function: the instance context, memory, traps.

Per-op lowerings never touch the context layout themselves: they ask this object for the
memory base and size, global slots, table descriptors, and to trap. The memory base and
size are cached in stack slots that LLVM promotes to registers, reloaded only after an op
that may change them (a call, ``memory.grow``), so the same lowering is fast and serves
both the GPU and the host.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

from llvmlite import ir

from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.lower.types import I1_T, I32_T, I64_T, PTR_T
from tensorwasm.compiler.traps import TrapKind

if TYPE_CHECKING:
    from tensorwasm.compiler.target import Target


class Environment:
    def __init__(self, builder: ir.IRBuilder, fn: ir.Function, ctx: ir.Value, target: Target):
        self.b = builder
        self.fn = fn
        self.ctx = ctx
        self.target = target
        entry = builder.block
        self.mem_ptr_type = ir.PointerType(addrspace=target.memory_address_space)
        self.mem_base_slot = builder.alloca(self.mem_ptr_type, name="mem.base")
        self.mem_size_slot = builder.alloca(I64_T, name="mem.size")
        self._entry = entry
        self._trap_blocks: dict[TrapKind, ir.Block] = {}
        self._exit: ir.Block | None = None
        self.reload_memory()

    # -- context slots --------------------------------------------------------------------

    def ctx_slot(self, index: int) -> ir.Value:
        return self.b.gep(self.ctx, [ir.Constant(I64_T, index)], source_etype=I64_T)

    def load_ctx(self, index: int, ty: ir.Type = I64_T) -> ir.Value:
        return self.b.load(self.ctx_slot(index), typ=ty)

    def store_ctx(self, index: int, value: ir.Value) -> None:
        self.b.store(value, self.ctx_slot(index))

    def slot_in(self, base: ir.Value, index: ir.Value | int) -> ir.Value:
        """The address of 64-bit slot ``index`` of the array at ``base``."""
        if isinstance(index, int):
            index = ir.Constant(I64_T, index)
        return self.b.gep(base, [index], source_etype=I64_T)

    # -- memory ------------------------------------------------------------------------------

    def reload_memory(self) -> None:
        base = self.load_ctx(abi.CTX_MEM_BASE, PTR_T)
        if self.mem_ptr_type != PTR_T:
            base = self.b.addrspacecast(base, self.mem_ptr_type)
        self.b.store(base, self.mem_base_slot)
        self.b.store(self.load_ctx(abi.CTX_MEM_SIZE), self.mem_size_slot)

    def mem_base(self) -> ir.Value:
        return self.b.load(self.mem_base_slot, typ=self.mem_ptr_type)

    def mem_size(self) -> ir.Value:
        return self.b.load(self.mem_size_slot, typ=I64_T)

    def global_slot(self, index: int) -> ir.Value:
        return self.slot_in(self.load_ctx(abi.CTX_GLOBALS, PTR_T), index)

    def table_field(self, table: int, field: int) -> ir.Value:
        base = self.load_ctx(abi.CTX_TABLES, PTR_T)
        return self.slot_in(base, table * abi.TABLE_SLOTS + field)

    def segment_field(self, ctx_index: int, segment: int, field: int) -> ir.Value:
        base = self.load_ctx(ctx_index, PTR_T)
        return self.slot_in(base, segment * abi.SEGMENT_SLOTS + field)

    def checked_segment(
        self, ctx_index: int, segment: int, src: ir.Value, count: ir.Value, kind: TrapKind
    ) -> ir.Value:
        """The segment's items pointer, trapping unless ``count`` items from ``src`` (both i32)
        lie inside it; a dropped segment has length 0."""
        b = self.b
        length = b.load(self.segment_field(ctx_index, segment, abi.SEGMENT_LEN), typ=I64_T)
        end = b.add(b.zext(src, I64_T), b.zext(count, I64_T))
        self.trap_if(b.icmp_unsigned(">", end, length), kind)
        return b.load(self.segment_field(ctx_index, segment, abi.SEGMENT_PTR), typ=PTR_T)

    # -- traps -------------------------------------------------------------------------------

    def exit_block(self) -> ir.Block:
        """Returns zeros: the way out once a trap code is in the context."""
        if self._exit is None:
            self._exit = self.fn.append_basic_block("trap.exit")
            with self.b.goto_block(self._exit):
                ret = self.fn.function_type.return_type
                if isinstance(ret, ir.VoidType):
                    self.b.ret_void()
                else:
                    self.b.ret(ir.Constant(ret, None))
        return self._exit

    def trap_block(self, kind: TrapKind) -> ir.Block:
        block = self._trap_blocks.get(kind)
        if block is None:
            block = self._trap_blocks[kind] = self.fn.append_basic_block(f"trap.{kind.name.lower()}")
            with self.b.goto_block(block):
                self.store_ctx(abi.CTX_TRAP, ir.Constant(I64_T, int(kind)))
                self.b.branch(self.exit_block())
        return block

    def trap(self, kind: TrapKind) -> None:
        """End the current block with a trap."""
        self.b.branch(self.trap_block(kind))

    def trap_if(self, cond: ir.Value, kind: TrapKind, name: str = "ok") -> None:
        """Trap when ``cond`` holds; go on in a fresh block otherwise."""
        cont = self.fn.append_basic_block(name)
        br = self.b.cbranch(cond, self.trap_block(kind), cont)
        br.set_weights([1, 1 << 20])  # traps are cold
        self.b.position_at_end(cont)

    @contextmanager
    def counted_loop(self, count: ir.Value):
        """``for i in range(count)``: yields i with the builder inside the body."""
        b, fn = self.b, self.fn
        head = fn.append_basic_block("loop.head")
        body = fn.append_basic_block("loop.body")
        done = fn.append_basic_block("loop.done")
        before = b.block
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64_T)
        i.add_incoming(ir.Constant(I64_T, 0), before)
        b.cbranch(b.icmp_unsigned("<", i, count), body, done)
        b.position_at_end(body)
        yield i
        i.add_incoming(b.add(i, ir.Constant(I64_T, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def check_trap(self) -> None:
        """After a call: leave at once if the callee trapped."""
        code = self.load_ctx(abi.CTX_TRAP)
        cond = self.b.icmp_unsigned("!=", code, ir.Constant(I64_T, 0))
        cont = self.fn.append_basic_block("call.ok")
        br = self.b.cbranch(cond, self.exit_block(), cont)
        br.set_weights([1, 1 << 20])
        self.b.position_at_end(cont)


def bool_const(value: bool) -> ir.Constant:
    return ir.Constant(I1_T, int(value))


def i32_const(value: int) -> ir.Constant:
    return ir.Constant(I32_T, value & 0xFFFFFFFF)


def i64_const(value: int) -> ir.Constant:
    return ir.Constant(I64_T, value & 0xFFFFFFFFFFFFFFFF)
