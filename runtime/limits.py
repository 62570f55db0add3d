"""Per-instance device memory caps, enforced on the host before the driver is asked.

A driver-level limit cannot be trusted to refuse an allocation (it is not what
``cuCtxSetLimit`` offers), so every device allocation an instance makes goes through
its :class:`DeviceAllocator`: the request is checked against the instance's cap and
against the memory the device has free, and refused with
:class:`DeviceMemoryLimitError` or :class:`DeviceOutOfMemory` before ``cuMemAlloc``
runs. A refused allocation leaves the context untouched, so the caller can fall back
to the CPU.

The cap comes from the caller, or from ``TENSORWASM_DEVICE_MEMORY_LIMIT`` (bytes, with
an optional ``K``/``M``/``G`` suffix, powers of 1024); without either, the only limit is
the device's free memory.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tensorwasm.support import config
from tensorwasm.support.errors import TensorWasmError

if TYPE_CHECKING:
    from tensorwasm.runtime.driver import Context, DeviceBuffer


# Left free on the device for the driver's own use (module images, stacks, printf).
_DRIVER_RESERVE = 64 << 20


class DeviceMemoryLimitError(TensorWasmError):
    """An allocation would take the instance past its device memory cap."""


class DeviceOutOfMemory(TensorWasmError):
    """The device has too little free memory for an allocation."""


def default_limit() -> int | None:
    """The cap named by ``TENSORWASM_DEVICE_MEMORY_LIMIT`` (:func:`config.device_memory_limit`),
    or None."""
    return config.device_memory_limit()


class DeviceAllocator:
    """Allocates device memory for one instance, never past ``limit`` bytes in total."""

    def __init__(self, context: Context, limit: int | None = None) -> None:
        self.context = context
        self.limit = default_limit() if limit is None else limit
        self.used = 0
        self._buffers: dict[int, DeviceBuffer] = {}  # id -> buffer, kept alive
        self._lock = threading.Lock()

    def alloc(self, nbytes: int, what: str = "device memory") -> DeviceBuffer:
        """Allocate ``nbytes``; refused before the driver is called when over a limit."""
        if nbytes <= 0:
            raise TensorWasmError(f"cannot allocate {nbytes} bytes of {what}")
        with self._lock:
            if self.limit is not None and self.used + nbytes > self.limit:
                raise DeviceMemoryLimitError(
                    f"{what}: {nbytes} bytes would exceed this instance's device memory cap "
                    f"({self.used} of {self.limit} bytes in use; set {config.DEVICE_MEMORY_LIMIT} to change it)"
                )
            free, _ = self.context.mem_get_info()
            if nbytes > free - _DRIVER_RESERVE:
                raise DeviceOutOfMemory(f"{what}: {nbytes} bytes requested, the device has {free} bytes free")
            buffer = self.context.mem_alloc(nbytes)
            self.used += nbytes
            self._buffers[id(buffer)] = buffer
            return buffer

    def free(self, buffer: DeviceBuffer) -> None:
        """Free ``buffer`` (made by :meth:`alloc`) and return its bytes to the cap."""
        with self._lock:
            if self._buffers.pop(id(buffer), None) is not buffer:
                raise TensorWasmError(f"{buffer._what} was not allocated by this instance")
            self.used -= buffer.nbytes
        buffer.free()

    def free_all(self) -> None:
        """Forget every allocation (after a context reset freed them all)."""
        with self._lock:
            self._buffers.clear()
            self.used = 0
