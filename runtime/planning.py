"""Planning an arrival at an offloaded loop: whether and what to launch, apart from running it.

Each time the rewritten module reaches an offloaded loop, its host function hands the
loop's live-ins to :meth:`ArrivalPlanner.arrive`. Planning checks the guards on them
(outcomes cached per loop, :mod:`runtime.guards`), turns an allowed launch into a
:class:`PreparedLaunch` (what every launch with those guard inputs needs) and the live-ins'
own part into :class:`LaunchArguments`, asks :class:`runtime.profit.Estimate` whether the
launch pays in auto mode, and hands it to the execution side (a :class:`LaunchRunner`:
device memory, copies, kernels and fault recovery live there). Planning knows nothing of
the CUDA driver, the device mirror or the GPU process: it imports none of them.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import operator
import struct
import time
import weakref
from typing import TYPE_CHECKING, Protocol

import wasmtime

from tensorwasm.compiler.analysis.plan import LoopPlan, ReductionKind
from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.prepare import returned
from tensorwasm.compiler.rewrite import FILTER_EXPORT, NEVER_SKIP, Insertion
from tensorwasm.dialect.types import Type
from tensorwasm.runtime import hostfunc, profit
from tensorwasm.runtime.known_host import Gains
from tensorwasm.runtime.profit import (
    CONTEXT_SECONDS,
    FIXED_SECONDS,
    PROBING,
    STARTUP_SECONDS,
    Estimate,
    wave_steps,
    work,
)
from tensorwasm.runtime.spans import Rows, Span, union
from tensorwasm.support.lazy import LazyModule
from tensorwasm.support.records import field, record

# The guards load when a loop first asks the host (a warm run whose loops the Wasm-side
# filters keep from the host never imports them).
guards = LazyModule("tensorwasm.runtime.guards", globals(), "guards")

if TYPE_CHECKING:
    from tensorwasm.runtime.guards import Launch, Range

U64 = ctypes.c_uint64
MASKS = {32: 0xFFFFFFFF, 64: 0xFFFFFFFFFFFFFFFF}


@record
class LoopStats:
    """What happened at one loop, for the report."""

    func: str
    offset: int
    device: str
    arrivals: int = 0
    offloaded: int = 0
    replayed: int = 0  # of the offloaded: replayed as the last arrival's launch (see ReplayRecord)
    native: int = 0  # of the replayed: by native code, without Python (runtime.replay)
    declined: dict[str, int] = field(default_factory=dict)
    iterations: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    kernel_seconds: float = 0.0
    transfer_seconds: float = 0.0
    threads: int = 1  # the most host threads one launch used
    on_host: int = 0  # of the offloaded: on the host's threads before the GPU started (runtime.while_starting)
    pinned: bool = False  # GPU copies from page-locked linear memory
    warned: set[str] = field(default_factory=set)  # fallback reasons already logged
    region: int | None = None  # the device-resident region the loop is in
    last_declined: str | None = None  # why its last arrival declined

    def decline(self, reason: str, arrivals: int = 1) -> None:
        self.declined[reason] = self.declined.get(reason, 0) + arrivals
        self.last_declined = reason


@record
class OffloadedLoop:
    """A loop the module offloads: its analysis plan, its kernel (index and launch entry),
    its host call in the rewritten module, its counts and its cost estimate."""

    plan: LoopPlan
    kernel_index: int
    entry: str
    insertion: Insertion
    stats: LoopStats
    estimate: Estimate = field(default_factory=Estimate)  # auto mode: does a launch pay?
    # Its recent arrivals whose launch replays as it was, by live-ins: the execution side's
    # records (runtime.device_replay.ReplayRecord).
    again: dict[tuple[int, ...], object] = field(default_factory=dict)
    may_trap: bool = True  # its kernel can trap (compiler.prepare.kernel_may_trap)
    gate: ArrivalGate | None = None  # its bound instance's gate (where the loop has one)
    # A tiled kernel's GPU launch shape (compiler.prepare.PreparedLoop.tile); None: one thread per cell.
    tile: tuple[int, int, int, int] | None = None
    per_thread: int = 1  # iterations per thread of a 1-D kernel (compiler.prepare.PreparedLoop.per_thread)

    @property
    def region(self) -> int | None:
        """The device-resident region the loop is in (index into OffloadModule.regions)."""
        return self.stats.region


@record
class RegionStats:
    """One device-resident region, for the report."""

    func: str
    offset: int
    loops: int  # offloaded loops inside it
    exits: int = 0  # times the region ended
    bytes_out: int = 0  # results brought back to linear memory at its end or before a decline
    transfer_seconds: float = 0.0


class RegionLost(Exception):
    """The device failed while it held a region's results that linear memory lacks: the
    guest cannot go on (wasmtime reports this as a trap of the call)."""


class LaunchRunner(Protocol):
    """What planning asks of the execution side (:mod:`runtime.device_launch` for device
    memory, :mod:`runtime.host_device` for the host backend)."""

    def run(self, lp: OffloadedLoop, ready: PreparedLaunch, arrival: LaunchArguments, base: int,
            size: int) -> list[int] | None:  # fmt: skip
        """Run the launch; the reductions' partial results, or None where it declined."""

    def transfer_estimate(self, lp: OffloadedLoop, ready: PreparedLaunch) -> tuple[int, bool]:
        """The bytes a launch would copy and whether from page-locked memory (the cost model's)."""

    # Optional: ``decline_seconds(lp, ready)``, what running the arrival on wasmtime would
    # cost beyond its own time (a region's results brought back; 0 where nothing is held).

    def record_replay(self, ready: PreparedLaunch, arrival: LaunchArguments, live: tuple[int, ...],
                      memory: tuple[int, int], results: list[int]):  # fmt: skip
        """What replays this arrival's launch as it was (see ``LaunchArguments.replay``)."""


