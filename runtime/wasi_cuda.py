"""The ``wasi:cuda`` guest API: a Wasm program that ships its own PTX loads and launches it.

A guest imports the functions of :data:`IMPORTS` from the module ``wasi:cuda``. Each
:class:`WasiCuda` serves one instance: it owns a table of small integer *handles* (loaded
modules, kernels, device buffers), a :class:`~runtime.limits.DeviceAllocator` that holds
the instance to its device memory cap, and the message of the last failed call.

The guest never sees a device address and never hands one over: buffers are named by
handle, copies name a handle and a byte offset, and a kernel's pointer arguments are
``(buffer handle, offset)`` records that the host turns into addresses at launch. Every
call answers with an i32: a handle or a length when it is ``>= 0``, a :class:`Status` code
when it is negative. Checks run in a fixed order, so a guest gets the same answer on every
machine: first the guest's pointers and lengths against its linear memory and the plain
values of the arguments, then whether a GPU is there (:attr:`Status.NO_GPU` on a machine
without one), then handles, buffer ranges and the device's launch limits, and only then the
driver. No exception reaches wasmtime: a driver error becomes a status code and a message
the guest reads with ``last_error``. A sticky fault (an illegal address inside a kernel,
...) leaves the process's CUDA context unusable, so from then on every GPU call of every
instance on that context answers :attr:`Status.FAULTED`.

What the host cannot check is what the guest's own kernels do once they run: PTX is code
with the rights of the process's CUDA context. The checks here keep mistakes made on the
host side of the API (a guest pointer passed as a device pointer, a copy past a buffer's
end, a handle of another instance) from ever reaching the driver. See docs/wasi-cuda.md.
"""

from __future__ import annotations

import ctypes
import itertools
import re
import struct
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

import wasmtime

from tensorwasm.support import logs
from tensorwasm.support.errors import TensorWasmError
from tensorwasm.support.lazy import LazyModule

from .driver import (
    Context,
    CudaError,
    DeviceBuffer,
    Kernel,
    Module,
    ModuleLoadError,
    NoGPU,
    StaleHandleError,
    check,
)
from .limits import DeviceAllocator, DeviceMemoryLimitError, DeviceOutOfMemory

cu = LazyModule("cuda.bindings.driver", globals(), "cu")  # imported at first use

log = logs.get_logger(__name__)

#: The import module a guest names (wasm-ld and clang's ``import_module`` accept the colon).
IMPORT_MODULE = "wasi:cuda"
#: The guest's linear memory must be exported under this name.
MEMORY_EXPORT = "memory"

#: One kernel argument record: u32 tag, u32 buffer handle (0 for scalars), u64 payload.
ARG_RECORD = struct.Struct("<IIQ")
#: Most argument records one launch takes.
MAX_ARGS = 1024
#: Most live handles one instance holds (modules, kernels and buffers together).
MAX_HANDLES = 65536
#: Longest PTX module and kernel name a guest may pass.
MAX_PTX_BYTES = 64 << 20
MAX_NAME_BYTES = 1024
_LARGEST_HANDLE = 0x7FFFFFFF  # handles are positive i32 values
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


class Status(IntEnum):
    """What a ``wasi:cuda`` call returns; every error is negative (docs/wasi-cuda.md)."""

    OK = 0
    NO_GPU = -1
    BAD_POINTER = -2
    BAD_HANDLE = -3
    BAD_ARGUMENT = -4
    BAD_RANGE = -5
    BAD_LAUNCH = -6
    OUT_OF_MEMORY = -7
    NOT_FOUND = -8
    MODULE_LOAD = -9
    DRIVER = -10
    FAULTED = -11
    TOO_MANY_HANDLES = -12
    INTERNAL = -13

    @property
    def c_name(self) -> str:
        """The name of the code in ``wasi_cuda.h``, e.g. ``WASI_CUDA_ERR_NO_GPU``."""
        return "WASI_CUDA_OK" if self is Status.OK else f"WASI_CUDA_ERR_{self.name}"


