"""The GPU's work in a process of its own, for a process whose CUDA context a fault ended.

After a sticky fault (an illegal address, a failed launch) the driver refuses the process
every new context: CUDA's documentation asks for a new process, and the H100's driver
(580) answers ``cuDevicePrimaryCtxRetain`` and ``cuCtxCreate`` with the fault's error.
:class:`WorkerContext` is that new process: a child (``python -m tensorwasm.runtime.remote``) that
makes its own context and answers the calls the offload path makes on a
:class:`runtime.driver.Context` (device memory, a stream of copies and launches,
recorded launches, module loads), forwarded over a socket.

Host memory does not cross processes. The copies and launches of the stream are gathered
until it is waited for; then the bytes going to the device are put in memory shared with
the child (a memfd both map, which the child page-locks), the child runs every step in
order and waits, and the bytes that came back are moved from the shared memory to their
host addresses. A copy to the device queued after a copy back is preceded by a wait, so
each copy reads the host memory a device would. A batch larger than the shared memory
goes in parts, each waited for.

A fault in the child ends only the child: :meth:`WorkerContext.reset` starts another,
and a child that dies is a sticky :class:`WorkerLost`. Recorded launches have no graph
handle here, so no native replay (:mod:`runtime.replay`) is armed on such a context.
"""

from __future__ import annotations

import ctypes
import importlib
import mmap
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tensorwasm.runtime import driver
from tensorwasm.runtime.device_info import DeviceInfo
from tensorwasm.runtime.driver import (
    CudaError,
    KernelAttributes,
    KernelParams,
    ModuleLoadError,
    NoGPU,
    PageLocks,
)
from tensorwasm.support import logs
from tensorwasm.support.errors import TensorWasmError

log = logs.get_logger(__name__)

_LENGTH = struct.Struct("<Q")

# A kernel argument of 64-bit words passed by value (a loop kernel's live-ins), by its code.
WORDS = "words"
# ctypes scalar types of kernel arguments by their type code, to rebuild them in the child.
_SCALARS = {
    t._type_: t
    for t in (
        ctypes.c_int8, ctypes.c_uint8, ctypes.c_int16, ctypes.c_uint16, ctypes.c_int32,
        ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_longlong, ctypes.c_ulonglong,
        ctypes.c_float, ctypes.c_double, ctypes.c_void_p,
    )
}  # fmt: skip


class WorkerLost(CudaError):
    """The GPU's process ended (it crashed or was killed) or cannot be started: sticky, as
    the context it held is gone."""

    sticky = True

    def __init__(self, detail: str) -> None:
        self.call, self.code, self.error_name = "GPU process", -1, "GPU_PROCESS_LOST"
        TensorWasmError.__init__(self, f"the GPU's process ended: {detail}")


# --- The wire: length-prefixed pickles, replies ("ok", value) or ("error", kind, fields).


