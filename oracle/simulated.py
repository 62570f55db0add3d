"""A device simulated in host memory: the GPU path's data movement, checked on the CPU.

:class:`SimulatedDevice` is a :class:`~runtime.device.Device` that an
:class:`~runtime.offload.OffloadModule` takes at construction: the module compiles its
kernels for the host backend and takes the GPU path with them: its launches copy linear
memory into a separate "device" buffer, run the host-compiled kernels there, and copy the
results back, exactly as on a GPU, so what the mirror moves and when (device-resident regions included) is checked
in CI and by ``tensorwasm fuzz --backend offload-sim``. Only the kernels' code is the
host's; no CUDA call is made.
"""

from __future__ import annotations

import ctypes
import itertools
import weakref
from typing import Any

from tensorwasm.compiler.target import HostTarget
from tensorwasm.runtime.cuda_device import CudaDevice
from tensorwasm.runtime.driver import CudaError, KernelParams, PageLocks
from tensorwasm.runtime.host_device import HostDevice
from tensorwasm.runtime.mirror import DeviceMirror
from tensorwasm.runtime.remote import HostBuffer

_STATUS_1 = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_uint64)
_STATUS_2 = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64)


class HostAllocator:
    def __init__(self) -> None:
        self.live: dict[int, HostBuffer] = {}

    def alloc(self, nbytes: int, what: str) -> HostBuffer:
        buffer = HostBuffer(nbytes)
        self.live[buffer.ptr] = buffer
        return buffer

    def free(self, buffer: HostBuffer) -> None:
        self.live.pop(buffer.ptr, None)

    def free_all(self) -> None:
        self.live.clear()


class HostContext:
    """The calls the offload path makes on a CUDA context, on host memory; ``copies``
    records each copy's direction and size.

    ``lazy``: what its streams queue (copies, launches, recorded launches) is done only at
    the next wait, as late as a GPU may do it, so that work the offload path queues and
    does not wait for is checked: linear memory a copy reads changed before the wait, or a
    result read before it, gives other bytes than wasmtime's."""

    def __init__(self, lazy: bool = False) -> None:
        self.lazy = lazy
        self.pending: list = []  # steps queued, done at the next wait (lazy)
        self.copies: list[tuple[str, int]] = []
        self.locks = PageLocks()
        self.generation = 0  # as runtime.driver.Context's (never reset here)
        self.watchers: weakref.WeakSet = weakref.WeakSet()
        self.refused = None
        self.graphs: dict[int, HostGraph] = {}  # by handle, for native replays
        self._native: tuple | None = None  # see native_calls

    def bind(self) -> None:
        pass

    def synchronize(self) -> None:
        """Do what the streams queued (lazy), in order."""
        while self.pending:
            steps, self.pending = self.pending, []
            for step in steps:
                step()

    def queue(self, steps) -> None:
        """Steps a stream queued: done now, or at the next wait where the context is lazy."""
        if self.lazy:
            self.pending.extend(steps)
        else:
            for step in steps:
                step()

    def memcpy_htod(self, dst: int, src, nbytes: int | None = None) -> None:
        nbytes = ctypes.sizeof(src) if nbytes is None else nbytes
        self._one_registration(src, nbytes)
        ctypes.memmove(dst, src, nbytes)
        self.copies.append(("in", nbytes))

    def memcpy_dtoh(self, dst, src: int, nbytes: int | None = None) -> None:
        nbytes = ctypes.sizeof(dst) if nbytes is None else nbytes
        self._one_registration(dst, nbytes)
        ctypes.memmove(dst, src, nbytes)
        self.copies.append(("out", nbytes))

    def _one_registration(self, host, nbytes: int) -> None:
        """The driver's rule: no copy runs across two page-locked registrations."""
        if isinstance(host, int) and len(self.locks.pieces(host, nbytes)) > 1:
            raise AssertionError(f"a copy of [{host:#x}, +{nbytes}) runs across page-locked registrations")

    def host_alloc(self, nbytes: int) -> HostBuffer:
        return HostBuffer(nbytes)

    def host_register(self, base: int, nbytes: int) -> bool:
        self.locks.add(base, nbytes)  # host memory is as good as page-locked here
        return True

    def host_unregister(self, base: int) -> None:
        self.locks.remove(base)

    def stream(self) -> HostStream:
        return HostStream(self)

    def record(self, queue) -> HostGraph:
        """What ``queue(stream)`` queues, kept to be done on each :meth:`HostGraph.launch`."""
        stream = HostStream(self, steps=[])
        queue(stream)
        graph = HostGraph(stream.steps, self)
        self.graphs[graph.handle] = graph
        return graph

    def native_calls(self) -> tuple[int, int, int, int]:
        """What native replays (:mod:`runtime.replay`) call for the driver's
        ``cuCtxSetCurrent``, ``cuGraphLaunch`` and ``cuStreamSynchronize``: callbacks into
        this context (a failed launch answers its error code), and a context handle."""
        if self._native is None:

            def launch(handle: int, stream: int) -> int:
                try:
                    self.graphs[handle].launch(stream)
                except CudaError as exc:
                    return exc.code
                return 0

            def wait(stream: int) -> int:
                self.synchronize()
                return 0

            self._native = (_STATUS_1(lambda context: 0), _STATUS_2(launch), _STATUS_1(wait))
        return (*(ctypes.cast(c, ctypes.c_void_p).value for c in self._native), 1)