# Why an arrival that would pay for its launch declines while the device is not started.
# When this module loaded: about when a run began its device's start, where it began it with
# the program (see ArrivalPlanner.start_would_pay).
LOADED = time.perf_counter()

NOT_STARTED = "the work so far does not yet pay for starting the device"
# Why an arrival whose launch would pay, the device's start included, declines while the
# CUDA context is still being made on a thread of its own: waiting for it would cost more
# than the launch gains (wasmtime runs the loop meanwhile; see ArrivalPlanner._started).
STARTING = "the device was still starting (wasmtime ran the loop)"
# Why an arrival that would launch declines while its kernel compiles in the background
# (runtime.loop_kernels): it passes, so its gate keeps only a few arrivals out for it.
COMPILING = "its kernel was compiling (wasmtime ran the loop)"
# Why a loop declines that no later arrival changes: its gate closes for good.
LASTING = frozenset({"the module has no (unshared) linear memory"})
# The gate's wait when closed for good (about 2^63 arrivals).
FOREVER = (1 << 63) - 1


class ArrivalGate:
    """One instance's Wasm-side gate and counters before one loop's host call (see
    :class:`compiler.rewrite.Insertion`): a declined loop costs a host call (microseconds of
    Python) at every arrival; once it declined for a reason that lasts, or
    :attr:`BACKOFF_AFTER` times in a row, the gate keeps the next arrivals in Wasm, where
    they cost a few instructions: for good, or for a wait that doubles with each further
    decline up to :attr:`WAIT_LIMIT` arrivals, so a loop whose arrivals grow into
    launches is asked again soon enough; where the host's answer costs more than
    :attr:`ASK_SHARE` of what the waited arrivals take on wasmtime, the wait may grow
    further (up to :attr:`WAIT_CAP`), so that asking again costs about that share. A launch opens it again. Declining is always
    exact (the original loop runs), so the gate trades only launches it may miss.

    A loop of a device-resident region may stay in Wasm only while the device holds nothing
    of the region: its next arrivals may write what the device still holds a copy of, and a
    later launch would read that copy. A decline brings back what the loop touches (the host
    function flushes it); where the gate then closes, the device forgets the rest too
    (:func:`runtime.offload._declined_in_region`). Any launch in the region, which makes
    its data resident again, opens the gates of all its loops and holds their filters open
    (:meth:`reopen`), so that their next arrivals ask the host; the filters apply again once
    the device holds nothing of the region (:meth:`release`: the region ended, or a gate
    closed)."""

    BACKOFF_AFTER = 4
    WAIT_LIMIT = 63
    # A declining loop's questions to the host, at most this share of its arrivals' own
    # time on wasmtime: PolyBench's doitgen asked every 64th of its 63,000 arrivals at
    # ~0.26 ms a question (its guards see new live-ins each time) where an arrival takes
    # ~7 us, 0.18 s in all of a 1.2 s program.
    ASK_SHARE = 0.01
    WAIT_CAP = 1 << 20
    # The longest wait after arrivals that declined while their kernel compiled: a compile on
    # a worker thread holds Python's interpreter lock in its Python half (the lowering, and
    # the whole module's analysis where the module was prepared from the cache), and each
    # host call waits for that lock (up to the switch interval, 5 ms), so an arrival that
    # asks costs milliseconds, not microseconds. The wait doubles from 1 to this, and the
    # kernel launches at most this many arrivals after it is ready.
    COMPILING_WAIT_LIMIT = 3

    def __init__(self, lp: OffloadedLoop, n: int, store, exports, threshold: int | None, mode: str) -> None:
        self.loop = lp
        self.context = hostfunc.store_context(store)
        self.store = weakref.ref(store)
        self.skipped = exports[f"{FILTER_EXPORT}skipped_{n}"]
        self.wait = hostfunc.I64Global(exports[f"{FILTER_EXPORT}wait_{n}"]) if lp.insertion.gate else None
        self.mode_reason = "offload is off" if mode == "off" else "too little work to pay for a launch"
        self.seen = 0  # skipped arrivals already counted in
        self.declines = 0  # in a row
        self.compiling = 0  # declines in a row while the kernel compiled
        self.waiting = 0  # the wait last set
        self.waiting_for = ""  # the decline that set it
        self.waited = 0  # arrivals of past waits not yet counted in
        # A region's loop's filter, held open (every arrival asks) while the device holds any
        # of the region: its global and the threshold it holds otherwise.
        self.filter: tuple[hostfunc.I64Global, int] | None = None
        self.held = False
        if lp.insertion.filter is not None and threshold is not None:
            exports[f"{FILTER_EXPORT}min_{n}"].set_value(store, wasmtime.Val.i64(threshold))
            if lp.region is not None and threshold != NEVER_SKIP:
                self.filter = (hostfunc.I64Global(exports[f"{FILTER_EXPORT}min_{n}"]), threshold)
        if mode == "off" and self.wait is not None:
            self.wait.set(self.context, FOREVER)

    def arrived(self) -> None:
        """The host was asked: the last wait ran out (every one of its arrivals stayed in Wasm)."""
        if self.waiting:
            self.waited += self.waiting  # counted in at collect, with the filter's
            self.waiting = 0

    def launched(self) -> None:
        self.declines = self.compiling = 0

    def reopen(self) -> None:
        """A launch in the loop's region: the next arrival asks the host (the part of a wait
        still running is counted as spent so far), and so do the later ones, whatever their
        distance, until :meth:`release`."""
        self.declines = 0
        if self.store() is None:
            return
        if self.filter is not None and not self.held:
            self.filter[0].set(self.context, NEVER_SKIP)
            self.held = True
        if not self.waiting:
            return
        left = self.wait.get(self.context)
        self.waited += self.waiting - left
        self.waiting = 0
        if left:
            self.wait.set(self.context, 0)

    def release(self) -> None:
        """The device holds nothing of the loop's region: its filter keeps arrivals with too
        little to go from the host again."""
        if self.held and self.store() is not None:
            self.filter[0].set(self.context, self.filter[1])
            self.held = False

    def declined(self, reason: str | None, asked: float = 0.0, arrival: float = 0.0) -> None:
        """An arrival declined: close the gate where the reason lasts or declines repeat. An
        arrival that would have paid but for the device's start (or that would have waited
        for a context still being made) is not kept out: its gain counts towards the start
        (see :meth:`ArrivalPlanner._started`). One whose kernel is still compiling, or whose
        device's context is still being made, keeps the next ones out only briefly
        (:attr:`COMPILING_WAIT_LIMIT`: that work holds Python's lock too), so that they
        launch soon after it is done. ``asked``: the seconds the host took to answer;
        ``arrival``: the CPU time the cost model gave the arrival (0 where it did not get
        that far)."""
        if self.wait is None or reason == NOT_STARTED:
            return
        if reason in (COMPILING, STARTING):
            self.compiling += 1
            wait = min(1 << (self.compiling - 1), self.COMPILING_WAIT_LIMIT)
            self.wait.set(self.context, wait)
            self.waiting, self.waiting_for = wait, reason
            return
        self.declines += 1
        if reason in LASTING:
            wait = FOREVER
        elif self.declines >= self.BACKOFF_AFTER:
            wait = min((1 << (self.declines - self.BACKOFF_AFTER + 1)) - 1, self.wait_limit(asked, arrival))
        else:
            return
        self.wait.set(self.context, wait)
        self.waiting, self.waiting_for = wait, reason or "declined again and again"

    def wait_limit(self, asked: float, arrival: float) -> int:
        """The longest wait: :attr:`WAIT_LIMIT`, or longer where a question costs more than
        :attr:`ASK_SHARE` of the arrivals it waits for (up to :attr:`WAIT_CAP`)."""
        if asked <= 0.0 or arrival <= 0.0:
            return self.WAIT_LIMIT
        return max(self.WAIT_LIMIT, min(self.WAIT_CAP, math.ceil(asked / (self.ASK_SHARE * arrival))))

    def collect(self) -> None:
        """Count in the arrivals the gate and the filter kept from the host: those of the
        waits under the decline that set them, the others under the mode's reason."""
        store = self.store()
        if store is None:  # the instance is gone: its counts were collected or are lost
            return
        total = self.skipped.value(store)
        if self.waiting:  # a wait still running: the part of it spent so far
            left = self.wait.get(self.context)
            spent = self.waiting - left
            self.waited += spent
            self.waiting = left
        new = total - self.seen
        if new <= 0:
            return
        stats = self.loop.stats
        stats.arrivals += new
        waited = min(self.waited, new)
        if waited:
            stats.decline(self.waiting_for, waited)
        if new > waited:
            stats.decline(self.mode_reason, new - waited)
        self.waited -= waited
        self.seen = total


