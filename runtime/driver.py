"""A thin, checked layer over the CUDA driver API (cuda-python's ``cuda.bindings``).

Every driver call goes through :func:`check`, which unpacks cuda-python's
``(CUresult, *values)`` tuples and raises :class:`CudaError` naming the call and the
error. The process uses each device's *primary* context, wrapped once per device by
:class:`Context`; every public method binds that context to the calling thread first,
so the objects here can be used from any thread without push/pop bookkeeping.

A sticky error (an illegal address, a trap, ...) poisons the context until
:meth:`Context.reset`. A reset frees every allocation and module, so each
:class:`DeviceBuffer` and :class:`Module` remembers the context *generation* it was
made in and refuses to touch a handle from an earlier one.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import itertools
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Self

from tensorwasm.runtime.device_info import DeviceInfo
from tensorwasm.runtime.spans import each_row
from tensorwasm.support import logs
from tensorwasm.support.errors import TensorWasmError
from tensorwasm.support.lazy import LazyModule

# cuda-python's bindings take ~40 ms to import, which a run whose loops stay on the CPU,
# or run on the host backend, does not need.
cu = LazyModule("cuda.bindings.driver", globals(), "cu")

logger = logs.get_logger(__name__)

#: Bytes reserved for each JIT log; the driver truncates longer logs.
JIT_LOG_BYTES = 64 * 1024

# Errors after which the context is unusable until it is reset (CUDA programming
# guide: "sticky" errors corrupt the context and are returned by every later call).
_STICKY_NAMES = (
    "ILLEGAL_ADDRESS",
    "LAUNCH_TIMEOUT",
    "ASSERT",
    "HARDWARE_STACK_ERROR",
    "ILLEGAL_INSTRUCTION",
    "MISALIGNED_ADDRESS",
    "INVALID_ADDRESS_SPACE",
    "INVALID_PC",
    "LAUNCH_FAILED",
    "TENSOR_MEMORY_LEAK",
    "ECC_UNCORRECTABLE",
    "NVLINK_UNCORRECTABLE",
    "CONTAINED",
)

# cuInit results that mean "this machine has no usable GPU" rather than a bug.
_NO_GPU_NAMES = (
    ("NO_DEVICE", "the driver sees no device (check CUDA_VISIBLE_DEVICES)"),
    ("STUB_LIBRARY", "libcuda.so is the CUDA toolkit's stub, not a driver"),
    ("SYSTEM_DRIVER_MISMATCH", "the kernel module and libcuda.so differ"),
    ("COMPAT_NOT_SUPPORTED_ON_DEVICE", "the compat driver lacks this device"),
    ("CALL_REQUIRES_NEWER_DRIVER", "the NVIDIA driver is too old"),
    ("DEVICE_UNAVAILABLE", "the device is busy or in exclusive mode"),
    ("SYSTEM_NOT_READY", "the system is not ready (nvidia-fabricmanager?)"),
)


@functools.cache
def _sticky_errors() -> frozenset[int]:
    return frozenset(int(getattr(cu.CUresult, f"CUDA_ERROR_{name}")) for name in _STICKY_NAMES)


@functools.cache
def _no_gpu_reasons() -> dict[int, str]:
    return {int(getattr(cu.CUresult, f"CUDA_ERROR_{name}")): reason for name, reason in _NO_GPU_NAMES}


class CudaError(TensorWasmError):
    """A CUDA driver call failed.

    ``call`` names the driver function, ``code`` is the raw ``CUresult`` value and
    ``error_name`` its symbolic name, e.g. ``CUDA_ERROR_OUT_OF_MEMORY``.
    """

    def __init__(self, call: str, code: int, detail: str = "") -> None:
        self.call = call
        self.code = int(code)
        self.detail = detail
        self.error_name, description = _describe(self.code)
        message = f"{call} failed: {self.error_name}"
        if description:
            message += f" ({description})"
        if detail:
            message += f": {detail}"
        super().__init__(message)

    @property
    def sticky(self) -> bool:
        """Whether the error poisoned the context, so only :meth:`Context.reset` helps."""
        return self.code in _sticky_errors()


class ModuleLoadError(CudaError):
    """The driver JIT rejected a PTX module, or ptxas crashed on it before the driver saw it
    (``crashed``; see :mod:`runtime.assembler`); ``log`` holds the JIT's error log, or how
    ptxas died."""

    def __init__(self, call: str, code: int, log: str, arch: str, kept: str | None = None) -> None:
        self.log, self.arch, self.kept = log, arch, kept
        self.crashed = kept is not None
        what = (
            "ptxas crashed on the module" if self.crashed else f"the PTX JIT for {arch} rejected the module"
        )
        detail = (
            f"{what}\n{log or '(empty JIT log)'}\n"
            f"reproduce offline with: ptxas -arch={arch} {kept or 'module.ptx'}"
        )
        super().__init__(call, code, detail)


# Of those, the ones that may be gone at the next try.
_PASSING = ("DEVICE_UNAVAILABLE", "SYSTEM_NOT_READY")


class NoGPU(TensorWasmError):
    """No usable GPU: the driver library, a device or a recent enough driver is missing.
    ``lasting``: not a state that may pass by itself (a busy device, a system not ready)."""

    @property
    def lasting(self) -> bool:
        return not any(f"[CUDA_ERROR_{name}]" in str(self) for name in _PASSING)


class StaleHandleError(TensorWasmError):
    """A buffer, module or kernel was used after it was freed or its context was reset."""


def _describe(code: int) -> tuple[str, str]:
    """Return ``(name, description)`` for a ``CUresult``, without needing the driver."""
    try:
        member = cu.CUresult(code)
    except ValueError:
        return f"CUDA_ERROR_{code}", ""
    try:
        name_err, name = cu.cuGetErrorName(member)
        text_err, text = cu.cuGetErrorString(member)
    except (RuntimeError, OSError):
        # Only the driver library knows the descriptions; the enum still knows the name.
        return member.name, ""
    if name_err != cu.CUresult.CUDA_SUCCESS or text_err != cu.CUresult.CUDA_SUCCESS:
        return member.name, ""
    return name.decode(), text.decode()


def check(call: str, result: tuple[Any, ...]) -> Any:
    """Unpack a cuda-python ``(CUresult, *values)`` tuple, raising :class:`CudaError`.

    Returns None when the call has no outputs, the value itself for one output and a
    tuple for several.
    """
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(call, err)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return tuple(values)


_init_lock = threading.Lock()
# None until cuInit has been tried; then "" on success or the NoGPU message.
_init_failure: str | None = None


def _ensure_init() -> None:
    """Call cuInit once per process; raise :class:`NoGPU` when it cannot succeed."""
    global _init_failure
    with _init_lock:
        if _init_failure is None:
            _init_failure = _try_init()
    if _init_failure:
        raise NoGPU(_init_failure)


def _try_init() -> str:
    try:
        (err,) = cu.cuInit(0)
    except Exception as exc:
        if not _library_missing(exc):
            raise
        return f"no usable GPU: the NVIDIA driver library (libcuda) is not installed ({exc})"
    reasons = _no_gpu_reasons()
    if int(err) in reasons:
        return f"no usable GPU: {reasons[int(err)]} [{err.name}]"
    check("cuInit", (err,))
    if check("cuDeviceGetCount", cu.cuDeviceGetCount()) == 0:
        return "no usable GPU: the driver reports zero devices"
    logger.debug("CUDA driver initialised")
    return ""


def _library_missing(exc: Exception) -> bool:
    """Whether ``exc`` says the driver's library could not be loaded. (cuda.pathfinder,
    whose error that is, takes 50 to 120 ms to import on an H100's host: only a failure
    pays for it, not every start.)"""
    if isinstance(exc, OSError):
        return True
    from cuda.pathfinder import DynamicLibNotFoundError

    return isinstance(exc, DynamicLibNotFoundError)


def load_bindings() -> None:
    """Import the CUDA bindings and have them find the driver's entry points (their first
    call does; ``cuDriverGetVersion`` needs no ``cuInit``), so that a thread may do it while
    the driver starts on another (:mod:`runtime.gpu_start`). A driver library that cannot be
    loaded is left for the first call that needs it to report."""
    try:
        cu.cuDriverGetVersion()
    except Exception:
        pass


def driver_available() -> bool:
    """Whether the driver initialises and sees at least one device."""
    try:
        _ensure_init()
    except NoGPU:
        return False
    return True


def _device_attribute(attribute: Any, device: Any) -> int:
    return check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(attribute, device))


def device_info(ordinal: int = 0) -> DeviceInfo:
    """Describe device ``ordinal``; raises :class:`NoGPU` when there is no GPU."""
    _ensure_init()
    device = check("cuDeviceGet", cu.cuDeviceGet(ordinal))
    raw_name = check("cuDeviceGetName", cu.cuDeviceGetName(256, device))
    attr = cu.CUdevice_attribute
    return DeviceInfo(
        ordinal=ordinal,
        name=raw_name.split(b"\0", 1)[0].decode(errors="replace"),
        compute_capability=(
            _device_attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
            _device_attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
        ),
        driver_version=check("cuDriverGetVersion", cu.cuDriverGetVersion()),
        total_memory=check("cuDeviceTotalMem", cu.cuDeviceTotalMem(device)),
        multiprocessor_count=_device_attribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
    )


def devices() -> list[DeviceInfo]:
    """Every visible GPU; an empty list (never :class:`NoGPU`) when there is none."""
    try:
        _ensure_init()
    except NoGPU as exc:
        logger.debug("%s", exc)
        return []
    count = check("cuDeviceGetCount", cu.cuDeviceGetCount())
    return [device_info(ordinal) for ordinal in range(count)]


def _host_view(data: Any, writable: bool) -> memoryview:
    """A view of a contiguous host buffer (bytes, bytearray, memoryview, numpy array)."""
    try:
        view = memoryview(data)
    except TypeError as exc:
        raise TensorWasmError(f"{type(data).__name__} is not a host buffer") from exc
    if not view.c_contiguous:
        raise TensorWasmError("host buffer must be C-contiguous")
    if writable and view.readonly:
        raise TensorWasmError("destination host buffer is read-only")
    return view


class PageLocks:
    """Host ranges page-locked by ``cuMemHostRegister``, and where they begin and end: the
    driver refuses a copy that runs across two registrations (CUDA_ERROR_INVALID_VALUE),
    so copies are cut there."""

    def __init__(self) -> None:
        self._ends: dict[int, int] = {}  # base -> end
        self._cuts: list[int] = []  # every base and end, sorted

    def add(self, base: int, nbytes: int) -> None:
        self._ends[base] = base + nbytes
        self._recut()

    def remove(self, base: int) -> None:
        if self._ends.pop(base, None) is not None:
            self._recut()

    def _recut(self) -> None:
        self._cuts = sorted({edge for span in self._ends.items() for edge in span})

    def pieces(self, host: int, nbytes: int) -> list[tuple[int, int]]:
        """``[host, host + nbytes)`` as ``(offset, length)`` pieces cut where a page-locked
        range begins or ends; one piece where none does."""
        cuts = self._cuts
        end = host + nbytes
        first, last = bisect.bisect_right(cuts, host), bisect.bisect_left(cuts, end)
        if first == last:
            return [(0, nbytes)]
        edges = [host, *cuts[first:last], end]
        return [(lo - host, hi - lo) for lo, hi in itertools.pairwise(edges)]


@functools.cache
def _replay_entry_points() -> tuple[int, int, int]:
    """The addresses of the driver's ``cuCtxSetCurrent``, ``cuGraphLaunch`` and
    ``cuStreamSynchronize`` (see :meth:`Context.native_calls`)."""
    # The library the bindings loaded: dlopen of the same name finds it loaded.
    library = ctypes.CDLL("libcuda.so.1")
    calls = (library.cuCtxSetCurrent, library.cuGraphLaunch, library.cuStreamSynchronize)
    return tuple(ctypes.cast(c, ctypes.c_void_p).value for c in calls)


class Context:
    """The process-wide wrapper of one device's primary context; see :meth:`get`.

    ``info`` describes the device; ``generation`` counts the resets so far.
    """

    _instances: ClassVar[dict[int, Context]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, info: DeviceInfo, device: Any, handle: Any) -> None:
        self.info = info
        self._device = device
        self._handle = handle
        self._lock = threading.Lock()
        # Bumped by reset(): objects from an older generation hold dangling handles.
        self.generation = 0
        self._capture: tuple[int, Stream] | None = None  # (generation, stream) for record()
        self.locks = PageLocks()  # what host_register page-locked
        # Told of every reset (``context_reset(context)``): what holds device state made here.
        self.watchers: weakref.WeakSet = weakref.WeakSet()
        self.refused: CudaError | None = None  # why the last reset could not make a new context

    @classmethod
    def made(cls, ordinal: int = 0) -> Context | None:
        """Device ``ordinal``'s :class:`Context` if it has been created (never waits)."""
        return cls._instances.get(ordinal)

    @classmethod
    def get(cls, ordinal: int = 0) -> Context:
        """The one :class:`Context` of device ``ordinal``, created on first use."""
        with cls._instances_lock:
            context = cls._instances.get(ordinal)
            if context is None:
                info = device_info(ordinal)
                device = check("cuDeviceGet", cu.cuDeviceGet(ordinal))
                handle = check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(device))
                context = cls(info, device, handle)
                cls._instances[ordinal] = context
                logger.info(
                    "using GPU %d: %s (%s, driver %d)",
                    ordinal,
                    info.name,
                    info.arch,
                    info.driver_version,
                )
            return context

    def bind(self) -> None:
        """Make this context current on the calling thread."""
        check("cuCtxSetCurrent", cu.cuCtxSetCurrent(self._handle))

    def synchronize(self) -> None:
        """Wait for all work in the context; surfaces asynchronous kernel faults."""
        self.bind()
        check("cuCtxSynchronize", cu.cuCtxSynchronize())

    def reset(self) -> None:
        """Recover from a sticky error by destroying and recreating the primary context.

        Every buffer, module and kernel made before the reset becomes stale.
        """
        with self._lock:
            # A poisoned context is only gone once nothing holds it: unbind it from this
            # thread, drop our reference, reset, and retain a fresh one.
            check("cuCtxSetCurrent", cu.cuCtxSetCurrent(cu.CUcontext(0)))
            cu.cuDevicePrimaryCtxRelease(self._device)
            cu.cuDevicePrimaryCtxReset(self._device)
            err, handle = cu.cuDevicePrimaryCtxRetain(self._device)
            self.generation += 1
            self.locks = PageLocks()  # the reset undid every registration
            for watcher in list(self.watchers):
                watcher.context_reset(self)
            if err != cu.CUresult.CUDA_SUCCESS:
                # Some faults (an illegal address, a failed launch) poison CUDA for the rest
                # of the process: the driver refuses every context from now on.
                self.refused = CudaError(
                    "cuDevicePrimaryCtxRetain", err,
                    "the GPU cannot be used again in this process after a sticky fault; "
                    "a new process is needed",
                )  # fmt: skip
                raise self.refused
            self._handle = handle
            check("cuCtxSetCurrent", cu.cuCtxSetCurrent(self._handle))
        logger.warning("GPU %d context reset (generation %d)", self.info.ordinal, self.generation)

    def native_calls(self) -> tuple[int, int, int, int]:
        """For native code that replays graphs (:mod:`runtime.replay`): the addresses of the
        driver's ``cuCtxSetCurrent``, ``cuGraphLaunch`` and ``cuStreamSynchronize``, and this
        context's handle (valid until a :meth:`reset`)."""
        return (*_replay_entry_points(), int(self._handle))

    def set_stack_size(self, nbytes: int) -> None:
        """Per-thread stack for device calls; the driver reserves it for every resident thread."""
        self.bind()
        check("cuCtxSetLimit", cu.cuCtxSetLimit(cu.CUlimit.CU_LIMIT_STACK_SIZE, nbytes))

    def stack_size(self) -> int:
        self.bind()
        return int(check("cuCtxGetLimit", cu.cuCtxGetLimit(cu.CUlimit.CU_LIMIT_STACK_SIZE)))

    def mem_alloc(self, nbytes: int) -> DeviceBuffer:
        """Allocate ``nbytes`` of device memory."""
        self.bind()
        ptr = check("cuMemAlloc", cu.cuMemAlloc(nbytes))
        return DeviceBuffer(self, int(ptr), nbytes)

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` device memory in bytes."""
        self.bind()
        return check("cuMemGetInfo", cu.cuMemGetInfo())

    def memcpy_htod(self, dst_ptr: int, src: Any, nbytes: int | None = None) -> None:
        """Copy host ``src`` to device address ``dst_ptr``.

        ``src`` is a contiguous buffer (its size is the default ``nbytes``) or an int
        host address, e.g. from ``ctypes.addressof``, for which ``nbytes`` is required.
        """
        host, nbytes = self._host_source(src, nbytes, writable=False)
        self.bind()
        if not isinstance(host, int):
            check("cuMemcpyHtoD", cu.cuMemcpyHtoD(dst_ptr, host, nbytes))
            return
        for at, length in self.locks.pieces(host, nbytes):
            check("cuMemcpyHtoD", cu.cuMemcpyHtoD(dst_ptr + at, host + at, length))

    def memcpy_dtoh(self, dst: Any, src_ptr: int, nbytes: int | None = None) -> None:
        """Copy ``nbytes`` (default: all of ``dst``) from device ``src_ptr`` into ``dst``."""
        host, nbytes = self._host_source(dst, nbytes, writable=True)
        self.bind()
        if not isinstance(host, int):
            check("cuMemcpyDtoH", cu.cuMemcpyDtoH(host, src_ptr, nbytes))
            return
        for at, length in self.locks.pieces(host, nbytes):
            check("cuMemcpyDtoH", cu.cuMemcpyDtoH(host + at, src_ptr + at, length))

    @staticmethod
    def _host_source(data: Any, nbytes: int | None, writable: bool) -> tuple[Any, int]:
        if isinstance(data, int):
            if nbytes is None:
                raise TensorWasmError("a raw host address needs an explicit nbytes")
            return data, nbytes
        view = _host_view(data, writable)
        if nbytes is None:
            nbytes = view.nbytes
        elif nbytes > view.nbytes:
            raise TensorWasmError(f"copy of {nbytes} bytes overruns a {view.nbytes}-byte host buffer")
        return view, nbytes

    def host_alloc(self, nbytes: int) -> PinnedBuffer:
        """Allocate ``nbytes`` of page-locked host memory (copies from and to it run by DMA,
        asynchronously)."""
        self.bind()
        ptr = check("cuMemHostAlloc", cu.cuMemHostAlloc(nbytes, 0))
        return PinnedBuffer(self, int(ptr), nbytes)

    def stream(self) -> Stream:
        """The default stream, for copies and launches waited for together."""
        return Stream(self)

    def host_register(self, base: int, nbytes: int) -> bool:
        """Page-lock the ordinary host memory ``[base, base + nbytes)``; False where the
        driver refuses (the copies from and to it then stay pageable)."""
        self.bind()
        (err,) = cu.cuMemHostRegister(base, nbytes, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            logger.info("host memory stays pageable: cuMemHostRegister failed (%s)", err.name)
            return False
        self.locks.add(base, nbytes)
        return True

    def host_unregister(self, base: int) -> None:
        """Undo :meth:`host_register` (a no-op once the mapping is gone)."""
        self.bind()
        cu.cuMemHostUnregister(base)
        self.locks.remove(base)

    def record(self, queue: Callable[[Stream], None]) -> Graph:
        """What ``queue(stream)`` queues (copies between device and page-locked host memory,
        launches), recorded as a graph instead of run: one driver call replays it all, and
        the GPU runs its steps back to back. Kernel arguments are taken as they are now."""
        self.bind()
        if self._capture is None or self._capture[0] != self.generation:
            flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
            handle = check("cuStreamCreate", cu.cuStreamCreate(flags))
            self._capture = (self.generation, Stream(self, int(handle)))
        stream = self._capture[1]
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check("cuStreamBeginCapture", cu.cuStreamBeginCapture(stream.handle, mode))
        try:
            queue(stream)
        except BaseException:
            err, graph = cu.cuStreamEndCapture(stream.handle)
            if err == cu.CUresult.CUDA_SUCCESS:
                cu.cuGraphDestroy(graph)
            raise
        graph = check("cuStreamEndCapture", cu.cuStreamEndCapture(stream.handle))
        try:
            return Graph(self, check("cuGraphInstantiate", cu.cuGraphInstantiate(graph, 0)))
        finally:
            cu.cuGraphDestroy(graph)

    def memset_d8(self, ptr: int, value: int, nbytes: int) -> None:
        """Set ``nbytes`` bytes at device address ``ptr`` to ``value``."""
        self.bind()
        check("cuMemsetD8", cu.cuMemsetD8(ptr, value & 0xFF, nbytes))

    def load_module(self, ptx: bytes | str) -> Module:
        """JIT-compile and load a PTX module; raises :class:`ModuleLoadError` with the log.
        Where ptxas is found it assembles the module in a process of its own first (see
        :mod:`runtime.assembler`), and the driver loads its cubin."""
        image = _ptx_image(ptx)
        cubin = self._assembled(image)
        if cubin is not None:
            try:
                return self.load_cubin(cubin, ptx_entries(image))
            except CudaError as exc:
                if exc.sticky:
                    raise
                logger.info("the driver refuses ptxas's cubin (%s): its JIT compiles the module", exc)
        logs = _JitLogs()
        self.bind()
        err, handle = cu.cuModuleLoadDataEx(image, *logs.options())
        if err != cu.CUresult.CUDA_SUCCESS:
            raise ModuleLoadError("cuModuleLoadDataEx", err, logs.error(), self.info.arch)
        logs.debug()
        return Module(self, handle, ptx_entries(image))

    def link_cubin(self, ptx: bytes | str, assemble: bool = True) -> bytes:
        """Compile PTX to this device's cubin with the driver's JIT linker (what
        :meth:`load_module` does internally), returning the image for :meth:`load_cubin`;
        where ptxas is found (and ``assemble``), its cubin, made in a process of its own."""
        image = _ptx_image(ptx)
        cubin = self._assembled(image) if assemble else None
        if cubin is not None:
            return cubin
        logs = _JitLogs()
        self.bind()
        state = check("cuLinkCreate", cu.cuLinkCreate(*logs.options()))
        try:
            (err,) = cu.cuLinkAddData(
                state, cu.CUjitInputType.CU_JIT_INPUT_PTX, image, len(image), b"kernels.ptx", 0, None, None
            )
            if err == cu.CUresult.CUDA_SUCCESS:
                err, cubin, size = cu.cuLinkComplete(state)
            if err != cu.CUresult.CUDA_SUCCESS:
                raise ModuleLoadError("cuLinkAddData", err, logs.error(), self.info.arch)
            logs.debug()
            return ctypes.string_at(int(cubin), size)
        finally:
            cu.cuLinkDestroy(state)

    def _assembled(self, image: bytes) -> bytes | None:
        """ptxas's cubin of the module, or None (the driver's JIT compiles it); a crash of
        ptxas is a :class:`ModuleLoadError` and the module never reaches the driver."""
        from tensorwasm.runtime.assembler import AssemblerCrash, assemble

        try:
            return assemble(image, self.info.arch, self.info.driver_version)
        except AssemblerCrash as exc:
            invalid = int(cu.CUresult.CUDA_ERROR_INVALID_PTX)
            raise ModuleLoadError("ptxas", invalid, exc.detail, self.info.arch, str(exc.kept)) from None

    def load_cubin(self, cubin: bytes, entries: tuple[str, ...]) -> Module:
        """Load a cubin made by :meth:`link_cubin` on a device of the same capability."""
        self.bind()
        handle = check("cuModuleLoadData", cu.cuModuleLoadData(cubin))
        return Module(self, handle, entries)


def _ptx_image(ptx: bytes | str) -> bytes:
    image = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    return image if image.endswith(b"\0") else image + b"\0"  # the driver reads a C string


def ptx_entries(ptx: bytes | str) -> tuple[str, ...]:
    """The kernel (``.entry``) names a PTX module defines."""
    image = ptx.encode() if isinstance(ptx, str) else ptx
    return tuple(name.decode() for name in re.findall(rb"\.entry\s+([A-Za-z_$%][\w$]*)", image))


class _JitLogs:
    """The error and info log buffers the driver's JIT fills, as option lists."""

    def __init__(self) -> None:
        self.error_log = bytearray(JIT_LOG_BYTES)
        self.info_log = bytearray(JIT_LOG_BYTES)

    def options(self) -> tuple[int, list, list]:
        jit = cu.CUjit_option
        options = [
            jit.CU_JIT_ERROR_LOG_BUFFER,
            jit.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            jit.CU_JIT_INFO_LOG_BUFFER,
            jit.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        ]
        return len(options), options, [self.error_log, JIT_LOG_BYTES, self.info_log, JIT_LOG_BYTES]

    def error(self) -> str:
        return _c_string(self.error_log)

    def debug(self) -> None:
        if info := _c_string(self.info_log):
            logger.debug("PTX JIT info log:\n%s", info)


def _c_string(buffer: bytearray) -> str:
    """Decode a NUL-terminated driver log."""
    return buffer.split(b"\0", 1)[0].decode(errors="replace").strip()


class _ContextObject:
    """Shared staleness check of objects that hold a handle in one context generation."""

    def __init__(self, context: Context, what: str) -> None:
        self.context = context
        self._generation = context.generation
        self._what = what
        self._released = False

    def _live(self) -> bool:
        return not self._released and self._generation == self.context.generation

    def ensure_live(self) -> None:
        """Bind the owning context, or raise :class:`StaleHandleError` if released."""
        if self._released:
            raise StaleHandleError(f"{self._what} was already released")
        if self._generation != self.context.generation:
            raise StaleHandleError(f"{self._what} belongs to a GPU context that was reset")
        self.context.bind()


class DeviceBuffer(_ContextObject):
    """An owned device allocation; free it with :meth:`free` or a ``with`` block."""

    def __init__(self, context: Context, ptr: int, nbytes: int) -> None:
        super().__init__(context, f"device buffer 0x{ptr:x} ({nbytes} bytes)")
        self._ptr = ptr
        self.nbytes = nbytes

    @property
    def ptr(self) -> int:
        """The device address; raises :class:`StaleHandleError` once freed or reset."""
        self.ensure_live()
        return self._ptr

    def free(self) -> None:
        """Release the allocation; freeing twice, or after a reset, does nothing."""
        if self._live():
            self.context.bind()
            check("cuMemFree", cu.cuMemFree(self._ptr))
        self._released = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.free()


class PinnedBuffer(_ContextObject):
    """Page-locked host memory from :meth:`Context.host_alloc`; ``ptr`` is its host address."""

    def __init__(self, context: Context, ptr: int, nbytes: int) -> None:
        super().__init__(context, f"page-locked host buffer 0x{ptr:x} ({nbytes} bytes)")
        self.ptr = ptr
        self.nbytes = nbytes

    def free(self) -> None:
        """Release the memory; freeing twice, or after a reset (which freed it), does nothing."""
        if self._live():
            self.context.bind()
            check("cuMemFreeHost", cu.cuMemFreeHost(self.ptr))
        self._released = True


class Stream:
    """Copies and launches queued in order, and waited for together: the offload path's one
    synchronisation a launch. The context's default stream (``handle`` 0) unless
    :meth:`Context.record` made it.

    Unlike :class:`Context`'s methods, these do not bind the context: each would double
    the driver calls of a launch. Call :meth:`Context.bind` on the thread before queueing.
    Copies from or to pageable host memory are correct too, only not asynchronous.
    """

    def __init__(self, context: Context, handle: int = 0) -> None:
        self.context = context
        self.handle = handle

    def launch(self, kernel: Kernel, grid: Sequence[int], block: Sequence[int], args: KernelParams) -> None:
        """Queue a launch of ``kernel`` (see :meth:`Kernel.launch`)."""
        kernel.launch(grid, block, args, stream=self.handle)

    def copy_htod(self, dst: int, src: int, nbytes: int) -> None:
        """Queue a copy of ``nbytes`` from host address ``src`` to device address ``dst``
        (one per piece of page-locked memory it spans: :meth:`PageLocks.pieces`)."""
        for at, length in self.context.locks.pieces(src, nbytes):
            check("cuMemcpyHtoDAsync", cu.cuMemcpyHtoDAsync(dst + at, src + at, length, self.handle))

    def copy_dtoh(self, dst: int, src: int, nbytes: int) -> None:
        """Queue a copy of ``nbytes`` from device address ``src`` to host address ``dst``
        (one per piece of page-locked memory it spans: :meth:`PageLocks.pieces`)."""
        for at, length in self.context.locks.pieces(dst, nbytes):
            check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(dst + at, src + at, length, self.handle))

    def copy_htod_rows(self, dst: int, src: int, pitch: int, width: int, count: int) -> None:
        """Queue a copy of ``count`` rows of ``width`` bytes, ``pitch`` bytes apart on both
        sides, from host address ``src`` to device address ``dst``: one 2-D copy where they
        lie in one piece of page-locked memory (:meth:`PageLocks.pieces`), else row by row."""
        self._rows(dst, src, pitch, width, count, to_device=True)

    def copy_dtoh_rows(self, dst: int, src: int, pitch: int, width: int, count: int) -> None:
        """:meth:`copy_htod_rows` from device address ``src`` to host address ``dst``."""
        self._rows(dst, src, pitch, width, count, to_device=False)

    def _rows(self, dst: int, src: int, pitch: int, width: int, count: int, *, to_device: bool) -> None:
        host = src if to_device else dst
        if len(self.context.locks.pieces(host, pitch * (count - 1) + width)) > 1:
            each_row(self.copy_htod if to_device else self.copy_dtoh, dst, src, pitch, width, count)
            return
        kind = cu.CUmemorytype
        copy = cu.CUDA_MEMCPY2D()
        copy.srcPitch = copy.dstPitch = pitch
        copy.WidthInBytes, copy.Height = width, count
        if to_device:
            copy.srcMemoryType, copy.srcHost = kind.CU_MEMORYTYPE_HOST, src
            copy.dstMemoryType, copy.dstDevice = kind.CU_MEMORYTYPE_DEVICE, dst
        else:
            copy.srcMemoryType, copy.srcDevice = kind.CU_MEMORYTYPE_DEVICE, src
            copy.dstMemoryType, copy.dstHost = kind.CU_MEMORYTYPE_HOST, dst
        check("cuMemcpy2DAsync", cu.cuMemcpy2DAsync(copy, self.handle))

    def synchronize(self) -> None:
        """Wait for everything queued; surfaces asynchronous kernel faults."""
        check("cuStreamSynchronize", cu.cuStreamSynchronize(self.handle))


class Graph(_ContextObject):
    """Copies and launches recorded once by :meth:`Context.record`, replayed by one call."""

    def __init__(self, context: Context, handle: Any) -> None:
        super().__init__(context, "CUDA graph")
        self._handle = handle

    @property
    def handle(self) -> int:
        """The executable graph's handle, for native code (:mod:`runtime.replay`)."""
        return int(self._handle)

    def launch(self, stream: int = 0) -> None:
        """Queue the recorded steps on ``stream``."""
        (err,) = cu.cuGraphLaunch(self._handle, stream)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise CudaError("cuGraphLaunch", err)

    def destroy(self) -> None:
        """Free the graph; idempotent, and a no-op after a context reset."""
        if self._live():
            self.context.bind()
            cu.cuGraphExecDestroy(self._handle)
        self._released = True


class Module(_ContextObject):
    """A loaded PTX module."""

    def __init__(self, context: Context, handle: Any, entries: tuple[str, ...]) -> None:
        super().__init__(context, "CUDA module")
        self._handle = handle
        self.entries = entries

    def function(self, name: str) -> Kernel:
        """The kernel ``name``; a missing kernel is a :class:`CudaError` naming it."""
        self.ensure_live()
        err, handle = cu.cuModuleGetFunction(self._handle, name.encode())
        if err != cu.CUresult.CUDA_SUCCESS:
            defined = ", ".join(self.entries) or "no kernels"
            raise CudaError(
                "cuModuleGetFunction",
                err,
                f"kernel {name!r} (module defines {defined})",
            )
        return Kernel(self, name, handle)

    def unload(self) -> None:
        """Unload the module; idempotent, and a no-op after a context reset."""
        if self._live():
            self.context.bind()
            check("cuModuleUnload", cu.cuModuleUnload(self._handle))
        self._released = True


@dataclass(frozen=True)
class KernelAttributes:
    """Static resource use of a compiled kernel, for reports."""

    num_regs: int
    max_threads_per_block: int
    local_size_bytes: int
    shared_size_bytes: int
    const_size_bytes: int


KernelArg = ctypes._SimpleCData | tuple[type[ctypes._SimpleCData], Any] | DeviceBuffer


def _kernel_arg(arg: KernelArg) -> ctypes._SimpleCData:
    """A ctypes scalar whose storage the driver copies the parameter from."""
    if isinstance(arg, ctypes._SimpleCData):
        return arg
    if isinstance(arg, DeviceBuffer):
        return ctypes.c_uint64(arg.ptr)
    if isinstance(arg, tuple) and len(arg) == 2:
        ctype, value = arg
        return ctype(value)
    raise TensorWasmError(f"kernel argument {arg!r} is not a ctypes scalar or (type, value)")


class KernelParams:
    """A kernel's arguments kept in place between launches: the storage of each and the
    ``void**`` array of their addresses are made once; a launch only changes values. An
    argument is a ctypes scalar, or a ctypes array passed by value (a ``byval`` parameter
    of as many bytes), whose value is its bytes."""

    def __init__(self, types: Sequence[type[ctypes._SimpleCData] | type[ctypes.Array]]) -> None:
        self.slots = [ctype() for ctype in types]
        self._pointers = (ctypes.c_void_p * max(1, len(self.slots)))(*map(ctypes.addressof, self.slots))
        self.address = ctypes.addressof(self._pointers) if self.slots else 0

    def set(self, values: Sequence[Any]) -> None:
        for slot, value in zip(self.slots, values, strict=True):
            if isinstance(slot, ctypes.Array):
                set_bytes(slot, value)
            else:
                slot.value = value

    @property
    def values(self) -> list[Any]:
        return [bytes(slot) if isinstance(slot, ctypes.Array) else slot.value for slot in self.slots]


def set_bytes(slot: ctypes.Array, value: bytes) -> None:
    """An array argument's bytes, all of them."""
    if len(value) != ctypes.sizeof(slot):
        raise TensorWasmError(f"a {ctypes.sizeof(slot)}-byte kernel argument given {len(value)} bytes")
    ctypes.memmove(slot, value, len(value))


def _dims(what: str, dims: Sequence[int]) -> tuple[int, int, int]:
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise TensorWasmError(f"{what} must be 1 to 3 positive sizes, got {tuple(dims)}")
    x, y, z = (*dims, 1, 1)[:3]
    return x, y, z


class Kernel:
    """One ``.entry`` of a loaded :class:`Module`."""

    def __init__(self, module: Module, name: str, handle: Any) -> None:
        self.module = module
        self.name = name
        self._handle = handle
        self._resident: dict[int, int] = {}  # threads per block -> blocks a multiprocessor holds

    def blocks_per_multiprocessor(self, threads: int) -> int:
        """Blocks of ``threads`` threads that one multiprocessor holds at once with this
        kernel's registers and shared memory (the driver's occupancy calculator; at least 1)."""
        found = self._resident.get(threads)
        if found is None:
            self.module.ensure_live()
            call = "cuOccupancyMaxActiveBlocksPerMultiprocessor"
            found = max(
                1, check(call, cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self._handle, threads, 0))
            )
            self._resident[threads] = found
        return found

    def launch(
        self,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[KernelArg] | KernelParams = (),
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        """Launch asynchronously; errors inside the kernel surface at the next sync.

        ``args`` are ctypes scalars (``c_uint64`` for device pointers), ``(ctype,
        value)`` pairs or :class:`DeviceBuffer` objects, in the kernel's order; or a
        :class:`KernelParams` kept for repeated launches.
        """
        gx, gy, gz = _dims("grid", grid)
        bx, by, bz = _dims("block", block)
        self.module.ensure_live()
        if isinstance(args, KernelParams):
            params = args.address
        else:
            values = [_kernel_arg(arg) for arg in args]
            # kernelParams is a void** whose entries point at each argument's storage;
            # `values` and `pointers` must stay alive until cuLaunchKernel has returned.
            pointers = (ctypes.c_void_p * len(values))(*map(ctypes.addressof, values))
            params = ctypes.addressof(pointers) if values else 0
        hstream = 0 if stream is None else stream
        (err,) = cu.cuLaunchKernel(self._handle, gx, gy, gz, bx, by, bz, shared_mem, hstream, params, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise CudaError("cuLaunchKernel", err, f"kernel {self.name!r}")

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow launches with up to ``nbytes`` of dynamic shared memory (> 48 KiB opt-in)."""
        self.module.ensure_live()
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check("cuFuncSetAttribute", cu.cuFuncSetAttribute(self._handle, attr, nbytes))

    @property
    def attributes(self) -> KernelAttributes:
        """Registers, local memory and limits the JIT chose for this kernel."""
        self.module.ensure_live()
        attr = cu.CUfunction_attribute

        def get(attribute: Any) -> int:
            return check("cuFuncGetAttribute", cu.cuFuncGetAttribute(attribute, self._handle))

        return KernelAttributes(
            num_regs=get(attr.CU_FUNC_ATTRIBUTE_NUM_REGS),
            max_threads_per_block=get(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            local_size_bytes=get(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
            shared_size_bytes=get(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
            const_size_bytes=get(attr.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES),
        )