#: What each status means, for the documentation and the C header.
STATUS_MEANING = {
    Status.OK: "success (calls that make something return its handle, >= 1, instead)",
    Status.NO_GPU: "no usable GPU on this machine; last_error says why",
    Status.BAD_POINTER: "a guest pointer and length lie outside the guest's linear memory "
    "(or it exports no memory named `memory`)",
    Status.BAD_HANDLE: "not a live handle of this instance, or a handle of the wrong kind",
    Status.BAD_ARGUMENT: "a bad value: size 0, a bad argument record, a count or size that "
    "does not match the kernel, non-ASCII PTX, a raw device address",
    Status.BAD_RANGE: "a copy or a pointer argument reaches past the end of its buffer",
    Status.BAD_LAUNCH: "grid, block or shared memory size past the device's or the kernel's limits",
    Status.OUT_OF_MEMORY: "over this instance's device memory cap, or the device is out of memory",
    Status.NOT_FOUND: "the module has no kernel of that name",
    Status.MODULE_LOAD: "the driver's JIT rejected the PTX (last_error holds its log), "
    "or it targets a newer GPU",
    Status.DRIVER: "another CUDA driver error; the context is still usable",
    Status.FAULTED: "a sticky fault (e.g. an illegal address in a kernel) made the GPU "
    "context unusable: every later GPU call is refused",
    Status.TOO_MANY_HANDLES: f"this instance holds {MAX_HANDLES} live handles already",
    Status.INTERNAL: "a bug in the host; it is logged",
}


class ArgTag(IntEnum):
    """The ``tag`` of a kernel argument record."""

    I32 = 1
    I64 = 2
    F32 = 3
    F64 = 4
    BUFFER = 5

    @property
    def size(self) -> int:
        """Bytes the argument fills in the kernel's parameter list."""
        return 4 if self in (ArgTag.I32, ArgTag.F32) else 8


@dataclass(frozen=True)
class HostImport:
    """One function of the API: its import name, typed parameters and what it does.

    Every function returns one i32. ``gpu`` functions need a GPU (they answer
    :attr:`Status.NO_GPU` without one) and replace the last error with their outcome.
    """

    name: str
    params: tuple[tuple[str, str], ...]
    summary: str
    gpu: bool = True

    @property
    def signature(self) -> str:
        """``(ptx_ptr: i32, ptx_len: i32) -> i32``, as the documentation shows it."""
        return "(" + ", ".join(f"{name}: {ty}" for name, ty in self.params) + ") -> i32"

    def func_type(self) -> wasmtime.FuncType:
        return wasmtime.FuncType([_VALTYPES[ty]() for _, ty in self.params], [wasmtime.ValType.i32()])


_VALTYPES: dict[str, Callable[[], wasmtime.ValType]] = {
    "i32": wasmtime.ValType.i32,
    "i64": wasmtime.ValType.i64,
}

_GRID = tuple((f"grid_{d}", "i32") for d in "xyz")
_BLOCK = tuple((f"block_{d}", "i32") for d in "xyz")

#: The API, one row per imported function; dispatch, docs and header tests read this table.
IMPORTS = (
    HostImport("module_load", (("ptx_ptr", "i32"), ("ptx_len", "i32")),
               "JIT-load the PTX text at ptx_ptr; returns a module handle"),
    HostImport("module_unload", (("module", "i32"),),
               "unload a module; its kernel handles die with it"),
    HostImport("module_get_function", (("module", "i32"), ("name_ptr", "i32"), ("name_len", "i32")),
               "the kernel (.entry) of that name; returns a function handle"),
    HostImport("mem_alloc", (("size", "i64"),),
               "allocate size bytes of device memory; returns a buffer handle"),
    HostImport("mem_free", (("buffer", "i32"),),
               "free a buffer; its bytes return to the instance's cap"),
    HostImport("memcpy_htod", (("dst", "i32"), ("dst_offset", "i64"), ("src_ptr", "i32"), ("len", "i32")),
               "copy len bytes of guest memory at src_ptr into buffer dst at dst_offset"),
    HostImport("memcpy_dtoh", (("dst_ptr", "i32"), ("src", "i32"), ("src_offset", "i64"), ("len", "i32")),
               "copy len bytes of buffer src at src_offset into guest memory at dst_ptr"),
    HostImport("launch", (("function", "i32"), *_GRID, *_BLOCK, ("shared_bytes", "i32"),
                          ("args_ptr", "i32"), ("nargs", "i32")),
               "launch a kernel with nargs argument records at args_ptr (asynchronous)"),
    HostImport("synchronize", (),
               "wait for every launch and copy; reports a fault inside a kernel"),
    HostImport("last_error", (("buf_ptr", "i32"), ("buf_len", "i32")),
               "copy the last failed call's message (at most buf_len bytes, no NUL); "
               "returns its full length, 0 after a success", gpu=False),
)  # fmt: skip
IMPORTS_BY_NAME = {spec.name: spec for spec in IMPORTS}