class ArrivalPlanner:
    """Decides each arrival at an offloaded loop: the guards' outcome (cached), whether the
    launch pays (auto mode), and which launches replay; ``runner`` runs what it allows."""

    # Guard outcomes kept per loop: a loop arrives again and again with the same live-ins
    # (a time step's pointers alternate between two arrays), and the outcome is a function
    # of the live-ins the guards read (:func:`runtime.guards.inputs`) and the memory size.
    GUARD_CACHE_ENTRIES = 16
    # What share of a launch's fixed cost a CPU estimate must reach before the host is asked:
    # well below break-even, so the Wasm-side test keeps from the host only arrivals it would
    # decline even after its launches came out faster than modelled.
    ASK_SHARE = 0.25
    # What share of the device's start the gains of the arrivals that would have paid must
    # reach before the start begins on a thread of its own (runner.begin_start, see
    # runtime.gpu_start): a program whose loops gain less than that never starts the driver,
    # whose start and teardown would slow it (atax at LARGE: 0.12 s on plain wasmtime, 0.23 s
    # with a context begun by its one kernel arrival, which gains ~5 ms).
    START_SHARE = 0.1
    # What share of the device's start the gains of arrivals that came after a context begun
    # with the program would have been made (the CUDA context's time after the planner's
    # module loaded) must reach for the next run of the module to begin the start with the
    # program (see start_would_pay): a start that overlaps the program costs its main thread
    # only the CUDA bindings' import, which holds the interpreter lock, and the rest of it.
    LATE_SHARE = 1 / 3

    def __init__(self, mode: str, device: str, runner: LaunchRunner) -> None:
        """``device``: "gpu" (launches copy to device memory) or "cpu" (the host backend)."""
        self.mode, self.device = mode, device
        self.guard_cache: dict[int, dict[tuple, PreparedLaunch | str]] = {}  # per loop: see guards
        self.guard_reads: dict[int, object] = {}  # per loop: the live-ins the guards read
        self.guards_passed: dict[int, PreparedLaunch] = {}  # per loop: the last launch they allowed
        self.run = runner.run
        self.transfer_estimate = runner.transfer_estimate
        self.decline_seconds = getattr(runner, "decline_seconds", None)
        self.record_replay = runner.record_replay
        self.startup_seconds = getattr(runner, "startup_seconds", None)
        self.startup_for = getattr(runner, "startup_for", None)  # the same, for a given loop's launch
        self.startup_wait = getattr(runner, "startup_wait", None)
        # What launches waited for the host's threads to start, left out of their measure.
        self.take_threads_seconds = getattr(runner, "take_threads_seconds", None)
        self.begin_start = getattr(runner, "begin_start", None)
        self.arrival_seconds = 0.0  # the last arrival's CPU time, by the cost model (see arrive)
        # The last arrival's launch as the guards prepared it, where the arrival declined for
        # what the launch would cost, gain or wait (not for the guards): what wasmtime's run
        # of the loop reads and writes, for a partial flush of its region (runtime.offload).
        self.declined_launch: PreparedLaunch | None = None
        self.prefetch = getattr(runner, "prefetch", None)  # a kernel's compile, begun early
        # Where the device's start keeps a launch from it: a launch on the host's threads, or None.
        self.while_starting = getattr(runner, "while_starting", None)
        self.banked = 0.0  # the gain of the arrivals that would have paid, before the device started
        self.banked_late = 0.0  # of it, the arrivals' once a context begun with the program would be made
        self.worth_waiting = False  # whether a launch was worth waiting for the context (begun: see start_would_pay)
        self.gains = Gains()  # per kernel: what its arrivals that paid gained (runtime.known_host)
        # An arrival left to wasmtime to time it (profit.PROBING): its loop, its CPU
        # estimate, and when the host call returned (0.0: not yet), until the next arrival.
        self.probing: tuple[OffloadedLoop, float, float] | None = None
        # Per region: the gates of its loops in every instance bound (see ArrivalGate.reopen).
        self.region_gates: dict[int, list[ArrivalGate]] = {}

    def threshold(self, lp: OffloadedLoop) -> int:
        """The distance to go below which the loop's Wasm-side filter keeps an arrival from
        the host (see :class:`compiler.rewrite.Filter`), for this planner's mode."""
        if self.mode == "off":
            return (1 << 63) - 1  # never asked: the host would decline
        if self.mode != "auto":
            return NEVER_SKIP
        per_iteration = sum(ops for ops, _ in lp.plan.work) or 1
        least = self.ASK_SHARE * FIXED_SECONDS[self.device] / profit.cpu_seconds_per_op()
        # A distance d runs at most d / |step| + 2 iterations (see Filter).
        iterations = math.ceil(least / per_iteration) - 2
        return max(0, iterations) * abs(lp.plan.trip.step)

    def bind(
        self, loops: list[OffloadedLoop], store, exports, thresholds: list[int] | None = None
    ) -> list[ArrivalGate]:
        """Each loop's gate and filter in the instance whose ``exports`` these are (see
        :meth:`runtime.offload.OffloadModule.bind`); later arrivals from that instance's
        store close its gates."""
        gates = []
        for n, lp in enumerate(loops):
            if lp.insertion.filter is None and not lp.insertion.gate:
                lp.gate = None
                continue
            threshold = thresholds[n] if thresholds is not None else self.threshold(lp)
            lp.gate = ArrivalGate(lp, n, store, exports, threshold, self.mode)
            gates.append(lp.gate)
            if lp.region is not None:
                kept = self.region_gates.setdefault(lp.region, [])
                kept[:] = [gate for gate in kept if gate.store() is not None]
                kept.append(lp.gate)
        return gates

    def emptied(self, region: int, context: int) -> None:
        """The device holds nothing of ``region`` for the store at ``context``: its loops'
        filters there apply again (see :meth:`ArrivalGate.release`)."""
        for gate in self.region_gates.get(region, ()):
            if gate.context == context:
                gate.release()

    def arrive(
        self, lp: OffloadedLoop, caller: int, args: tuple[int, ...], context: int | None = None
    ) -> list[int]:
        """One call of loop ``lp``'s host function: ``args`` are its live-ins, then the current
        values of the locals it returns; the result is the flag (1: the loop ran here), then
        those locals' values after the loop. A decline may close the loop's gate in the
        calling instance (:class:`ArrivalGate`)."""
        if self.probing is not None:
            self._timed(lp)
        gate = lp.gate
        if gate is None or gate.context != context:
            results = self._arrive(lp, caller, args, context)
        else:
            gate.arrived()
            asked = time.perf_counter()
            self.arrival_seconds = 0.0
            results = self._arrive(lp, caller, args, context)
            if results[0]:
                gate.launched()
            else:
                gate.declined(lp.stats.last_declined, time.perf_counter() - asked, self.arrival_seconds)
        if results[0] and lp.region is not None:  # its data may now be resident: no loop of it skips the host
            for other in self.region_gates.get(lp.region, ()):
                other.reopen()
        if self.probing is not None and not self.probing[2]:  # wasmtime runs the loop from here
            self.probing = (*self.probing[:2], time.perf_counter())
        return results

    def _timed(self, lp: OffloadedLoop) -> None:
        """An arrival at ``lp`` ends the timing of the one left to wasmtime to time it where
        ``lp`` is that loop or one of the same function outside it: wasmtime's run of the
        loop (with whatever the loops inside it did: what declining it cost) lies between the
        two host calls. A loop inside it, or in another function, which the loop may call,
        may arrive while it runs: the timing goes on (PolyBench's heat-3d: the timed loop's
        inner loops arrive at once)."""
        probed, cpu, since = self.probing
        at, here = probed.insertion, lp.insertion
        outside = here.func_index == at.func_index and (here.start > at.end or here.end < at.start)
        if lp is not probed and not outside:
            return
        self.probing = None
        if since:
            probed.estimate.measured(time.perf_counter() - since, cpu)

    def _arrive(
        self, lp: OffloadedLoop, caller: int, args: tuple[int, ...], context: int | None
    ) -> list[int]:
        stats = lp.stats
        stats.arrivals += 1
        n_live = len(lp.plan.live_ins)
        self.declined_launch = None
        if self.mode == "off":
            stats.decline("offload is off")
            return [0, *args[n_live:]]
        memory = hostfunc.memory(caller, context=context)
        if memory is None:
            stats.decline("the module has no (unshared) linear memory")
            return [0, *args[n_live:]]
        base, size = memory
        live = args[:n_live]
        ready = self.guards(lp, live, size)
        if isinstance(ready, str):
            stats.decline(ready)
            return [0, *args[n_live:]]
        arrival = ready.arrival(lp, live)
        launch = ready.launch
        estimate = None
        if self.mode == "auto" and launch.trip:
            nbytes, pinned = self.transfer_estimate(lp, ready)
            declining = (
                self.decline_seconds(lp, ready) if lp.region is not None and self.decline_seconds else 0.0
            )
            go, why, model, cpu = lp.estimate.decide(
                self.device, ready.ops, nbytes, pinned, ready.cells, touched=ready.moved,
                serial_ops=ready.serial_ops, steps=ready.steps, declining=declining, probe=True,
            )
            self.arrival_seconds = cpu
            if why == PROBING:
                self.probing = (lp, cpu, 0.0)
            if go:
                self.gains.would_have(lp.kernel_index, cpu - model)
                not_yet = self._started(cpu - model, lp)
                partials = None
                if not_yet is not None:
                    go, why = False, not_yet
                    if self.prefetch is not None:  # ready when the device is (in this run or the next)
                        self.prefetch(lp)
                    if self.while_starting is not None:
                        partials = self.while_starting(lp, ready, arrival, base, size)
                elif self.while_starting is not None:
                    # Worth waiting for the context: unless the host's threads would be done
                    # sooner than the wait and the device's launch.
                    wait = self.startup_wait() if self.startup_wait is not None else 0.0
                    if wait > 0.0:
                        self.worth_waiting = True
                        beat = wait + model * lp.estimate.correction
                        partials = self.while_starting(lp, ready, arrival, base, size, beat)
                if partials is not None:  # ran on the host's threads meanwhile (no replay of it)
                    stats.offloaded += 1
                    stats.iterations += launch.trip
                    return [1, *arrival.live_outs(partials)]
            if not go:
                stats.decline(why)
                self.declined_launch = ready
                return [0, *args[n_live:]]
            estimate = (time.perf_counter(), model, cpu)
        if launch.trip == 0:  # a loop tested first that runs no iteration
            partials = ready.identities
        else:
            partials = self.run(lp, ready, arrival, base, size)
        if partials is None:
            return [0, *args[n_live:]]
        if estimate is not None:
            started, model, cpu = estimate
            took = time.perf_counter() - started
            if self.take_threads_seconds is not None:
                took -= self.take_threads_seconds()
            lp.estimate.record(took, model, cpu)
            self.gains.launched(lp.kernel_index, cpu - took)
        stats.offloaded += 1
        stats.iterations += launch.trip
        results = [1, *arrival.live_outs(partials)]
        if launch.trip and arrival.replay is not None and not ready.reductions:  # this launch replays
            if len(lp.again) >= ARRIVALS_KEPT:
                lp.again.clear()
            lp.again[live] = record_ = self.record_replay(ready, arrival, live, memory, results)
            record_.decision = estimate[1:] if estimate is not None else None
        return results

    def _started(self, gain: float, lp: OffloadedLoop | None = None) -> str | None:
        """Why a launch that would gain ``gain`` seconds waits for the device's start, or
        None where the device is started or may be now: the gains of the arrivals that
        would have paid for a launch (this one's included) reach what starting it still
        costs (``auto`` only; a rent-or-buy rule: a program loses at most the start-up's
        worth), and, where a thread is still making the CUDA context, this launch alone
        gains more than waiting for it costs (otherwise wasmtime runs the loop while the
        thread works). Once those gains reach :attr:`START_SHARE` of the start, the start
        begins. A context a thread is already making (begun at the command line's start,
        where the module launched last time, or by this rule) is no longer a cost to weigh:
        only the rest of the start is (device memory, page-locking), and the wait."""
        if lp is not None and self.startup_for is not None:  # (what this loop's first launch would pay)
            startup = self.startup_for(lp)
        else:
            startup = self.startup_seconds() if self.startup_seconds is not None else 0.0
        if not startup:
            return None
        self.banked += gain
        if time.perf_counter() - LOADED >= CONTEXT_SECONDS.get(self.device, 0.0):
            self.banked_late += gain
        begun = self.startup_wait() if self.startup_wait is not None else 0.0  # (before this arrival)
        if self.begin_start is not None and self.banked >= self.START_SHARE * startup:
            self.begin_start()
        if self.banked < startup - begun:
            return NOT_STARTED
        wait = self.startup_wait() if self.startup_wait is not None else 0.0
        return STARTING if gain < wait else None

    def start_would_pay(self) -> bool:
        """Whether a run of the same module that began the device's start with the program
        would launch (see :func:`runtime.known_gpu.remember_launches`): the gains of this
        run's arrivals that would have paid for a launch reached the whole start
        (:data:`runtime.profit.STARTUP_SECONDS`), or those of the arrivals that came once a
        context begun with the program would have been made reached :attr:`LATE_SHARE` of
        it (PolyBench's deriche: ~0.35 s of loops from ~0.15 s into the run gain less than
        the start, but a start begun with the program would be made for half of them); or a
        launch was worth waiting for the context being made, wherever it ran (the host's
        threads may have beaten the wait: deriche's launches all did on an H200 once its
        context was no longer begun with the program, 260 ms against 50 ms on the GPU)."""
        startup = STARTUP_SECONDS.get(self.device, 0.0)
        return startup > 0.0 and (
            self.worth_waiting or self.banked >= startup or self.banked_late >= self.LATE_SHARE * startup
        )

    def guards(self, lp: OffloadedLoop, live: tuple[int, ...], size: int) -> PreparedLaunch | str:
        """The launch the guards allow for these live-ins, made ready, or why they refuse it."""
        cache = self.guard_cache.get(lp.kernel_index)
        if cache is None:
            cache = self.guard_cache[lp.kernel_index] = {}
            read = guards.inputs(lp.plan)
            indices = [i for i, (_, sym, _, _) in enumerate(lp.plan.live_ins) if sym in read]
            self.guard_reads[lp.kernel_index] = operator.itemgetter(*indices) if indices else _nothing
        key = (self.guard_reads[lp.kernel_index](live), size)
        outcome = cache.get(key)
        if outcome is None:
            env = _environment(lp.plan, live)
            env = {sym: env[sym] for sym in guards.inputs(lp.plan) if sym in env}
            strict = self.device == "gpu"
            last = self.guards_passed.get(lp.kernel_index)
            try:
                # Where only live-ins that move addresses changed since the last launch they
                # allowed, that launch moved (a row pointer, a time step's element).
                launch = None
                if last is not None and last.size == size:
                    launch = guards.moved(lp.plan, env, size, last.launch, strict_alignment=strict)
                if launch is None:
                    outcome = PreparedLaunch(lp, guards.check(lp.plan, env, size, strict_alignment=strict), size)
                else:
                    outcome = last.moved_to(launch)
                self.guards_passed[lp.kernel_index] = outcome
            except guards.GuardFailed as exc:
                outcome = str(exc)
            if len(cache) >= self.GUARD_CACHE_ENTRIES:
                cache.clear()
            cache[key] = outcome
        return outcome