def _send(sock: socket.socket, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def _receive(sock: socket.socket) -> Any:
    (length,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    return pickle.loads(_exactly(sock, length))


def _exactly(sock: socket.socket, nbytes: int) -> bytes:
    data = bytearray()
    while len(data) < nbytes:
        chunk = sock.recv(nbytes - len(data))
        if not chunk:
            raise EOFError("the other end closed the socket")
        data += chunk
    return bytes(data)


def _error_fields(exc: Exception) -> tuple:
    """An error of the child as it crosses to the parent (see :func:`_rebuilt`)."""
    if isinstance(exc, ModuleLoadError):
        return ("load", exc.call, exc.code, exc.log, exc.arch, exc.kept)
    if isinstance(exc, CudaError):
        return ("cuda", exc.call, exc.code, exc.detail)
    if isinstance(exc, NoGPU):
        return ("no-gpu", str(exc))
    return ("other", f"{type(exc).__name__}: {exc}")


def _rebuilt(fields: tuple) -> TensorWasmError:
    kind, *rest = fields
    if kind == "load":
        return ModuleLoadError(*rest)
    if kind == "cuda":
        return CudaError(*rest)
    if kind == "no-gpu":
        return NoGPU(rest[0])
    return TensorWasmError(f"in the GPU's process: {rest[0]}")


# --- The parent's side.


class WorkerContext:
    """A CUDA context in a child process, with the calls of :class:`runtime.driver.Context`
    that the offload path and the whole-function executor make (see the module's doc)."""

    # The most bytes of memory shared with the child; a larger batch of copies goes in parts.
    SHARED_MAX = 256 << 20

    def __init__(self, ordinal: int = 0, factory: str | None = None) -> None:
        """Start the child for device ``ordinal``; ``factory`` (``module:function``) makes
        the child's context instead of the GPU's (tests)."""
        self._ordinal, self._factory = ordinal, factory
        self.generation = 0
        self.locks = PageLocks()  # (nothing here is page-locked: the copies cross the socket)
        self.watchers: weakref.WeakSet = weakref.WeakSet()  # as runtime.driver.Context's
        self.refused: CudaError | None = None  # (a reset here always starts another child)
        self._ops: list[tuple] = []
        self._copied_back = False  # whether the ops queued copy anything back
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
        # -P: the working directory does not go first on the path (a user's own ``runtime``
        # package there would shadow this one).
        command = [
            sys.executable,
            "-P",
            "-m",
            "tensorwasm.runtime.remote",
            str(theirs.fileno()),
            str(self._ordinal),
        ]
        if self._factory:
            command.append(self._factory)
        try:
            self._process = subprocess.Popen(
                command, pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL
            )
        except OSError as exc:
            ours.close()
            raise WorkerLost(f"it could not be started ({exc})") from None
        finally:
            theirs.close()
        self._socket = ours
        self._shared: _Shared | None = None
        self._ended = weakref.finalize(self, _end, self._process, ours)
        try:
            self.info: DeviceInfo = self._call("hello")
        except (CudaError, NoGPU):
            self.close()
            raise
        except TensorWasmError as exc:  # (an error of the child's own start)
            self.close()
            raise WorkerLost(str(exc)) from None
        log.info("GPU %d's work runs in process %d (%s)", self._ordinal, self._process.pid, self.info.name)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        """Whether the child is there to ask (neither closed nor lost)."""
        return self._ended.alive

    def close(self) -> None:
        """End the child (it frees everything it held)."""
        self._ops.clear()
        self._ended()

    def _call(self, op: str, *args: Any) -> Any:
        if not self._ended.alive:
            raise WorkerLost("it was closed")
        try:
            _send(self._socket, (op, args))
            reply = _receive(self._socket)
        except (OSError, EOFError) as exc:
            try:
                code = self._process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
            self.close()
            raise WorkerLost(f"{exc}" + (f" (exit status {code})" if code is not None else "")) from None
        except (
            BaseException
        ):  # (an interrupt between the call and its reply: the next reply would be this one's)
            self.close()
            raise
        if reply[0] == "ok":
            return reply[1]
        raise _rebuilt(reply[1])

    # Context's calls.

    def bind(self) -> None:
        pass

    def synchronize(self) -> None:
        self._flush()

    def reset(self) -> None:
        """End the child and start another: every buffer, module and kernel made before
        is stale, as after :meth:`runtime.driver.Context.reset`."""
        self.close()
        self.generation += 1
        self._copied_back = False
        for watcher in list(self.watchers):
            watcher.context_reset(self)
        self._start()
        log.warning("GPU %d's process restarted (generation %d)", self._ordinal, self.generation)

    def native_calls(self) -> None:
        """None: recorded launches here have no graph handle native code could replay."""
        return None

    def set_stack_size(self, nbytes: int) -> None:
        self._call("set_stack_size", nbytes)

    def stack_size(self) -> int:
        return self._call("stack_size")

    def mem_alloc(self, nbytes: int) -> WorkerBuffer:
        return WorkerBuffer(self, self._call("alloc", nbytes), nbytes)

    def mem_get_info(self) -> tuple[int, int]:
        return self._call("mem_get_info")

    def memset_d8(self, ptr: int, value: int, nbytes: int) -> None:
        self._ops.append(("memset", ptr, value & 0xFF, nbytes))
        self._flush()

    def memcpy_htod(self, dst_ptr: int, src: Any, nbytes: int | None = None) -> None:
        host, nbytes = driver.Context._host_source(src, nbytes, writable=False)
        self.copy_htod(dst_ptr, host if isinstance(host, int) else bytes(host[:nbytes]), nbytes)
        self._flush()

    def memcpy_dtoh(self, dst: Any, src_ptr: int, nbytes: int | None = None) -> None:
        host, nbytes = driver.Context._host_source(dst, nbytes, writable=True)
        if not isinstance(host, int):
            host = ctypes.addressof((ctypes.c_char * nbytes).from_buffer(host))
        self.copy_dtoh(host, src_ptr, nbytes)
        self._flush()

    def host_alloc(self, nbytes: int) -> HostBuffer:
        return HostBuffer(nbytes)

    def stream(self) -> WorkerStream:
        return WorkerStream(self)

    def host_register(self, base: int, nbytes: int) -> bool:
        """False: copies from the parent's memory always pass the shared memory."""
        return False

    def host_unregister(self, base: int) -> None:
        pass

    def record(self, queue: Callable[[Any], None]) -> WorkerGraph:
        """What ``queue(stream)`` queues, kept to be queued again by :meth:`WorkerGraph.launch`
        (kernel arguments as they are now)."""
        recorder = _Recorder(self)
        queue(recorder)
        return WorkerGraph(self, recorder.ops)

    def load_module(self, ptx: bytes | str) -> WorkerModule:
        handle, entries = self._call("load_module", driver._ptx_image(ptx))
        return WorkerModule(self, handle, entries)

    def link_cubin(self, ptx: bytes | str, assemble: bool = True) -> bytes:
        return self._call("link_cubin", driver._ptx_image(ptx), assemble)

    def load_cubin(self, cubin: bytes, entries: tuple[str, ...]) -> WorkerModule:
        return WorkerModule(self, self._call("load_cubin", bytes(cubin), tuple(entries)), tuple(entries))

    # The stream: steps gathered until the wait.

    def copy_htod(self, dst: int, src: int | bytes, nbytes: int) -> None:
        if self._copied_back:  # it reads host memory a copy queued before writes
            self._flush()
        for at in range(0, nbytes, self.SHARED_MAX):
            length = min(self.SHARED_MAX, nbytes - at)
            piece = src + at if isinstance(src, int) else src[at : at + length]
            self._ops.append(("in", dst + at, piece, length))

    def copy_dtoh(self, dst: int, src: int, nbytes: int) -> None:
        for at in range(0, nbytes, self.SHARED_MAX):
            self._ops.append(("out", dst + at, src + at, min(self.SHARED_MAX, nbytes - at)))
        self._copied_back = True

    def launch(self, kernel: WorkerKernel, grid, block, args, shared_mem: int = 0) -> None:
        self._ops.append(_launch_op(kernel, grid, block, args, shared_mem))

    def queue(self, ops: Sequence[tuple]) -> None:
        """Queue recorded steps again (see :meth:`record`)."""
        for op in ops:
            if op[0] == "in":
                self.copy_htod(*op[1:])
            elif op[0] == "out":
                self.copy_dtoh(*op[1:])
            else:
                self._ops.append(op)

    def _flush(self) -> None:
        """Run what was queued, in parts that fit the shared memory, each waited for."""
        ops, self._ops, self._copied_back = self._ops, [], False
        while ops:
            size, count = 0, 0
            for op in ops:
                nbytes = op[3] if op[0] in ("in", "out") else 0
                if count and size + nbytes > self.SHARED_MAX:
                    break
                size, count = size + nbytes, count + 1
            part, ops = ops[:count], ops[count:]
            self._run(part, size)

    def _run(self, ops: list[tuple], size: int) -> None:
        shared = self._shared_for(size) if size else None
        wire, back, at = [], [], 0
        for op in ops:
            if op[0] == "in":
                _, dst, src, nbytes = op
                ctypes.memmove(shared.address + at, src, nbytes)
                wire.append(("in", dst, at, nbytes))
                at += nbytes
            elif op[0] == "out":
                _, dst, src, nbytes = op
                wire.append(("out", at, src, nbytes))
                back.append((dst, at, nbytes))
                at += nbytes
            else:
                wire.append(op)
        self._call("run", wire)
        for dst, at, nbytes in back:
            ctypes.memmove(dst, shared.address + at, nbytes)

    def _shared_for(self, size: int) -> _Shared:
        """The memory shared with the child, at least ``size`` bytes of it."""
        if self._shared is None or self._shared.size < size:
            grown = max(size, 1 << 20, 2 * self._shared.size if self._shared else 0)
            shared = _Shared(min(grown, max(self.SHARED_MAX, size)))
            try:
                _send(self._socket, ("map", (shared.size,)))
                socket.send_fds(self._socket, [b"m"], [shared.fd])
                shared.close_fd()
                self._expect_ok()
            except BaseException as exc:
                shared.close()
                if isinstance(exc, OSError):
                    self.close()
                    raise WorkerLost(str(exc)) from None
                raise
            if self._shared is not None:
                self._shared.close()
            self._shared = shared
        return self._shared

    def _expect_ok(self) -> None:
        try:
            reply = _receive(self._socket)
        except (OSError, EOFError) as exc:
            self.close()
            raise WorkerLost(str(exc)) from None
        if reply[0] != "ok":
            raise _rebuilt(reply[1])


def _end(process: subprocess.Popen, sock: socket.socket) -> None:
    """Close the socket (the child ends when it reads its end) and wait for it briefly."""
    sock.close()
    try:
        process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _launch_op(kernel: WorkerKernel, grid, block, args, shared_mem: int = 0) -> tuple:
    """A launch as the child runs it, its arguments taken now."""
    kernel.module.ensure_live()
    dims = (driver._dims("grid", grid), driver._dims("block", block))
    return ("launch", kernel.handle, kernel.name, *dims, shared_mem, _wire_args(args))


def _wire_args(args) -> list[tuple[str, bytes]]:
    """Kernel arguments as (ctypes type code, bytes), taken now (bytes: a float's bits cross
    unchanged, a signalling NaN's too)."""
    scalars = args.slots if isinstance(args, KernelParams) else [driver._kernel_arg(a) for a in args]
    return [(WORDS if isinstance(s, ctypes.Array) else type(s)._type_, bytes(s)) for s in scalars]


def _argument_type(code: str, raw: bytes) -> type:
    """The ctypes type a wired kernel argument (:func:`_wire_args`) is rebuilt as."""
    return ctypes.c_uint64 * (len(raw) // 8) if code == WORDS else _SCALARS[code]


class _Shared:
    """Memory the parent and the child both map: a memfd."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("tensorwasm-gpu", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self._view = ctypes.c_char.from_buffer(self.map)
        self.address = ctypes.addressof(self._view)

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        self.close_fd()
        del self._view
        self.map.close()


class HostBuffer:
    """Host memory with the ``ptr``, ``nbytes`` and ``free`` of a driver's buffer: staging
    here (the copies through the child page-lock nothing), or a simulated device's memory."""

    def __init__(self, nbytes: int) -> None:
        self.raw = ctypes.create_string_buffer(nbytes)
        self.ptr, self.nbytes = ctypes.addressof(self.raw), nbytes

    def free(self) -> None:
        pass


class WorkerStream:
    """The child's stream as :class:`runtime.driver.Stream` is used (``handle`` 0)."""

    handle = 0

    def __init__(self, context: WorkerContext) -> None:
        self.context = context

    def launch(self, kernel: WorkerKernel, grid, block, args: KernelParams) -> None:
        self.context.launch(kernel, grid, block, args)

    def copy_htod(self, dst: int, src: int, nbytes: int) -> None:
        self.context.copy_htod(dst, src, nbytes)

    def copy_dtoh(self, dst: int, src: int, nbytes: int) -> None:
        self.context.copy_dtoh(dst, src, nbytes)

    def synchronize(self) -> None:
        self.context.synchronize()


class _Recorder:
    """A stream whose steps are kept, not run (see :meth:`WorkerContext.record`)."""

    handle = 0

    def __init__(self, context: WorkerContext) -> None:
        self.context, self.ops = context, []

    def launch(self, kernel: WorkerKernel, grid, block, args: KernelParams) -> None:
        self.ops.append(_launch_op(kernel, grid, block, args))

    def copy_htod(self, dst: int, src: int, nbytes: int) -> None:
        self.ops.append(("in", dst, src, nbytes))

    def copy_dtoh(self, dst: int, src: int, nbytes: int) -> None:
        self.ops.append(("out", dst, src, nbytes))


class WorkerBuffer(driver.DeviceBuffer):
    """Device memory of the child; ``ptr`` is its device address."""

    def free(self) -> None:
        if self._live() and self.context.alive:  # (a child that ended took it with it)
            self.context._call("free", self._ptr)
        self._released = True


class WorkerGraph(driver._ContextObject):
    """Steps recorded by :meth:`WorkerContext.record`, queued again by :meth:`launch`."""

    def __init__(self, context: WorkerContext, ops: list[tuple]) -> None:
        super().__init__(context, "recorded launch")
        self.ops = ops

    @property
    def handle(self) -> int:
        raise TensorWasmError("a launch recorded in the GPU's process has no graph handle")

    def launch(self, stream: int = 0) -> None:
        self.ensure_live()
        self.context.queue(self.ops)

    def destroy(self) -> None:
        self._released = True


class WorkerModule(driver._ContextObject):
    """A module loaded in the child."""

    def __init__(self, context: WorkerContext, handle: int, entries: tuple[str, ...]) -> None:
        super().__init__(context, "CUDA module")
        self.handle, self.entries = handle, entries

    def function(self, name: str) -> WorkerKernel:
        self.ensure_live()
        return WorkerKernel(self, name, self.context._call("function", self.handle, name))

    def unload(self) -> None:
        if self._live() and self.context.alive:
            self.context._call("unload", self.handle)
        self._released = True


class WorkerKernel:
    """One ``.entry`` of a :class:`WorkerModule`."""

    def __init__(self, module: WorkerModule, name: str, handle: int) -> None:
        self.module, self.name, self.handle = module, name, handle

    def launch(self, grid, block, args=(), shared_mem: int = 0, stream: Any = None) -> None:
        self.module.context.launch(self, grid, block, args, shared_mem)

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        self.module.ensure_live()
        self.module.context._call("set_max_dynamic_shared", self.handle, nbytes)

    @property
    def attributes(self) -> KernelAttributes:
        self.module.ensure_live()
        return KernelAttributes(*self.module.context._call("attributes", self.handle))


# --- The child's side: ``python -m tensorwasm.runtime.remote FD ORDINAL [MODULE:FUNCTION]``.


class _Child:
    """The child's context and what it made, answering the parent's calls (one per op)."""

    def __init__(self, sock: socket.socket, context: Any) -> None:
        self.socket, self.context = sock, context
        self.buffers: dict[int, Any] = {}  # device address -> buffer
        self.modules: dict[int, Any] = {}
        self.kernels: dict[int, tuple[int, Any]] = {}  # handle -> (module handle, kernel)
        self.shared: tuple[mmap.mmap, Any, int] | None = None  # map, view, address
        self.handles = iter(range(1, 1 << 62))

    def hello(self) -> DeviceInfo:
        return self.context.info

    def map(self, size: int) -> None:
        _, fds, _, _ = socket.recv_fds(self.socket, 1, 1)
        if len(fds) != 1:
            raise EOFError("the parent sent no shared memory")
        (fd,) = fds
        try:
            shared = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        view = ctypes.c_char.from_buffer(shared)
        address = ctypes.addressof(view)
        self.context.host_register(address, size)  # (stays pageable where refused)
        if self.shared is not None:
            old, old_view, old_address = self.shared
            self.context.host_unregister(old_address)
            del old_view
            old.close()
        self.shared = (shared, view, address)

    def alloc(self, nbytes: int) -> int:
        buffer = self.context.mem_alloc(nbytes)
        self.buffers[buffer.ptr] = buffer
        return buffer.ptr

    def free(self, ptr: int) -> None:
        buffer = self.buffers.pop(ptr, None)
        if buffer is not None:
            buffer.free()

    def mem_get_info(self) -> tuple[int, int]:
        return tuple(int(n) for n in self.context.mem_get_info())

    def set_stack_size(self, nbytes: int) -> None:
        self.context.set_stack_size(nbytes)

    def stack_size(self) -> int:
        return int(self.context.stack_size())

    def _module(self, module: Any) -> int:
        handle = next(self.handles)
        self.modules[handle] = module
        return handle

    def load_module(self, image: bytes) -> tuple[int, tuple[str, ...]]:
        module = self.context.load_module(image)
        return self._module(module), tuple(module.entries)

    def link_cubin(self, image: bytes, assemble: bool) -> bytes:
        return bytes(self.context.link_cubin(image, assemble))

    def load_cubin(self, cubin: bytes, entries: tuple[str, ...]) -> int:
        return self._module(self.context.load_cubin(cubin, entries))

    def unload(self, handle: int) -> None:
        module = self.modules.pop(handle, None)
        if module is not None:
            self.kernels = {k: found for k, found in self.kernels.items() if found[0] != handle}
            module.unload()

    def function(self, module: int, name: str) -> int:
        handle = next(self.handles)
        self.kernels[handle] = (module, self.modules[module].function(name))
        return handle

    def set_max_dynamic_shared(self, kernel: int, nbytes: int) -> None:
        self.kernels[kernel][1].set_max_dynamic_shared(nbytes)

    def attributes(self, kernel: int) -> tuple[int, ...]:
        a = self.kernels[kernel][1].attributes
        return (
            a.num_regs,
            a.max_threads_per_block,
            a.local_size_bytes,
            a.shared_size_bytes,
            a.const_size_bytes,
        )

    def run(self, ops: list[tuple]) -> None:
        """Queue the steps on the stream, in order, and wait (also where a step failed: the
        parent reuses the shared memory the queued copies read)."""
        stream = self.context.stream()
        base = self.shared[2] if self.shared is not None else 0
        kept = []  # every launch's arguments, alive until the wait
        self.context.bind()
        try:
            for op in ops:
                kind = op[0]
                if kind == "in":
                    _, dst, at, nbytes = op
                    stream.copy_htod(dst, base + at, nbytes)
                elif kind == "out":
                    _, at, src, nbytes = op
                    stream.copy_dtoh(base + at, src, nbytes)
                elif kind == "launch":
                    _, handle, _name, grid, block, shared_mem, args = op
                    params = KernelParams([_argument_type(code, raw) for code, raw in args])
                    for slot, (_, raw) in zip(params.slots, args, strict=True):
                        ctypes.memmove(ctypes.addressof(slot), raw, len(raw))
                    kept.append(params)
                    self.kernels[handle][1].launch(grid, block, params, shared_mem, stream=stream.handle)
                else:  # memset
                    _, ptr, value, nbytes = op
                    stream.synchronize()
                    self.context.memset_d8(ptr, value, nbytes)
        except BaseException:
            try:
                stream.synchronize()
            except TensorWasmError:
                pass  # (the step's own error is the one to report)
            raise
        stream.synchronize()

    def serve(self) -> None:
        while True:
            try:
                op, args = _receive(self.socket)
            except (EOFError, OSError):
                return  # the parent closed its end, or ended
            try:
                reply = ("ok", getattr(self, op)(*args))
            except Exception as exc:  # (a bug here reaches the parent as an error, not a lost process)
                reply = ("error", _error_fields(exc))
            _send(self.socket, reply)


def _gpu_context(ordinal: int) -> Any:
    return driver.Context.get(ordinal)


def main(argv: list[str]) -> int:
    fd, ordinal = int(argv[0]), int(argv[1])
    make: Callable[[int], Any] = _gpu_context
    if len(argv) > 2:
        module, function = argv[2].split(":")
        make = getattr(importlib.import_module(module), function)
    logs.configure(logs.WARNING, format="tensorwasm (GPU process): %(message)s")
    # An interrupt at the terminal is the parent's to handle: it ends this process (by
    # closing the socket) when it ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    try:
        context = make(ordinal)
    except TensorWasmError as exc:
        _receive(sock)  # the parent's hello
        _send(sock, ("error", _error_fields(exc)))
        return 1
    _Child(sock, context).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
