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
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from tensorwasm.compiler.callgraph import reachable, recursive_functions
from tensorwasm.compiler.frontend import load, translate_module
from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.lower.function import LowerOptions
from tensorwasm.compiler.pipeline import Compilation, compile_entries, exported_functions
from tensorwasm.compiler.target import HostTarget, NVPTXTarget, describe, nvptx_for_device
from tensorwasm.compiler.traps import TrapKind, trap_message
from tensorwasm.dialect.types import Type
from tensorwasm.runtime.instance import InstanceState, InstantiationError, initial_state
from tensorwasm.runtime.values import CallResult, WasmValue
from tensorwasm.support import logs

log = logs.get_logger(__name__)

U64 = ctypes.c_uint64
GPU_MEMORY_HEADROOM_PAGES = 16384  # 1 GiB of growth reserved on the device
TABLE_HEADROOM = 4096
GPU_STACK_BYTES = 16384  # the least per-thread stack a GPU executor sets
# Recursion on the GPU: the stack is sized for this many calls on a cycle where the device's
# memory allows (see plan_stack), and never beyond the hardware's local memory per thread.
GPU_TARGET_CALL_DEPTH = 10_000
GPU_MAX_STACK_BYTES = 512 * 1024 - 1024
GPU_STACK_MEMORY_SHARE = 0.5  # of the device's free memory, at most, for the stack
STACK_MARGIN_BYTES = 1024  # what the trap path and the entry's own calls may add
MIN_FRAME_BYTES = 16
# The driver reserves the stack for every thread that can be resident: per multiprocessor,
# by compute capability major version (2048 where not listed, the largest).
RESIDENT_THREADS_PER_SM = {7: 1024, 8: 1536, 9: 2048, 10: 2048, 12: 1536}
# The host backend counts depth up to this, and traps sooner where the native stack of the
# calling thread would run out (the context's stack floor, HOST_STACK_MARGIN_BYTES above it).
HOST_CALL_DEPTH = 1_000_000
HOST_STACK_MARGIN_BYTES = 1024 * 1024


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
        self._io_slots = 1 + max(
            [max(_slot_count(f.params), _slot_count(f.results)) for f in self.module.functions] + [0]
        )
        self._global_types = [g.type.name for g in self.module.globals]
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
        at = abi.IO_VALUES
        for ty, bits in args:
            for k in range(abi.value_slots(ty.name)):
                io[at] = (bits >> (64 * k)) & abi.MASK64
                at += 1
        self._run(index, io)
        if io[abi.IO_TRAP]:
            return CallResult(trap=trap_message(io[abi.IO_TRAP]))
        values = []
        at = abi.IO_VALUES
        for ty in func.results:
            n = abi.value_slots(ty.name)
            values.append(_from_slot(ty, sum(io[at + k] << (64 * k) for k in range(n))))
            at += n
        return CallResult(values=tuple(values))

    # -- the layout shared by both backends ------------------------------------------------

    def capacity_pages(self, headroom: int | None) -> int:
        current = len(self.state.memory) // abi.PAGE_SIZE if self.state.memory is not None else 0
        limit = self.state.max_pages
        return limit if headroom is None else min(limit, current + headroom)


def _slot_count(types) -> int:
    return sum(abi.value_slots(t.name) for t in types)


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
            for lo, hi in state.initialised:  # the rest is zero, as the new mapping is
                self._mem[lo:hi] = state.memory[lo:hi]
            self._mem_view = (ctypes.c_char * len(self._mem)).from_buffer(self._mem)
            memory = {
                "memory_base": ctypes.addressof(self._mem_view),
                "memory_size": len(state.memory),
                "memory_capacity": capacity,
            }
        slots = abi.global_slot_values(self._global_types, state.globals)
        self._globals = (U64 * max(1, len(slots)))(*slots)
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
            depth_limit=HOST_CALL_DEPTH,
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
        self.ctx[abi.CTX_STACK_FLOOR] = native_stack_floor()
        self._entries[index](ctypes.addressof(self.ctx), ctypes.addressof(io))

    def memory(self) -> bytes | None:
        if self.state.memory is None:
            return None
        return bytes(self._mem[: self.ctx[abi.CTX_MEM_SIZE]])

    def globals(self) -> list[int]:
        return abi.global_values(self._global_types, list(self._globals))