class _Refusal(Exception):
    """A call refused on the host, before or instead of the driver; never leaves this module."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _u32(value: int) -> int:
    """wasmtime hands i32 values over signed; pointers, lengths and sizes are unsigned."""
    return value & _U32


def _u64(value: int) -> int:
    """The same for i64 sizes and offsets."""
    return value & _U64


# Sticky faults seen per context, shared by every instance on it: context -> (generation,
# message). A fault in one instance makes the context fail for all of them.
_FAULTS: weakref.WeakKeyDictionary[Context, tuple[int, str]] = weakref.WeakKeyDictionary()
_FAULTS_LOCK = threading.Lock()
# Handle numbers are unique in the process, so a handle of one instance is never a live
# handle of another one (it is refused rather than taken for something else).
_NEXT_HANDLE = itertools.count(1)


class _Guest:
    """The calling instance's linear memory, with every access bounds-checked."""

    def __init__(self, caller: wasmtime.Caller) -> None:
        self._caller = caller
        self._memory: wasmtime.Memory | None = None

    def _get(self) -> wasmtime.Memory:
        if self._memory is None:
            memory = self._caller.get(MEMORY_EXPORT)
            if not isinstance(memory, wasmtime.Memory):
                raise _Refusal(
                    Status.BAD_POINTER,
                    f"the guest exports no (unshared) linear memory named {MEMORY_EXPORT!r}",
                )
            self._memory = memory
        return self._memory

    def span(self, ptr: int, length: int, what: str) -> int:
        """The host address of guest bytes ``[ptr, ptr + length)``, refused when outside."""
        memory = self._get()
        size = memory.data_len(self._caller)
        end = ptr + length
        if end > size:
            wraps = " (ptr + len wraps around 4 GiB)" if end > _U32 + 1 else ""
            raise _Refusal(
                Status.BAD_POINTER,
                f"{what}: bytes [{ptr:#x}, {end:#x}) lie outside the guest's linear memory "
                f"({size} bytes){wraps}",
            )
        return ctypes.cast(memory.data_ptr(self._caller), ctypes.c_void_p).value + ptr

    def read(self, ptr: int, length: int, what: str) -> bytes:
        return ctypes.string_at(self.span(ptr, length, what), length)

    def write(self, ptr: int, data: bytes, what: str) -> None:
        ctypes.memmove(self.span(ptr, len(data), what), data, len(data))


@dataclass
class _LoadedModule:
    module: Module
    functions: set[int]


@dataclass(frozen=True)
class _Function:
    kernel: Kernel
    module: int
    param_sizes: tuple[int, ...]
    max_threads: int
    static_shared: int


@dataclass(frozen=True)
class _Arg:
    """A decoded argument record: its position, tag, buffer handle and raw payload."""

    index: int
    tag: ArgTag
    handle: int
    payload: int


@dataclass(frozen=True)
class _DeviceLimits:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    threads_per_block: int
    shared_per_block: int

    @classmethod
    def query(cls, context: Context) -> _DeviceLimits:
        device = check("cuDeviceGet", cu.cuDeviceGet(context.info.ordinal))
        attr = cu.CUdevice_attribute

        def get(name: str) -> int:
            attribute = getattr(attr, f"CU_DEVICE_ATTRIBUTE_{name}")
            return int(check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(attribute, device)))

        return cls(
            grid=(get("MAX_GRID_DIM_X"), get("MAX_GRID_DIM_Y"), get("MAX_GRID_DIM_Z")),
            block=(get("MAX_BLOCK_DIM_X"), get("MAX_BLOCK_DIM_Y"), get("MAX_BLOCK_DIM_Z")),
            threads_per_block=get("MAX_THREADS_PER_BLOCK"),
            shared_per_block=get("MAX_SHARED_MEMORY_PER_BLOCK"),
        )


