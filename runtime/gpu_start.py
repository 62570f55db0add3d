"""Starting the GPU off the critical path: the CUDA context made on a thread of its own.

Making the process's CUDA context (the driver's start and the device's primary context) is
most of what a GPU's first launch pays (:data:`runtime.profit.STARTUP_SECONDS`). A run
begins it on a thread of its own as soon as it may launch: the command line at its start,
where the module launched the last time it ran here (:mod:`runtime.cli`), and the CUDA
device at the first arrival whose launch would pay
(:meth:`runtime.cuda_device.CudaDevice.startup_seconds`). The start-up rule
(:meth:`runtime.planning.ArrivalPlanner._started`) charges only what is left of it
(:meth:`ContextStart.seconds_left`), and a launch waits (on the driver's lock) for the rest
only where it alone gains more than that wait (:meth:`ContextStart.seconds_to_wait`):
otherwise wasmtime runs the loop while the thread works, and a later arrival finds the
context made. The thread touches nothing of a module's: a failure
is met again by the launch that needs the context, which declines with its reason.

The driver's own start (``cuInit`` and the device's primary context: ~0.19 s of the ~0.3 s
on an H100) does not wait for the CUDA bindings to be imported: a second thread asks the
driver's C library for it directly (:class:`DriverOpen`; ctypes lets go of Python's
interpreter lock for each call) while the first imports the bindings, which hold that lock
and share it with a main thread busy starting the program. The bindings then find the
driver started and the primary context made, and retain it themselves.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from tensorwasm.runtime.device_info import context_made

# The driver's C library, where the CUDA bindings find it (by its name, on the system's
# search path), so that both reach the one copy loaded in the process.
DRIVER_LIBRARY = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}.get(sys.platform)


class DriverOpen:
    """``cuInit`` and device 0's primary context, asked of the driver's C library (``load``ed
    by its name: ``ctypes.CDLL`` by default) on a thread of its own, begun here, which holds
    a reference to the context until :meth:`release`. Any failure is left as it is: the
    bindings meet it again and say why."""

    def __init__(
        self, library: str | None = DRIVER_LIBRARY, load: Callable[[str], Any] | None = None
    ) -> None:
        self._driver: Any = None  # the library, once it holds a reference to the primary context
        self._device = 0
        self.thread = threading.Thread(
            target=self._open, args=(library, load), name="tensorwasm-cuda-driver", daemon=True
        )
        self.thread.start()

    def _open(self, library: str | None, load: Callable[[str], Any] | None) -> None:
        import ctypes

        if library is None:
            return
        try:
            driver = (load or ctypes.CDLL)(library)
        except OSError:
            return
        device, context = ctypes.c_int(), ctypes.c_void_p()
        if (
            driver.cuInit(0) != 0
            or driver.cuDeviceGet(ctypes.byref(device), 0) != 0
            or driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0
        ):
            return
        self._device = device.value
        self._driver = driver

    def release(self) -> None:
        """Wait for the thread, and give back its reference to the primary context (the
        bindings', taken meanwhile, keeps the context alive)."""
        self.thread.join()
        driver, self._driver = self._driver, None
        if driver is not None:
            release = (
                getattr(driver, "cuDevicePrimaryCtxRelease_v2", None) or driver.cuDevicePrimaryCtxRelease
            )
            release(self._device)


def make_context(launch_expected: bool = False) -> None:
    """The process's CUDA context, made (a failure is left to the launch that needs it): the
    driver started through its C library, then the bindings' context. Where a launch is
    expected (the command line's start of a module that launched last time), the bindings
    are loaded and ptxas is asked its release while the driver starts, so that the launch,
    which may be waiting already, finds all three done. Otherwise (a start begun mid-run,
    by arrivals whose launch may never come) that work waits for the driver's start: it
    holds Python's lock, which the program's arrivals need meanwhile."""
    opening = DriverOpen()
    try:
        from tensorwasm.runtime.driver import Context, load_bindings

        if launch_expected:
            load_bindings()  # (~40 ms of import and symbol lookup)
            from tensorwasm.runtime import assembler

            assembler.ptxas()  # (its release names cached cubins: ~5 ms of `ptxas --version`)
        opening.thread.join()
        Context.get()
    except Exception:
        pass
    finally:
        opening.release()


class ContextStart:
    """One process's start of its CUDA context on a thread (``made``: whether the context is
    made, by whichever thread)."""

    def __init__(self, made: Callable[[], bool] = context_made) -> None:
        self._made = made
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.began: float | None = None  # perf_counter() when the last thread started

    def begin(self, make: Callable[[], None] | None = None) -> threading.Thread | None:
        """Begin making the context on a thread (running ``make``, by default
        :func:`make_context`), unless a thread is making it or it is made; the thread making
        it, if any. A start that ended without a context (no GPU) begins again when asked."""
        with self._lock:
            if self.thread is not None and self.thread.is_alive():
                return self.thread
            if self._made():
                return None
            self.thread = threading.Thread(
                target=make or make_context, name="tensorwasm-cuda-start", daemon=True
            )
            self.began = time.perf_counter()
            self.thread.start()
            return self.thread

    def running(self) -> bool:
        """Whether a thread is still making the context."""
        return self.thread is not None and self.thread.is_alive()

    def seconds_left(self, total: float) -> float:
        """What is left of a context's start that takes ``total`` seconds: nothing once it is
        made, all of it where no thread is making it, else what the thread has yet to spend
        (a tenth of it at least while it runs: a start past its estimate is not yet done)."""
        if self._made():
            return 0.0
        if not self.running():
            return total
        return max(total / 10, total - (time.perf_counter() - self.began))

    def seconds_to_wait(self, total: float) -> float:
        """How long a launch needing the context now would wait for the thread making it
        (nothing where none is making it: such a launch makes it itself, and its start-up
        rule charged that)."""
        return self.seconds_left(total) if self.running() and not self._made() else 0.0


# The process's one start: its CUDA context is one per process (runtime.driver).
STARTER = ContextStart()
