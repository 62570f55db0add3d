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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tensorwasm.runtime.device_info import context_made


def make_context() -> None:
    """The process's CUDA context, made (a failure is left to the launch that needs it)."""
    try:
        from tensorwasm.runtime.driver import Context

        Context.get()
    except Exception:
        pass


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