_Object = _LoadedModule | _Function | DeviceBuffer
_T = TypeVar("_T", _LoadedModule, _Function, DeviceBuffer)
_KIND = {_LoadedModule: "module", _Function: "function", DeviceBuffer: "buffer"}


class WasiCuda:
    """The ``wasi:cuda`` functions of one instance: its handles, device memory and last error.

    ``limit`` caps the instance's device memory in bytes (default: the
    ``TENSORWASM_DEVICE_MEMORY_LIMIT`` environment variable, else only the device's free
    memory). ``context`` is the GPU to use (default: the primary context of device 0,
    opened on the first GPU call). Call :meth:`define` before instantiating the guest and
    :meth:`close` when it is done.
    """

    def __init__(self, limit: int | None = None, context: Context | None = None) -> None:
        self._limit = limit
        self._context = context
        self._allocator: DeviceAllocator | None = None
        self._generation: int | None = None
        self._device_limits: _DeviceLimits | None = None
        self._handles: dict[int, _Object] = {}
        self._fault = ""
        self._error = ""
        self._lock = threading.RLock()

    # -- the embedder's side --------------------------------------------------------------

    @property
    def last_error(self) -> str:
        """The message of the last failed call ("" after a success)."""
        return self._error

    @property
    def device_memory_used(self) -> int:
        """Bytes of device memory the instance's live buffers hold."""
        return self._allocator.used if self._allocator is not None else 0

    def host_functions(self, store: wasmtime.Store) -> dict[str, wasmtime.Func]:
        """Every function of :data:`IMPORTS`, bound to ``store``."""
        return {
            spec.name: wasmtime.Func(store, spec.func_type(), self._entry(spec), access_caller=True)
            for spec in IMPORTS
        }

    def define(self, linker: wasmtime.Linker, store: wasmtime.Store) -> None:
        """Define the functions on ``linker`` under :data:`IMPORT_MODULE`."""
        for name, func in self.host_functions(store).items():
            linker.define(store, IMPORT_MODULE, name, func)

    def close(self) -> None:
        """Unload every module and free every buffer the instance still holds."""
        with self._lock:
            handles, self._handles = self._handles, {}
            if self._context is None or self._allocator is None:
                return
            # After a fault or a reset the driver has dropped everything already.
            healthy = not self._fault and self._context.generation == self._generation
            for obj in handles.values() if healthy else ():
                try:
                    if isinstance(obj, DeviceBuffer):
                        self._allocator.free(obj)
                    elif isinstance(obj, _LoadedModule):
                        obj.module.unload()
                except TensorWasmError as exc:
                    log.warning("wasi:cuda: releasing a handle failed: %s", exc)
            self._allocator.free_all()

    def __enter__(self) -> WasiCuda:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- dispatch -------------------------------------------------------------------------

    def _entry(self, spec: HostImport) -> Callable[..., int]:
        method = getattr(self, f"_{spec.name}")

        def entry(caller: wasmtime.Caller, *args: int) -> int:
            return self._call(spec, method, caller, args)

        return entry

    def _call(
        self, spec: HostImport, method: Callable[..., int], caller: wasmtime.Caller, args: tuple
    ) -> int:
        """Run one guest call; every failure becomes a status code and a message."""
        with self._lock:
            try:
                result = method(_Guest(caller), *args)
            except _Refusal as exc:
                status, message = exc.status, exc.message
            except CudaError as exc:
                status, message = self._driver_failure(exc)
            except (DeviceMemoryLimitError, DeviceOutOfMemory) as exc:
                status, message = Status.OUT_OF_MEMORY, str(exc)
            except StaleHandleError as exc:
                status, message = Status.BAD_HANDLE, str(exc)
            except NoGPU as exc:
                status, message = Status.NO_GPU, str(exc)
            except Exception as exc:
                # A trap would tear the guest down for a host bug: report it as a status.
                log.exception("wasi:cuda %s failed inside the host", spec.name)
                status, message = Status.INTERNAL, f"internal error: {exc!r}"
            else:
                if spec.gpu:
                    self._error = ""
                return int(result)
            self._error = f"{spec.name}: {message}"
            log.debug("wasi:cuda %s -> %s: %s", spec.name, status.name, message)
            return int(status)

    def _driver_failure(self, exc: CudaError) -> tuple[Status, str]:
        if isinstance(exc, ModuleLoadError):
            return Status.MODULE_LOAD, str(exc)
        if exc.sticky and self._context is not None:
            self._fault = (
                f"the GPU context is unusable after a fault ({exc}); no GPU call can succeed "
                "in this process until the host resets the context"
            )
            with _FAULTS_LOCK:
                _FAULTS[self._context] = (self._context.generation, self._fault)
            return Status.FAULTED, self._fault
        if exc.error_name == "CUDA_ERROR_OUT_OF_MEMORY":
            return Status.OUT_OF_MEMORY, str(exc)
        return Status.DRIVER, str(exc)

    def _gpu(self) -> Context:
        """The context, or a refusal: no GPU, or a context that a fault or a reset ruined."""
        if self._context is None:
            try:
                self._context = Context.get()
            except NoGPU as exc:
                raise _Refusal(Status.NO_GPU, str(exc)) from None
        context = self._context
        if self._allocator is None:
            self._allocator = DeviceAllocator(context, self._limit)
            self._generation = context.generation
        if not self._fault:
            with _FAULTS_LOCK:
                seen = _FAULTS.get(context)
            if seen is not None and seen[0] == context.generation:
                self._fault = seen[1]
            elif context.generation != self._generation:
                self._fault = "the GPU context was reset, and every handle of this instance with it"
        if self._fault:
            raise _Refusal(Status.FAULTED, self._fault)
        return context

    def _add(self, obj: _Object) -> int:
        handle = next(_NEXT_HANDLE)
        if handle > _LARGEST_HANDLE:
            raise _Refusal(Status.TOO_MANY_HANDLES, "the process has used up the handle numbers")
        self._handles[handle] = obj
        return handle

    def _reserve(self) -> None:
        """Refuse before making a driver object that could not get a handle."""
        if len(self._handles) >= MAX_HANDLES:
            raise _Refusal(
                Status.TOO_MANY_HANDLES,
                f"this instance holds {MAX_HANDLES} live handles; free or unload some first",
            )

    def _lookup(self, handle: int, kind: type[_T]) -> _T:
        handle = _u32(handle)
        obj = self._handles.get(handle)
        if obj is None:
            raise _Refusal(
                Status.BAD_HANDLE,
                f"{handle} is not a live handle of this instance (never made here, made by "
                "another instance, or already freed)",
            )
        if not isinstance(obj, kind):
            raise _Refusal(Status.BAD_HANDLE, f"handle {handle} is a {_KIND[type(obj)]}, not a {_KIND[kind]}")
        return obj

    # -- the functions, one per row of IMPORTS ---------------------------------------------

    def _module_load(self, guest: _Guest, ptx_ptr: int, ptx_len: int) -> int:
        ptx_ptr, ptx_len = _u32(ptx_ptr), _u32(ptx_len)
        if ptx_len > MAX_PTX_BYTES:
            raise _Refusal(
                Status.BAD_ARGUMENT, f"PTX of {ptx_len} bytes is over the {MAX_PTX_BYTES}-byte limit"
            )
        ptx = _text(guest.read(ptx_ptr, ptx_len, "PTX"), "PTX")
        context = self._gpu()
        _check_target(ptx, context)
        self._reserve()
        return self._add(_LoadedModule(context.load_module(ptx), set()))

    def _module_unload(self, guest: _Guest, module: int) -> int:
        self._gpu()
        loaded = self._lookup(module, _LoadedModule)
        for function in loaded.functions:
            del self._handles[function]
        del self._handles[_u32(module)]
        loaded.module.unload()
        return Status.OK

    def _module_get_function(self, guest: _Guest, module: int, name_ptr: int, name_len: int) -> int:
        name_ptr, name_len = _u32(name_ptr), _u32(name_len)
        if name_len > MAX_NAME_BYTES:
            raise _Refusal(Status.BAD_ARGUMENT, f"a kernel name of {name_len} bytes is too long")
        name = _text(guest.read(name_ptr, name_len, "kernel name"), "kernel name")
        self._gpu()
        loaded = self._lookup(module, _LoadedModule)
        self._reserve()
        try:
            kernel = loaded.module.function(name)
        except CudaError as exc:
            if exc.error_name == "CUDA_ERROR_NOT_FOUND":
                raise _Refusal(Status.NOT_FOUND, str(exc)) from None
            raise
        attributes = kernel.attributes
        handle = self._add(
            _Function(
                kernel,
                _u32(module),
                _param_sizes(kernel),
                attributes.max_threads_per_block,
                attributes.shared_size_bytes,
            )
        )
        loaded.functions.add(handle)
        return handle

    def _mem_alloc(self, guest: _Guest, size: int) -> int:
        size = _u64(size)
        if size == 0:
            raise _Refusal(Status.BAD_ARGUMENT, "cannot allocate 0 bytes")
        self._gpu()
        self._reserve()
        assert self._allocator is not None  # made by _gpu
        return self._add(self._allocator.alloc(size, "wasi:cuda buffer"))

    def _mem_free(self, guest: _Guest, buffer: int) -> int:
        self._gpu()
        found = self._lookup(buffer, DeviceBuffer)
        del self._handles[_u32(buffer)]
        assert self._allocator is not None
        self._allocator.free(found)
        return Status.OK

    def _memcpy_htod(self, guest: _Guest, dst: int, dst_offset: int, src_ptr: int, length: int) -> int:
        offset, length = _u64(dst_offset), _u32(length)
        host = guest.span(_u32(src_ptr), length, "memcpy_htod source")
        context = self._gpu()
        buffer = self._lookup(dst, DeviceBuffer)
        _check_range(buffer, offset, length, "memcpy_htod destination")
        if length:
            context.memcpy_htod(buffer.ptr + offset, host, length)
        return Status.OK

    def _memcpy_dtoh(self, guest: _Guest, dst_ptr: int, src: int, src_offset: int, length: int) -> int:
        offset, length = _u64(src_offset), _u32(length)
        host = guest.span(_u32(dst_ptr), length, "memcpy_dtoh destination")
        context = self._gpu()
        buffer = self._lookup(src, DeviceBuffer)
        _check_range(buffer, offset, length, "memcpy_dtoh source")
        if length:
            context.memcpy_dtoh(host, buffer.ptr + offset, length)
        return Status.OK

    def _launch(
        self,
        guest: _Guest,
        function: int,
        grid_x: int,
        grid_y: int,
        grid_z: int,
        block_x: int,
        block_y: int,
        block_z: int,
        shared_bytes: int,
        args_ptr: int,
        nargs: int,
    ) -> int:
        grid = (_u32(grid_x), _u32(grid_y), _u32(grid_z))
        block = (_u32(block_x), _u32(block_y), _u32(block_z))
        shared, nargs = _u32(shared_bytes), _u32(nargs)
        if 0 in grid or 0 in block:
            raise _Refusal(Status.BAD_LAUNCH, f"grid {grid} and block {block} sizes must all be >= 1")
        if nargs > MAX_ARGS:
            raise _Refusal(Status.BAD_ARGUMENT, f"{nargs} argument records: at most {MAX_ARGS}")
        raw = guest.read(_u32(args_ptr), nargs * ARG_RECORD.size, f"{nargs} kernel argument records")
        args = [_decode_arg(index, *fields) for index, fields in enumerate(ARG_RECORD.iter_unpack(raw))]
        context = self._gpu()
        found = self._lookup(function, _Function)
        self._check_launch(context, found, grid, block, shared)
        values = self._kernel_args(context, found, args)
        found.kernel.launch(grid, block, values, shared_mem=shared)
        return Status.OK

    def _synchronize(self, guest: _Guest) -> int:
        self._gpu().synchronize()
        return Status.OK

    def _last_error(self, guest: _Guest, buf_ptr: int, buf_len: int) -> int:
        buf_ptr, buf_len = _u32(buf_ptr), _u32(buf_len)
        guest.span(buf_ptr, buf_len, "last_error buffer")
        message = self._error.encode("utf-8", errors="replace")
        guest.write(buf_ptr, message[:buf_len], "last_error buffer")
        return len(message)

    # -- launch checks --------------------------------------------------------------------

    def _check_launch(
        self,
        context: Context,
        function: _Function,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
    ) -> None:
        if self._device_limits is None:
            self._device_limits = _DeviceLimits.query(context)
        limits = self._device_limits
        name = function.kernel.name
        for what, dims, most in (("grid", grid, limits.grid), ("block", block, limits.block)):
            for axis, size, bound in zip("xyz", dims, most, strict=True):
                if size > bound:
                    raise _Refusal(
                        Status.BAD_LAUNCH, f"{what} {axis} = {size}: the device allows at most {bound}"
                    )
        threads = block[0] * block[1] * block[2]
        most_threads = min(limits.threads_per_block, function.max_threads)
        if threads > most_threads:
            raise _Refusal(
                Status.BAD_LAUNCH,
                f"{threads} threads per block: kernel {name!r} runs at most {most_threads} on this device",
            )
        room = limits.shared_per_block - function.static_shared
        if shared > room:
            raise _Refusal(
                Status.BAD_LAUNCH,
                f"{shared} bytes of dynamic shared memory: kernel {name!r} has room for {room} "
                f"({limits.shared_per_block} per block, {function.static_shared} static)",
            )

    def _kernel_args(self, context: Context, function: _Function, args: list[_Arg]) -> list[Any]:
        """ctypes values for the launch, each checked against the kernel's parameter list."""
        name = function.kernel.name
        sizes = function.param_sizes
        if len(args) != len(sizes):
            raise _Refusal(
                Status.BAD_ARGUMENT,
                f"kernel {name!r} takes {len(sizes)} parameters, got {len(args)} arguments",
            )
        values: list[Any] = []
        for arg, size in zip(args, sizes, strict=True):
            if arg.tag.size != size:
                raise _Refusal(
                    Status.BAD_ARGUMENT,
                    f"argument {arg.index} is {arg.tag.name} ({arg.tag.size} bytes), but parameter "
                    f"{arg.index} of kernel {name!r} takes {size} bytes",
                )
            if arg.tag is ArgTag.BUFFER:
                buffer = self._lookup(arg.handle, DeviceBuffer)
                _check_range(buffer, arg.payload, 0, f"argument {arg.index}")
                values.append(ctypes.c_uint64(buffer.ptr + arg.payload))
            elif arg.tag is ArgTag.I64:
                _refuse_device_address(context, arg)
                values.append(ctypes.c_uint64(arg.payload))
            elif arg.tag.size == 4:
                values.append(ctypes.c_uint32(arg.payload & _U32))  # floats travel as bits
            else:
                values.append(ctypes.c_uint64(arg.payload))
        return values