class PreparedLaunch:
    """A launch the guards allowed, kept with their outcome (per loop, the live-ins they read
    and the memory size), and what every launch of it needs that no arrival changes: the
    ranges to copy, the grid, the scratch layout. What the other live-ins change is a
    :class:`LaunchArguments`. The execution side keeps its own derived arguments here
    (``device_arguments``: a GPU launch's; ``host_arguments``: the host backend's)."""

    def __init__(self, lp: OffloadedLoop, launch: Launch, size: int) -> None:
        self.size = size
        self.moved = sum(r.hi - r.lo for r in launch.reads + launch.writes)
        self.ops = work(lp.plan, launch)
        self.cells = launch.trip * math.prod(launch.nest)  # iterations in parallel
        # A stepped loop: the ops its phases on one thread run, and its phases in all (a
        # grid-wide barrier after each); its grids have at most ``lanes`` threads.
        stepped = lp.plan.stepped
        if lp.plan.wave:  # its steps, each as long as its longest task (bounded by the largest)
            self.steps, self.serial_ops = wave_steps(lp.plan, launch)
        else:
            self.serial_ops = work(lp.plan, launch, lp.plan.serial_work) if stepped else 0
            self.steps = launch.trip * len(lp.plan.phases) if stepped else 0
        if stepped:
            self.cells = launch.lanes
        self.reductions = len(lp.plan.reductions)
        self.identities = identities(lp)
        self.grid, self.block = launch_grid(launch, lp.tile, self.reductions, lp.per_thread)
        # The scratch buffer: context | live-ins | reduction slots | written ranges, in u64s.
        self.out_words = self.identities or [0]
        self.out_at = abi.CTX_SLOTS + max(1, len(lp.plan.live_ins))
        self.back_slots = self.out_at + len(self.out_words)  # what comes back after a launch
        self.back_bytes = 8 * self.back_slots
        self._place(launch)

    def _place(self, launch: Launch) -> None:
        """What ``launch``'s ranges decide: the bytes it needs and writes, its copies, the
        scratch buffer's written ranges; and no arguments made for another launch."""
        self.launch = launch
        self.written = tuple(merged_spans(launch.writes))
        # Gathered loads may read anywhere: then the device gets all of memory.
        self.needed = (
            (Span(0, self.size),) if launch.gathers else tuple(merged_spans(launch.reads + launch.writes))
        )
        self.in_bytes = sum(r.hi - r.lo for r in self.needed)
        # What a launch outside a region copies in and out: columns and rows' tails by rows.
        self.copies_in, self.copies_out = copy_plan(launch, self.needed, self.written)
        self.copies_in_bytes = sum(copy_bytes(c) for c in self.copies_in)
        self.rows_out = any(c.__class__ is Rows for c in self.copies_out)
        self.token = next(_tokens)  # names it in the mirror's recorded launches
        self.out_bytes = sum(r.hi - r.lo for r in self.written)
        self.range_words = [v for r in self.written for v in (r.lo, r.hi)] or [0, 0]
        self.slots = self.back_slots + len(self.range_words)
        self.staged_at = 8 * self.slots
        self.device_arguments: tuple | None = None
        self.host_arguments: tuple | None = None
        self._arrivals: dict[tuple[int, ...], LaunchArguments] = {}

    def moved_to(self, launch: Launch) -> PreparedLaunch:
        """The same loop's launch with its ranges moved (:func:`runtime.guards.moved`): the
        same trip counts, grid and work as this one, its own ranges, copies and arguments."""
        found = object.__new__(PreparedLaunch)
        found.__dict__.update(self.__dict__)
        found._place(launch)
        return found

    def arrival(self, lp: OffloadedLoop, live: tuple[int, ...]) -> LaunchArguments:
        """The part of a launch that these live-ins make (kept for the last few of them)."""
        found = self._arrivals.get(live)
        if found is None:
            if len(self._arrivals) >= ARRIVALS_KEPT:
                self._arrivals.clear()
            found = self._arrivals[live] = LaunchArguments(lp, self.launch, live)
        return found


