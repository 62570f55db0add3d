"""Replaying an arrival's device launch as it was, in Python and in native code.

An arrival with the live-ins of one whose launch ran from a recorded graph, with nothing to
upload and no reductions, gets the same guard outcome, the same kernel arguments and the
same results: :class:`ReplayRecord` keeps what that launch ran with, and
:meth:`DeviceReplays.replay` relaunches the graph, waits, checks the trap slot and moves
the staged results into linear memory. Once a loop replays often, its host function
becomes native code (:mod:`runtime.replay`) armed with the record (:class:`NativeReplay`),
which replays without Python and hands the call back where anything changed.
"""

from __future__ import annotations

import ctypes
import time
import weakref
from typing import TYPE_CHECKING

import wasmtime

from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.rewrite import MEMORY_EXPORT
from tensorwasm.runtime import hostfunc, replay
from tensorwasm.runtime.planning import MASKS, trap_reason
from tensorwasm.support.lazy import LazyModule

driver = LazyModule("tensorwasm.runtime.driver", globals(), "driver")

if TYPE_CHECKING:
    from tensorwasm.runtime.device_launch import DeviceLaunches
    from tensorwasm.runtime.driver import CudaError
    from tensorwasm.runtime.planning import LaunchArguments, OffloadedLoop, PreparedLaunch

U64 = ctypes.c_uint64