# -- checks that need no instance ----------------------------------------------------------


def _text(data: bytes, what: str) -> str:
    """ASCII text from the guest; trailing NULs (a C string's terminator) are dropped."""
    text = data.rstrip(b"\0")
    if not text:
        raise _Refusal(Status.BAD_ARGUMENT, f"the {what} is empty")
    if b"\0" in text:
        raise _Refusal(Status.BAD_ARGUMENT, f"the {what} holds a NUL byte at offset {text.index(0)}")
    if not text.isascii():
        offset = next(i for i, byte in enumerate(text) if byte >= 0x80)
        raise _Refusal(Status.BAD_ARGUMENT, f"the {what} is not ASCII (byte {offset})")
    return text.decode("ascii")


_TARGET = re.compile(r"^\s*\.target\s+sm_(\d+)", re.MULTILINE)


def _check_target(ptx: str, context: Context) -> None:
    """Refuse PTX for a newer GPU than this one: the driver is never handed it."""
    match = _TARGET.search(ptx)
    major, minor = context.info.compute_capability
    if match and int(match.group(1)) > major * 10 + minor:
        raise _Refusal(
            Status.MODULE_LOAD,
            f"the PTX targets sm_{match.group(1)}, newer than this GPU ({context.info.arch}); "
            "target an older architecture (sm_75 runs everywhere)",
        )


