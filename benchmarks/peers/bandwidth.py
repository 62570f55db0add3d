"""Device copy bandwidth, measured with TensorWasm's driver layer in the same run as the
kernels: the physical limits that the copies of offloaded loops and the bandwidth-bound
kernels are judged against.

Host-to-device and device-to-host copies run from page-locked memory (``cuMemHostAlloc``)
and from ordinary pageable memory; device-to-device is ``cuMemcpyDtoD`` within one device,
counted as the bytes read plus the bytes written, like a kernel's traffic. Each figure is
the median of :data:`REPEATS` copies timed with CUDA events, in GB/s (1e9 bytes per second).
``host_register`` is the rate at which ``cuMemHostRegister`` page-locks ordinary memory (the
one-time cost of the fast copies from linear memory), timed on the host clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from benchmarks.peers.harness import describe

REPEATS = 5
#: What is measured, in the order of the document.
KINDS = ("htod_pinned", "dtoh_pinned", "htod_pageable", "dtoh_pageable", "dtod", "host_register")
#: Bytes per copy: large enough that per-call costs vanish.
COPY_BYTES = {"small": 32 << 20, "large": 512 << 20}


def measure(size_set: str) -> dict:
    """The JSON document of the copy measurements (status "ok", "skipped" or "error")."""
    document: dict = {"peer": "copy", "status": "ok"}
    try:
        from cuda.bindings import driver as cu

        from tensorwasm.runtime import driver
    except ImportError as exc:
        return {**document, "status": "skipped", "reason": f"cuda-python is not usable ({exc})"}
    try:
        context = driver.Context.get()
    except driver.NoGPU as exc:
        return {**document, "status": "skipped", "reason": str(exc)}
    except Exception as exc:
        return {**document, "status": "error", "reason": describe(exc)}
    nbytes = COPY_BYTES[size_set]
    document["bytes"] = nbytes
    buffers = []
    pinned = None
    try:
        src = context.mem_alloc(nbytes)
        dst = context.mem_alloc(nbytes)
        buffers = [src, dst]
        pageable = np.ones(nbytes, np.uint8)  # touched: every page is resident
        context.bind()
        pinned = driver.check("cuMemHostAlloc", cu.cuMemHostAlloc(nbytes, 0))
        start, stop = (driver.check("cuEventCreate", cu.cuEventCreate(0)) for _ in range(2))

        def timed(copy: Callable[[], None], counted: int) -> float:
            rates = []
            copy()  # warm-up
            for _ in range(REPEATS):
                context.synchronize()
                driver.check("cuEventRecord", cu.cuEventRecord(start, 0))
                copy()
                driver.check("cuEventRecord", cu.cuEventRecord(stop, 0))
                driver.check("cuEventSynchronize", cu.cuEventSynchronize(stop))
                ms = driver.check("cuEventElapsedTime", cu.cuEventElapsedTime(start, stop))
                rates.append(counted / (ms / 1e3) / 1e9)
            return statistics.median(rates)

        def register_rate() -> float:
            rates = []
            for _ in range(REPEATS):
                began = time.perf_counter()
                driver.check("cuMemHostRegister", cu.cuMemHostRegister(pageable.ctypes.data, nbytes, 0))
                took = time.perf_counter() - began
                driver.check("cuMemHostUnregister", cu.cuMemHostUnregister(pageable.ctypes.data))
                rates.append(nbytes / took / 1e9)
            return statistics.median(rates)

        def dtod() -> None:
            context.bind()
            driver.check("cuMemcpyDtoD", cu.cuMemcpyDtoD(dst.ptr, src.ptr, nbytes))

        document["gbps"] = {
            "htod_pinned": timed(lambda: context.memcpy_htod(dst.ptr, int(pinned), nbytes), nbytes),
            "dtoh_pinned": timed(lambda: context.memcpy_dtoh(int(pinned), src.ptr, nbytes), nbytes),
            "htod_pageable": timed(lambda: context.memcpy_htod(dst.ptr, pageable), nbytes),
            "dtoh_pageable": timed(lambda: context.memcpy_dtoh(pageable, src.ptr), nbytes),
            "dtod": timed(dtod, 2 * nbytes),
            "host_register": register_rate(),
        }
    except Exception as exc:
        return {**document, "status": "error", "reason": describe(exc)}
    finally:
        for buffer in buffers:
            buffer.free()
        if pinned is not None:
            cu.cuMemFreeHost(pinned)
    return document
