"""Wasm linear memory mirrored on the GPU for offloaded loops.

One :class:`DeviceMirror` per offloaded module holds a device copy of linear memory and a
small scratch buffer for the launch's context, parameters, reduction slots and written
ranges; every device allocation goes through the module's
:class:`~runtime.limits.DeviceAllocator`, so its device memory cap holds. Copies move only
the ranges a launch reads and writes. They are queued on one stream with the launch, the
scratch going in and coming back through one page-locked staging buffer, so a launch costs
a few asynchronous driver calls and one wait instead of a synchronous round trip per copy.

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
memory; before wasmtime runs one of the region's loops whose footprint the guards know,
:meth:`DeviceMirror.flush_part` brings back only the dirty bytes that loop touches, and
forgets only what it writes. Outside a region both are empty.

A launch inside a region whose kernel returns nothing (no reduction; a region's kernels
cannot trap) is queued without a wait (:meth:`DeviceMirror.launch_unwaited`): the host
goes back to wasmtime while the device runs it, and the next wait covers it. Every path by
which wasmtime may touch linear memory again waits first (:meth:`DeviceMirror.drain`: a
flush, a partial flush with nothing to bring back, the region's end, unpinning, new
buffers). Such a launch's scratch goes in from a slot of a page-locked ring, not the
staging buffer, so no queued copy reads bytes the host has changed since.
"""

from __future__ import annotations

import ctypes
import functools

from tensorwasm.compiler.lower import abi
from tensorwasm.runtime.driver import Context, CudaError, DeviceBuffer, PinnedBuffer
from tensorwasm.runtime.limits import DeviceAllocator
from tensorwasm.runtime.spans import Rows, Span, SpanSet, each_row, union
from tensorwasm.support import logs

log = logs.get_logger(__name__)
U64 = ctypes.c_uint64


