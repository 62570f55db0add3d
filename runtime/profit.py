"""Whether a launch pays: estimated CPU time against estimated (then measured) device time.

The CPU side is calibrated once per process: wasmtime runs a small loop whose ops the
loop analysis counts, giving seconds per dialect op. A loop's work at an arrival is its
ops per iteration times the iteration counts (inner loops' included), known from the
guards. The device side starts from a model (a fixed cost per launch, the bytes copied at
bus speed, the work at a fraction of the CPU's cost per op) and is corrected per loop by
what its launches really took; a loop whose launches ran slower than the CPU estimate
twice in a row goes back to the CPU, and is tried on the device again now and then.

The CPU estimate is a model too, and one loop may run faster on wasmtime than the
calibration loop's pace says (jacobi-2d's stencil at PolyBench MEDIUM on a 2-core machine:
~48 us an arrival, where the estimate was above the 72 us its host launches took, so all
200 launched and the kernel ran 1.8x slower than on wasmtime). Where a loop's measured
launches gain less than :data:`PROBE_MARGIN` over that estimate, one of its arrivals is left
to wasmtime (:data:`PROBING`) and timed up to the next arrival of a loop outside it
(runtime.planning): an upper bound on wasmtime's time for it, which the estimate takes
where it is the lower (:meth:`Estimate.measured`).
"""

from __future__ import annotations

import functools
import os
import time
from typing import TYPE_CHECKING

from tensorwasm.support.records import record

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.plan import LoopPlan
    from tensorwasm.runtime.guards import Launch

# Device model before any measurement: fixed seconds per launch (driver launch, copies of
# the launch arguments, synchronisation, Python: 32 to 38 us per offloaded call on the H100) and
# the share of a CPU op's time one op takes there (many threads in parallel: on the host, one
# thread per core, counted up to eight, as memory-bound loops scale no further; a measured
# launch corrects it, see Estimate).
FIXED_SECONDS = {"gpu": 60e-6, "cpu": 40e-6}
OP_SHARE = {"gpu": 0.002, "cpu": 1 / max(2, min(8, os.cpu_count() or 1))}
# How much slower than wasmtime one device thread runs the ops it runs in sequence (an
# iteration's own, its inner loops' included): a launch takes at least that long, however
# many threads it has. A GPU thread runs dependent scalar code at a third of the clock and
# without a CPU core's out-of-order issue.
THREAD_SLOWDOWN = {"gpu": 8.0, "cpu": 1.0}
# A grid-wide barrier (a stepped loop waits at one after each phase of each iteration).
BARRIER_SECONDS = 5e-6
# Bytes per second between linear memory and the device: page-locked linear memory copies
# at ~55 GB/s each way on the H100 (and page-locking it runs at ~21 GB/s, once), pageable
# memory at 9 to 13 GB/s. A little below what was measured.
COPY_BYTES_PER_SECOND = {"pinned": 45e9, "pageable": 8e9}
# A device's start, paid once at its first launch: on a GPU the CUDA context, device memory
# and page-locking linear memory (PolyBench MEDIUM on an H200: loops whose kernels take
# 0.2 to 1 ms on wasmtime took 210 to 240 ms at their first launch; on an H100 the context
# took 0.30 to 0.31 s, cuda-python's import included, and the rest ~0.01 s). In ``auto`` no launch
# starts the device until the arrivals that would have paid for a launch add up to a
# gain this large (see runtime.planning): a program too small for the GPU never starts it.
# The host backend's start is loading LLVM's JIT (llvmlite: 25 to 55 ms on a 2-core
# Xeon) with the first kernel's object code, and the first host threads: PolyBench MEDIUM's
# memset launched on it at 40 ms where wasmtime takes well under one.
STARTUP_SECONDS = {"gpu": 0.33, "cpu": 0.04}
# The host backend's start where the kernel's shared library is in the code cache
# (compiler.target.shared): the library loads in well under a millisecond, without LLVM, and
# the first host threads start.
LIBRARY_START_SECONDS = 0.002
# Of a GPU's start, the CUDA context's part: made on a thread of its own as soon as a run
# may launch (runtime.gpu_start), so that only what is left of it is charged, and an
# arrival does not wait for it unless its own gain is larger than the wait (see
# runtime.planning's STARTING).
CONTEXT_SECONDS = {"gpu": 0.3}
# wasmtime's pace through more data than the processor's caches hold: a loop streaming
# over it waits for memory, whatever its op count. clang's SIMD build of the suite's saxpy
# (13 ops per 4 elements) streams 805 MB a pass at n=67M in 60 ms on the H100's host
# (13 GB/s) where its ops estimate 18 ms, below the 18 ms of copies, so its arrivals all
# declined while the scalar build's (10 ops an element) launched. Above CPU_CACHE_BYTES of
# loads and stores an arrival's CPU time is at least its bytes at this pace (a little
# above what was measured, as the copy rates are a little below).
CPU_STREAM_BYTES_PER_SECOND = 16e9
CPU_CACHE_BYTES = 64 << 20
SLOWER_LIMIT = 2  # launches slower than the CPU estimate, in a row, before going back
# A loop whose last launch gained less than this over the CPU estimate has one arrival
# timed on wasmtime (once): a model off by that much would turn the gain into a loss. Not
# before its launches number PROBE_AFTER: the arrival timed costs at most its share of the
# loop's gain (a loop that arrives a few times gains or loses little either way).
PROBE_MARGIN = 3.0
PROBE_AFTER = 4
# Why an arrival runs on wasmtime while the launches pay by the model: to time it there.
PROBING = "timed on wasmtime, to check the CPU estimate"
RETRY_EVERY = 64  # arrivals on the CPU between retries on the device
RATIOS_KEPT = 3  # launches whose measured / modelled time the correction takes the median of

