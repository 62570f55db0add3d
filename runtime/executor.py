"""Whole-function execution: a Wasm instance whose exported functions run compiled code.

An :class:`Executor` decodes, validates and translates a module, computes its initial
state (:mod:`runtime.instance`), compiles every exported function that does not reach a
host import into one code object, and builds the context block of
:mod:`compiler.lower.abi` around the state. :class:`HostExecutor` keeps the state in host
memory and calls native code; :class:`GPUExecutor` mirrors it in device memory and runs
each call as a one-thread kernel. State (memory, globals, tables) persists across calls,
and a trap comes back as Wasm's trap message with the instance still usable.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
from abc import ABC, abstractmethod

from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.lower.function import LowerOptions
from tensorwasm.compiler.pipeline import Compilation, compile_entries, exported_functions
from tensorwasm.compiler.target import HostTarget, NVPTXTarget, describe, nvptx_for_device
from tensorwasm.compiler.traps import trap_message
from tensorwasm.dialect.types import Type
from tensorwasm.runtime.instance import InstanceState, InstantiationError, initial_state
from tensorwasm.runtime.values import CallResult, WasmValue

from tensorwasm.support import logs

log = logs.get_logger(__name__)

U64 = ctypes.c_uint64
GPU_MEMORY_HEADROOM_PAGES = 16384  # 1 GiB of growth reserved on the device
TABLE_HEADROOM = 4096
GPU_STACK_BYTES = 16384
GPU_MAX_CALL_DEPTH = 200


class Executor(ABC):
    """A module instance on one backend; ``call`` runs an exported function."""

    backend = "?"

    def __init__(self, wasm: bytes, options: LowerOptions | None = None):
        self.wasm = load(wasm)
        self.module = translate_module(self.wasm)
        self.state: InstanceState = initial_state(self.wasm)
        self.exports = {e.name: e.index for e in self.wasm.exports if e.kind == "func"}
        roots = exported_functions(self.wasm)
        if self.wasm.start is not None and self.wasm.start not in roots:
            roots.append(self.wasm.start)
        from tensorwasm.runtime.cache import default_cache, make_key

        target = self.target()
        self.cache = default_cache()
        self.cache_key = make_key("whole", hashlib.sha256(wasm).hexdigest(), describe(target), options or "")
        self.compilation: Compilation = compile_entries(
            self.module, target, roots, options, self.cache, self.cache_key
        )
        self._io_slots = 1 + max([max(len(f.params), len(f.results)) for f in self.module.functions] + [0])
        self._setup()
        if self.wasm.start is not None:
            result = self.call_index(self.wasm.start, [])
            if result.trap or result.error:
                raise InstantiationError(f"start function failed: {result.trap or result.error}")

    @abstractmethod
    def target(self): ...

    @abstractmethod
    def _setup(self) -> None: ...

    @abstractmethod
    def _run(self, index: int, io: ctypes.Array) -> None: ...

    @abstractmethod
    def memory(self) -> bytes | None:
        """The current contents of linear memory 0."""

    @abstractmethod
    def globals(self) -> list[int]:
        """Every global's bit pattern, in index order."""

    def call(self, export: str, args: list[WasmValue]) -> CallResult:
        index = self.exports.get(export)
        if index is None:
            return CallResult(error=f"no exported function {export!r}")
        return self.call_index(index, args)

    def call_index(self, index: int, args: list[WasmValue]) -> CallResult:
        func = self.module.functions[index]
        if len(args) != len(func.params):
            return CallResult(error=f"{func.name} takes {len(func.params)} argument(s), got {len(args)}")
        for i, ((ty, _), want) in enumerate(zip(args, func.params, strict=True)):
            if ty is not want:
                return CallResult(error=f"argument {i} of {func.name} must be {want}, got {ty}")
        if index not in self.compilation.entries:
            reason = self.compilation.skipped.get(index, "not compiled")
            return CallResult(error=f"not compilable for the {self.backend} backend: {reason}")
        io = (U64 * self._io_slots)()
        for i, (_, bits) in enumerate(args):
            io[abi.IO_VALUES + i] = bits
        self._run(index, io)
        if io[abi.IO_TRAP]:
            return CallResult(trap=trap_message(io[abi.IO_TRAP]))
        values = tuple(_from_slot(t, io[abi.IO_VALUES + i]) for i, t in enumerate(func.results))
        return CallResult(values=values)

    # -- the layout shared by both backends ------------------------------------------------

    def capacity_pages(self, headroom: int | None) -> int:
        current = len(self.state.memory) // abi.PAGE_SIZE if self.state.memory is not None else 0
        limit = self.state.max_pages
        return limit if headroom is None else min(limit, current + headroom)


