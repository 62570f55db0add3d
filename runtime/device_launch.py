"""Running planned launches on a device with memory of its own, and recovering from its faults.

:class:`DeviceLaunches` is the execution side of an offloaded module on a
:class:`~runtime.device.MemoryDevice` (the CUDA device, a GPU process, the simulated
device): it queues a launch's copies in, the kernel and the copies back on one stream and
waits once (a launch repeated with the same copies replays them all from one recorded
graph), keeps a device-resident region's results on the device until the region ends,
and after a failed driver call waits for what was queued, or, after a sticky fault, resets
the device and renews its memory and kernels. Replays of whole arrivals are
:mod:`runtime.device_replay`'s.
"""

from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING, Any

from tensorwasm.compiler.lower import abi
from tensorwasm.runtime import hostfunc
from tensorwasm.runtime.device_replay import DeviceReplays, ReplayRecord
from tensorwasm.runtime.planning import RegionLost, trap_reason, words
from tensorwasm.runtime.profit import region_decline_seconds
from tensorwasm.runtime.spans import union
from tensorwasm.support import logs
from tensorwasm.support.errors import TensorWasmError
from tensorwasm.support.lazy import LazyModule

driver = LazyModule("tensorwasm.runtime.driver", globals(), "driver")
limits = LazyModule("tensorwasm.runtime.limits", globals(), "limits")

if TYPE_CHECKING:
    from tensorwasm.runtime.device import MemoryDevice
    from tensorwasm.runtime.driver import CudaError
    from tensorwasm.runtime.mirror import DeviceMirror
    from tensorwasm.runtime.planning import LaunchArguments, OffloadedLoop, PreparedLaunch

log = logs.get_logger(__name__)
U64 = ctypes.c_uint64

# Written ranges up to this size come back through the staging buffer, with the trap slot,
# in the launch's one wait (a memmove of 64 KiB costs less than a second wait); larger ones
# are copied straight into linear memory once the kernel is known not to have trapped.
STAGED_RESULT_BYTES = 64 << 10