class HostStream:
    """A stream whose copies and launches are done at once (which keeps a stream's order),
    or at its context's next wait where that context is lazy, or, recording for a graph,
    kept in ``steps``."""

    handle = 0

    def __init__(self, context: HostContext, steps: list | None = None) -> None:
        self.context = context
        self.steps = steps

    def _do(self, step) -> None:
        if self.steps is None:
            self.context.queue((step,))
        else:
            self.steps.append(step)

    def copy_htod(self, dst: int, src: int, nbytes: int) -> None:
        for at, n in self.context.locks.pieces(src, nbytes):  # as runtime.driver.Stream cuts them
            self._do(lambda at=at, n=n: self.context.memcpy_htod(dst + at, src + at, n))

    def copy_dtoh(self, dst: int, src: int, nbytes: int) -> None:
        for at, n in self.context.locks.pieces(dst, nbytes):
            self._do(lambda at=at, n=n: self.context.memcpy_dtoh(dst + at, src + at, n))

    def launch(self, kernel: HostKernel, grid, block, args: KernelParams) -> None:
        values = args.values  # a graph keeps the arguments it was recorded with
        self._do(lambda: kernel.run(values))

    def synchronize(self) -> None:
        self.context.synchronize()


class HostGraph:
    _handles = itertools.count(1)

    def __init__(self, steps: list, context: HostContext) -> None:
        self.steps = steps
        self.context = context
        self.launches = 0
        self.handle = next(self._handles)

    def launch(self, stream: int = 0) -> None:
        self.launches += 1
        self.context.queue(self.steps)

    def destroy(self) -> None:
        pass


class HostKernel:
    """A launch of a loop kernel, run by its host-compiled entry over the whole grid:
    the device's ``(ctx, params, trip, [trip2,] out)`` becomes the host's
    ``(ctx, params, 0, trip, [trip2,] out)``."""

    def __init__(self, entry) -> None:
        self.entry = entry
        self.launches = 0

    def launch(self, grid, block, args, stream=None) -> None:
        self.run(args.values if isinstance(args, KernelParams) else [value for _, value in args])

    def run(self, values: list) -> None:
        ctx, params, trip, *nest, out = values
        if isinstance(params, bytes):  # live-ins by value: the host's entry reads them at an address
            held = (ctypes.c_uint64 * (len(params) // 8)).from_buffer_copy(params)
            params = ctypes.addressof(held)
        self.entry(ctx, params, 0, trip, *nest, out)
        self.launches += 1


class SimulatedDevice(CudaDevice):
    """The GPU path on host memory: a :class:`HostContext` (or ``context``: a stand-in for a
    CUDA context), device memory from host buffers, and the host backend's kernels run over
    the whole grid (``kernel``: what wraps each entry; :class:`HostKernel` by default).
    Its own context is lazy: queued work is done at the wait, as late as a GPU may do it.
    Linear memory counts as page-locked, so launches take the GPU's recorded path. A reset
    the context refuses moves the work to a GPU process (:class:`runtime.remote.WorkerContext`),
    as on the CUDA device."""

    code = "cpu"
    label = "gpu (simulated)"
    pin = True

    def __init__(self, context: Any = None, kernel: type = HostKernel) -> None:
        super().__init__()
        self._context = context if context is not None else HostContext(lazy=True)
        self.kernel = kernel

    def target(self) -> HostTarget:
        return HostTarget()

    def resident_blocks(self) -> int:
        """Blocks resident at once, as a small GPU would have them (a kernel runs its whole
        grid in one host call, whatever the grid)."""
        return 2

    def wave_blocks(self, kernel: Any, threads: int) -> int | None:
        """No occupancy to fill: a kernel runs its whole grid in one host call."""
        return None

    def load_kernels(self, prepared: Any) -> dict[str, Any]:
        host = HostDevice().load_kernels(prepared)
        return {name: self.kernel(entry) for name, entry in host.items()}

    def allocate(self, limit: int | None) -> DeviceMirror:
        """Device memory from host buffers on a :class:`HostContext`; from the context's own
        allocations on any other (a GPU process's stand-in)."""
        context = self.context
        allocator = HostAllocator() if isinstance(context, HostContext) else None
        return DeviceMirror(context, limit, allocator=allocator)


class SimulatedOffloadInstance:
    """The oracle's ``offload-sim`` backend: an :class:`~oracle.offload.OffloadInstance`
    whose launches take the GPU path on the simulated device."""

    def __new__(cls, wasm: bytes, filters: bool = False, declines: bool = False):
        from tensorwasm.oracle.offload import OffloadInstance

        return OffloadInstance(wasm, device=SimulatedDevice(), filters=filters, declines=declines)