def _check_range(buffer: DeviceBuffer, offset: int, length: int, what: str) -> None:
    if offset + length > buffer.nbytes:
        raise _Refusal(
            Status.BAD_RANGE,
            f"{what}: bytes [{offset}, {offset + length}) of a {buffer.nbytes}-byte buffer",
        )


def _decode_arg(index: int, tag: int, handle: int, payload: int) -> _Arg:
    """Check one record's form; its handle is looked up at launch, after the GPU check."""
    try:
        kind = ArgTag(tag)
    except ValueError:
        raise _Refusal(
            Status.BAD_ARGUMENT,
            f"argument {index} has tag {tag}; tags are " + ", ".join(f"{t.value} {t.name}" for t in ArgTag),
        ) from None
    if kind is ArgTag.BUFFER and handle == 0:
        raise _Refusal(Status.BAD_HANDLE, f"argument {index} is a BUFFER record without a handle")
    if kind is not ArgTag.BUFFER and handle != 0:
        raise _Refusal(
            Status.BAD_ARGUMENT,
            f"argument {index} is {kind.name} but its handle field is {handle}, not 0; "
            "device pointers are BUFFER records",
        )
    return _Arg(index, kind, handle, payload)


def _refuse_device_address(context: Context, arg: _Arg) -> None:
    """An I64 argument that points into a live allocation is a raw device address: refuse it."""
    context.bind()
    err, *_ = cu.cuMemGetAddressRange(arg.payload)
    if err in (cu.CUresult.CUDA_ERROR_NOT_FOUND, cu.CUresult.CUDA_ERROR_INVALID_VALUE):
        return  # not an allocation
    if err == cu.CUresult.CUDA_SUCCESS:
        raise _Refusal(
            Status.BAD_ARGUMENT,
            f"argument {arg.index} (I64 {arg.payload:#x}) is a device address; pass the "
            "buffer as a BUFFER record (handle and offset)",
        )
    check("cuMemGetAddressRange", (err,))