class DeviceMirror:
    """Device memory for one offloaded module's launches, and the copies between it and
    linear memory, queued on one stream (the caller binds the context first and waits with
    :meth:`synchronize`)."""

    # Whether mirrors made from now on record launches as graphs (a profiler timing each
    # kernel launch with events turns it off: a replayed graph makes no launch call).
    RECORD = True

    def __init__(self, context: Context, limit: int | None = None, allocator=None) -> None:
        """``allocator``: where its buffers come from (default: the context's memory, through a
        :class:`~runtime.limits.DeviceAllocator` capped at ``limit``)."""
        self.context = context
        self.generation = context.generation  # a reset since leaves every buffer here stale
        self.allocator = allocator if allocator is not None else DeviceAllocator(context, limit)
        self.stream = context.stream()
        self.memory: DeviceBuffer | None = None
        self.scratch: DeviceBuffer | None = None
        # Page-locked host memory: a launch's scratch on its way in and out, then its small
        # written ranges on their way out (see :meth:`stage_out`).
        self.staging: PinnedBuffer | None = None
        self.staged: ctypes.Array | None = None  # the staging buffer as u64s
        # Device addresses of the two buffers (their ``ptr`` checks the handle on each use).
        self.memory_ptr = self.scratch_ptr = 0
        self.scratch_holds: bytes | None = None  # the image the scratch buffer is known to hold
        self.pinned: tuple[int, int] | None = None  # (host base, bytes) registered
        self.pieces: list[int] = []  # where each registration of it begins, from the base
        self.pin_failed = False
        self.valid = SpanSet()
        self.dirty = SpanSet()
        # Span tuples known to be inside ``valid`` (or ``dirty`` and ``valid``): both only grow
        # until they are dropped, so a launch repeated inside a region skips the span arithmetic.
        self._inside_valid: set[tuple[Span, ...]] = set()
        self._inside_dirty: set[tuple[Span, ...]] = set()
        self._graphs: dict[tuple, object] = {}  # recorded launches; see launch()
        self.graphs_off = not self.RECORD
        self.epoch = 0
        self.queued = False  # work queued since the last wait (see launch_unwaited)
        # Page-locked slots the scratch of launches queued without a wait goes in from, each
        # used once between two waits: (buffer, bytes per slot, the next slot).
        self.ring: PinnedBuffer | None = None
        self.ring_slot = self.ring_next = 0

    @property
    def stale(self) -> bool:
        """Whether the context was reset since this mirror was made (by its owner or by
        another module on the same context): its buffers and recorded launches are gone."""
        return self.context.generation != self.generation

    @property
    def holds_results(self) -> bool:
        """Whether the device holds results linear memory does not have yet."""
        return bool(self.dirty)

    def ensure(self, size: int, scratch_slots: int, staged_bytes: int = 0) -> None:
        """Device memory for ``size`` bytes of linear memory and ``scratch_slots`` u64s
        (a larger memory only outside a region: linear memory cannot grow inside one), and
        staging for the scratch and ``staged_bytes`` of results."""
        if self.memory is None or self.memory.nbytes < size:
            assert not self.dirty, "linear memory grew inside a device-resident region"
            self.drain()
            self.forget()
            if self.memory is not None:
                self.allocator.free(self.memory)
                self.memory = None
            self.drop_graphs()
            self.memory = self.allocator.alloc(max(size, abi.PAGE_SIZE), "mirrored linear memory")
            self.memory_ptr = self.memory.ptr
        nbytes = 8 * scratch_slots
        if self.scratch is None or self.scratch.nbytes < nbytes:
            self.drain()
            if self.scratch is not None:
                self.allocator.free(self.scratch)
                self.scratch = None
            self.drop_graphs()
            self.scratch = self.allocator.alloc(max(nbytes, 4096), "launch arguments")
            self.scratch_ptr = self.scratch.ptr
            self.scratch_holds = None
        nbytes += staged_bytes
        if self.staging is None or self.staging.nbytes < nbytes:
            if self.staging is not None:
                self.drop_graphs()
                self.staging.free()
                self.staging = self.staged = None
            self.staging = self.context.host_alloc(max(nbytes, 4096))
            self.staged = (U64 * (self.staging.nbytes // 8)).from_address(self.staging.ptr)

    # Registrations linear memory may be page-locked in, one more each time it grows, before
    # it is page-locked again as one.
    PIECES_KEPT = 8

    def pin(self, base: int, size: int) -> None:
        """Page-lock ``[base, base + size)`` (wasmtime's linear memory) for fast copies. Where
        the memory grew in place, only its new pages are registered (the rest stays as it
        is, and recorded launches stay valid); copies are cut where two registrations meet."""
        if self.pin_failed or self.pinned == (base, size):
            return
        if (self.pinned is not None and self.pinned[0] == base and self.pinned[1] < size
                and len(self.pieces) < self.PIECES_KEPT):  # fmt: skip
            grown = self.pinned[1]
            if self.context.host_register(base + grown, size - grown):
                self.pieces.append(grown)
                self.pinned = (base, size)
                return
        self.unpin()
        if not self.context.host_register(base, size):
            self.pin_failed = True
            return
        self.pinned, self.pieces = (base, size), [0]

    def unpin(self) -> None:
        if self.pinned is not None:
            self.drain()  # queued copies read the pages unpinned here
            self.drop_graphs()  # they copy from the pages unpinned here
            for at in self.pieces:
                self.context.host_unregister(self.pinned[0] + at)
            self.pinned, self.pieces = None, []

    def launch(self, key: tuple | None, base: int, copies: tuple[Span, ...], upload: int, kernel,
               grid, block, params, back: int, staged: tuple[Span, ...], at: int):  # fmt: skip
        """Queue one launch: ``copies`` from linear memory at ``base`` in, ``upload`` bytes of
        the staging buffer into the scratch buffer, the kernel, the first ``back`` bytes of
        the scratch buffer back into the staging buffer, and the ``staged`` spans into it
        from byte ``at`` on.

        With a ``key`` (the caller's promise that every argument but ``base`` follows from
        it), the steps are recorded once as a graph and replayed by one driver call, where
        every host side of a copy is page-locked; otherwise they are queued one by one.
        Returns the graph replayed, or None.
        """

        if key is not None and not self.graphs_off and (not copies or self.pinned is not None):
            key = (key, base, self.epoch)
            graph = self._graphs.get(key)
            if graph is None:
                queue = functools.partial(self._queue, base=base, copies=copies, upload=upload, kernel=kernel,
                                          grid=grid, block=block, params=params, back=back, staged=staged,
                                          at=at)  # fmt: skip
                graph = self._record(key, queue)
            if graph is not None:
                try:
                    graph.launch(self.stream.handle)
                    return graph
                except CudaError as exc:
                    if exc.sticky:
                        raise
                    self.forget_graph(graph)
                    log.info("a recorded launch failed (%s): queued step by step instead", exc)
        self._queue(self.stream, base, copies, upload, kernel, grid, block, params, back, staged, at)
        return None

    # Slots in the ring: launches queued without a wait that upload their scratch, between
    # two waits (the next one waits first).
    RING_SLOTS = 32

    def launch_unwaited(self, base: int, copies: tuple[Span, ...], image: bytes, kernel, grid, block,
                        params) -> int:  # fmt: skip
        """Inside a region: queue ``copies`` from linear memory at ``base`` in, ``image`` into
        the scratch buffer where it does not hold it already, and the kernel, which must
        leave the scratch as it found it (no trap, no reduction): nothing comes back and
        nothing is waited for. Returns the bytes of scratch uploaded."""
        stream = self.stream
        self.copy_in(base, copies, stream)
        upload = 0
        if image != self.scratch_holds:
            upload = len(image)
            stream.copy_htod(self.scratch_ptr, self._ring_slot(image), upload)
        stream.launch(kernel, grid, block, params)
        self.scratch_holds = image
        self.queued = True
        return upload

    def _ring_slot(self, image: bytes) -> int:
        """A ring slot no queued copy reads, holding ``image``: its address."""
        if self.ring is None or self.ring_slot < len(image):
            self.drain()
            if self.ring is not None:
                self.ring.free()
                self.ring = None
            self.ring_slot = -(-len(image) // 256) * 256
            self.ring = self.context.host_alloc(self.ring_slot * self.RING_SLOTS)
        elif self.ring_next == self.RING_SLOTS:
            self.drain()
        at = self.ring.ptr + self.ring_slot * self.ring_next
        ctypes.memmove(at, image, len(image))
        self.ring_next += 1
        return at

    def drain(self) -> None:
        """Wait for launches queued without a wait (and whatever was queued before them)."""
        if self.queued:
            self.context.bind()
            self.synchronize()

    def _queue(self, stream, base, copies, upload, kernel, grid, block, params, back, staged, at) -> None:
        memory, scratch, staging = self.memory_ptr, self.scratch_ptr, self.staging.ptr
        self.copy_in(base, copies, stream)
        if upload:
            stream.copy_htod(scratch, staging, upload)
        stream.launch(kernel, grid, block, params)
        stream.copy_dtoh(staging, scratch, back)
        for span in staged:
            stream.copy_dtoh(staging + at, memory + span.lo, span.hi - span.lo)
            at += span.hi - span.lo

    # Graphs kept per mirror (each holds a little driver memory): past this many, all go.
    GRAPHS_KEPT = 64

    def _record(self, key: tuple, queue):
        """Record ``queue`` as a graph under ``key``; None (and no more graphs) where the
        driver cannot record it."""
        if len(self._graphs) >= self.GRAPHS_KEPT:
            self.drop_graphs()
        try:
            graph = self._graphs[key] = self.context.record(queue)
        except CudaError as exc:
            if exc.sticky:
                raise
            self.graphs_off = True
            log.info("launches are queued step by step: recording one as a graph failed (%s)", exc)
            return None
        return graph

    def forget_graph(self, graph) -> None:
        """Drop one recorded launch (it failed to launch)."""
        for key, kept in list(self._graphs.items()):
            if kept is graph:
                del self._graphs[key]
        graph.destroy()

    def drop_graphs(self) -> None:
        for graph in self._graphs.values():
            graph.destroy()
        self._graphs.clear()
        self.epoch += 1  # buffers or page-locking changed: recorded launches are stale

    def copy_in(self, base: int, spans, stream=None) -> int:
        """Queue host linear memory -> device, span by span (or :class:`~runtime.spans.Rows`
        by rows), on ``stream`` (default: the mirror's); returns the bytes moved."""
        stream = stream or self.stream
        moved = 0
        for span in spans:
            if span.__class__ is Rows:
                _copy_rows(stream, True, self.memory_ptr, base, span)
                moved += span.nbytes
                continue
            stream.copy_htod(self.memory_ptr + span.lo, base + span.lo, span.hi - span.lo)
            moved += span.hi - span.lo
        return moved

    def missing(self, spans: tuple[Span, ...]) -> tuple[Span, ...]:
        """Inside a region: the parts of ``spans`` the device does not hold (all of them,
        or none, after a launch repeated inside the region)."""
        if spans in self._inside_valid:
            return ()
        lacking = self.valid.outside((s.lo, s.hi) for s in spans)
        if lacking == [(s.lo, s.hi) for s in spans]:
            return spans
        return tuple(Span(lo, hi) for lo, hi in lacking)

    def now_valid(self, spans: tuple[Span, ...], copied: tuple[Span, ...]) -> None:
        """Inside a region: ``copied``, the parts of ``spans`` the device lacked, were queued
        in; the device holds all of ``spans`` from then on."""
        if copied:
            self.valid.add((s.lo, s.hi) for s in copied)
        self._inside_valid.add(spans)

    def missing_bytes(self, spans) -> int:
        """How many bytes of ``spans`` a launch inside a region would copy in."""
        return sum(s.hi - s.lo for s in self.missing(tuple(spans)))

    def keep(self, spans) -> None:
        """Inside a region: a launch wrote ``spans``; the device now has them newer."""
        spans = tuple(spans)
        if spans in self._inside_dirty:
            return
        written = [(s.lo, s.hi) for s in spans]
        self.dirty.add(written)
        self.valid.add(written)
        self._inside_dirty.add(spans)

    def flush(self, base: int) -> int:
        """Copy the dirty spans back to linear memory at ``base`` and forget what the
        device holds; returns the bytes moved."""
        dirty = self.dirty.ranges()
        self.forget()
        self.context.bind()
        moved = self.copy_out(base, [Span(lo, hi) for lo, hi in dirty])
        self.synchronize()
        return moved

    def flush_part(self, base: int, touched, written) -> int:
        """Before wasmtime runs a loop of the region that reads and writes only ``touched``
        (spans) and writes only within ``written``: copy back the dirty parts of ``touched``,
        and forget that the device holds ``written`` (wasmtime makes it newer). The rest stays
        resident, dirty where it was; returns the bytes moved."""
        touched = union([(s.lo, s.hi) for s in touched], [])
        written = [(s.lo, s.hi) for s in written]
        back = self.dirty.inside(touched)  # the dirty bytes the loop may read or overwrite
        self.dirty.remove(touched)
        self.valid.remove(written)
        # Span tuples apart from what changed are still inside (a region's other loops'
        # launches then skip the span arithmetic at their next arrival).
        self._inside_valid = {t for t in self._inside_valid if not _meets(t, written)}
        self._inside_dirty = {t for t in self._inside_dirty if not _meets(t, touched) and not _meets(t, written)}
        if not back:
            self.drain()  # queued copies may still read what wasmtime is about to write
            return 0
        self.context.bind()
        moved = self.copy_out(base, [Span(lo, hi) for lo, hi in back])
        self.synchronize()
        return moved

    def forget(self) -> None:
        """Drop what the device holds (it is lost: a reset context), or stop tracking it."""
        self.dirty, self.valid = SpanSet(), SpanSet()
        self._inside_valid.clear()
        self._inside_dirty.clear()

    def copy_out(self, base: int, spans) -> int:
        """Queue device -> host linear memory, span by span (or rows); returns the bytes moved."""
        moved = 0
        for span in spans:
            if span.__class__ is Rows:
                _copy_rows(self.stream, False, self.memory_ptr, base, span)
                moved += span.nbytes
                continue
            self.stream.copy_dtoh(base + span.lo, self.memory_ptr + span.lo, span.hi - span.lo)
            moved += span.hi - span.lo
        return moved

    def stage_scratch(self, image: bytes) -> int:
        """Put ``image`` (a launch's context, parameters, reduction slots and written ranges)
        in the staging buffer for :meth:`launch` to upload; the bytes to upload, 0 where the
        scratch buffer holds it already."""
        if image == self.scratch_holds:
            return 0
        ctypes.memmove(self.staging.ptr, image, len(image))
        self.scratch_holds = None  # until a launch is seen to leave it as it is
        return len(image)

    def check_scratch(self, image: bytes, nbytes: int) -> ctypes.Array:
        """After the wait for a :meth:`launch`: note whether the launch left the scratch
        buffer holding ``image`` (it wrote no trap code and no reduction result in its first
        ``nbytes``; the written ranges behind them it only reads). Returns the staging buffer
        as u64s, the scratch's first ``nbytes`` at its start."""
        unchanged = ctypes.string_at(self.staging.ptr, nbytes) == image[:nbytes]
        self.scratch_holds = image if unchanged else None
        return self.staged

    def unstage(self, base: int, spans, at: int) -> int:
        """After a :meth:`launch` that staged ``spans`` from byte ``at`` on, and the wait:
        the staged ranges into linear memory at ``base``; returns the bytes moved."""
        moved = 0
        for span in spans:
            ctypes.memmove(base + span.lo, self.staging.ptr + at + moved, span.hi - span.lo)
            moved += span.hi - span.lo
        return moved

    def synchronize(self) -> None:
        self.stream.synchronize()
        self.queued = False
        self.ring_next = 0

    def release(self) -> None:
        """Free everything (a reset context has freed it already: then only forget it; a
        context that fails even to free has nothing left to give back)."""
        try:
            self.drain()
            self.unpin()
            self.drop_graphs()
            for buffer in (self.memory, self.scratch):
                if buffer is not None:
                    self.allocator.free(buffer)
            for pinned in (self.staging, self.ring):
                if pinned is not None:
                    pinned.free()
        except CudaError as exc:
            log.info("releasing device memory failed (%s): the context took it with it", exc)
        self.abandon()

    def abandon(self) -> None:
        """Forget every buffer, registration and recorded launch without a driver call (the
        context is gone, or refuses even to free)."""
        self.allocator.free_all()
        self._graphs.clear()
        self.epoch += 1
        self.pinned, self.pieces = None, []
        self.memory = self.scratch = self.staging = self.staged = self.ring = None
        self.memory_ptr = self.scratch_ptr = 0
        self.scratch_holds = None
        self.queued = False
        self.ring_next = 0
        self.forget()


def _meets(spans: tuple[Span, ...], ranges: list[tuple[int, int]]) -> bool:
    """Whether any of ``spans`` shares a byte with any of ``ranges``."""
    return any(s.lo < hi and lo < s.hi for s in spans for lo, hi in ranges)


def _copy_rows(stream, to_device: bool, memory: int, base: int, rows: Rows) -> None:
    """Queue ``rows`` of linear memory at ``base`` to the device copy at ``memory`` (or
    back): as one 2-D copy where the stream makes them (the CUDA device's), else row by row
    (a simulated device, a GPU process)."""
    device, host = memory + rows.lo, base + rows.lo
    dst, src = (device, host) if to_device else (host, device)
    copy = getattr(stream, "copy_htod_rows" if to_device else "copy_dtoh_rows", None)
    if copy is None:
        each_row(
            stream.copy_htod if to_device else stream.copy_dtoh, dst, src, rows.pitch, rows.width, rows.count
        )
    else:
        copy(dst, src, rows.pitch, rows.width, rows.count)