class DeviceReplays:
    """The replays of one module's recorded launches (``launches``: its execution side)."""

    # Replays of a loop (in Python) after which its host function becomes native code: the
    # first costs compiling that code once per process (~10 ms, and ~45 ms to load LLVM where
    # no compile loaded it), which a replay in native code repays at ~10 us saved.
    NATIVE_AFTER = 256
    # In auto mode, native replays between two in Python (which decide again and record).
    NATIVE_BUDGET = 64

    def __init__(self, launches: DeviceLaunches) -> None:
        self.launches = launches
        self.prepared = launches.prepared
        self.generation = launches.generation
        self.natives: list[NativeReplay] = []
        native_after = self.prepared.native_after
        self.native_after = self.NATIVE_AFTER if native_after is None else native_after

    def still_valid(self, again: ReplayRecord) -> bool:
        """Whether nothing a recorded replay relies on changed, linear memory aside."""
        launches = self.launches
        mirror = launches.mirror
        return (mirror is again.mirror and mirror.epoch == again.epoch and mirror.scratch_holds is again.image
                and launches.gpu_lost is None and self.prepared.mode == again.mode
                and not mirror.stale)  # fmt: skip

    def replay(
        self,
        lp: OffloadedLoop,
        again: ReplayRecord,
        caller: int,
        args: tuple[int, ...],
        context: int | None = None,
    ) -> list[int] | None:
        """An arrival with the live-ins of one whose launch was recorded with nothing to upload
        and nothing left to decide: the guards' outcome, the launch's arguments and its results
        are that arrival's, so it replays the recorded graph, waits, checks the trap slot and
        moves the staged results into linear memory. None (and the arrival forgotten) where
        anything that relied on changed (linear memory, the mirror's buffers or page-locking,
        the scratch buffer's contents, the mode, the GPU): the whole path decides."""
        if hostfunc.memory(caller, context=context) != again.memory or not self.still_valid(again):
            lp.again.pop(again.live, None)
            return None
        stats = lp.stats
        stats.arrivals += 1
        ready = again.ready
        decision = None
        if again.mode == "auto":
            pinned = self.prepared.pin and not self.launches.mirror.pin_failed
            go, why, model, cpu = lp.estimate.decide(
                "gpu", ready.ops, ready.moved, pinned, ready.cells, touched=ready.moved,
                serial_ops=ready.serial_ops, steps=ready.steps,
            )
            if not go:
                stats.decline(why)
                return [0, *args[again.n_live :]]
            decision = (model, cpu)
        self.generation[0] += 1
        try:
            again.bind()
            launched = time.perf_counter()
            again.launch(again.stream)
            again.wait()
        except driver.CudaError as exc:
            return self._replay_failed(lp, again, args, exc)
        stats.kernel_seconds += time.perf_counter() - launched
        return self._replayed(lp, again, args, launched, decision)

    def _replay_failed(
        self, lp: OffloadedLoop, again: ReplayRecord, args: tuple[int, ...], exc: CudaError
    ) -> list[int]:
        """A replay's driver call failed: decline, and recover (or wait for what was queued)."""
        lp.again.pop(again.live, None)
        if not exc.sticky:  # (a reset context takes the graphs with it)
            self.launches.mirror.forget_graph(again.graph)
        self.launches.device_error(lp, exc)
        return [0, *args[again.n_live :]]

    def _replayed(self, lp: OffloadedLoop, again: ReplayRecord, args: tuple[int, ...],
                  launched: float | None = None, decision: tuple[float, float] | None = None) -> list[int]:  # fmt: skip
        """After a replay's wait: where the kernel trapped decline, else move the staged
        results into linear memory and return the arrival's. ``launched`` (and, in auto mode,
        ``decision``: the modelled and CPU seconds): when it was launched, where timed here."""
        stats, mirror, ready = lp.stats, self.launches.mirror, again.ready
        done = time.perf_counter()
        if ctypes.string_at(again.staging, again.back_bytes) != again.back:
            mirror.scratch_holds = None  # the kernel wrote its scratch: the next launch uploads
            lp.again.pop(again.live, None)
            code = mirror.staged[abi.CTX_TRAP]
            if code:  # it trapped: nothing reaches linear memory, wasmtime runs the loop
                stats.decline(trap_reason(code))
                return [0, *args[again.n_live :]]
        base = again.memory[0]
        for lo, at, nbytes in again.staged:
            ctypes.memmove(base + lo, at, nbytes)
        end = time.perf_counter()
        stats.transfer_seconds += end - done
        stats.bytes_in += ready.copies_in_bytes
        stats.bytes_out += ready.out_bytes
        if decision is not None:
            lp.estimate.record(end - launched, *decision)
        stats.offloaded += 1
        stats.replayed += 1
        stats.iterations += ready.launch.trip
        again.generation = self.generation[0]
        if decision is not None:
            again.decision = decision
        return again.results

    def finish_native(self, lp: OffloadedLoop, native: NativeReplay, args: tuple[int, ...]) -> list[int]:
        """A native replay launched and handed the rest to Python: its driver call failed, or
        its kernel left the scratch changed (a trap, say)."""
        arm, again = native.arm, native.again
        pending, arm.pending = arm.pending, 0
        lp.stats.arrivals += 1
        self.generation[0] += 1
        if pending == replay.PENDING_ERROR:
            return self._replay_failed(
                lp, again, args, driver.CudaError(replay.CALLS[arm.error_call], arm.error)
            )
        return self._replayed(lp, again, args)

    def arm_native_replay(self, lp: OffloadedLoop, hook: Hook, again: ReplayRecord) -> None:
        """After ``again``'s launch: let the next arrival with its live-ins replay it in
        native code, where nothing changed since, and its loop replays often enough."""
        if again.generation != self.generation[0] or not self.still_valid(again):
            return
        if lp.stats.replayed < self.native_after:
            return
        calls = self.launches.device.native_calls()
        if calls is None:  # (a GPU process's recorded launches: none native code could replay)
            return
        native = hook.native
        if native is None:
            store = hook.store()
            if store is None or hook.table is None:  # (an instance left unbound)
                return
            native = hook.native = NativeReplay(self.prepared, self.generation, lp, hook)
            params, results = self.prepared.host_sigs[lp.insertion.import_name]
            func = hostfunc.native_func(store, params, results, replay.entry(), native.arm)
            hook.table.set(store, hook.index, func)
            self.natives.append(native)
        # In auto mode its replays are recorded against the decision that launched it, and
        # every so many go through Python, which decides again.
        budget = self.NATIVE_BUDGET if again.mode == "auto" else 1 << 62
        native.arm_with(again, calls, budget, again.decision)

    @staticmethod
    def collect_native_counts(native: NativeReplay) -> None:
        """Count in what native replays did since they were last counted."""
        arm = native.arm
        if not (arm.replays or arm.kernel_ns or arm.transfer_ns):
            return
        n, lp, ready = arm.replays, native.lp, native.again.ready
        stats = lp.stats
        stats.arrivals += n
        stats.offloaded += n
        stats.replayed += n
        stats.native += n
        stats.iterations += n * ready.launch.trip
        stats.bytes_in += n * ready.copies_in_bytes
        stats.bytes_out += n * ready.out_bytes
        seconds = (arm.kernel_ns + arm.transfer_ns) * 1e-9
        stats.kernel_seconds += arm.kernel_ns * 1e-9
        stats.transfer_seconds += arm.transfer_ns * 1e-9
        if n and native.decision is not None:
            lp.estimate.record(seconds / n, *native.decision)
        arm.replays = arm.kernel_ns = arm.transfer_ns = 0