def _param_sizes(kernel: Kernel) -> tuple[int, ...]:
    """The byte size of each of the kernel's parameters, from the driver.

    The driver reads one value per parameter through the launch's pointer array, so a
    launch with fewer (or smaller) arguments than the kernel declares would make it read
    past host memory: the count and sizes are checked before every launch. The driver has
    no call for the count before CUDA 13.2; the index past the last parameter is refused.
    """
    sizes: list[int] = []
    handle = kernel._handle  # runtime.driver.Kernel does not expose parameter information
    for index in range(MAX_ARGS + 1):
        err, _offset, size = cu.cuFuncGetParamInfo(handle, index)
        if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
            return tuple(sizes)
        check("cuFuncGetParamInfo", (err,))
        sizes.append(int(size))
    raise _Refusal(Status.BAD_ARGUMENT, f"kernel {kernel.name!r} takes more than {MAX_ARGS} parameters")


def imports_wasi_cuda(module: wasmtime.Module) -> bool:
    """Whether ``module`` imports anything from :data:`IMPORT_MODULE`."""
    return any(imp.module == IMPORT_MODULE for imp in module.imports)


def define_if_imported(
    linker: wasmtime.Linker, store: wasmtime.Store, module: wasmtime.Module, limit: int | None = None
) -> WasiCuda | None:
    """Define the API on ``linker`` when ``module`` imports it; returns the instance's API.

    A name the API does not have is an error here rather than a trap at the first call.
    """
    if not imports_wasi_cuda(module):
        return None
    unknown = sorted(
        {imp.name for imp in module.imports if imp.module == IMPORT_MODULE} - set(IMPORTS_BY_NAME)
    )
    if unknown:
        raise TensorWasmError(
            f"the module imports {IMPORT_MODULE}.{unknown[0]}, which the API does not have "
            f"(it has: {', '.join(IMPORTS_BY_NAME)})"
        )
    api = WasiCuda(limit=limit)
    api.define(linker, store)
    return api
