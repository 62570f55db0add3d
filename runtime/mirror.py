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

Inside a device-resident region (:mod:`compiler.analysis.regions`) the mirror remembers
what the device holds: ``valid`` spans, where the device copy equals linear memory or is
newer, and ``dirty`` spans, where it is newer. A launch there copies in only what is not
valid and leaves its writes on the device; :meth:`DeviceMirror.flush` copies the dirty
spans back and forgets both, at the region's end or before anything else may touch linear
memory. Outside a region both are empty.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

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
        self.valid: list[tuple[int, int]] = []  # sorted, disjoint byte ranges
        self.dirty: list[tuple[int, int]] = []

    @property
    def holds_results(self) -> bool:
        """Whether the device holds results linear memory does not have yet."""
        return bool(self.dirty)

    def ensure(self, size: int, scratch_slots: int) -> None:
        """Device memory for ``size`` bytes of linear memory and ``scratch_slots`` u64s
        (a larger memory only outside a region: linear memory cannot grow inside one)."""
        if self.memory is None or self.memory.nbytes < size:
            assert not self.dirty, "linear memory grew inside a device-resident region"
            self.valid = []
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

    def copy_in_missing(self, base: int, spans) -> int:
        """Inside a region: copy in the parts of ``spans`` the device does not hold; they
        are valid from then on. Returns the bytes moved."""
        missing = subtract([(s.lo, s.hi) for s in spans], self.valid)
        moved = self.copy_in(base, [Span(lo, hi) for lo, hi in missing])
        self.valid = union(self.valid, missing)
        return moved

    def missing_bytes(self, spans) -> int:
        """How many bytes of ``spans`` a launch inside a region would copy in."""
        return sum(hi - lo for lo, hi in subtract([(s.lo, s.hi) for s in spans], self.valid))

    def keep(self, spans) -> None:
        """Inside a region: a launch wrote ``spans``; the device now has them newer."""
        written = [(s.lo, s.hi) for s in spans]
        self.dirty = union(self.dirty, written)
        self.valid = union(self.valid, written)

    def flush(self, base: int) -> int:
        """Copy the dirty spans back to linear memory at ``base`` and forget what the
        device holds; returns the bytes moved."""
        dirty, self.dirty, self.valid = self.dirty, [], []
        return self.copy_out(base, [Span(lo, hi) for lo, hi in dirty])

    def forget(self) -> None:
        """Drop what the device holds (it is lost: a reset context)."""
        self.dirty, self.valid = [], []

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


@dataclass(frozen=True, slots=True)
class Span:
    """The byte range ``[lo, hi)`` of linear memory."""

    lo: int
    hi: int


def union(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The sorted, disjoint ranges covering ``a`` and ``b`` (touching ranges merge)."""
    merged: list[list[int]] = []
    for lo, hi in sorted(r for r in a + b if r[1] > r[0]):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``a`` outside the sorted, disjoint ranges ``b``."""
    out = []
    for lo, hi in union(a, []):
        for blo, bhi in b:
            if bhi <= lo or blo >= hi:
                continue
            if blo > lo:
                out.append((lo, blo))
            lo = max(lo, bhi)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out
