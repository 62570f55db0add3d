"""Auto-offload: a Wasm module runs on wasmtime while its parallel loops run as kernels.

:class:`OffloadModule` analyses a module, outlines every outermost loop the analysis
accepts into an iteration kernel, and rewrites the module so that a host function runs
before each such loop (:mod:`compiler.rewrite`). Each kernel is compiled for the chosen
device (the GPU, or the host backend where there is none) at its first launch
(:mod:`runtime.loop_kernels`). That function checks the guards on
the live values (:mod:`runtime.guards`); if they hold it runs the loop as a kernel on
wasmtime's linear memory (copied to and from the device for the GPU) and returns the
loop's live-out locals; otherwise, or if the kernel traps, it declines and the original
loop runs on wasmtime, so the program sees exactly Wasm's behaviour, trap included.

Offloaded loops inside a sequential loop that does nothing else with memory (a time-step
loop around a stencil) form a device-resident region (:mod:`compiler.analysis.regions`):
on the GPU their data stays on the device from one launch to the next, and comes back to
linear memory when the region ends, where the rewritten module calls the host again, or
before a launch in it declines.

The module holds the preparation and the binding to wasmtime; where each launch runs is
its :class:`~runtime.device.Device`, given at construction. Planning an arrival (guards,
profitability, replays) is :mod:`runtime.planning`'s; running it is the device's execution
side (:mod:`runtime.device_launch` and :mod:`runtime.device_replay` for device memory,
:mod:`runtime.host_device` for the host backend).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import wasmtime

from tensorwasm.compiler.analysis.plan import AnalysisOptions
from tensorwasm.compiler.frontend import load
from tensorwasm.compiler.rewrite import HOOKS_EXPORT, HOST_MODULE
from tensorwasm.compiler.target import describe, nvptx_for_device
from tensorwasm.runtime import hostfunc, prepared
from tensorwasm.runtime.cache import default_cache, make_key
from tensorwasm.runtime.host_device import HostDevice
from tensorwasm.runtime.loop_kernels import CompileFirst, LoopKernels
from tensorwasm.runtime.planning import (
    ArrivalPlanner,
    LoopStats,
    OffloadedLoop,
    RegionLost,
    RegionStats,
)
from tensorwasm.runtime.profit import SLOWER_LIMIT, Estimate
from tensorwasm.support import config, logs
from tensorwasm.support.digest import hexdigest, sha256
from tensorwasm.support.errors import TensorWasmError
from tensorwasm.support.lazy import LazyModule
from tensorwasm.support.records import replace
from tensorwasm.support.serial import SerialError

# A warm start (its preparation cached) imports neither the analysis nor the outliner
# (they load in _load_or_prepare), nor the GPU's layers until it needs the GPU: a run on
# the host backend, or one whose loops all stay on the CPU, never does.
driver = LazyModule("tensorwasm.runtime.driver", globals(), "driver")
limits = LazyModule("tensorwasm.runtime.limits", globals(), "limits")

if TYPE_CHECKING:
    from tensorwasm.compiler.analysis.plan import LoopReport
    from tensorwasm.compiler.prepare import PreparedModule
    from tensorwasm.runtime.device import Device
    from tensorwasm.runtime.device_replay import Hook
    from tensorwasm.runtime.prepared import ReportRow

__all__ = ["LoopStats", "OffloadModule", "OffloadedLoop", "RegionLost", "RegionStats", "device_named"]

log = logs.get_logger(__name__)


def device_named(name: str) -> Device:
    """The device a name picks: "gpu" the CUDA device, "cpu" the host backend."""
    if name == "gpu":
        from tensorwasm.runtime.cuda_device import CudaDevice

        return CudaDevice()
    if name == "cpu":
        return HostDevice()
    raise ValueError(f"unknown device {name!r} (expected 'gpu' or 'cpu', or a Device)")


class OffloadModule:
    """A module prepared for offload: the rewritten bytes, and its kernels (each compiled at
    its first launch: :class:`~runtime.loop_kernels.LoopKernels`).

    ``device`` is "gpu", "cpu" or a :class:`~runtime.device.Device` (the simulated device,
    a GPU process); ``mode`` "always" launches whenever the guards hold, "off" never does
    (the rewritten module then behaves as the original).
    ``device_memory_limit`` caps the device memory its launches may hold (default:
    ``TENSORWASM_DEVICE_MEMORY_LIMIT``). ``pin`` page-locks the instance's linear memory
    for the copies: only for a module instantiated once, with :meth:`close` called before
    its store goes (the driver would otherwise keep pinning pages the store unmapped, and
    a new store mapped at the same address would be copied from the stale pages).
    ``native_after``: replays of a loop after which its host function becomes native code
    (default: :attr:`DeviceReplays.NATIVE_AFTER <runtime.device_replay.DeviceReplays.NATIVE_AFTER>`).
    """

    def __init__(self, wasm: bytes, device: str | Device = "cpu", mode: str = "always",
                 options: AnalysisOptions | None = None, device_memory_limit: int | None = None,
                 pin: bool = False, native_after: int | None = None):  # fmt: skip
        self.backend: Device = device_named(device) if isinstance(device, str) else device
        self.device = self.backend.kind  # "gpu": launches copy to device memory; "cpu": in place
        self.code_kind = self.backend.code  # the code compiled for it: "gpu" (PTX) or "cpu"
        self.pin = pin or self.backend.pin
        self.device_memory_limit = device_memory_limit
        self.native_after = native_after
        if self.code_kind == "gpu" and device_memory_limit is None:
            limits.default_limit()  # a malformed TENSORWASM_DEVICE_MEMORY_LIMIT fails here, not at a launch
        self._kernels = LoopKernels(self)
        self.mode = mode
        self.options = options or AnalysisOptions()
        if self.device == "cpu" and (self.options.distribute or self.options.stepped):
            # (the host backend runs whole iterations; a stepped loop would run on one thread)
            self.options = replace(self.options, distribute=False, stepped=False)
        self._unbound_hooks: list[Hook] = []  # made by host_functions, given their table by bind
        self.launches = self.backend.runner(self)
        first = CompileFirst(self.launches, self._kernels)
        self._while_starting = None  # runtime.while_starting.HostWhileStarting, made at its first need
        self._host_paces: dict[int, float] = {}  # its kernels' paces there in the last runs (known_host)
        self._host_while_starting = config.host_while_starting() if self.device == "gpu" and mode == "auto" else "off"
        if self._host_while_starting != "off":
            first.while_starting = self._launch_while_starting
        self.planner = ArrivalPlanner(mode, self.device, first)
        self._load_or_prepare(wasm)
        for lp in self.loops:
            lp.stats.device = self.backend.label

    def _load_or_prepare(self, wasm: bytes) -> None:
        """The preparation, from the cache or made by the compiler (and cached); no kernel is
        compiled here."""
        self._wasm_bytes = bytes(wasm)
        self._wasm = None
        self._rewritten_digest: str | None = None  # (where the cache entry says it)
        self._entry: prepared.Entry | None = None  # the cache entry, where it came from one
        self._preparation = None  # the compiler's state, where this process prepared the module
        self.target = self.backend.target()
        cache = default_cache()
        digest = hexdigest(self._wasm_bytes)
        tiling = "tiled" if config.tiling_enabled() else "untiled"
        self._key = make_key("offload", digest, describe(self.target), self.options, tiling)
        blob = cache.get("prepared", self._key)
        entry = prepared.read(blob) if blob is not None else None
        if entry is not None:
            self._adopt(entry.module)
            self._entry, self._rewritten_digest = entry, entry.rewritten_digest
            return
        self._adopt(self.preparation().prepared)
        if not cache.enabled:  # (writing the record costs ~2 ms a loop: not for nothing)
            return
        try:
            cache.put("prepared", self._key, prepared.dump(self._preparation.prepared))
        except (prepared.UnwritableError, RecursionError) as exc:  # costs warm starts, nothing else
            log.info("prepared module not cached: %s", exc)

    def _adopt(self, found: PreparedModule) -> None:
        """Take a prepared module's loops, reports and regions, with fresh statistics (the
        reports of one read from the cache are built at the first need: :attr:`reports`)."""
        self._reports = list(found.reports)
        self.unsupported = found.unsupported  # why nothing is offloaded, where the module says
        self.rewritten = found.rewritten
        self.regions = list(found.regions)
        self._host_sigs = found.host_sigs
        gpu = self.code_kind == "gpu"
        self.loops = [
            OffloadedLoop(lp.plan, lp.kernel_index, lp.entry(gpu), lp.insertion,
                          LoopStats(lp.plan.func.name, lp.plan.loop.offset, self.code_kind, region=lp.region),
                          may_trap=lp.may_trap, tile=lp.tile, per_thread=lp.per_thread)
            for lp in found.loops
        ]  # fmt: skip
        self.region_stats = [
            RegionStats(self.loops[r.children[0]].stats.func, r.offset, len(r.children)) for r in self.regions
        ]

    @property
    def reports(self) -> list[LoopReport]:
        """The analysis's report on every loop of the module, in the order of the code (each
        offloaded loop's with the loop's own plan)."""
        if self._entry is not None and not self._reports:
            try:
                self._reports = self._entry.reports([lp.plan for lp in self.loops])
            except SerialError as exc:  # (cannot happen to an entry this build wrote whole)
                log.info("the cached reports are unusable (%s): the module's own are used", exc)
                self._reports = _linked(self.preparation().prepared.reports, self.loops)
            self._entry = None
        return self._reports

    def report_rows(self) -> list[ReportRow]:
        """Per report (see :attr:`reports`): its function's name, the loop's offset and depth,
        the verdict, the reason, and the index in :attr:`loops` of the loop it reports on
        (None where it has no loop of its own); read without building the reports where
        they came from the cache."""
        if self._entry is not None and not self._reports:
            return self._entry.rows
        index = {id(lp.plan): k for k, lp in enumerate(self.loops)}
        return [
            (r.func.name, r.loop.offset, r.loop.depth, r.verdict, r.reason,
             index.get(id(r.plan)) if r.plan is not None else None)
            for r in self.reports
        ]  # fmt: skip

    def _launch_while_starting(
        self, lp, ready, arrival, base: int, size: int, beat: float | None = None
    ) -> list[int] | None:
        """A launch the device's start keeps from the GPU (or one that would wait ``beat``
        seconds for it and its launch), on the host's threads where that pays
        (:class:`runtime.while_starting.HostWhileStarting`); None: wasmtime runs it (or,
        with ``beat``, the launch waits for the device)."""
        return self._stand_in().run(lp, ready, arrival, base, size, beat)

    def _stand_in(self):
        if self._while_starting is None:
            from tensorwasm.runtime.while_starting import HostWhileStarting

            self._while_starting = HostWhileStarting(
                self, regions=self._host_while_starting == "on", paces=self._host_paces
            )
        return self._while_starting

    def load_host_kernels_early(self) -> bool:
        """Begin reading and loading, on a compile worker, the kernels this module's last run
        here would have run on the host's threads (:mod:`runtime.known_host`): on the host
        backend, or standing in for a GPU whose start does not pay yet; and park on wasmtime
        those whose launches there ran slower than wasmtime in the run that last launched
        them; and keep their measured paces there for the host's threads standing in for a GPU
        (:meth:`runtime.while_starting.HostWhileStarting.pace`). Whether any load was begun
        (not where kernels compile as their launches need them). Their launch threads are started meanwhile, on a thread of their own: a
        launch that started them took 10 to 25 ms to start 16 on the H100 machine's host, to
        run ~2 ms of work."""
        if self.mode != "auto" or (self.device == "gpu" and self._host_while_starting == "off"):
            return False
        from tensorwasm.runtime import known_host

        load, slower, paces = known_host.last_run(self.key)
        self._host_paces.update(paces)
        wanted = set(load)
        if wanted:
            from tensorwasm.runtime.host_device import warm_launch_threads

            warm_launch_threads()
        if self.device == "gpu":
            if slower:
                self._stand_in().park(slower)
            return bool(wanted) and self._stand_in().load_early(wanted)
        for lp in self.loops:
            if lp.kernel_index in slower:
                lp.estimate = Estimate(launches=SLOWER_LIMIT, slower=SLOWER_LIMIT)  # as if measured twice
        if not self._kernels.load_early([lp for lp in self.loops if lp.kernel_index in wanted]):
            return False
        self.launches.begun_early = True
        return True

    def kernels_load_cheaply(self, lp: OffloadedLoop) -> bool:
        """Whether ``lp``'s host kernel loads from a shared library in the code cache."""
        return self._kernels.loads_cheaply(lp.kernel_index)

    def launched_on_device(self) -> bool:
        """Whether a loop launched on the module's device itself (not on the host's threads
        standing in for a GPU that had not started)."""
        return any(lp.stats.offloaded > lp.stats.on_host for lp in self.loops)

    def remember_host_kernels(self) -> None:
        """Keep, for this module's next run, the kernels whose arrivals gained on the host's
        threads or would have (see :meth:`load_host_kernels_early`)."""
        if self.mode != "auto":
            return
        from tensorwasm.runtime import known_host

        if self.device == "cpu":
            gains, cheap = self.planner.gains, self._kernels.loads_cheaply
        elif self._while_starting is not None:
            gains, cheap = self._while_starting.gains, self._while_starting.loads_cheaply
        else:
            gains, cheap = known_host.Gains(), None
        known_host.remember_kernels(self.key, gains, cheap)

    @property
    def cached(self) -> bool:
        """Whether everything it used so far came from the cache: its preparation, and every
        kernel it loaded (none was compiled in this process)."""
        return self._preparation is None and not self._kernels.counts.compiled

    @property
    def key(self) -> str:
        """The code cache's key of the prepared module (the module, the target, the options)."""
        return self._key

    def preparation(self):
        """The compiler's state the kernels are made from (:class:`compiler.prepare.Preparation`):
        made here at the first need where the prepared module came from the cache."""
        if self._preparation is None:
            from tensorwasm.compiler.prepare import prepare_offload

            self._preparation = prepare_offload(self._wasm_bytes, self.options, self.wasm)
        return self._preparation

    @property
    def wasm(self):
        """The decoded module (decoded on first use: a warm start does not need it), with
        what the compiler cannot translate marked, not refused: wasmtime runs those parts."""
        if self._wasm is None:
            self._wasm = load(self._wasm_bytes, degrade=True)
        return self._wasm

    @property
    def context(self):
        """The device's context (the CUDA context, made at first need; a GPU process's)."""
        return self.backend.context

    @property
    def mirror(self):
        """The device memory of its launches, once a launch made it (None on the host)."""
        return getattr(self.launches, "mirror", None)

    @property
    def gpu_lost(self) -> str | None:
        """Why the GPU cannot be used any more, if it cannot."""
        return getattr(self.launches, "gpu_lost", None)

    @property
    def faults(self) -> int:
        """Sticky faults its device saw."""
        return getattr(self.launches, "faults", 0)

    @property
    def host_sigs(self) -> dict:
        """Each loop's host function's parameter and result types, by import name."""
        return self._host_sigs

    def retarget(self, info) -> None:
        """The context's device against the remembered one the code was made for: where
        their targets differ, the code made for the real one is taken (same loops, same
        entries: the preparation does not depend on the GPU)."""
        try:
            real = nvptx_for_device(info.compute_capability, info.driver_version)
        except TensorWasmError as exc:  # a device or driver too old for any target
            raise driver.NoGPU(str(exc)) from exc
        if describe(real) == describe(self.target):
            return
        log.info("the GPU is not the one remembered (%s, not %s): its own code is used",
                 describe(real), describe(self.target))  # fmt: skip
        try:
            fresh = OffloadModule(
                self._wasm_bytes, device="gpu", mode=self.mode, options=self.options,
                device_memory_limit=self.device_memory_limit, pin=self.pin,
            )  # fmt: skip
        except TensorWasmError as exc:
            raise driver.NoGPU(f"the kernels could not be made for this GPU: {exc}") from exc
        if [lp.entry for lp in fresh.loops] != [lp.entry for lp in self.loops]:
            raise driver.NoGPU("the GPU is not the one the module's kernels were prepared for")
        self.target, self._key = fresh.target, fresh._key
        self._kernels.forget_all()  # each made again for the real target at its next launch

    def compiled(self, engine: wasmtime.Engine) -> wasmtime.Module:
        """The rewritten module compiled by ``engine``, through the cache (wasmtime's own
        serialized code: a warm start skips compiling it; wasmtime refuses code made by
        another release or engine configuration, which is then compiled again)."""
        return _compiled(engine, self.rewritten, self._rewritten_digest)

    @property
    def kernels(self) -> LoopKernels:
        """The kernels by entry name, each compiled (or read from the cache) and loaded at its
        first launch: a program whose loops all stay on the CPU never pays for one (nor for
        loading LLVM)."""
        return self._kernels

    def reload_kernels(self) -> None:
        """Load the kernels again, each at its next launch (on a device whose context was reset)."""
        self._kernels.forget_loaded()

    def close(self) -> None:
        """Give back device memory and unpin linear memory (call before the store dies);
        the arrivals the Wasm-side filters kept from the host are counted in."""
        self.collect_skipped()
        self.launches.close()

    # -- instantiation --------------------------------------------------------------------------

    def host_functions(self, store) -> dict[str, wasmtime.Func]:
        """The ``tensorwasm`` imports of the rewritten module, bound to ``store``. On the GPU
        a loop's becomes native code once its arrivals replay, where :meth:`bind` gave the
        instance's table of hooks (see :mod:`compiler.rewrite`)."""
        funcs = {}
        context = hostfunc.store_context(store)
        self._unbound_hooks = []
        if self.device == "gpu":  # (the host backend's replays are not native code: not loaded there)
            from tensorwasm.runtime.device_replay import Hook
        for k, lp in enumerate(self.loops):
            params, results = self._host_sigs[lp.insertion.import_name]
            hook = Hook(weakref.ref(store), k, context) if self.device == "gpu" else None
            funcs[lp.insertion.import_name], key = hostfunc.keyed_func(
                store, params, results, self._callback(lp, context, hook)
            )
            if hook is not None:
                hook.key = key
                self._unbound_hooks.append(hook)
        for k in range(len(self.regions)):
            funcs[f"region_{k}"] = hostfunc.func(store, [], [], self._region_end(k, context))
        return funcs

    def define(self, linker: wasmtime.Linker, store) -> None:
        for import_name, func in self.host_functions(store).items():
            linker.define(store, HOST_MODULE, import_name, func)

    def bind(self, store, exports, thresholds: list[int] | None = None) -> None:
        """Set the instance's Wasm-side filters (see :class:`compiler.rewrite.Filter`) and
        gates (:class:`runtime.planning.ArrivalGate`): in auto mode an arrival whose counter
        has too little to go is kept from the host (it would decline it), with offload off
        every arrival is, and in always mode none; a loop that keeps declining is kept from it.
        ``exports`` are the instance's; ``thresholds`` (per loop) overrides the mode's. An
        instance left unbound asks the host at every arrival."""
        for hook in self._unbound_hooks:
            hook.table = exports[HOOKS_EXPORT]
        self._unbound_hooks = []
        self._gates = self.planner.bind(self.loops, store, exports, thresholds)

    def collect_skipped(self) -> None:
        """Fold the arrivals the Wasm-side filters kept from the host, and those replayed in
        native code, into the loops' counts."""
        replays = self.launches.replays
        for native in replays.natives if replays is not None else ():
            replays.collect_native_counts(native)
        for gate in getattr(self, "_gates", ()):
            gate.collect()

    def _callback(self, lp: OffloadedLoop, context: int, hook: Hook | None = None):
        """Loop ``lp``'s host function's body, for a store whose context is at ``context``
        (``hook``: where that store's function may be made native). Every call it makes is
        bound here, once: an arrival that replays costs microseconds."""
        n_live = len(lp.plan.live_ins)
        planner = self.planner
        arrive, flush = planner.arrive, self.launches.flush
        replays = self.launches.replays
        if replays is not None:
            collect, finish_native = replays.collect_native_counts, replays.finish_native
            replay, arm = replays.replay, replays.arm_native_replay

        def run(caller: int, args: tuple[int, ...]) -> list[int]:
            native = hook.native if hook is not None else None
            if native is not None:
                collect(native)
                if native.arm.pending:
                    return finish_native(lp, native, args)
            again = lp.again.get(args[:n_live]) if lp.again else None
            if again is not None:
                results = replay(lp, again, caller, args, context)
                if results is not None:
                    if hook is not None:
                        arm(lp, hook, again)
                    return results
            try:
                results = arrive(lp, caller, args, context)
            except BaseException:
                if lp.region is not None:  # the guest stops here: its memory must be current
                    flush(caller, lp.region)
                raise
            if not results[0] and lp.region is not None:
                _declined_in_region(lp, caller, context, flush, planner)
            elif hook is not None and results[0] and lp.again:
                again = lp.again.get(args[:n_live])
                if again is not None:
                    arm(lp, hook, again)
            return results

        return run

    def _region_end(self, k: int, context: int):
        def run(caller: int, args: tuple[int, ...]) -> tuple[()]:
            self.region_stats[k].exits += 1
            self.launches.flush(caller, k)
            self.planner.emptied(k, context)
            return ()

        return run