class DeviceLaunches:
    """The launches of one offloaded module on one device with memory of its own."""

    # Sticky faults a module recovers from; after the next, its loops stay on the CPU.
    FAULTS_RECOVERED = 3

    def __init__(self, prepared: Any, device: MemoryDevice) -> None:
        """``prepared``: the module (its loops' kernels, mode, page-locking, memory cap)."""
        self.prepared, self.device = prepared, device
        self.gpu_lost: str | None = None  # why the GPU cannot be used any more
        self.faults = 0  # sticky faults seen (see recover)
        self.mirror: DeviceMirror | None = None  # device memory, made at the first launch
        # Bumped on whatever changes the device's state (a launch, a flush, closing): a native
        # replay armed at another generation hands its call to Python (runtime.replay).
        self.generation = (U64 * 1)()
        self.replays = DeviceReplays(self)

    def context_reset(self, context) -> None:
        """Its context was reset (by this module or another on it): native replays armed
        before go through Python, which finds the mirror stale (see renew_device_state)."""
        self.generation[0] += 1

    def allocate(self) -> DeviceMirror:
        """New device memory for the launches (told when its context is reset)."""
        self.mirror = self.device.allocate(self.prepared.device_memory_limit)
        self.device.watch(self)
        return self.mirror

    def startup_seconds(self) -> float:
        """What the next launch pays once before it runs (0 once the device has memory)."""
        if self.mirror is not None:
            return 0.0
        startup = getattr(self.device, "startup_seconds", None)
        return startup() if startup is not None else 0.0

    def begin_start(self) -> None:
        """Begin the device's start where it makes one on a thread of its own (the CUDA
        context: :mod:`runtime.gpu_start`)."""
        if self.mirror is None:
            begin = getattr(self.device, "begin_start", None)
            if begin is not None:
                begin()

    def startup_wait(self) -> float:
        """How long the next launch would wait for the device's start still under way on a
        thread of its own (0 once the device has memory, or where nothing is under way)."""
        if self.mirror is not None:
            return 0.0
        wait = getattr(self.device, "startup_wait", None)
        return wait() if wait is not None else 0.0

    def transfer_estimate(self, lp: OffloadedLoop, ready: PreparedLaunch) -> tuple[int, bool]:
        """The bytes a launch would copy (inside a region: only in, what the device lacks),
        and whether from page-locked memory."""
        mirror = self.mirror
        if lp.region is None:
            nbytes = ready.moved
        elif mirror is None:  # nothing is on the device yet
            nbytes = sum(hi - lo for lo, hi in union([], [(s.lo, s.hi) for s in ready.needed]))
        else:
            nbytes = mirror.missing_bytes(ready.needed)
        return nbytes, self.prepared.pin and not (mirror is not None and mirror.pin_failed)

    def decline_seconds(self, lp: OffloadedLoop, ready: PreparedLaunch) -> float:
        """What wasmtime's run of this arrival costs beyond its own time: inside a region
        whose device holds results or has work queued, the wait and the copies of a partial
        flush and of the next launch (:func:`runtime.profit.region_decline_seconds`); else 0."""
        mirror = self.mirror
        if lp.region is None or mirror is None or not (mirror.queued or mirror.holds_results):
            return 0.0
        return region_decline_seconds(ready.moved)

    def record_replay(self, ready: PreparedLaunch, arrival: LaunchArguments, live: tuple[int, ...],
                      memory: tuple[int, int], results: list[int]) -> ReplayRecord:  # fmt: skip
        return ReplayRecord(self, ready, arrival, live, memory, results)

    def close(self) -> None:
        """Give back device memory and unpin linear memory; end the device's GPU process."""
        self.generation[0] += 1
        if self.mirror is not None:
            self.mirror.release()
        self.device.close()

    def run(
        self, lp: OffloadedLoop, ready: PreparedLaunch, arrival: LaunchArguments, base: int, size: int
    ) -> list[int] | None:
        """Run on the device; on any device failure decline (wasmtime runs the loop) and say why."""
        if self.gpu_lost is not None:
            lp.stats.decline(self.gpu_lost)
            return None
        self.generation[0] += 1
        if self.mirror is None:
            try:
                self.allocate()  # the context and device memory, made at the first launch
            except TensorWasmError as exc:  # no usable GPU after all, or one unlike the remembered
                self.gpu_lost = (
                    str(exc) if isinstance(exc, driver.NoGPU) else f"the GPU cannot be used: {exc}"
                )
                self.fall_back(lp, self.gpu_lost)
                return None
        try:
            if self.mirror.stale:  # another module on the context reset it
                self.renew_device_state()
            return self._launch(lp, ready, arrival, base, size)
        except (limits.DeviceMemoryLimitError, limits.DeviceOutOfMemory) as exc:
            self.fall_back(lp, f"device memory: {exc}")
        except driver.ModuleLoadError as exc:  # cached code the driver refuses: no loop can run there
            self.gpu_lost = f"the kernels failed to load: {exc}"
            self.fall_back(lp, self.gpu_lost)
        except driver.CudaError as exc:
            self.device_error(lp, exc)
        return None

    def _launch(
        self, lp: OffloadedLoop, ready: PreparedLaunch, arrival: LaunchArguments, base: int, size: int
    ) -> list[int] | None:
        """Queue the copies in, the launch and the copies back on one stream, and wait once
        (a launch repeated with the same copies replays them all from one recorded graph).

        The results come back to linear memory only once the kernel is known not to have
        trapped: small written ranges land in the staging buffer with the trap slot and are
        moved from there after the wait; large ones are copied after it, with a second wait.
        Inside a region they stay on the device.
        """
        stats = lp.stats
        mirror = self.mirror
        start = time.perf_counter()
        if ready.launch.spread:  # a split loop's grid waits for all its blocks: no more than are resident
            ready.grid = (min(ready.grid[0], self.device.resident_blocks()), 1, 1)
        elif ready.reductions and not (ready.launch.nest or ready.launch.rows or lp.tile):
            # A 1-D fold's threads stride: one wave of resident blocks, no tail of a second
            # (REDUCTION_BLOCKS assumes 8 a multiprocessor; 40 registers a thread fit 6).
            wave = self.device.wave_blocks(self.prepared.kernels[lp.entry], ready.block[0])
            if wave is not None:
                ready.grid = (min(ready.grid[0], wave), 1, 1)
        resident = lp.region is not None
        staged = not resident and not ready.rows_out and ready.out_bytes <= STAGED_RESULT_BYTES
        mirror.ensure(size, ready.slots, ready.out_bytes if staged else 0)
        if self.prepared.pin:
            mirror.pin(base, size)
        image, params = device_arguments(ready, mirror, arrival)
        needed = ready.needed
        copies = mirror.missing(needed) if resident else ready.copies_in
        self.device.bind()
        if resident and not ready.reductions and not lp.may_trap:
            arrival.replay = None  # (a region's launches never replay)
            return self._launch_unwaited(lp, ready, image, params, copies, base, start)
        upload = mirror.stage_scratch(image)
        # Every argument of the launch follows from the prepared launch, these three flags and
        # the buffers (which the mirror adds to the key); copies in part only do not.
        whole = copies is needed or copies is ready.copies_in
        key = (ready.token, bool(copies), bool(upload), staged) if whole or not copies else None
        if key is not None and isinstance(params.slots[1], ctypes.Array):
            # A recording keeps the live-ins it was made with: one for each set of them,
            # made at the set's second launch (a time step's counter makes a set a step).
            arrival.launches += 1
            key = (*key, arrival.param_bytes) if arrival.launches > 1 else None
        launched = time.perf_counter()
        graph = mirror.launch(
            key, base, copies, upload, self.prepared.kernels[lp.entry], ready.grid, ready.block, params,
            ready.back_bytes, ready.written if staged else (), ready.staged_at,
        )  # fmt: skip
        if resident:
            mirror.now_valid(needed, copies)
        mirror.synchronize()
        done = time.perf_counter()
        stats.kernel_seconds += done - launched
        partials = self._partials(lp, ready, image)
        if partials is None:
            stats.transfer_seconds += launched - start
            return None
        if resident:  # the results stay on the device until the region ends
            mirror.keep(ready.written)
            moved_out = 0
        elif staged:
            moved_out = mirror.unstage(base, ready.written, ready.staged_at)
        else:
            moved_out = mirror.copy_out(base, ready.copies_out)
            mirror.synchronize()
        stats.transfer_seconds += launched - start + time.perf_counter() - done
        if copies is ready.copies_in:  # (outside a region; ``needed`` itself where nothing goes by rows)
            stats.bytes_in += ready.copies_in_bytes
        else:
            stats.bytes_in += ready.in_bytes if copies is needed else sum(s.hi - s.lo for s in copies)
        stats.bytes_out += moved_out
        stats.pinned = mirror.pinned is not None
        # What the same arrival again replays (DeviceReplays.replay): this launch, where it ran
        # from a recorded graph with nothing to upload; else nothing.
        replayable = graph is not None and staged and not upload
        arrival.replay = (mirror, mirror.epoch, image, graph) if replayable else None
        return partials

    def _launch_unwaited(
        self, lp: OffloadedLoop, ready: PreparedLaunch, image: bytes, params, copies, base: int, start: float
    ) -> tuple[()]:
        """A launch inside a region whose kernel returns nothing (no reduction; a region's
        kernels cannot trap): ``copies`` in, its scratch ``image`` and the kernel queued, not
        waited for (:meth:`DeviceMirror.launch_unwaited`). wasmtime goes on with the region's
        scalar code while the device runs it; the wait comes before anything else may touch
        linear memory (:meth:`flush`)."""
        stats, mirror = lp.stats, self.mirror
        mirror.launch_unwaited(base, copies, image, self.prepared.kernels[lp.entry], ready.grid, ready.block,
                               params)  # fmt: skip
        mirror.now_valid(ready.needed, copies)
        mirror.keep(ready.written)
        stats.kernel_seconds += time.perf_counter() - start  # (the host's part: the device's is unseen)
        stats.bytes_in += ready.in_bytes if copies is ready.needed else sum(s.hi - s.lo for s in copies)
        stats.pinned = mirror.pinned is not None
        return ()

    def _partials(self, lp: OffloadedLoop, ready: PreparedLaunch, image: bytes) -> list[int] | None:
        """After a launch's wait: its reductions' partial results from the scratch buffer
        brought back, or None where the kernel trapped (the arrival is declined)."""
        back = self.mirror.check_scratch(image, ready.back_bytes)
        if back[abi.CTX_TRAP]:
            lp.stats.decline(trap_reason(back[abi.CTX_TRAP]))
            return None
        return back[ready.out_at : ready.out_at + ready.reductions] if ready.reductions else ()

    def flush(self, caller: int, k: int, footprint: PreparedLaunch | None = None) -> bool:
        """Bring region ``k``'s results on the device back into linear memory, and forget
        what the device holds: wasmtime may write memory from here on. With ``footprint``
        (the launch the guards prepared for the region's loop that wasmtime is about to run
        instead), only what that loop reads or writes comes back and only what it writes is
        forgotten (:meth:`runtime.mirror.DeviceMirror.flush_part`): the rest stays resident.
        Whether the device still holds results that linear memory lacks."""
        mirror = self.mirror
        if mirror is None:
            return False
        self.generation[0] += 1
        if not mirror.holds_results:  # (a region whose loops only read: nothing comes back)
            try:
                mirror.drain()
            except driver.CudaError as exc:
                mirror.forget()
                raise RegionLost(self._lost_message(k, exc)) from exc
            if footprint is None:
                mirror.forget()
            else:
                mirror.flush_part(0, footprint.needed, footprint.written)
            return False
        base, _ = hostfunc.memory(caller)  # a launch found it, so it is there
        start = time.perf_counter()
        try:
            if footprint is None:
                moved = mirror.flush(base)
            else:
                moved = mirror.flush_part(base, footprint.needed, footprint.written)
        except driver.CudaError as exc:
            mirror.forget()
            raise RegionLost(self._lost_message(k, exc)) from exc
        stats = self.prepared.region_stats[k]
        stats.bytes_out += moved
        stats.transfer_seconds += time.perf_counter() - start
        return mirror.holds_results

    def _lost_message(self, k: int, exc: Exception) -> str:
        stats = self.prepared.region_stats[k]
        return (
            f"the GPU failed ({exc}) while it held the results of the device-resident region at "
            f"{stats.func}+0x{stats.offset:x}; linear memory lacks them, so the call cannot go on"
        )

    def device_error(self, lp: OffloadedLoop, exc: CudaError) -> None:
        """After a failed driver call in a launch: recover from a sticky fault (or wait for
        what was queued), and decline the arrival, saying why once per loop."""
        if exc.sticky:
            lost = self.mirror.holds_results
            self.recover(exc)
            if lost:  # the reset took the region's results with it
                raise RegionLost(self._lost_message(lp.region, exc)) from exc
        else:
            self.wait_for_queued_work()
        self.fall_back(lp, f"GPU error: {exc}")

    def wait_for_queued_work(self) -> None:
        """After a failed call in a launch: wait for what was queued before it (copies into
        linear memory among them), so none lands once wasmtime runs the loop."""
        mirror = self.mirror
        if mirror is None:
            return
        mirror.scratch_holds = None
        try:
            mirror.synchronize()
        except driver.CudaError as exc:
            log.info("waiting for the stream after a failed launch: %s", exc)

    @staticmethod
    def fall_back(lp: OffloadedLoop, reason: str) -> None:
        """Decline this arrival; warn once per loop and reason (the loop runs on wasmtime)."""
        if reason not in lp.stats.warned:
            lp.stats.warned.add(reason)
            log.warning("loop at %s+0x%x runs on the CPU: %s", lp.stats.func, lp.stats.offset, reason)
        lp.stats.decline(reason)

    def recover(self, fault: CudaError) -> None:
        """After a sticky fault: reset the device (unless another module on its context did
        since) and renew its memory and kernels (:meth:`renew_device_state`). Past
        :attr:`FAULTS_RECOVERED` faults, or where no context can be made, every later loop
        runs on the CPU."""
        self.mirror.forget()
        self.faults += 1
        if self.faults > self.FAULTS_RECOVERED:
            self.gpu_lost = f"the GPU faulted {self.faults} times (last: {fault.call}: {fault.error_name}); loops run on the CPU"
            log.warning("%s", self.gpu_lost)
            self.mirror.abandon()  # (a faulted context refuses even to free)
            self.device.close()
            return
        try:
            if not self.mirror.stale:
                self.device.reset()
            self.renew_device_state(fault)
        except (driver.CudaError, driver.NoGPU) as exc:
            self.gpu_lost = (
                f"the GPU faulted ({fault.call}: {fault.error_name}) and no context could be made "
                f"after it ({exc}); loops run on the CPU"
            )
            log.warning("%s", self.gpu_lost)
            self.mirror.abandon()
            self.device.close()

    def renew_device_state(self, fault: CudaError | None = None) -> None:
        """After the context was reset: new device memory and kernels (where the driver
        refused the reset, the device goes on in a GPU process: :meth:`MemoryDevice.renew`)."""
        self.device.renew(fault)
        self.mirror.abandon()
        self.allocate()
        self.prepared.reload_kernels()