class ReplayRecord:
    """An arrival whose launch replays as it was, kept per loop by its live-ins
    (:meth:`DeviceReplays.replay`): what it ran with (the memory, the mirror and its epoch,
    the scratch image, the mode), the calls of its replay bound once, where its results wait
    in the staging buffer, and what it returned. Only arrivals without reductions, whose
    results are known before the launch."""

    __slots__ = (
        "back", "back_bytes", "bind", "decision", "epoch", "generation", "graph", "image", "launch", "live",
        "memory", "mirror", "mode", "n_live", "ready", "results", "staged", "staging", "stream", "wait",
    )  # fmt: skip

    def __init__(self, launches: DeviceLaunches, ready: PreparedLaunch, arrival: LaunchArguments,
                 live: tuple[int, ...], memory: tuple[int, int], results: list[int]) -> None:  # fmt: skip
        mirror, epoch, image, graph = arrival.replay
        self.ready, self.live, self.n_live = ready, live, len(live)
        self.memory, self.mirror, self.epoch, self.image = memory, mirror, epoch, image
        self.mode, self.results = launches.prepared.mode, results
        self.generation = launches.generation[0]  # the module's, just after its launch
        self.decision: tuple[float, float] | None = None  # auto mode: the last launch's (model, CPU seconds)
        self.graph, self.launch, self.stream = graph, graph.launch, mirror.stream.handle
        self.bind, self.wait = launches.device.context.bind, mirror.stream.synchronize
        self.staging, self.back_bytes = mirror.staging.ptr, ready.back_bytes
        self.back = image[: ready.back_bytes]  # the scratch as a launch that did not trap leaves it
        at = self.staging + ready.staged_at
        self.staged = []  # (offset in linear memory, staging address, bytes) of each written range
        for span in ready.written:
            self.staged.append((span.lo, at, span.hi - span.lo))
            at += span.hi - span.lo


class Hook:
    """Where one loop's host function is reached in one instance: entry ``index`` of its
    ``table`` of hooks (known once :meth:`OffloadModule.bind` gives it), its Python
    function's ``key`` (:func:`runtime.hostfunc.keyed_func`), and its native one once made."""

    __slots__ = ("context", "index", "key", "native", "store", "table")

    def __init__(self, store: weakref.ref, index: int, context: int) -> None:
        self.store, self.index, self.context = store, index, context
        self.table: wasmtime.Table | None = None
        self.key = 0
        self.native: NativeReplay | None = None


class NativeReplay:
    """A loop's native host function in one store (:mod:`runtime.replay`): its arm, the
    buffers the arm points into, and the replay it is armed with."""

    def __init__(self, prepared, generation: ctypes.Array, lp: OffloadedLoop, hook: Hook) -> None:
        self.lp = lp
        self.arm = arm = replay.Arm()
        params, results = prepared.host_sigs[lp.insertion.import_name]
        n_live = len(lp.plan.live_ins)
        self._masks = [MASKS[t.bits] for t in params[:n_live]]
        self._result_masks = [MASKS[t.bits] for t in results]
        self._name = ctypes.create_string_buffer(MEMORY_EXPORT.encode())
        self._live = (U64 * max(1, n_live))()
        masks = (U64 * max(1, n_live))(*self._masks)
        self._results = (U64 * max(1, len(results)))()
        self._kept: list = [masks]  # what the arm points to, besides the above
        export_get, memory_data, memory_size = hostfunc.native_calls()
        memcmp, clock = replay.libc_calls()
        for name, value in (
            ("generation_at", ctypes.addressof(generation)), ("fallback", hostfunc.TRAMPOLINE),
            ("fallback_env", hook.key), ("n_live", n_live), ("live", ctypes.addressof(self._live)),
            ("masks", ctypes.addressof(masks)), ("export_get", export_get), ("memory_data", memory_data),
            ("memory_size", memory_size), ("store_context", hook.context),
            ("export_name", ctypes.addressof(self._name)), ("export_len", len(MEMORY_EXPORT.encode())),
            ("memcmp", memcmp), ("clock", clock), ("n_results", len(results)),
            ("results", ctypes.addressof(self._results)),
        ):  # fmt: skip
            setattr(arm, name, value)
        self.again: ReplayRecord | None = None
        self.decision: tuple[float, float] | None = None  # auto mode: (modelled, CPU seconds)

    def arm_with(self, again: ReplayRecord, calls: tuple[int, int, int, int], budget: int,
                 decision: tuple[float, float] | None) -> None:  # fmt: skip
        """Replay ``again`` from the next arrival with its live-ins on, for up to ``budget``
        arrivals; ``calls``: the driver's (see ``Context.native_calls``); ``decision``: the
        modelled and CPU seconds its replays' time is recorded against (auto mode)."""
        arm = self.arm
        arm.armed = 0
        self.again, self.decision = again, decision
        for i, (value, mask) in enumerate(zip(again.live, self._masks, strict=True)):
            self._live[i] = value & mask
        for i, (value, mask) in enumerate(zip(again.results, self._result_masks, strict=True)):
            self._results[i] = value & mask
        staged = (U64 * max(1, 3 * len(again.staged)))(*(v for triple in again.staged for v in triple))
        image = ctypes.create_string_buffer(again.back, max(1, len(again.back)))
        self._kept[1:] = [staged, image]
        arm.ctx_set_current, arm.graph_launch, arm.stream_sync, arm.cu_context = calls
        arm.graph, arm.stream = again.graph.handle, again.stream
        arm.base, arm.size = again.memory
        arm.staging, arm.image, arm.back_bytes = again.staging, ctypes.addressof(image), again.back_bytes
        arm.n_staged, arm.staged = len(again.staged), ctypes.addressof(staged)
        arm.generation = again.generation
        arm.budget = budget
        arm.armed = 1
