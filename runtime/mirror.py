"""Wasm linear memory mirrored on the GPU for offloaded loops.

One :class:`DeviceMirror` per offloaded module holds a device copy of linear memory and a
small scratch buffer for the launch's context, parameters, reduction slots and written
ranges; every allocation goes through the module's :class:`~runtime.limits.DeviceAllocator`,
so its device memory cap holds. Copies move only the ranges a launch reads and writes.

wasmtime's linear memory is page-locked with ``cuMemHostRegister`` where the driver allows
it, so copies run by DMA at full bus speed instead of through the driver's pageable staging
buffer (on an H100: ~18 GB/s in and ~4 GB/s out pageable, ~50 GB/s both ways pinned). Its
base stays put when memory grows, but the grown pages are not registered yet: a larger
size re-registers the whole range. Where registration fails the copies stay pageable.
"""

from __future__ import annotations

import ctypes
import logging

from cuda.bindings import driver as cu

from compiler.lower import abi
from runtime.driver import Context, DeviceBuffer
from runtime.limits import DeviceAllocator

log = logging.getLogger(__name__)
U64 = ctypes.c_uint64


class DeviceMirror:
    """Device memory for one offloaded module's launches."""

    def __init__(self, context: Context, limit: int | None = None) -> None:
        self.context = context
        self.allocator = DeviceAllocator(context, limit)
        self.memory: DeviceBuffer | None = None
        self.scratch: DeviceBuffer | None = None
        self.pinned: tuple[int, int] | None = None  # (host base, bytes) registered
        self.pin_failed = False

    def ensure(self, size: int, scratch_slots: int) -> None:
        """Device memory for ``size`` bytes of linear memory and ``scratch_slots`` u64s."""
        if self.memory is None or self.memory.nbytes < size:
            if self.memory is not None:
                self.allocator.free(self.memory)
                self.memory = None
            self.memory = self.allocator.alloc(max(size, abi.PAGE_SIZE), "mirrored linear memory")
        nbytes = 8 * scratch_slots
        if self.scratch is None or self.scratch.nbytes < nbytes:
            if self.scratch is not None:
                self.allocator.free(self.scratch)
                self.scratch = None
            self.scratch = self.allocator.alloc(max(nbytes, 4096), "launch arguments")

    def pin(self, base: int, size: int) -> None:
        """Page-lock ``[base, base + size)`` (wasmtime's linear memory) for fast copies."""
        if self.pin_failed or self.pinned == (base, size):
            return
        self.unpin()
        self.context.bind()
        (err,) = cu.cuMemHostRegister(base, size, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            self.pin_failed = True
            log.info("linear memory stays pageable: cuMemHostRegister failed (%s)", err.name)
            return
        self.pinned = (base, size)

    def unpin(self) -> None:
        if self.pinned is not None:
            self.context.bind()
            cu.cuMemHostUnregister(self.pinned[0])  # fails only if the mapping is gone
            self.pinned = None

    def copy_in(self, base: int, spans) -> int:
        """Host linear memory -> device, span by span; returns the bytes moved."""
        moved = 0
        for span in spans:
            self.context.memcpy_htod(self.memory.ptr + span.lo, base + span.lo, span.hi - span.lo)
            moved += span.hi - span.lo
        return moved

    def copy_out(self, base: int, spans) -> int:
        """Device -> host linear memory, span by span; returns the bytes moved."""
        moved = 0
        for span in spans:
            self.context.memcpy_dtoh(base + span.lo, self.memory.ptr + span.lo, span.hi - span.lo)
            moved += span.hi - span.lo
        return moved

    def upload_scratch(self, parts: list[ctypes.Array]) -> list[int]:
        """Pack ``parts`` (u64 arrays) into the scratch buffer with one copy; their device
        addresses, in order."""
        addresses, offset = [], 0
        packed = (U64 * sum(len(p) for p in parts))()
        for part in parts:
            ctypes.memmove(ctypes.addressof(packed) + 8 * offset, part, 8 * len(part))
            addresses.append(self.scratch.ptr + 8 * offset)
            offset += len(part)
        self.context.memcpy_htod(self.scratch.ptr, packed)
        return addresses

    def download(self, part: ctypes.Array, address: int) -> None:
        self.context.memcpy_dtoh(part, address, 8 * len(part))

    def release(self) -> None:
        """Free everything (a reset context has freed it already: then only forget it)."""
        self.unpin()
        for buffer in (self.memory, self.scratch):
            if buffer is not None:
                self.allocator.free(buffer)
        self.memory = self.scratch = None