def _from_slot(ty: Type, bits: int) -> WasmValue:
    return (ty, bits & ((1 << ty.bits) - 1) if ty.bits < 64 else bits)


class HostExecutor(Executor):
    """Runs compiled functions natively on this machine, state in host memory."""

    backend = "cpu"

    def target(self):
        return HostTarget()

    def _setup(self) -> None:
        state = self.state
        if self.compilation.obj is not None:
            self.code = HostTarget().jit(None, self.compilation.obj)
        else:
            self.code = HostTarget().jit(self.compilation.llvm_ir)
            if self.compilation.entries:
                self.cache.put("obj", self.cache_key, self.code.object)
        self._entries = {
            index: ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(self.code.address(name))
            for index, name in self.compilation.entries.items()
        }
        self._keep = []
        memory = {}
        if state.memory is not None:
            capacity = self.capacity_pages(None) * abi.PAGE_SIZE
            # Anonymous memory is reserved, not committed: untouched pages cost nothing.
            self._mem = mmap.mmap(
                -1, max(capacity, abi.PAGE_SIZE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
            )
            self._mem[: len(state.memory)] = state.memory
            self._mem_view = (ctypes.c_char * len(self._mem)).from_buffer(self._mem)
            memory = {
                "memory_base": ctypes.addressof(self._mem_view),
                "memory_size": len(state.memory),
                "memory_capacity": capacity,
            }
        self._globals = (U64 * max(1, len(state.globals)))(*state.globals)
        descriptors = (U64 * max(1, abi.TABLE_SLOTS * len(state.tables)))()
        for t, table in enumerate(state.tables):
            limit = table.max if table.max is not None else 0xFFFFFFFF
            capacity = min(limit, len(table.entries) + TABLE_HEADROOM)
            entries = (U64 * max(1, capacity))(*table.entries)
            self._keep.append(entries)
            base = t * abi.TABLE_SLOTS
            descriptors[base + abi.TABLE_PTR] = ctypes.addressof(entries)
            descriptors[base + abi.TABLE_SIZE] = len(table.entries)
            descriptors[base + abi.TABLE_CAPACITY] = capacity
            descriptors[base + abi.TABLE_MAX] = limit
        self._tables = descriptors
        self.ctx = abi.context_block(
            **memory,
            max_pages=state.max_pages,
            globals_at=ctypes.addressof(self._globals),
            tables_at=ctypes.addressof(descriptors),
            data_at=self._segments([bytes(d) for d in state.data], item_size=1),
            elems_at=self._segments(state.elems, item_size=8),
        )

    def _segments(self, segments, item_size: int) -> int:
        descriptors = (U64 * max(1, abi.SEGMENT_SLOTS * len(segments)))()
        for i, seg in enumerate(segments):
            if item_size == 1:
                buf = ctypes.create_string_buffer(bytes(seg), max(1, len(seg)))
            else:
                buf = (U64 * max(1, len(seg)))(*seg)
            self._keep.append(buf)
            descriptors[i * abi.SEGMENT_SLOTS + abi.SEGMENT_PTR] = ctypes.addressof(buf)
            descriptors[i * abi.SEGMENT_SLOTS + abi.SEGMENT_LEN] = len(seg)
        self._keep.append(descriptors)
        return ctypes.addressof(descriptors)

    def _run(self, index: int, io: ctypes.Array) -> None:
        self._entries[index](ctypes.addressof(self.ctx), ctypes.addressof(io))

    def memory(self) -> bytes | None:
        if self.state.memory is None:
            return None
        return bytes(self._mem[: self.ctx[abi.CTX_MEM_SIZE]])

    def globals(self) -> list[int]:
        return list(self._globals[: len(self.state.globals)])


class GPUExecutor(Executor):
    """Runs each call as a one-thread kernel; the instance state lives in device memory."""

    backend = "gpu"

    def __init__(self, wasm: bytes, options: LowerOptions | None = None, target: NVPTXTarget | None = None):
        from tensorwasm.runtime import driver

        self.context = driver.Context.get()
        info = self.context.info
        self._target = target or nvptx_for_device(info.compute_capability, info.driver_version)
        super().__init__(wasm, options or LowerOptions(max_call_depth=GPU_MAX_CALL_DEPTH))

    def target(self):
        return self._target

    def _alloc(self, nbytes: int, init: bytes | None = None):
        buf = self.context.mem_alloc(max(8, nbytes))
        self._buffers.append(buf)
        if init:
            self.context.memcpy_htod(buf.ptr, init, len(init))
        return buf

    def _setup(self) -> None:
        state, ctxt = self.state, self.context
        self._buffers = []
        if self.compilation.ptx is None:
            self.kernels = {}
        else:
            from tensorwasm.runtime.cache import load_kernels

            self.cu_module = load_kernels(ctxt, self.compilation.ptx.encode("ascii"), self.cache)
            self.kernels = {i: self.cu_module.function(n) for i, n in self.compilation.entries.items()}
        if any(f.index in self.compilation.entries for f in self.module.functions):
            ctxt.set_stack_size(max(GPU_STACK_BYTES, ctxt.stack_size()))
        memory = {}
        if state.memory is not None:
            capacity = self.capacity_pages(GPU_MEMORY_HEADROOM_PAGES) * abi.PAGE_SIZE
            self._mem = self._alloc(capacity)
            ctxt.memset_d8(self._mem.ptr, 0, max(8, capacity))
            if state.memory:
                ctxt.memcpy_htod(self._mem.ptr, bytes(state.memory), len(state.memory))
            memory = {
                "memory_base": self._mem.ptr,
                "memory_size": len(state.memory),
                "memory_capacity": capacity,
            }
        self._globals = self._alloc(8 * len(state.globals), bytes((U64 * len(state.globals))(*state.globals)))
        descriptors = (U64 * max(1, abi.TABLE_SLOTS * len(state.tables)))()
        for t, table in enumerate(state.tables):
            limit = table.max if table.max is not None else 0xFFFFFFFF
            capacity = min(limit, len(table.entries) + TABLE_HEADROOM)
            entries = (U64 * max(1, capacity))(*table.entries)
            buf = self._alloc(ctypes.sizeof(entries), bytes(entries))
            base = t * abi.TABLE_SLOTS
            descriptors[base + abi.TABLE_PTR] = buf.ptr
            descriptors[base + abi.TABLE_SIZE] = len(table.entries)
            descriptors[base + abi.TABLE_CAPACITY] = capacity
            descriptors[base + abi.TABLE_MAX] = limit
        ctx = abi.context_block(
            **memory,
            max_pages=state.max_pages,
            globals_at=self._globals.ptr,
            tables_at=self._alloc(ctypes.sizeof(descriptors), bytes(descriptors)).ptr,
            data_at=self._segments([bytes(d) for d in state.data], item_size=1),
            elems_at=self._segments(state.elems, item_size=8),
        )
        self._ctx = self._alloc(ctypes.sizeof(ctx), bytes(ctx))
        self._io = self._alloc(8 * self._io_slots)

    def _segments(self, segments, item_size: int) -> int:
        descriptors = (U64 * max(1, abi.SEGMENT_SLOTS * len(segments)))()
        for i, seg in enumerate(segments):
            raw = bytes(seg) if item_size == 1 else bytes((U64 * len(seg))(*seg))
            buf = self._alloc(len(raw), raw)
            descriptors[i * abi.SEGMENT_SLOTS + abi.SEGMENT_PTR] = buf.ptr
            descriptors[i * abi.SEGMENT_SLOTS + abi.SEGMENT_LEN] = len(seg)
        return self._alloc(ctypes.sizeof(descriptors), bytes(descriptors)).ptr

    def _run(self, index: int, io: ctypes.Array) -> None:
        ctxt = self.context
        ctxt.memcpy_htod(self._io.ptr, io, ctypes.sizeof(io))
        self.kernels[index].launch((1, 1, 1), (1, 1, 1), [(U64, self._ctx.ptr), (U64, self._io.ptr)])
        ctxt.memcpy_dtoh(io, self._io.ptr, ctypes.sizeof(io))

    def _ctx_slot(self, slot: int) -> int:
        out = (U64 * 1)()
        self.context.memcpy_dtoh(out, self._ctx.ptr + 8 * slot, 8)
        return out[0]

    def memory(self) -> bytes | None:
        if self.state.memory is None:
            return None
        size = self._ctx_slot(abi.CTX_MEM_SIZE)
        out = bytearray(size)
        if size:
            self.context.memcpy_dtoh(out, self._mem.ptr, size)
        return bytes(out)

    def globals(self) -> list[int]:
        n = len(self.state.globals)
        out = (U64 * max(1, n))()
        if n:
            self.context.memcpy_dtoh(out, self._globals.ptr, 8 * n)
        return list(out[:n])

    def close(self) -> None:
        for buf in self._buffers:
            buf.free()
        self._buffers.clear()