CALIBRATION_WAT = """(module (memory (export "memory") 48)
  (func (export "run") (param $n i32) (result i32) (local $i i32) (local $acc i32)
    (loop $l
      (i32.store (i32.shl (local.get $i) (i32.const 2))
        (i32.add (i32.mul (local.get $i) (i32.const 3)) (local.get $n)))
      (local.set $acc (i32.xor (local.get $acc)
        (i32.load offset=0x100000 (i32.shl (local.get $i) (i32.const 3)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $acc)))"""


# Processes whose calibrations are kept (the fastest counts: a process measuring while the
# machine is busy reads slow), after which later processes measure no more.
CALIBRATIONS_KEPT = 3


@functools.cache
def cpu_seconds_per_op() -> float:
    """wasmtime's seconds per dialect op on this machine: measured on the calibration loop
    by the first few processes, and kept in the cache for later ones (keyed by the
    processor, wasmtime's library and the compiler, whose analysis counts the ops)."""
    import json
    import os

    import wasmtime

    from tensorwasm.compiler.target import HostTarget, describe
    from tensorwasm.runtime.cache import default_cache, make_key

    try:
        library = os.stat(wasmtime._ffi.dll._name)
        build = (library.st_size, library.st_mtime_ns)
    except (AttributeError, OSError):  # another wasmtime-py layout: its package then
        build = (os.path.dirname(wasmtime.__file__),)
    key = make_key("calibration", CALIBRATION_WAT, describe(HostTarget()), *build)
    cache = default_cache()
    kept = {"ops": 0, "seconds_per_op": []}
    blob = cache.get("calibration", key)
    if blob is not None:
        try:
            kept = json.loads(blob)
            kept["seconds_per_op"] = [float(x) for x in kept["seconds_per_op"]]
            kept["ops"] = int(kept["ops"])
        except (ValueError, TypeError, KeyError):
            cache.drop("calibration", key)
            kept = {"ops": 0, "seconds_per_op": []}
    if len(kept["seconds_per_op"]) < CALIBRATIONS_KEPT:
        kept["ops"] = kept["ops"] or _calibration_ops()  # counted once: it needs the frontend
        kept["seconds_per_op"].append(_measure_seconds_per_op(kept["ops"]))
        cache.put("calibration", key, json.dumps(kept).encode())
    return min(kept["seconds_per_op"])