def _declined_in_region(lp: OffloadedLoop, caller: int, context: int, flush, planner: ArrivalPlanner) -> None:
    """wasmtime runs region loop ``lp``: what it touches must be current in memory (only
    that, where the guards said what it touches); while the device still holds results, its
    next arrival asks the host again. Where its gate keeps the next arrivals in Wasm, they
    may write elsewhere, over what the device still holds a copy of: the device forgets the
    region (see :class:`runtime.planning.ArrivalGate`)."""
    gate, part = lp.gate, planner.declined_launch
    if flush(caller, lp.region, part):
        if gate is not None:
            gate.reopen()
    elif gate is not None and gate.waiting:
        if part is not None:
            flush(caller, lp.region)
        planner.emptied(lp.region, context)


def _linked(reports: list[LoopReport], loops: list[OffloadedLoop]) -> list[LoopReport]:
    """``reports`` with each offloaded loop's plan the loop's own (matched by its function
    and offset), as the reports read from the cache have them."""
    plans = {(lp.stats.func, lp.stats.offset): lp.plan for lp in loops}
    return [
        replace(r, plan=plans[(r.func.name, r.loop.offset)])
        if r.plan is not None and (r.func.name, r.loop.offset) in plans
        else r
        for r in reports
    ]


def _compiled(engine: wasmtime.Engine, wasm: bytes, digest: str | None = None) -> wasmtime.Module:
    """``wasm`` (its SHA-256 ``digest``, where known) compiled by ``engine``, through the cache
    (wasmtime's own serialized code: a warm start skips compiling it; wasmtime refuses code
    made by another release or engine configuration, which is then compiled again)."""
    cache = default_cache()
    key = make_key("cwasm", digest or sha256(wasm).hexdigest())
    blob = cache.get("cwasm", key)
    if blob is not None:
        try:
            return wasmtime.Module.deserialize(engine, blob)
        except wasmtime.WasmtimeError as exc:  # another engine configuration made it
            log.info("recompiling the module: wasmtime refuses its cached code (%s)", exc)
            cache.drop("cwasm", key)
    module = wasmtime.Module(engine, wasm)
    cache.put("cwasm", key, module.serialize())
    return module