class GPUExecutor(Executor):
    """Runs each call as a one-thread kernel; the instance state lives in device memory."""

    backend = "gpu"

    def __init__(self, wasm: bytes, options: LowerOptions | None = None, target: NVPTXTarget | None = None):
        from tensorwasm.runtime import driver

        self.context = driver.Context.get()
        info = self.context.info
        self._target = target or nvptx_for_device(info.compute_capability, info.driver_version)
        super().__init__(wasm, options)

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
        self.stack = StackPlan(0, 0)
        self._recursive = False
        if self.compilation.entries:
            self.stack = self._size_stack()
        memory = {}
        if state.memory is not None:
            capacity = self.capacity_pages(GPU_MEMORY_HEADROOM_PAGES) * abi.PAGE_SIZE
            self._mem = self._alloc(capacity)
            ctxt.memset_d8(self._mem.ptr, 0, max(8, capacity))
            for lo, hi in state.initialised:  # the rest is zero, as the memset left it
                ctxt.memcpy_htod(self._mem.ptr + lo, bytes(state.memory[lo:hi]), hi - lo)
            memory = {
                "memory_base": self._mem.ptr,
                "memory_size": len(state.memory),
                "memory_capacity": capacity,
            }
        slots = abi.global_slot_values(self._global_types, state.globals)
        self._globals = self._alloc(8 * len(slots), bytes((U64 * len(slots))(*slots)))
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
            depth_limit=max(1, self.stack.depth_limit),
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

    def _size_stack(self) -> StackPlan:
        """Set the context's per-thread stack for this module's calls and return the plan:
        from the frames of its functions (the cubin's, else an upper bound read from the PTX)
        where one recurses, grown within the device's free memory and never shrunk (other
        instances share the context)."""
        ctxt = self.context
        current = ctxt.stack_size()
        roots = list(self.compilation.entries)
        if not recursive_functions(self.module, reachable(self.module, roots)):
            stack = max(GPU_STACK_BYTES, current)
            if stack != current:
                ctxt.set_stack_size(stack)
            return StackPlan(stack, 0)
        self._recursive = True
        frames = self._frames()
        threads = resident_threads(ctxt.info.compute_capability, ctxt.info.multiprocessor_count)
        free, _ = ctxt.mem_get_info()
        budget = int((free + current * threads) * GPU_STACK_MEMORY_SHARE) // threads
        plan = plan_stack(frames, budget, current)
        from tensorwasm.runtime.driver import CudaError

        size = plan.stack_bytes
        while size > current:
            try:
                ctxt.set_stack_size(size)
                break
            except CudaError as exc:  # the driver could not reserve it: ask for less
                if exc.sticky:
                    raise
                log.info("a %d-byte stack per thread was refused (%s): trying less", size, exc.error_name)
                size = max(current, size // 2)
        plan = plan_stack(frames, ctxt.stack_size(), ctxt.stack_size())
        log.info(
            "GPU stack: %d bytes per thread, recursion traps at call depth %d (largest frame %d bytes)",
            plan.stack_bytes, plan.depth_limit, max(frames, default=0),
        )  # fmt: skip
        return plan

    def _frames(self) -> list[int]:
        """Every function's stack frame: ptxas's, from the cached cubin, else a bound."""
        from tensorwasm.runtime import assembler
        from tensorwasm.runtime.cache import kernels_cubin_key

        ptx = self.compilation.ptx.encode("ascii")
        if self.cache.enabled:
            cubin = self.cache.get("cubin", kernels_cubin_key(self.context, ptx))
            frames = assembler.stack_frames(cubin) if cubin is not None else None
            if frames is not None:
                return frames
        return assembler.ptx_frame_bounds(ptx)

    def _run(self, index: int, io: ctypes.Array) -> None:
        if self._recursive and self.stack.depth_limit == 0:
            io[abi.IO_TRAP] = TrapKind.STACK_OVERFLOW  # not even one frame fits: never launch
            return
        ctxt = self.context
        if self._recursive and ctxt.stack_size() < self.stack.stack_bytes:
            ctxt.set_stack_size(self.stack.stack_bytes)  # someone shrank it since
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
        n = len(abi.global_slot_values(self._global_types, self.state.globals))
        out = (U64 * max(1, n))()
        if n:
            self.context.memcpy_dtoh(out, self._globals.ptr, 8 * n)
        return abi.global_values(self._global_types, list(out[:n]))

    def close(self) -> None:
        for buf in self._buffers:
            buf.free()
        self._buffers.clear()


# -- stacks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackPlan:
    """A per-thread stack size, and the call depth at which recursion traps on it (0: not
    one recursive call fits; no recursion, where ``stack_bytes`` is for a module without)."""

    stack_bytes: int
    depth_limit: int


def plan_stack(frames: Sequence[int], budget: int, current: int) -> StackPlan:
    """The stack to set for code whose functions have stack ``frames`` (bytes each), and the
    call depth it allows, within ``budget`` bytes per thread, never below ``current``.

    Depth counts calls to functions on a call cycle, and each one's frame is at most the
    largest frame; the frames of all other functions appear at most once each on the stack,
    so their sum, with :data:`STACK_MARGIN_BYTES`, is a fixed part. The stack aims at
    :data:`GPU_TARGET_CALL_DEPTH` calls; where the budget or the hardware's limit is lower,
    the depth is what fits."""
    largest = max(MIN_FRAME_BYTES, max(frames, default=0))
    fixed = sum(frames) + STACK_MARGIN_BYTES
    wanted = fixed + GPU_TARGET_CALL_DEPTH * largest
    ceiling = max(GPU_STACK_BYTES, min(budget, GPU_MAX_STACK_BYTES))
    stack = max(current, GPU_STACK_BYTES, min(wanted, ceiling))
    return StackPlan(stack, max(0, stack - fixed) // largest)


def resident_threads(capability: tuple[int, int], multiprocessors: int) -> int:
    """How many threads the driver reserves a stack for on a device."""
    return multiprocessors * RESIDENT_THREADS_PER_SM.get(capability[0], 2048)


_THREAD_FLOORS = threading.local()


def native_stack_floor() -> int:
    """The lowest native stack address compiled host code may start a recursive call below
    on the calling thread (:data:`HOST_STACK_MARGIN_BYTES` above its stack's end), or 0 where
    the C library does not tell the stack's bounds (the depth limit alone then holds)."""
    floor = getattr(_THREAD_FLOORS, "floor", None)
    if floor is None:
        floor = _THREAD_FLOORS.floor = _read_stack_floor()
    return floor


def _read_stack_floor() -> int:
    try:
        libc = ctypes.CDLL(None)
        getattr_np, getstack = libc.pthread_getattr_np, libc.pthread_attr_getstack
    except (OSError, AttributeError):
        return 0
    libc.pthread_self.restype = ctypes.c_ulong
    getattr_np.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    attr = ctypes.create_string_buffer(256)  # a pthread_attr_t (56 bytes on glibc x86-64)
    if getattr_np(libc.pthread_self(), attr) != 0:
        return 0
    low, size = ctypes.c_void_p(), ctypes.c_size_t()
    try:
        if getstack(attr, ctypes.byref(low), ctypes.byref(size)) != 0 or not low.value:
            return 0
    finally:
        libc.pthread_attr_destroy(attr)
    if size.value <= 2 * HOST_STACK_MARGIN_BYTES:
        return 0
    return low.value + HOST_STACK_MARGIN_BYTES