def _calibration_ops() -> int:
    """Dialect ops per iteration of the calibration loop, as the loop analysis counts them."""
    import wasmtime

    from tensorwasm.compiler.analysis.loops import analyze_module
    from tensorwasm.compiler.frontend import load, translate_module

    (report,) = analyze_module(translate_module(load(bytes(wasmtime.wat2wasm(CALIBRATION_WAT)))))
    return sum(n for n, _ in report.plan.work)


def _measure_seconds_per_op(ops: int) -> float:
    """wasmtime's time per iteration of the calibration loop (the best of three runs) / ops."""
    import wasmtime

    store = wasmtime.Store()
    module = wasmtime.Module(store.engine, wasmtime.wat2wasm(CALIBRATION_WAT))
    run = wasmtime.Instance(store, module, []).exports(store)["run"]
    iterations = 200_000
    run(store, 1000)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        run(store, iterations)
        best = min(best, time.perf_counter() - start)
    return best / (iterations * ops)


def region_decline_seconds(touched: int) -> float:
    """What wasmtime's run of a loop inside a device-resident region costs beyond its own
    time while the device holds the region's results or has work queued: a wait for the
    work queued (the host idles while it runs, where it would have gone on), the dirty bytes
    among the ``touched`` ones copied back (a round trip), then those it writes copied in
    again at the region's next launch (a second): a launch's fixed cost each, and at most
    the ``touched`` bytes both ways. PolyBench's fdtd-2d sets one row of ``ey`` in Wasm at
    each of its 500 time steps (1,200 iterations, well under a launch's fixed cost): each
    decline waited for the step's three queued kernels and copied the row both ways."""
    return 3 * FIXED_SECONDS["gpu"] + 2 * touched / COPY_BYTES_PER_SECOND["pinned"]


def work(plan: LoopPlan, launch: Launch, entries: list | None = None) -> int:
    """Dialect ops the arrival runs: per-iteration ops times the loops' trip counts (of
    ``entries``: a part of ``plan.work``)."""
    inner = launch.inner or {}
    per_iteration = 0
    for ops, around in plan.work if entries is None else entries:
        for counter in around:
            ops *= inner.get(counter, 1)
        per_iteration += ops
    return per_iteration * launch.trip