_tokens = itertools.count()

# Live-ins kept per PreparedLaunch: a time step's counter makes a new set every step.
ARRIVALS_KEPT = 16


class LaunchArguments:
    """What one arrival's live-ins add to a :class:`PreparedLaunch`: the kernel's parameters,
    and the returned locals: those known without running it (induction values at the exit)
    and, for each reduction's, where it goes, its slot, operator, initial value and type."""

    def __init__(self, lp: OffloadedLoop, launch: Launch, live: tuple[int, ...]) -> None:
        plan = lp.plan
        env = _environment(plan, live)
        bits = [v & MASKS[64] for v in live] or [0]
        self.param_bytes = words(bits)
        self.image = (None, b"")  # (kernel arguments, scratch image) of its last GPU launch
        self.launches = 0  # GPU launches with these live-ins by value (DeviceLaunches.launch)
        self.replay: tuple | None = None  # set by a device launch that can replay (ReplayRecord)
        self.params = (U64 * len(bits))(*bits)  # the host backend's
        k_exit = launch.trip if plan.trip.top else launch.trip - 1
        at_exit = dict(env)
        at_exit[plan.counter] = k_exit
        types = lp.insertion.local_types
        reductions = {id(r): i for i, r in enumerate(plan.reductions)}
        self.values, self.folds = [], []
        for live_out in returned(plan):
            ty = types[live_out.local]
            if live_out.kind == "affine":
                self.values.append(_to_host(live_out.value.evaluate(at_exit), ty))
            else:
                reduction = live_out.reduction
                init = reduction.init.evaluate(env)
                self.folds.append((len(self.values), reductions[id(reduction)], reduction.op, init, ty))
                self.values.append(0)

    def live_outs(self, partials: list[int]) -> list[int]:
        """The loop's returned locals after it ran, given its reductions' partial results."""
        out = list(self.values)
        for at, index, op, init, ty in self.folds:
            out[at] = _to_host(ReductionKind(op).fold_bits(init, partials[index], ty.bits), ty)
        return out