def device_arguments(
    ready: PreparedLaunch, mirror: DeviceMirror, arrival: LaunchArguments
) -> tuple[bytes, Any]:
    """The scratch image and the kernel's arguments of a launch, for the mirror's current
    buffers (kept on ``ready`` and ``arrival`` until the buffers change)."""
    buffers = (mirror.memory_ptr, mirror.scratch_ptr)
    found = ready.device_arguments
    if found is None or found[0] != buffers:
        memory, scratch = buffers
        ctx = abi.context_block(
            memory_base=memory, memory_size=ready.size, memory_capacity=ready.size,
            max_pages=ready.size // abi.PAGE_SIZE, written_at=scratch + 8 * ready.back_slots,
            written_count=len(ready.written),
        )  # fmt: skip
        tail = [*ready.out_words, *ready.range_words]
        counts = (ready.launch.trip, *ready.launch.nest)
        # The live-ins by value where they fit, else the scratch image's copy (see abi).
        count = len(arrival.param_bytes) // 8
        by_value = abi.params_by_value(count)
        live_ins = arrival.param_bytes if by_value else scratch + 8 * abi.CTX_SLOTS
        params = driver.KernelParams(
            [U64, U64 * count if by_value else U64, *(ctypes.c_int64 for _ in counts), U64]
        )
        params.set([scratch, live_ins, *counts, scratch + 8 * ready.out_at])
        found = ready.device_arguments = (buffers, bytes(ctx), words(tail), params)
    _, head, tail, params = found
    if arrival.image[0] is not params:  # made for other buffers
        arrival.image = (params, head + arrival.param_bytes + tail)
    if isinstance(params.slots[1], ctypes.Array):  # this arrival's live-ins (a launch copies them)
        driver.set_bytes(params.slots[1], arrival.param_bytes)
    return arrival.image[1], params
