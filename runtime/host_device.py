"""The host backend as a device: loop kernels compiled for this CPU, run in linear memory.

Where there is no GPU (tests, CI, laptops) an offloaded loop's kernel is the same LLVM IR
compiled for the host, run in wasmtime's linear memory itself: no copies. A launch with
enough iterations is cut into ranges run on host threads (the native code releases the
GIL), each folding its reductions into its own slots. A kernel that traps leaves memory as
it was: the ranges the loop writes are saved before the launch and restored after a trap,
and wasmtime runs the loop (to its trap, if any).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from tensorwasm.compiler.analysis.plan import ReductionKind
from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.target import HostTarget
from tensorwasm.runtime.planning import identities, trap_reason

if TYPE_CHECKING:
    from tensorwasm.runtime.guards import Launch
    from tensorwasm.runtime.planning import LaunchArguments, OffloadedLoop, PreparedLaunch

U64 = ctypes.c_uint64
CPUS = os.cpu_count() or 1
LAUNCH_THREADS = "tensorwasm-host"  # the names of the launches' threads begin so


class LaunchThreads:
    """The threads host launches run on, shared by the process's modules: one per processor
    but the one of the launching thread, which runs ranges too.

    A launch's ranges are taken in turn by the threads it wakes and by the launching thread
    itself, each taking the next range as it comes free. It is a queue and a few locks, not
    :mod:`concurrent.futures`: importing that (with :mod:`logging`, which it needs) took 9 to
    13 ms of a run's first host launch, holding Python's lock; PolyBench's matrix-vector
    programs run their kernels in less."""

    def __init__(self, count: int) -> None:
        import queue

        self.count = count  # the threads wanted
        self.threads: list[threading.Thread] = []
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the threads not started yet (those the process may start)."""
        with self._lock:
            while len(self.threads) < self.count:
                thread = threading.Thread(
                    target=self._serve, name=f"{LAUNCH_THREADS}-{len(self.threads)}", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError:  # the process may start no more threads: the launches make do
                    self.count = len(self.threads)
                    break
                self.threads.append(thread)

    def _serve(self) -> None:
        while True:
            self._tasks.get().work()

    def run(self, fn, calls: list[tuple]) -> None:
        """``fn(*args)`` for each of ``calls``, on the threads and this one, in no set order;
        returns once all have returned (the first exception raised again)."""
        batch = _Batch(fn, calls)
        for _ in range(min(len(self.threads), len(calls) - 1)):
            self._tasks.put(batch)
        batch.work()
        batch.done.wait()
        if batch.error is not None:
            raise batch.error


class _Batch:
    """One launch's calls, taken one at a time by whichever thread asks next."""

    def __init__(self, fn, calls: list[tuple]) -> None:
        self.fn, self.calls = fn, calls
        self.taken = 0
        self.left = len(calls)
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.done = threading.Event()
        if not calls:
            self.done.set()

    def work(self) -> None:
        while True:
            with self.lock:
                index = self.taken
                if index >= len(self.calls):
                    return
                self.taken += 1
            try:
                self.fn(*self.calls[index])
            except BaseException as exc:  # (raised again on the launching thread)
                self.error = self.error or exc
            with self.lock:
                self.left -= 1
                if not self.left:
                    self.done.set()


# The launches' threads: made on the first need, or beforehand by warm_launch_threads.
_POOL: LaunchThreads | None = None
_POOL_LOCK = threading.Lock()
_WARMING: threading.Thread | None = None


def launch_threads() -> LaunchThreads:
    """The host threads launches run on (started by :func:`warm_launch_threads`)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = LaunchThreads(CPUS - 1)
        return _POOL


def warm_launch_threads(wait: bool = False) -> None:
    """Start the launch threads on a thread of its own, before a launch needs them: a
    thread's start waits for the new thread to take the interpreter lock, which the run's
    other threads (compile workers, the CUDA context's start) hold for milliseconds at a
    time; a launch that started its 16 threads itself took 10 to 25 ms on the H100
    machine's host, for ~2 ms of work. Once per process; nothing where one processor runs
    all. ``wait``: return once they are started (begun now if need be)."""
    global _WARMING
    with _POOL_LOCK:
        warming, begin = _WARMING, _WARMING is None and CPUS > 1
        if begin:
            warming = _WARMING = threading.Thread(target=_start_all, name=f"{LAUNCH_THREADS}-start")
            warming.daemon = True
    if begin:
        warming.start()
    if wait and warming is not None:
        warming.join()


def _start_all() -> None:
    """Have every launch thread started."""
    launch_threads().start()


class HostDevice:
    """The host backend: kernels compiled for this CPU, on host threads."""

    kind = "cpu"
    code = "cpu"
    label = "cpu"
    pin = False

    def target(self) -> HostTarget:
        return HostTarget()

    def load_kernels(self, unit: Any) -> dict[str, Any]:
        """The loop entries of one kernel's host object code (a
        :class:`~runtime.loop_kernels.KernelUnit`, JIT-loaded once)."""
        if unit.code is None:
            unit.code = HostTarget().jit(None, unit.host_object)
        entries = {}
        for lp in unit.loops:
            entry = host_entry_type(lp)(unit.code.address(lp.entry))
            # and the entry of a split loop's phases, which the threads share in turn
            if lp.plan.fission and not lp.plan.stepped:
                entry.phase = PHASE_ENTRY(unit.code.address(abi.phase_entry_name(lp.kernel_index)))
            entries[lp.entry] = entry
        return entries

    def runner(self, prepared: Any) -> HostLaunches:
        return HostLaunches(prepared)

    def close(self) -> None:
        pass


# ``(ctx, params, phase, lo, hi, trip, out)``: see ``compiler.lower.phases``.
PHASE_ENTRY = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_void_p, *(ctypes.c_int64,) * 4, ctypes.c_void_p
)


def host_entry_type(lp: OffloadedLoop):
    """``(ctx, params, begin, end, [trip2, [trip3,]] out)``: see ``lower_loop_entry``."""
    counts = (ctypes.c_int64,) * (2 + len(lp.plan.collapse))
    return ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, *counts, ctypes.c_void_p)


class HostLaunches:
    """The launches of one offloaded module on the host backend."""

    # Iterations below which one host thread does the whole loop (a thread costs ~50 us)...
    THREAD_MIN_ITERATIONS = 8_192
    # ... unless each iteration runs an inner loop: wasmtime's estimated seconds for the whole
    # launch (its ops at the calibrated pace) per thread at least (PolyBench's deriche: 2,160
    # columns of a 4,096-step recurrence ran on one thread, 35 ms where wasmtime takes ~25).
    THREAD_MIN_SECONDS = 100e-6

    def __init__(self, prepared: Any) -> None:
        self.prepared = prepared
        # What a launch waited for its threads to start (once per process, where no run began
        # them early): the process's start, not the launch's cost (see take_threads_seconds).
        self.threads_seconds = 0.0
        self.started = False  # a launch ran (LLVM's JIT is loaded): see startup_seconds
        self.begun_early = False  # kernels are loading since the run began (runtime.known_host)
        self.replays = None  # launches in place leave nothing to replay

    def startup_seconds(self) -> float:
        """What the first launch pays before it runs: loading LLVM's JIT and the first host
        threads (see :data:`runtime.profit.STARTUP_SECONDS`); nothing once one launch ran, or
        where the kernels the last run launched are loading since this one began (their
        launches wait for what is left of it)."""
        from tensorwasm.runtime.profit import STARTUP_SECONDS

        return 0.0 if self.started or self.begun_early else STARTUP_SECONDS["cpu"]

    def startup_for(self, lp: OffloadedLoop) -> float:
        """:meth:`startup_seconds` for a launch of ``lp``: only the first host threads and a
        shared library where ``lp``'s kernel has one in the code cache."""
        from tensorwasm.runtime.profit import LIBRARY_START_SECONDS

        startup = self.startup_seconds()
        cheaply = getattr(self.prepared, "kernels_load_cheaply", None)
        if startup and cheaply is not None and cheaply(lp):
            return LIBRARY_START_SECONDS
        return startup

    def take_threads_seconds(self) -> float:
        """What launches waited for their threads to start since the last call: a launch's
        measure leaves it out."""
        seconds, self.threads_seconds = self.threads_seconds, 0.0
        return seconds

    def transfer_estimate(self, lp: OffloadedLoop, ready: PreparedLaunch) -> tuple[int, bool]:
        return 0, False  # nothing is copied

    def record_replay(self, ready, arrival, live, memory, results) -> None:
        raise AssertionError("a launch in linear memory is never recorded for replay")

    def flush(self, caller: int, k: int, footprint: PreparedLaunch | None = None) -> bool:
        """A region's results are in linear memory already."""
        return False

    def close(self) -> None:
        pass

    def run(
        self, lp: OffloadedLoop, ready: PreparedLaunch, arrival: LaunchArguments, base: int, size: int
    ) -> list[int] | None:
        """Run the launch in linear memory; the reductions' partial results, or None where
        the kernel trapped (memory restored, the arrival declined)."""
        self.started = True
        stats = lp.stats
        launch = ready.launch
        params = arrival.params
        ctx_image, chunks = self.host_arguments(ready)
        ctx = abi.ContextBlock.from_buffer_copy(ctx_image)
        ctx[abi.CTX_MEM_BASE] = base
        saved = self._undo_copy(lp, ready, base)
        if saved is None:
            return None
        start = time.perf_counter()
        if len(chunks) > 1:
            warm_launch_threads(wait=True)
            self.threads_seconds += time.perf_counter() - start
            start = time.perf_counter()
        if launch.spread and len(chunks) > 1:
            out = self._run_phases(lp, launch, ctx, params)
            stats.threads = max(stats.threads, CPUS)
        elif len(chunks) == 1:
            out = (U64 * len(ready.out_words))(*ready.out_words)
            self.prepared.kernels[lp.entry](
                ctypes.addressof(ctx), ctypes.addressof(params), 0, launch.trip, *launch.nest,
                ctypes.addressof(out),
            )  # fmt: skip
        else:
            out = self._run_threads(lp, launch, ctx, params, chunks)
            stats.threads = max(stats.threads, min(len(chunks), CPUS))
        stats.kernel_seconds += time.perf_counter() - start
        if ctx[abi.CTX_TRAP]:
            for lo, raw in saved:  # undo, and let wasmtime run the loop (to its trap, if any)
                ctypes.memmove(base + lo, (ctypes.c_char * len(raw)).from_buffer(raw), len(raw))
            stats.decline(trap_reason(ctx[abi.CTX_TRAP]))
            return None
        return out[: ready.reductions]

    # The most bytes a launch whose kernel may trap keeps to undo it: a larger one stays on
    # wasmtime (copying it costs what running it there would, and doubles the memory).
    UNDO_LIMIT = 64 << 20

    def _undo_copy(self, lp: OffloadedLoop, ready: PreparedLaunch, base: int) -> list | None:
        """What the launch may overwrite, kept to undo a trap: nothing where the kernel
        cannot trap; None (the arrival declined) where it may and writes too much."""
        if not lp.may_trap:
            return []
        if ready.out_bytes > self.UNDO_LIMIT:
            lp.stats.decline(
                f"the kernel may trap and writes {ready.out_bytes >> 20} MiB, more than the host backend "
                f"keeps to undo a trap ({self.UNDO_LIMIT >> 20} MiB)"
            )
            return None
        saved = []
        for span in ready.written:
            raw = bytearray(span.hi - span.lo)
            ctypes.memmove((ctypes.c_char * len(raw)).from_buffer(raw), base + span.lo, len(raw))
            saved.append((span.lo, raw))
        return saved

    def host_arguments(self, ready: PreparedLaunch) -> tuple[bytes, list[tuple[int, int]]]:
        """The context's image (all but the memory base) and the iteration ranges of the host
        threads (kept on ``ready``)."""
        if ready.host_arguments is None:
            spans = (U64 * len(ready.range_words))(*ready.range_words)  # the context points at it
            ctx = abi.context_block(
                memory_size=ready.size, memory_capacity=ready.size, max_pages=ready.size // abi.PAGE_SIZE,
                written_at=ctypes.addressof(spans), written_count=len(ready.written),
            )  # fmt: skip
            # (a split loop's threads, where there are several, share each phase: _run_phases;
            # a stepped loop's iterations run in order, on one thread)
            launch = ready.launch
            chunks = (
                [(0, launch.trip)]
                if ready.steps
                else self.chunks(launch.trip, math.prod(launch.nest), ready.ops)
            )
            ready.host_arguments = (bytes(ctx), chunks, spans)
        image, chunks, _ = ready.host_arguments
        return image, chunks

    # Ranges per thread that a launch with the work for them is cut into, taken by the threads
    # as they come free: a triangular nest's rows differ in length (syrk's row i has i + 1
    # cells), and equal ranges left one thread the longest rows (PolyBench LARGE syr2k 0.71
    # to 0.81 s on the CPU machine's two threads, 0.54 s in four ranges a thread).
    RANGES_PER_THREAD = 4

    def chunks(self, trip: int, per_iteration: int = 1, ops: int = 0) -> list[tuple[int, int]]:
        """The iteration ranges a launch of ``trip`` iterations (each of ``per_iteration``
        grid cells), running ``ops`` dialect ops in all, is cut into for the host threads:
        one per thread, or up to :data:`RANGES_PER_THREAD` where each still has
        :data:`THREAD_MIN_SECONDS` of work."""
        from tensorwasm.runtime.profit import cpu_seconds_per_op

        by_work = int(ops * cpu_seconds_per_op() / self.THREAD_MIN_SECONDS) if ops else 0
        threads = min(CPUS, trip, max(1, trip * per_iteration // self.THREAD_MIN_ITERATIONS, by_work))
        ranges = min(trip, threads * self.RANGES_PER_THREAD, max(threads, by_work)) if threads > 1 else 1
        step = -(-trip // ranges)
        return [(lo, min(lo + step, trip)) for lo in range(0, trip, step)]

    def _run_phases(self, lp: OffloadedLoop, launch: Launch, ctx, params) -> ctypes.Array:
        """A split loop's phases in turn, each shared by the host's threads in ranges of its
        own threads (iterations of the loop where it runs whole, else of its grid loop)."""
        phase_entry = self.prepared.kernels[lp.entry].phase
        out = (U64 * 1)()
        at, state, result = ctypes.addressof(ctx), ctypes.addressof(params), ctypes.addressof(out)
        for n, phase in enumerate(lp.plan.phases):
            lanes = launch.trip if phase.whole else launch.inner.get(phase.counter, 0)
            if not lanes:
                continue
            # A range a thread: the longer its part of a row, the better.
            step = -(-lanes // min(lanes, CPUS))
            calls = [
                (at, state, n, lo, min(lo + step, lanes), launch.trip, result) for lo in range(0, lanes, step)
            ]
            launch_threads().run(phase_entry, calls)
        return out

    def _run_threads(self, lp: OffloadedLoop, launch: Launch, ctx, params, chunks) -> ctypes.Array:
        """Run iteration ranges on host threads (the native code releases the GIL), each
        folding its reductions into its own slots; then fold the slots together."""
        count = max(1, len(lp.plan.reductions))
        outs = [(U64 * count)(*identities(lp)) for _ in chunks]
        entry = self.prepared.kernels[lp.entry]
        at, state = ctypes.addressof(ctx), ctypes.addressof(params)
        calls = [
            (at, state, lo, hi, *launch.nest, ctypes.addressof(o))
            for (lo, hi), o in zip(chunks, outs, strict=True)
        ]
        launch_threads().run(entry, calls)
        total = (U64 * count)(*identities(lp))
        for i, r in enumerate(lp.plan.reductions):
            for o in outs:
                total[i] = ReductionKind(r.op).fold_bits(total[i], o[i], r.arg.type.bits)
        return total