def _environment(plan: LoopPlan, live: tuple[int, ...]) -> dict:
    """The live-ins by symbol, as unsigned values of their types."""
    masks = plan.__dict__.get("_live_masks")
    if masks is None:
        masks = plan.__dict__["_live_masks"] = [
            (sym, MASKS.get(value.type.bits, MASKS[64])) for value, sym, _, _ in plan.live_ins
        ]
    return {sym: bits & mask for (sym, mask), bits in zip(masks, live, strict=True)}


def _nothing(live: tuple[int, ...]) -> tuple[()]:
    return ()


def words(values: list[int]) -> bytes:
    """``values`` as little-endian u64s."""
    return struct.pack(f"<{len(values)}Q", *values)


# Threads per block, and the grid's limit in y and z (x allows 2**31 - 1 blocks; the
# kernels stride over whatever the grid does not cover). A 1-D kernel's grid stops at
# 65535 blocks in x too: its threads then run more than one chunk each, which measured
# faster than a block per chunk (the suite's condmap at n = 2**26 on an H200, Nsight
# Compute: 180.4 us in 65535 blocks, 201.8 us in 131072).
BLOCK_THREADS = 256
MAX_GRID_Y = 65535
# Rows of threads in a block of a 2-D or 3-D nest's grid (y: the next counter out).
NEST_ROWS = 8
# Blocks of a 1-D kernel with reductions: one wave of resident blocks on an H100/H200 (132
# multiprocessors, 8 blocks of 256 threads each), every thread striding over the rest.
# Each block ends in a shuffle tree and one atomic per result; a block per 256 iterations
# (up to 65535 of them) queued that many atomics on each result slot, which cost more
# than the loads (the hand-written peer launches 8 blocks per multiprocessor).
REDUCTION_BLOCKS = 1024