def wave_steps(plan: LoopPlan, launch: Launch) -> tuple[int, int]:
    """A wavefront's steps (:attr:`LoopPlan.wave`: ``w = m * k + t + c``, ``t`` up to its grid
    loop's largest count) and the ops of its critical path: every step as long as the
    longest task any phase may have (inner loops at their largest counts)."""
    inner = launch.inner or {}
    last = launch.trip - 1
    steps = 1 + max(
        m * last + c + inner.get(p.counter, 1) for p, (m, c) in zip(plan.phases, plan.wave, strict=True)
    )
    task = max(work(plan, launch, list(entries)) // max(1, launch.trip) for entries in plan.task_work)
    return steps, steps * task


@record
class Estimate:
    """The adaptive part of one loop's decision."""

    correction: float = 1.0  # measured device time / modelled, smoothed
    slower: int = 0  # launches in a row slower than the CPU estimate
    parked: int = 0  # arrivals since it went back to the CPU
    launches: int = 0
    ratios: tuple[float, ...] = ()  # the last RATIOS_KEPT launches' measured / modelled
    gain: float = 0.0  # the CPU estimate / the last launch's measured time
    # wasmtime's measured time for the loop (an upper bound) / the CPU estimate, once timed
    cpu_scale: float = 1.0
    probed: bool = False  # an arrival was left to wasmtime to time it

    def decide(
        self, device: str, ops: int, nbytes: int, pinned: bool = True, iterations: int = 1 << 62,
        touched: int = 0, serial_ops: int = 0, steps: int = 0, declining: float = 0.0,
        probe: bool = False,
    ) -> tuple[bool, str, float, float]:  # fmt: skip
        """(offload?, reason if not, modelled device seconds, estimated CPU seconds) for an
        arrival running ``ops`` dialect ops (:func:`work`) over ``iterations`` parallel
        iterations (grid cells), copying ``nbytes`` (from page-locked linear memory when
        ``pinned``), its loads and stores covering ``touched`` bytes. A stepped loop
        (``steps`` phases in all, each followed by a grid-wide barrier) runs ``serial_ops``
        of them on one thread, the rest over at most ``iterations`` threads at a time.
        ``declining``: what running the arrival on wasmtime costs beyond its own time (inside
        a device-resident region, the device's results brought back: see
        :func:`region_decline_seconds`), counted in its CPU seconds. ``probe``: the caller
        can time an arrival left to wasmtime (:data:`PROBING`, see :meth:`measured`)."""
        per_op = cpu_seconds_per_op()
        cpu = ops * per_op
        if touched > CPU_CACHE_BYTES:  # streaming from memory on the CPU too
            cpu = max(cpu, touched / CPU_STREAM_BYTES_PER_SECOND)
        cpu = cpu * min(1.0, self.cpu_scale) + declining
        copies = nbytes / COPY_BYTES_PER_SECOND["pinned" if pinned else "pageable"] if nbytes else 0.0
        spread = ops * per_op * OP_SHARE[device]
        serial = ops / max(1, iterations) * per_op * THREAD_SLOWDOWN[device]
        if steps:
            alone = serial_ops + (ops - serial_ops) / max(1, iterations)
            serial = alone * per_op * THREAD_SLOWDOWN[device] + steps * BARRIER_SECONDS
        model = FIXED_SECONDS[device] + copies + max(spread, serial)
        pays = model * self.correction < cpu
        if self.launches >= 2 and (not pays or self.slower >= SLOWER_LIMIT):
            # Measured: the device is slower for this loop. Stay on the CPU, retrying now and then.
            self.parked += 1
            if self.parked % RETRY_EVERY:
                return False, "its launches ran slower than the CPU would", model, cpu
            return True, "", model, cpu
        settled = self.probed or declining or self.gain >= PROBE_MARGIN
        if probe and self.launches >= PROBE_AFTER and not settled:
            self.probed = True  # (once, whether or not the caller's timing ends in a measure)
            return False, PROBING, model, cpu
        if not pays:
            if serial > spread and FIXED_SECONDS[device] + copies + spread < cpu:
                return False, "too few iterations to spread the work over the device's threads", model, cpu
            return False, "too little work to pay for a launch", model, cpu
        self.parked = 0
        return True, "", model, cpu

    def record(self, measured: float, model: float, cpu: float) -> None:
        """Fold in what a launch really took (not the first: it pays for warming up, e.g. the
        first touch of device memory or of the host threads): the median of the last
        RATIOS_KEPT launches' measured / modelled times (the lower middle of two), so that
        one launch that stalled does not send the loop back to the CPU. PolyBench's symm
        had one launch of 6.5 ms among launches of 0.26 ms: it made the smoothed
        correction 52 from 4, and 785 of the next 900 arrivals ran on wasmtime."""
        self.launches += 1
        if self.launches == 1:
            return
        self.ratios = (*self.ratios, measured / model)[-RATIOS_KEPT:]
        typical = sorted(self.ratios)[(len(self.ratios) - 1) // 2]
        self.correction = 0.5 * self.correction + 0.5 * typical
        self.slower = self.slower + 1 if measured > cpu else 0
        self.gain = cpu / measured if measured > 0 else float("inf")

    def measured(self, seconds: float, cpu: float) -> None:
        """An arrival left to wasmtime took at most ``seconds`` where the CPU estimate said
        ``cpu``: later estimates take the measured pace where it is the faster (a bound
        above the estimate says nothing: other code ran before the next arrival too)."""
        self.probed = True
        if cpu > 0:
            self.cpu_scale = seconds / cpu