def launch_grid(
    launch: Launch, tile: tuple[int, int, int, int] | None = None, reductions: int = 0, per_thread: int = 1
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Grid and block: 1-D over the iterations (a block per iteration for a distributed
    body; at most :data:`REDUCTION_BLOCKS` blocks where the kernel folds ``reductions``),
    or x over a nest's innermost counter (rounded to whole warps) and y over the next one
    out, in blocks of up to :data:`NEST_ROWS` rows of a warp, and z over the outermost of a
    3-D nest. A tiled kernel (``tile``: rows, columns, threads across, threads down; a 1-D
    kernel's tiles are one column wide) gets a block per tile; a 1-D kernel whose threads
    run ``per_thread`` iterations each (compiler.stream) that many times fewer blocks."""
    if launch.spread:  # a split loop: a thread per iteration of its widest phase (no more
        # blocks than can be resident at once: the device's launch caps them, resident_grid)
        blocks = -(-max(launch.lanes, 1) // BLOCK_THREADS)
        return (max(1, min(blocks, 65535)), 1, 1), (BLOCK_THREADS, 1, 1)
    if launch.rows:  # a distributed body: a block per iteration (per cell of a 3-D grid's outer two),
        # no more whole warps than its longest phase has grid iterations (a short z row's 16
        # vector steps leave the rest of a full block idle, and fewer blocks resident)
        threads = min(BLOCK_THREADS, 32 * -(-launch.lanes // 32)) if launch.lanes else BLOCK_THREADS
        return (max(1, min(launch.trip * math.prod(launch.nest), 65535)), 1, 1), (max(threads, 32), 1, 1)
    if tile is not None and len(launch.nest) <= 1:  # (a 1-D kernel's tiles: one column)
        rows, cols, threads_x, threads_y = tile
        tiles_x, tiles_y = -(-(launch.nest or (1,))[0] // cols), -(-launch.trip // rows)
        return (max(1, min(tiles_x, 65535)), max(1, min(tiles_y, MAX_GRID_Y)), 1), (threads_x, threads_y, 1)
    if not launch.nest:
        most = REDUCTION_BLOCKS if reductions else 65535
        blocks = -(-launch.trip // (BLOCK_THREADS * per_thread))
        return (max(1, min(blocks, most)), 1, 1), (BLOCK_THREADS, 1, 1)
    *outer, innermost = (launch.trip, *launch.nest)
    # Up to NEST_ROWS rows of a warp each (32 x 8, nvcc's stencils' block): a row's
    # neighbours above and below are then mostly in the block's own L1 lines, and a row of
    # 382 cells leaves 2 threads of 384 idle, not 130 of 512 (two blocks of 256).
    rows = 1 << (min(max(outer[-1], 1), NEST_ROWS) - 1).bit_length()
    width = min(BLOCK_THREADS // rows, 32 * -(-innermost // 32))
    y = min(-(-outer[-1] // rows), MAX_GRID_Y)
    z = min(outer[0], MAX_GRID_Y) if len(outer) == 2 else 1
    return (min(-(-innermost // width), 65535), y, z), (width, rows, 1)


def identities(lp: OffloadedLoop) -> list[int]:
    """The identity of each of the loop's reductions, as bits."""
    return [ReductionKind(r.op).identity(r.arg.type.bits) for r in lp.plan.reductions]


def _to_host(bits: int, ty: Type) -> int:
    """A bit pattern as wasmtime-py wants an i32/i64 result: a signed Python int."""
    width = 64 if ty.bits == 64 else 32
    bits &= MASKS[width]
    return bits - (1 << width) if bits >> (width - 1) else bits


def trap_reason(code: int) -> str:
    """Why an arrival declined after its kernel wrote trap ``code``."""
    from tensorwasm.compiler.traps import TrapKind, trap_message

    if code == TrapKind.GATHER_CONFLICT:
        return "a gathered load read memory the loop writes; the loop re-ran on the CPU"
    return f"the kernel trapped ({trap_message(code)}); the loop re-ran on the CPU"


# Past this many separate written spans, merged_spans copies back one covering them all.
MERGED_SPANS = 128


def copy_plan(launch: Launch, needed: tuple[Span, ...], written: tuple[Span, ...]) -> tuple[tuple, tuple]:
    """What a launch outside a device-resident region copies in and back: ``needed`` and
    ``written``, except that an access whose elements lie in rows filling at most half of
    its range (a column of a row-major matrix, the tails of its rows: :func:`access_rows`)
    is copied as those rows, both ways where it is written. Each access is copied back as
    it was copied in, so no byte goes back that did not come in; and where the other
    written ranges would be merged into one covering span (past :data:`MERGED_SPANS`), which
    could cover bytes between rows that never came in, nothing is copied by rows."""
    if launch.gathers or not launch.trip:
        return needed, written
    rows = {id(r): access_rows(r, launch.trip) for r in launch.reads + launch.writes}
    if not any(rows.values()):
        return needed, written
    plain_out = union([(r.lo, r.hi) for r in launch.writes if rows[id(r)] is None], [])
    if len(plain_out) > MERGED_SPANS:
        return needed, written
    plain_in = merged_spans([r for r in launch.reads + launch.writes if rows[id(r)] is None])
    rows_in = dict.fromkeys(rows[id(r)] for r in launch.reads + launch.writes if rows[id(r)] is not None)
    rows_out = dict.fromkeys(rows[id(r)] for r in launch.writes if rows[id(r)] is not None)
    return (*plain_in, *rows_in), (*(Span(lo, hi) for lo, hi in plain_out), *rows_out)


def access_rows(r: Range, trip: int) -> Rows | None:
    """The rows that hold every element an access touches over a launch of ``trip``
    iterations, where its footprint moves along one inner loop (``r.lattice``: a row's
    pitch and their count) and the rows, each as wide as the launched loop's iterations
    reach, fill at most half of its range and lie inside it; else None."""
    if r.nest_strides or len(r.lattice) != 1 or not r.element:
        return None
    pitch, count = r.lattice[0]
    width = abs(r.stride) * (trip - 1) + r.element
    if pitch <= 0 or count < 2 or width >= pitch:
        return None
    rows = Rows(r.origin + min(0, r.stride * (trip - 1)), width, pitch, count)
    if rows.lo < r.lo or rows.hi > r.hi or 2 * rows.nbytes > r.hi - r.lo:
        return None
    return rows


def copy_bytes(copy: Span | Rows) -> int:
    return copy.nbytes if copy.__class__ is Rows else copy.hi - copy.lo


def merged_spans(ranges) -> list[Span]:
    """Sorted, coalesced byte ranges (one covering span past 128 of them)."""
    merged = union([(r.lo, r.hi) for r in ranges], [])
    if len(merged) > MERGED_SPANS:
        merged = [(merged[0][0], merged[-1][1])]
    return [Span(lo, hi) for lo, hi in merged]
