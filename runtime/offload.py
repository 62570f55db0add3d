"""Auto-offload: a Wasm module runs on wasmtime while its parallel loops run as kernels.

:class:`OffloadModule` analyses a module, outlines every outermost loop the analysis
accepts into an iteration kernel, compiles the kernels for the chosen device (the GPU, or
the host backend where there is none), and rewrites the module so that a host function
runs before each such loop (:mod:`compiler.rewrite`). That function checks the guards on
the live values (:mod:`runtime.guards`); if they hold it runs the loop as a kernel on
wasmtime's linear memory (copied to and from the device for the GPU) and returns the
loop's live-out locals; otherwise, or if the kernel traps, it declines and the original
loop runs on wasmtime, so the program sees exactly Wasm's behaviour, trap included.

Offloaded loops inside a sequential loop that does nothing else with memory (a time-step
loop around a stencil) form a device-resident region (:mod:`compiler.analysis.regions`):
on the GPU their data stays on the device from one launch to the next, and comes back to
linear memory when the region ends, where the rewritten module calls the host again, or
before a launch in it declines.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import operator
import os
import pickle
import random
import struct
import sys
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import wasmtime
from tensorwasm.compiler.analysis.plan import AnalysisOptions, LoopPlan
from tensorwasm.compiler.frontend import load
from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.rewrite import (
    FILTER_EXPORT,
    HOOKS_EXPORT,
    HOST_MODULE,
    MEMORY_EXPORT,
    NEVER_SKIP,
    Insertion,
    RegionExit,
    loop_filter,
    rewrite,
)
from tensorwasm.compiler.target import HostTarget, describe, nvptx_for_device
from tensorwasm.dialect.types import F32, Type
from tensorwasm.runtime import hostfunc, prepared, profit, replay
from tensorwasm.runtime.cache import default_cache, load_kernels, make_key
from tensorwasm.runtime.profit import FIXED_SECONDS, Estimate, work

from tensorwasm.support import logs
from tensorwasm.support.digest import sha256
from tensorwasm.support.errors import TensorWasmError
from tensorwasm.support.lazy import LazyModule
from tensorwasm.support.records import field, record

# A warm start (its preparation cached) imports neither the analysis nor the outliner
# (they load in _prepare), nor the guards until a loop asks the host, nor the GPU's
# layers until it needs the GPU: a run on the host backend, or one whose loops all stay
# on the CPU, never does.
guards = LazyModule("tensorwasm.runtime.guards", globals(), "guards")
driver = LazyModule("tensorwasm.runtime.driver", globals(), "driver")
limits = LazyModule("tensorwasm.runtime.limits", globals(), "limits")

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from tensorwasm.compiler.analysis.plan import LoopReport
    from tensorwasm.compiler.analysis.regions import Region
    from tensorwasm.runtime.driver import CudaError
    from tensorwasm.runtime.guards import Launch
    from tensorwasm.runtime.mirror import DeviceMirror, Span

log = logs.get_logger(__name__)
U64 = ctypes.c_uint64
CPUS = os.cpu_count() or 1
MASKS = {32: 0xFFFFFFFF, 64: 0xFFFFFFFFFFFFFFFF}


@record
class LoopStats:
    """What happened at one loop, for the report."""

    func: str
    offset: int
    device: str
    arrivals: int = 0
    offloaded: int = 0
    replayed: int = 0  # of the offloaded: replayed as the last arrival's launch (OffloadModule._again)
    native: int = 0  # of the replayed: by native code, without Python (runtime.replay)
    declined: dict[str, int] = field(default_factory=dict)
    iterations: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    kernel_seconds: float = 0.0
    transfer_seconds: float = 0.0
    threads: int = 1  # the most host threads one launch used
    pinned: bool = False  # GPU copies from page-locked linear memory
    warned: set[str] = field(default_factory=set)  # fallback reasons already logged
    region: int | None = None  # the device-resident region the loop is in

    def decline(self, reason: str) -> None:
        self.declined[reason] = self.declined.get(reason, 0) + 1


@record
class OffloadedLoop:
    plan: LoopPlan
    kernel_index: int
    entry: str
    insertion: Insertion
    stats: LoopStats
    estimate: Estimate = field(default_factory=Estimate)  # auto mode: does a launch pay?
    # Its recent arrivals whose launch replays as it was, by live-ins (see OffloadModule._again).
    again: dict[tuple[int, ...], Again] = field(default_factory=dict)

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


class OffloadModule:
    """A module prepared for offload: the rewritten bytes and the compiled kernels.

    ``device`` is "gpu" or "cpu"; ``mode`` "always" launches whenever the guards hold,
    "off" never does (the rewritten module then behaves as the original).
    ``device_memory_limit`` caps the device memory its launches may hold (default:
    ``TENSORWASM_DEVICE_MEMORY_LIMIT``). ``pin`` page-locks the instance's linear memory
    for the copies: only for a module instantiated once, with :meth:`close` called before
    its store goes (the driver would otherwise keep pinning pages the store unmapped, and
    a new store mapped at the same address would be copied from the stale pages).
    """

    def __init__(self, wasm: bytes, device: str = "cpu", mode: str = "always",
                 options: AnalysisOptions | None = None, device_memory_limit: int | None = None,
                 pin: bool = False):  # fmt: skip
        self.device = device
        self.pin = pin
        self.device_memory_limit = device_memory_limit
        if device == "gpu" and device_memory_limit is None:
            limits.default_limit()  # a malformed TENSORWASM_DEVICE_MEMORY_LIMIT fails here, not at a launch
        self.gpu_lost: str | None = None  # why the GPU cannot be used any more
        self.faults = 0  # sticky faults seen (see _recover)
        self._context = None  # see the context property
        self._mirror: DeviceMirror | None = None  # see the mirror property
        self._assumed = None  # the remembered device the target was made for (known_gpu)
        self._kernels: dict | None = None  # see the kernels property
        self.mode = mode
        self.options = options or AnalysisOptions()
        self._pool: ThreadPoolExecutor | None = None  # host threads, made on first need
        self._guard_cache: dict[int, dict[tuple, Ready | str]] = {}  # per loop: see _guards
        self._guard_reads: dict[int, Callable] = {}  # per loop: the live-ins the guards read
        # Bumped on whatever changes the device's state (a launch, a flush, closing): a native
        # replay armed at another generation hands its call to Python (runtime.replay).
        self._generation = (U64 * 1)()
        self._natives: list[NativeReplay] = []
        self._unbound_hooks: list[Hook] = []  # made by host_functions, given their table by bind
        self._wasm_bytes = bytes(wasm)
        self._wasm = None
        self.target = self._target()
        cache = default_cache()
        digest = sha256(self._wasm_bytes).hexdigest()
        self._key = make_key("offload", digest, describe(self.target), self.options)
        state = None
        blob = cache.get("prepared", self._key)
        if blob is not None:
            state = prepared.load(blob)
        if state is not None:
            self.reports, self.loops = state["reports"], state["loops"]
            self.rewritten, self._host_sigs = state["rewritten"], state["host_sigs"]
            self.regions, self.region_stats = state["regions"], state["region_stats"]
            if self._compile(cache):
                return
        self._prepare()
        self._compile(cache, must=True)
        state = {"reports": self.reports, "loops": self.loops, "rewritten": self.rewritten,
                 "host_sigs": self._host_sigs, "regions": self.regions,
                 "region_stats": self.region_stats}  # fmt: skip
        try:
            cache.put("prepared", self._key, prepared.dump(state))
        except (pickle.PicklingError, RecursionError) as exc:  # costs warm starts, nothing else
            log.info("prepared module not cached: %s", exc)

    @property
    def wasm(self):
        """The decoded module (decoded on first use: a warm start does not need it)."""
        if self._wasm is None:
            self._wasm = load(self._wasm_bytes)
        return self._wasm

    def _target(self):
        """The code's target. For the GPU: the device's, from its context if one is made,
        else from the description its last context gave on this machine (a run waits for
        the context only at its first launch), else from a new context."""
        if self.device != "gpu":
            return HostTarget()
        from tensorwasm.runtime import known_gpu
        from tensorwasm.runtime.device_info import context_made

        info = None
        if not context_made():
            info = self._assumed = known_gpu.remembered()
        if info is None:
            self._context = driver.Context.get()
            info = self._context.info
            known_gpu.remember(info)
        return nvptx_for_device(info.compute_capability, info.driver_version)

    @property
    def context(self):
        """The CUDA context, made (or waited for) at first need: a launch, a cold compile's
        load. Where the target came from a remembered description, it is checked here."""
        if self._context is None:
            context = driver.Context.get()
            if self._assumed is not None:
                self._check_assumed(context.info)
            self._context = context
        return self._context

    @context.setter
    def context(self, context) -> None:
        self._context = context

    def _check_assumed(self, info) -> None:
        """The context's device against the remembered one the code was made for: where
        their targets differ, the code made for the real one is taken (same loops, same
        entries: the preparation does not depend on the GPU)."""
        try:
            real = nvptx_for_device(info.compute_capability, info.driver_version)
        except TensorWasmError as exc:  # a device or driver too old for any target
            raise driver.NoGPU(str(exc)) from exc
        if describe(real) == describe(self.target):
            self._assumed = None
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
        self.target, self._key, self.cached = fresh.target, fresh._key, fresh.cached
        self.ptx = getattr(fresh, "ptx", None)  # None: no loops, nothing to load
        self._kernels = fresh._kernels  # loaded if it compiled them; else at the first launch
        self._assumed = None

    @property
    def mirror(self) -> DeviceMirror | None:
        """Device memory and the copies (GPU only), made at the first launch."""
        if self._mirror is None and self.device == "gpu":
            from tensorwasm.runtime.mirror import DeviceMirror

            self.mirror = DeviceMirror(self.context, self.device_memory_limit)
        return self._mirror

    @mirror.setter
    def mirror(self, mirror: DeviceMirror) -> None:
        self._mirror = mirror
        mirror.context.watchers.add(self)  # (see context_reset)

    def context_reset(self, context) -> None:
        """Its context was reset (by this module or another on it): native replays armed
        before go through Python, which finds the mirror stale (see _still_valid)."""
        self._generation[0] += 1

    def _prepare(self) -> None:
        """Translate, analyse, outline every outermost accepted loop, rewrite the module."""
        from tensorwasm.compiler.analysis.loops import analyze_module
        from tensorwasm.compiler.analysis.regions import find_regions
        from tensorwasm.compiler.frontend.translate import loop_closure, translate_module
        from tensorwasm.compiler.outline import outline

        # Only what the loops need: the functions with loops and what their loops call.
        self.module = translate_module(self.wasm, only=loop_closure(self.wasm))
        self.reports: list[LoopReport] = analyze_module(self.module, self.options)
        # Every accepted loop gets its host call, those inside another accepted loop too:
        # they run when the outer one declines (its guards fail, or it is not worth it).
        chosen = [r.plan for r in self.reports if r.verdict == "offload"]
        self.loops: list[OffloadedLoop] = []
        for n, plan in enumerate(chosen):
            kernel = outline(self.module, plan)
            insertion = _insertion(self.wasm, plan, f"loop_{n}")
            stats = LoopStats(plan.func.name, plan.loop.offset, self.device)
            self.loops.append(OffloadedLoop(plan, kernel.index, "", insertion, stats))
        spans = [
            (lp.insertion.func_index, lp.insertion.start, lp.insertion.end,
             bool(lp.plan.gathers))
            for lp in self.loops
        ]  # fmt: skip
        self.regions: list[Region] = find_regions(self.wasm, spans)
        self.region_stats = []
        for k, region in enumerate(self.regions):
            for n in region.children:
                self.loops[n].stats.region = k
            name = self.loops[region.children[0]].stats.func
            self.region_stats.append(RegionStats(name, region.offset, len(region.children)))
        for lp in self.loops:  # a region's loops always call: a decline must bring results back
            lp.insertion.filter = loop_filter(lp.plan) if lp.region is None else None
        exits = [RegionExit(r.func_index, r.exits, f"region_{k}") for k, r in enumerate(self.regions)]
        self.rewritten = (
            rewrite(self.wasm, [lp.insertion for lp in self.loops], exits) if self.loops else self._wasm_bytes
        )
        self._host_sigs = {lp.insertion.import_name: _host_sig(self.wasm, lp.insertion) for lp in self.loops}

    def _compile(self, cache, must: bool = False) -> bool:
        """Load the kernels' code from the cache, or (``must``) compile it; False on a miss."""
        if not self.loops:
            self._kernels = {}
            return True
        target = self.target
        key = make_key("kernels", self._key, [lp.kernel_index for lp in self.loops])
        gpu = self.device == "gpu"
        for lp in self.loops:
            lp.entry = abi.loop_entry_name(lp.kernel_index, gpu)
        cached = cache.get("ptx" if gpu else "obj", key)
        if cached is None and not must:
            return False
        self.cached = cached is not None
        if cached is None:
            from tensorwasm.compiler.callgraph import reachable, recursive_functions
            from tensorwasm.compiler.lower.function import FunctionLowering, ModuleLowering, lower_loop_entry

            lowering = ModuleLowering(self.module, target)
            indices = [lp.kernel_index for lp in self.loops]
            closure = reachable(self.module, indices)
            lowering.recursive = recursive_functions(self.module, closure)
            for index in closure:
                FunctionLowering(lowering, self.module.functions[index]).lower()
            for lp in self.loops:
                lower_loop_entry(lowering, lp.kernel_index, [r.op for r in lp.plan.reductions])
            llvm_ir = str(lowering.llvm)
        if gpu:
            if cached is None:
                cached = target.emit_ptx(llvm_ir).encode("ascii")
                cache.put("ptx", key, cached)
            self.ptx = cached
            if not self.cached:  # code just compiled is loaded now, so a JIT error shows here
                self._load_kernels()
        else:
            self.code = None if cached is not None else HostTarget().jit(llvm_ir)
            self.host_object = cached if cached is not None else self.code.object
            if cached is None:
                cache.put("obj", key, self.host_object)
                self._load_kernels()
        return True

    def compiled(self, engine: wasmtime.Engine) -> wasmtime.Module:
        """The rewritten module compiled by ``engine``, through the cache (wasmtime's own
        serialized code: a warm start skips compiling it; wasmtime refuses code made by
        another release or engine configuration, which is then compiled again)."""
        return _compiled(engine, self.rewritten)

    @property
    def kernels(self) -> dict:
        """The kernels by entry name. Cached code is loaded at the first launch: a program
        whose loops all stay on the CPU never pays for it (nor for loading LLVM)."""
        if self._kernels is None:
            self._load_kernels()
        return self._kernels

    @kernels.setter
    def kernels(self, kernels: dict) -> None:
        self._kernels = kernels

    def _load_kernels(self) -> None:
        if self.device != "gpu":
            if self.code is None:
                self.code = HostTarget().jit(None, self.host_object)
            self._kernels = {lp.entry: _host_entry_type(lp)(self.code.address(lp.entry)) for lp in self.loops}
            return
        self.cu_module = load_kernels(self.context, self.ptx)
        self._kernels = {lp.entry: self.cu_module.function(lp.entry) for lp in self.loops}

    def close(self) -> None:
        """Give back device memory and unpin linear memory (call before the store dies);
        the arrivals the Wasm-side filters kept from the host are counted in."""
        self.collect_skipped()
        self._generation[0] += 1
        if self._mirror is not None:
            self._mirror.release()
        self._end_gpu_process()

    def _end_gpu_process(self) -> None:
        """End the GPU process this module's work went to after a fault, if any (its context
        holds device memory until it ends)."""
        remote = sys.modules.get("tensorwasm.runtime.remote")
        if remote is not None and isinstance(self._context, remote.WorkerContext):
            self._context.close()

    # -- instantiation --------------------------------------------------------------------------

    def host_functions(self, store) -> dict[str, wasmtime.Func]:
        """The ``tensorwasm`` imports of the rewritten module, bound to ``store``. On the GPU
        a loop's becomes native code once its arrivals replay, where :meth:`bind` gave the
        instance's table of hooks (see :mod:`compiler.rewrite`)."""
        funcs = {}
        context = hostfunc.store_context(store)
        self._unbound_hooks = []
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
            funcs[f"region_{k}"] = hostfunc.func(store, [], [], self._region_end(k))
        return funcs

    def define(self, linker: wasmtime.Linker, store) -> None:
        for import_name, func in self.host_functions(store).items():
            linker.define(store, HOST_MODULE, import_name, func)

    def bind(self, store, exports, thresholds: list[int] | None = None) -> None:
        """Set the instance's Wasm-side filters (see :class:`compiler.rewrite.Filter`): in
        auto mode an arrival whose counter has too little to go is kept from the host (it
        would decline it), with offload off every arrival is, and in always mode none.
        ``exports`` are the instance's; ``thresholds`` (per loop) overrides the mode's. An
        instance left unbound asks the host at every arrival."""
        self._skipped = []
        for hook in self._unbound_hooks:
            hook.table = exports[HOOKS_EXPORT]
        self._unbound_hooks = []
        for n, lp in enumerate(self.loops):
            if lp.insertion.filter is None:
                continue
            threshold = thresholds[n] if thresholds is not None else self._threshold(lp)
            exports[f"{FILTER_EXPORT}min_{n}"].set_value(store, wasmtime.Val.i64(threshold))
            self._skipped.append((lp, exports[f"{FILTER_EXPORT}skipped_{n}"], weakref.ref(store), [0]))

    # What share of a launch's fixed cost a CPU estimate must reach before the host is asked:
    # well below break-even, so the Wasm-side test keeps from the host only arrivals it would
    # decline even after its launches came out faster than modelled.
    ASK_SHARE = 0.25

    def _threshold(self, lp: OffloadedLoop) -> int:
        if self.mode == "off":
            return (1 << 63) - 1  # never asked: the host would decline
        if self.mode != "auto":
            return NEVER_SKIP
        per_iteration = sum(ops for ops, _ in lp.plan.work) or 1
        least = self.ASK_SHARE * FIXED_SECONDS[self.device] / profit.cpu_seconds_per_op()
        # A distance d runs at most d / |step| + 2 iterations (see Filter).
        iterations = math.ceil(least / per_iteration) - 2
        return max(0, iterations) * abs(lp.plan.trip.step)

    def collect_skipped(self) -> None:
        """Fold the arrivals the Wasm-side filters kept from the host, and those replayed in
        native code, into the loops' counts."""
        for native in self._natives:
            self._fold(native)
        reason = "offload is off" if self.mode == "off" else "too little work to pay for a launch"
        for lp, counter, store_ref, seen in getattr(self, "_skipped", ()):
            store = store_ref()
            if store is None:  # the instance is gone: its counts were collected or are lost
                continue
            total = counter.value(store)
            if total > seen[0]:
                lp.stats.arrivals += total - seen[0]
                lp.stats.declined[reason] = lp.stats.declined.get(reason, 0) + total - seen[0]
                seen[0] = total

    def _callback(self, lp: OffloadedLoop, context: int, hook: Hook | None = None):
        """Loop ``lp``'s host function's body, for a store whose context is at ``context``
        (``hook``: where that store's function may be made native)."""
        n_live = len(lp.plan.live_ins)

        def run(caller: int, args: tuple[int, ...]) -> list[int]:
            native = hook.native if hook is not None else None
            if native is not None:
                self._fold(native)
                if native.arm.pending:
                    return self._finish_native(lp, native, args)
            again = lp.again.get(args[:n_live]) if lp.again else None
            if again is not None:
                results = self._again(lp, again, caller, args, context)
                if results is not None:
                    if hook is not None:
                        self._arm(lp, hook, again)
                    return results
            try:
                results = self._arrive(lp, caller, args, context)
            except BaseException:
                if lp.region is not None:  # the guest stops here: its memory must be current
                    self._flush(caller, lp.region)
                raise
            if not results[0] and lp.region is not None:
                self._flush(caller, lp.region)  # wasmtime runs this loop: memory must be current
            elif hook is not None and results[0] and lp.again:
                again = lp.again.get(args[:n_live])
                if again is not None:
                    self._arm(lp, hook, again)
            return results

        return run

    # Replays of a loop (in Python) after which its host function becomes native code: the
    # first costs compiling that code once per process (~10 ms, and ~45 ms to load LLVM where
    # no compile loaded it), which a replay in native code repays at ~10 us saved.
    NATIVE_AFTER = 256
    # In auto mode, native replays between two in Python (which decide again and record).
    NATIVE_BUDGET = 64

    def _arm(self, lp: OffloadedLoop, hook: Hook, again: Again) -> None:
        """After ``again``'s launch: let the next arrival with its live-ins replay it in
        native code, where nothing changed since, and its loop replays often enough."""
        if again.generation != self._generation[0] or not self._still_valid(again):
            return
        if lp.stats.replayed < self.NATIVE_AFTER:
            return
        calls = self.context.native_calls()
        if calls is None:  # (a GPU process's recorded launches: none native code could replay)
            return
        native = hook.native
        if native is None:
            store = hook.store()
            if store is None or hook.table is None:  # (an instance left unbound)
                return
            native = hook.native = NativeReplay(self, lp, hook)
            params, results = self._host_sigs[lp.insertion.import_name]
            func = hostfunc.native_func(store, params, results, replay.entry(), native.arm)
            hook.table.set(store, hook.index, func)
            self._natives.append(native)
        # In auto mode its replays are recorded against the decision that launched it, and
        # every so many go through Python, which decides again.
        budget = self.NATIVE_BUDGET if again.mode == "auto" else 1 << 62
        native.arm_with(again, calls, budget, again.decision)

    def _fold(self, native: NativeReplay) -> None:
        """Count in what native replays did since the last fold."""
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
        stats.bytes_in += n * ready.in_bytes
        stats.bytes_out += n * ready.out_bytes
        seconds = (arm.kernel_ns + arm.transfer_ns) * 1e-9
        stats.kernel_seconds += arm.kernel_ns * 1e-9
        stats.transfer_seconds += arm.transfer_ns * 1e-9
        if n and native.decision is not None:
            lp.estimate.record(seconds / n, *native.decision)
        arm.replays = arm.kernel_ns = arm.transfer_ns = 0

    def _finish_native(self, lp: OffloadedLoop, native: NativeReplay, args: tuple[int, ...]) -> list[int]:
        """A native replay launched and handed the rest to Python: its driver call failed, or
        its kernel left the scratch changed (a trap, say)."""
        arm, again = native.arm, native.again
        pending, arm.pending = arm.pending, 0
        lp.stats.arrivals += 1
        self._generation[0] += 1
        if pending == replay.PENDING_ERROR:
            return self._replay_failed(
                lp, again, args, driver.CudaError(replay.CALLS[arm.error_call], arm.error)
            )
        return self._replayed(lp, again, args)

    def _region_end(self, k: int):
        def run(caller: int, args: tuple[int, ...]) -> tuple[()]:
            self.region_stats[k].exits += 1
            self._flush(caller, k)
            return ()

        return run

    def _flush(self, caller: int, k: int) -> None:
        """Bring region ``k``'s results on the device back into linear memory, and forget
        what the device holds: wasmtime may write memory from here on."""
        mirror = self._mirror
        if mirror is None:
            return
        self._generation[0] += 1
        if not mirror.holds_results:  # (a region whose loops only read: nothing comes back)
            mirror.forget()
            return
        base, _ = hostfunc.memory(caller)  # a launch found it, so it is there
        start = time.perf_counter()
        try:
            moved = mirror.flush(base)
        except driver.CudaError as exc:
            mirror.forget()
            raise RegionLost(self._lost_message(k, exc)) from exc
        stats = self.region_stats[k]
        stats.bytes_out += moved
        stats.transfer_seconds += time.perf_counter() - start

    def _lost_message(self, k: int, exc: Exception) -> str:
        stats = self.region_stats[k]
        return (
            f"the GPU failed ({exc}) while it held the results of the device-resident region at "
            f"{stats.func}+0x{stats.offset:x}; linear memory lacks them, so the call cannot go on"
        )

    # -- one arrival at a loop ------------------------------------------------------------------

    def _arrive(
        self, lp: OffloadedLoop, caller: int, args: tuple[int, ...], context: int | None = None
    ) -> list[int]:
        """One call of loop ``lp``'s host function: ``args`` are its live-ins, then the current
        values of the locals it returns; the result is the flag (1: the loop ran here), then
        those locals' values after the loop."""
        stats = lp.stats
        stats.arrivals += 1
        n_live = len(lp.plan.live_ins)
        if self.mode == "off":
            stats.decline("offload is off")
            return [0, *args[n_live:]]
        memory = hostfunc.memory(caller, context=context)
        if memory is None:
            stats.decline("the module has no (unshared) linear memory")
            return [0, *args[n_live:]]
        base, size = memory
        live = args[:n_live]
        ready = self._guards(lp, live, size)
        if isinstance(ready, str):
            stats.decline(ready)
            return [0, *args[n_live:]]
        arrival = ready.arrival(lp, live)
        launch = ready.launch
        estimate = None
        if self.mode == "auto" and launch.trip:
            gpu = self.device == "gpu"
            nbytes = self._bytes_to_move(lp, ready) if gpu else 0
            pinned = gpu and self.pin and not (self._mirror is not None and self._mirror.pin_failed)
            go, why, model, cpu = lp.estimate.decide(self.device, ready.ops, nbytes, pinned, ready.cells)
            if not go:
                stats.decline(why)
                return [0, *args[n_live:]]
            estimate = (time.perf_counter(), model, cpu)
        if launch.trip == 0:  # a loop tested first that runs no iteration
            partials = ready.identities
        else:
            partials = self._run(lp, ready, arrival, base, size)
        if partials is None:
            return [0, *args[n_live:]]
        if estimate is not None:
            started, model, cpu = estimate
            lp.estimate.record(time.perf_counter() - started, model, cpu)
        stats.offloaded += 1
        stats.iterations += launch.trip
        results = [1, *arrival.live_outs(partials)]
        if launch.trip and arrival.replay is not None and not ready.reductions:  # this launch replays
            if len(lp.again) >= ARRIVALS_KEPT:
                lp.again.clear()
            lp.again[live] = again = Again(self, ready, arrival, live, memory, results)
            again.decision = estimate[1:] if estimate is not None else None
        return results

    def _still_valid(self, again: Again) -> bool:
        """Whether nothing a recorded replay relies on changed, linear memory aside."""
        mirror = self._mirror
        return (mirror is again.mirror and mirror.epoch == again.epoch and mirror.scratch_holds is again.image
                and self.gpu_lost is None and self.mode == again.mode and not mirror.stale)  # fmt: skip

    def _again(
        self, lp: OffloadedLoop, again: Again, caller: int, args: tuple[int, ...], context: int | None = None
    ) -> list[int] | None:
        """An arrival with the live-ins of one whose launch was recorded with nothing to upload
        and nothing left to decide: the guards' outcome, the launch's arguments and its results
        are that arrival's, so it replays the recorded graph, waits, checks the trap slot and
        moves the staged results into linear memory. None (and the arrival forgotten) where
        anything that relied on changed (linear memory, the mirror's buffers or page-locking,
        the scratch buffer's contents, the mode, the GPU): the whole path decides."""
        if hostfunc.memory(caller, context=context) != again.memory or not self._still_valid(again):
            lp.again.pop(again.live, None)
            return None
        stats = lp.stats
        stats.arrivals += 1
        ready = again.ready
        decision = None
        if again.mode == "auto":
            pinned = self.pin and not self._mirror.pin_failed
            go, why, model, cpu = lp.estimate.decide("gpu", ready.ops, ready.moved, pinned, ready.cells)
            if not go:
                stats.decline(why)
                return [0, *args[again.n_live :]]
            decision = (model, cpu)
        self._generation[0] += 1
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
        self, lp: OffloadedLoop, again: Again, args: tuple[int, ...], exc: CudaError
    ) -> list[int]:
        """A replay's driver call failed: decline, and recover (or wait for what was queued)."""
        lp.again.pop(again.live, None)
        if not exc.sticky:  # (a reset context takes the graphs with it)
            self._mirror.forget_graph(again.graph)
        self._device_error(lp, exc)
        return [0, *args[again.n_live :]]

    def _replayed(self, lp: OffloadedLoop, again: Again, args: tuple[int, ...], launched: float | None = None,
                  decision: tuple[float, float] | None = None) -> list[int]:  # fmt: skip
        """After a replay's wait: where the kernel trapped decline, else move the staged
        results into linear memory and return the arrival's. ``launched`` (and, in auto mode,
        ``decision``: the modelled and CPU seconds): when it was launched, where timed here."""
        stats, mirror, ready = lp.stats, self._mirror, again.ready
        done = time.perf_counter()
        if ctypes.string_at(again.staging, again.back_bytes) != again.back:
            mirror.scratch_holds = None  # the kernel wrote its scratch: the next launch uploads
            lp.again.pop(again.live, None)
            code = mirror.staged[abi.CTX_TRAP]
            if code:  # it trapped: nothing reaches linear memory, wasmtime runs the loop
                stats.decline(_trap_reason(code))
                return [0, *args[again.n_live :]]
        base = again.memory[0]
        for lo, at, nbytes in again.staged:
            ctypes.memmove(base + lo, at, nbytes)
        end = time.perf_counter()
        stats.transfer_seconds += end - done
        stats.bytes_in += ready.in_bytes
        stats.bytes_out += ready.out_bytes
        if decision is not None:
            lp.estimate.record(end - launched, *decision)
        stats.offloaded += 1
        stats.replayed += 1
        stats.iterations += ready.launch.trip
        again.generation = self._generation[0]
        if decision is not None:
            again.decision = decision
        return again.results

    # Guard outcomes kept per loop: a loop arrives again and again with the same live-ins
    # (a time step's pointers alternate between two arrays), and the outcome is a function
    # of the live-ins the guards read (:func:`runtime.guards.inputs`) and the memory size.
    GUARD_CACHE_ENTRIES = 16

    def _guards(self, lp: OffloadedLoop, live: tuple[int, ...], size: int) -> Ready | str:
        """The launch the guards allow for these live-ins, made ready, or why they refuse it."""
        cache = self._guard_cache.get(lp.kernel_index)
        if cache is None:
            cache = self._guard_cache[lp.kernel_index] = {}
            read = guards.inputs(lp.plan)
            indices = [i for i, (_, sym, _, _) in enumerate(lp.plan.live_ins) if sym in read]
            self._guard_reads[lp.kernel_index] = operator.itemgetter(*indices) if indices else _nothing
        key = (self._guard_reads[lp.kernel_index](live), size)
        outcome = cache.get(key)
        if outcome is None:
            env = _environment(lp.plan, live)
            env = {sym: env[sym] for sym in guards.inputs(lp.plan) if sym in env}
            try:
                launch = guards.check(lp.plan, env, size, strict_alignment=self.device == "gpu")
                outcome = Ready(lp, launch, size)
            except guards.GuardFailed as exc:
                outcome = str(exc)
            if len(cache) >= self.GUARD_CACHE_ENTRIES:
                cache.clear()
            cache[key] = outcome
        return outcome

    def _bytes_to_move(self, lp: OffloadedLoop, ready: Ready) -> int:
        """The bytes a GPU launch would copy (inside a region: only in, what the device lacks)."""
        if lp.region is None:
            return ready.moved
        if self._mirror is None:  # nothing is on the device yet
            from tensorwasm.runtime.mirror import union

            return sum(hi - lo for lo, hi in union([], [(s.lo, s.hi) for s in ready.needed]))
        return self._mirror.missing_bytes(ready.needed)

    def _run(
        self, lp: OffloadedLoop, ready: Ready, arrival: Arrival, base: int, size: int
    ) -> list[int] | None:
        """Run the launch; the reductions' partial results, or None where it declined."""
        if self.device == "gpu":
            return self._run_gpu(lp, ready, arrival, base, size)
        stats = lp.stats
        launch = ready.launch
        params = arrival.params
        ctx_image, chunks = ready.host_args(self)
        ctx = _Context.from_buffer_copy(ctx_image)
        ctx[abi.CTX_MEM_BASE] = base
        saved = [(r.lo, ctypes.string_at(base + r.lo, r.hi - r.lo)) for r in ready.written]
        start = time.perf_counter()
        if len(chunks) == 1:
            out = (U64 * len(ready.out_words))(*ready.out_words)
            self.kernels[lp.entry](
                ctypes.addressof(ctx), ctypes.addressof(params), 0, launch.trip, *launch.nest,
                ctypes.addressof(out),
            )  # fmt: skip
        else:
            out = self._run_threads(lp, launch, ctx, params, chunks)
            stats.threads = max(stats.threads, len(chunks))
        stats.kernel_seconds += time.perf_counter() - start
        if ctx[abi.CTX_TRAP]:
            for lo, raw in saved:  # undo, and let wasmtime run the loop (to its trap, if any)
                ctypes.memmove(base + lo, raw, len(raw))
            stats.decline(_trap_reason(ctx[abi.CTX_TRAP]))
            return None
        return out[: ready.reductions]

    # Iterations below which one host thread does the whole loop (a thread costs ~50 us).
    THREAD_MIN_ITERATIONS = 8_192

    def _chunks(self, trip: int, per_iteration: int = 1) -> list[tuple[int, int]]:
        threads = min(CPUS, trip, max(1, trip * per_iteration // self.THREAD_MIN_ITERATIONS))
        step = -(-trip // threads)
        return [(lo, min(lo + step, trip)) for lo in range(0, trip, step)]

    def _run_threads(self, lp: OffloadedLoop, launch: Launch, ctx, params, chunks) -> ctypes.Array:
        """Run iteration ranges on host threads (the native code releases the GIL), each
        folding its reductions into its own slots; then fold the slots together."""
        count = max(1, len(lp.plan.reductions))
        outs = [(U64 * count)(*_identities(lp)) for _ in chunks]
        entry = self.kernels[lp.entry]
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=CPUS)
        futures = [
            self._pool.submit(
                entry,
                ctypes.addressof(ctx),
                ctypes.addressof(params),
                lo,
                hi,
                *launch.nest,
                ctypes.addressof(o),
            )
            for (lo, hi), o in zip(chunks, outs, strict=True)
        ]
        for future in futures:
            future.result()
        total = (U64 * count)(*_identities(lp))
        for i, r in enumerate(lp.plan.reductions):
            for o in outs:
                total[i] = _combine(r.op, total[i], o[i], r.arg.type)
        return total

    def _run_gpu(
        self, lp: OffloadedLoop, ready: Ready, arrival: Arrival, base: int, size: int
    ) -> list[int] | None:
        """Run on the GPU; on any device failure decline (wasmtime runs the loop) and say why."""
        if self.gpu_lost is not None:
            lp.stats.decline(self.gpu_lost)
            return None
        self._generation[0] += 1
        if self._mirror is None:
            try:
                self.mirror  # noqa: B018 (the context and device memory, made at the first launch)
            except TensorWasmError as exc:  # no usable GPU after all, or one unlike the remembered
                self.gpu_lost = (
                    str(exc) if isinstance(exc, driver.NoGPU) else f"the GPU cannot be used: {exc}"
                )
                self._fall_back(lp, self.gpu_lost)
                return None
        try:
            if self._mirror.stale:  # another module on the context reset it
                self._renew()
            return self._launch_gpu(lp, ready, arrival, base, size)
        except (limits.DeviceMemoryLimitError, limits.DeviceOutOfMemory) as exc:
            self._fall_back(lp, f"device memory: {exc}")
        except driver.ModuleLoadError as exc:  # cached code the driver refuses: no loop can run there
            self.gpu_lost = f"the kernels failed to load: {exc}"
            self._fall_back(lp, self.gpu_lost)
        except driver.CudaError as exc:
            self._device_error(lp, exc)
        return None

    def _device_error(self, lp: OffloadedLoop, exc: driver.CudaError) -> None:
        """After a failed driver call in a launch: recover from a sticky fault (or wait for
        what was queued), and decline the arrival, saying why once per loop."""
        if exc.sticky:
            lost = self._mirror.holds_results
            self._recover(exc)
            if lost:  # the reset took the region's results with it
                raise RegionLost(self._lost_message(lp.region, exc)) from exc
        else:
            self._drain()
        self._fall_back(lp, f"GPU error: {exc}")

    def _launch_gpu(
        self, lp: OffloadedLoop, ready: Ready, arrival: Arrival, base: int, size: int
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
        resident = lp.region is not None
        staged = not resident and ready.out_bytes <= STAGED_RESULT_BYTES
        mirror.ensure(size, ready.slots, ready.out_bytes if staged else 0)
        if self.pin:
            mirror.pin(base, size)
        image, params = ready.device_args(mirror, arrival)
        needed = ready.needed
        copies = mirror.missing(needed) if resident else needed
        self.context.bind()
        upload = mirror.stage_scratch(image)
        # Every argument of the launch follows from the Ready launch, these three flags and
        # the buffers (which the mirror adds to the key); copies in part only do not.
        key = (ready.token, bool(copies), bool(upload), staged) if copies is needed or not copies else None
        launched = time.perf_counter()
        graph = mirror.launch(
            key, base, copies, upload, self.kernels[lp.entry], ready.grid, ready.block, params,
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
            moved_out = mirror.copy_out(base, ready.written)
            mirror.synchronize()
        stats.transfer_seconds += launched - start + time.perf_counter() - done
        stats.bytes_in += ready.in_bytes if copies is needed else sum(s.hi - s.lo for s in copies)
        stats.bytes_out += moved_out
        stats.pinned = mirror.pinned is not None
        # What the same arrival again replays (OffloadModule._again): this launch, where it ran
        # from a recorded graph with nothing to upload; else nothing.
        replayable = graph is not None and staged and not upload
        arrival.replay = (mirror, mirror.epoch, image, graph) if replayable else None
        return partials

    def _partials(self, lp: OffloadedLoop, ready: Ready, image: bytes) -> list[int] | None:
        """After a launch's wait: its reductions' partial results from the scratch buffer
        brought back, or None where the kernel trapped (the arrival is declined)."""
        back = self.mirror.check_scratch(image, ready.back_bytes)
        if back[abi.CTX_TRAP]:
            lp.stats.decline(_trap_reason(back[abi.CTX_TRAP]))
            return None
        return back[ready.out_at : ready.out_at + ready.reductions] if ready.reductions else ()

    def _drain(self) -> None:
        """After a failed call in a launch: wait for what was queued before it (copies into
        linear memory among them), so none lands once wasmtime runs the loop."""
        mirror = self._mirror
        if mirror is None:
            return
        mirror.scratch_holds = None
        try:
            mirror.synchronize()
        except driver.CudaError as exc:
            log.info("waiting for the stream after a failed launch: %s", exc)

    def _fall_back(self, lp: OffloadedLoop, reason: str) -> None:
        """Decline this arrival; warn once per loop and reason (the loop runs on wasmtime)."""
        if reason not in lp.stats.warned:
            lp.stats.warned.add(reason)
            log.warning("loop at %s+0x%x runs on the CPU: %s", lp.stats.func, lp.stats.offset, reason)
        lp.stats.decline(reason)

    # Sticky faults a module recovers from; after the next, its loops stay on the CPU.
    FAULTS_RECOVERED = 3

    def _recover(self, fault: driver.CudaError) -> None:
        """After a sticky fault: reset the context (unless another module on it did since)
        and reload the kernels (:meth:`_renew`). Past :attr:`FAULTS_RECOVERED` faults, or
        where no context can be made, every later loop runs on the CPU."""
        self.mirror.forget()
        self.faults += 1
        if self.faults > self.FAULTS_RECOVERED:
            self.gpu_lost = f"the GPU faulted {self.faults} times (last: {fault.call}: {fault.error_name}); loops run on the CPU"
            log.warning("%s", self.gpu_lost)
            self._mirror.abandon()  # (a faulted context refuses even to free)
            self._end_gpu_process()
            return
        try:
            if not self._mirror.stale and self.context.refused is None:
                try:
                    self.context.reset()
                except driver.CudaError:
                    if self.context.refused is None:  # (a GPU process that did not start again)
                        raise
            self._renew(fault)
        except (driver.CudaError, driver.NoGPU) as exc:
            self.gpu_lost = (
                f"the GPU faulted ({fault.call}: {fault.error_name}) and no context could be made "
                f"after it ({exc}); loops run on the CPU"
            )
            log.warning("%s", self.gpu_lost)
            self._mirror.abandon()
            self._end_gpu_process()

    def _renew(self, fault: driver.CudaError | None = None) -> None:
        """After the context was reset: new device memory and kernels. Where the driver
        refused the reset (it refuses the process any new context after a sticky fault), the
        module's GPU work goes on in a process of its own (:mod:`runtime.remote`), which a
        later fault there restarts."""
        from tensorwasm.runtime import remote
        from tensorwasm.runtime.mirror import DeviceMirror

        refused = self.context.refused
        if refused is not None:
            log.warning(
                "%sthe driver refuses this process further GPU work (%s): the GPU's work goes on "
                "in a process of its own",
                f"the GPU faulted ({fault.call}: {fault.error_name}) and " if fault else "",
                refused.error_name,
            )  # fmt: skip
            self.context = remote.WorkerContext(self.context.info.ordinal)
        self._mirror.abandon()
        self.mirror = DeviceMirror(self.context, self.device_memory_limit)
        self._load_kernels()


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

    def __init__(self, module: OffloadModule, lp: OffloadedLoop, hook: Hook) -> None:
        self.lp = lp
        self.arm = arm = replay.Arm()
        params, results = module._host_sigs[lp.insertion.import_name]
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
            ("generation_at", ctypes.addressof(module._generation)), ("fallback", hostfunc.TRAMPOLINE),
            ("fallback_env", hook.key), ("n_live", n_live), ("live", ctypes.addressof(self._live)),
            ("masks", ctypes.addressof(masks)), ("export_get", export_get), ("memory_data", memory_data),
            ("memory_size", memory_size), ("store_context", hook.context),
            ("export_name", ctypes.addressof(self._name)), ("export_len", len(MEMORY_EXPORT.encode())),
            ("memcmp", memcmp), ("clock", clock), ("n_results", len(results)),
            ("results", ctypes.addressof(self._results)),
        ):  # fmt: skip
            setattr(arm, name, value)
        self.again: Again | None = None
        self.decision: tuple[float, float] | None = None  # auto mode: (modelled, CPU seconds)

    def arm_with(self, again: Again, calls: tuple[int, int, int, int], budget: int,
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


def _compiled(engine: wasmtime.Engine, wasm: bytes) -> wasmtime.Module:
    """``wasm`` compiled by ``engine``, through the cache (wasmtime's own serialized code: a
    warm start skips compiling it; wasmtime refuses code made by another release or engine
    configuration, which is then compiled again)."""
    cache = default_cache()
    key = make_key("cwasm", sha256(wasm).hexdigest())
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


# Written ranges up to this size come back through the staging buffer, with the trap slot,
# in the launch's one wait (a memmove of 64 KiB costs less than a second wait); larger ones
# are copied straight into linear memory once the kernel is known not to have trapped.
STAGED_RESULT_BYTES = 64 << 10

_Context = abi.ContextBlock


class Ready:
    """A launch the guards allowed, kept with their outcome (per loop, the live-ins they read
    and the memory size), and what every launch of it needs that no arrival changes: the
    ranges to copy, the grid, the scratch layout and kernel arguments (GPU) or the context
    image and iteration ranges (host). What the other live-ins change is an :class:`Arrival`."""

    def __init__(self, lp: OffloadedLoop, launch: Launch, size: int) -> None:
        from tensorwasm.runtime.mirror import Span

        self.launch = launch
        self.size = size
        self.written = tuple(_merge(launch.writes))
        # Gathered loads may read anywhere: then the device gets all of memory.
        self.needed = (Span(0, size),) if launch.gathers else tuple(_merge(launch.reads + launch.writes))
        self.moved = sum(r.hi - r.lo for r in launch.reads + launch.writes)
        self.in_bytes = sum(r.hi - r.lo for r in self.needed)
        self.token = next(_tokens)  # names it in the mirror's recorded launches
        self.out_bytes = sum(r.hi - r.lo for r in self.written)
        self.ops = work(lp.plan, launch)
        self.cells = launch.trip * math.prod(launch.nest)  # iterations in parallel
        self.reductions = len(lp.plan.reductions)
        self.identities = _identities(lp)
        self.grid, self.block = _grid(launch)
        # The scratch buffer: context | live-ins | reduction slots | written ranges, in u64s.
        self.out_words = self.identities or [0]
        self.range_words = [v for r in self.written for v in (r.lo, r.hi)] or [0, 0]
        self.out_at = abi.CTX_SLOTS + max(1, len(lp.plan.live_ins))
        self.back_slots = self.out_at + len(self.out_words)  # what comes back after a launch
        self.slots = self.back_slots + len(self.range_words)
        self.back_bytes, self.staged_at = 8 * self.back_slots, 8 * self.slots
        self._device: tuple[tuple[int, int], bytes, bytes, driver.KernelParams] | None = None
        self._host: tuple | None = None
        self._arrivals: dict[tuple[int, ...], Arrival] = {}

    def arrival(self, lp: OffloadedLoop, live: tuple[int, ...]) -> Arrival:
        """The part of a launch that these live-ins make (kept for the last few of them)."""
        found = self._arrivals.get(live)
        if found is None:
            if len(self._arrivals) >= ARRIVALS_KEPT:
                self._arrivals.clear()
            found = self._arrivals[live] = Arrival(lp, self.launch, live)
        return found

    def device_args(self, mirror: DeviceMirror, arrival: Arrival) -> tuple[bytes, driver.KernelParams]:
        """The scratch image and the kernel's arguments for the mirror's current buffers."""
        buffers = (mirror.memory_ptr, mirror.scratch_ptr)
        if self._device is None or self._device[0] != buffers:
            memory, scratch = buffers
            ctx = abi.context_block(
                memory_base=memory, memory_size=self.size, memory_capacity=self.size,
                max_pages=self.size // abi.PAGE_SIZE, written_at=scratch + 8 * self.back_slots,
                written_count=len(self.written),
            )  # fmt: skip
            tail = [*self.out_words, *self.range_words]
            counts = (self.launch.trip, *self.launch.nest)
            params = driver.KernelParams([U64, U64, *(ctypes.c_int64 for _ in counts), U64])
            params.set([scratch, scratch + 8 * abi.CTX_SLOTS, *counts, scratch + 8 * self.out_at])
            self._device = (buffers, bytes(ctx), _words(tail), params)
        _, head, tail, params = self._device
        if arrival.image[0] is not params:  # made for other buffers
            arrival.image = (params, head + arrival.param_bytes + tail)
        return arrival.image[1], params

    def host_args(self, module: OffloadModule) -> tuple[bytes, list[tuple[int, int]]]:
        """For the host backend: the context's image (all but the memory base) and the
        iteration ranges of the host threads."""
        if self._host is None:
            self._spans = (U64 * len(self.range_words))(*self.range_words)  # the context points at it
            ctx = abi.context_block(
                memory_size=self.size, memory_capacity=self.size, max_pages=self.size // abi.PAGE_SIZE,
                written_at=ctypes.addressof(self._spans), written_count=len(self.written),
            )  # fmt: skip
            chunks = module._chunks(self.launch.trip, math.prod(self.launch.nest))
            self._host = (bytes(ctx), chunks)
        return self._host


_tokens = itertools.count()


class Again:
    """An arrival whose launch replays as it was, kept per loop by its live-ins
    (:meth:`OffloadModule._again`): what it ran with (the memory, the mirror and its epoch,
    the scratch image, the mode), the calls of its replay bound once, where its results wait
    in the staging buffer, and what it returned. Only arrivals without reductions, whose
    results are known before the launch."""

    __slots__ = (
        "back", "back_bytes", "bind", "decision", "epoch", "generation", "graph", "image", "launch", "live",
        "memory", "mirror", "mode", "n_live", "ready", "results", "staged", "staging", "stream", "wait",
    )  # fmt: skip

    def __init__(self, module: OffloadModule, ready: Ready, arrival: Arrival, live: tuple[int, ...],
                 memory: tuple[int, int], results: list[int]) -> None:  # fmt: skip
        mirror, epoch, image, graph = arrival.replay
        self.ready, self.live, self.n_live = ready, live, len(live)
        self.memory, self.mirror, self.epoch, self.image = memory, mirror, epoch, image
        self.mode, self.results = module.mode, results
        self.generation = module._generation[0]  # the module's, just after its launch
        self.decision: tuple[float, float] | None = None  # auto mode: the last launch's (model, CPU seconds)
        self.graph, self.launch, self.stream = graph, graph.launch, mirror.stream.handle
        self.bind, self.wait = module.context.bind, mirror.stream.synchronize
        self.staging, self.back_bytes = mirror.staging.ptr, ready.back_bytes
        self.back = image[: ready.back_bytes]  # the scratch as a launch that did not trap leaves it
        at = self.staging + ready.staged_at
        self.staged = []  # (offset in linear memory, staging address, bytes) of each written range
        for span in ready.written:
            self.staged.append((span.lo, at, span.hi - span.lo))
            at += span.hi - span.lo


# Live-ins kept per Ready launch: a time step's counter makes a new set every step.
ARRIVALS_KEPT = 16


class Arrival:
    """What one arrival's live-ins add to a :class:`Ready` launch: the kernel's parameters,
    and the returned locals: those known without running it (induction values at the exit)
    and, for each reduction's, where it goes, its slot, operator, initial value and type."""

    def __init__(self, lp: OffloadedLoop, launch: Launch, live: tuple[int, ...]) -> None:
        plan = lp.plan
        env = _environment(plan, live)
        bits = [v & MASKS[64] for v in live] or [0]
        self.param_bytes = _words(bits)
        self.image = (None, b"")  # (kernel arguments, scratch image) of its last GPU launch
        self.replay: tuple | None = None  # (mirror, its epoch, scratch image, graph): see Again
        self.params = (U64 * len(bits))(*bits)  # the host backend's
        k_exit = launch.trip if plan.trip.top else launch.trip - 1
        at_exit = dict(env)
        at_exit[plan.counter] = k_exit
        types = lp.insertion.local_types
        reductions = {id(r): i for i, r in enumerate(plan.reductions)}
        self.values, self.folds = [], []
        for live_out in _returned(plan):
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
            out[at] = _to_host(_combine(op, init, partials[index], ty), ty)
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


def _words(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


# Threads per block, and the grid's limit in y and z (x allows 2**31 - 1 blocks; the
# kernels stride over whatever the grid does not cover).
BLOCK_THREADS = 256
MAX_GRID_Y = 65535


def _grid(launch: Launch) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Grid and block: 1-D over the iterations, or x over a nest's innermost counter (rounded
    to whole warps), y over the next one out and z over the outermost of a 3-D nest."""
    if not launch.nest:
        return (max(1, min(-(-launch.trip // BLOCK_THREADS), 65535)), 1, 1), (BLOCK_THREADS, 1, 1)
    *outer, innermost = (launch.trip, *launch.nest)
    width = min(BLOCK_THREADS, 32 * -(-innermost // 32))
    y = min(outer[-1], MAX_GRID_Y)
    z = min(outer[0], MAX_GRID_Y) if len(outer) == 2 else 1
    return (min(-(-innermost // width), 65535), y, z), (width, 1, 1)


def _host_entry_type(lp: OffloadedLoop):
    """``(ctx, params, begin, end, [trip2, [trip3,]] out)``: see ``lower_loop_entry``."""
    counts = (ctypes.c_int64,) * (2 + len(lp.plan.collapse))
    return ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, *counts, ctypes.c_void_p)


def _insertion(wasm, plan: LoopPlan, import_name: str) -> Insertion:
    index = plan.func.index
    sig = wasm.func_sig(index)
    local_types = list(sig.params) + wasm.codes[index - wasm.num_imported_funcs].locals
    locals_ = [i for _, _, kind, i in plan.live_ins if kind == "local"]
    globals_ = [i for _, _, kind, i in plan.live_ins if kind == "global"]
    # The host receives the live-ins in plan order: locals first, then globals (the
    # analysis orders them so, and the kernel's parameters follow the same order).
    return Insertion(index, plan.loop.start, plan.loop.end, locals_, globals_,
                     [lo.local for lo in _returned(plan)], local_types, import_name)  # fmt: skip


def _returned(plan: LoopPlan) -> list:
    """The live-outs the host hands back: a local not read after the loop keeps its value
    (wasmtime-py converts every value crossing the boundary, at a cost per value)."""
    return [live for live in plan.live_outs if live.kind != "dead"]


def _host_sig(wasm, ins: Insertion):
    from tensorwasm.compiler.rewrite import host_signature

    sig = host_signature(ins, [g.type for g in wasm.global_types()])
    return sig.params, sig.results


def _identities(lp: OffloadedLoop) -> list[int]:
    from tensorwasm.compiler.outline import identity_bits

    return [identity_bits(r.op, r.arg.type) for r in lp.plan.reductions]


def _to_host(bits: int, ty: Type) -> int:
    """A bit pattern as wasmtime-py wants an i32/i64 result: a signed Python int."""
    width = 64 if ty.bits == 64 else 32
    bits &= MASKS[width]
    return bits - (1 << width) if bits >> (width - 1) else bits


def _combine(op: str, a: int, b: int, ty: Type) -> int:
    bits = ty.bits
    mask = MASKS[bits]
    a &= mask
    b &= mask
    if op in ("fadd", "fmul"):
        fmt, ifmt = ("<f", "<I") if ty is F32 else ("<d", "<Q")
        x, y = (struct.unpack(fmt, struct.pack(ifmt, v))[0] for v in (a, b))
        import numpy as np

        cast = np.float32 if ty is F32 else np.float64
        result = cast(x) + cast(y) if op == "fadd" else cast(x) * cast(y)
        return struct.unpack(ifmt, struct.pack(fmt, result))[0]
    if op == "add":
        return (a + b) & mask
    if op == "mul":
        return (a * b) & mask
    if op == "and":
        return a & b
    if op == "or":
        return a | b
    if op == "xor":
        return a ^ b
    kind, sign = op.split("_")
    key = (lambda v: v - (1 << bits) if v >> (bits - 1) else v) if sign == "s" else (lambda v: v)
    pick = min if kind == "min" else max
    return pick(a, b, key=key)


def _trap_reason(code: int) -> str:
    from tensorwasm.compiler.traps import TrapKind, trap_message

    if code == TrapKind.GATHER_CONFLICT:
        return "a gathered load read memory the loop writes; the loop re-ran on the CPU"
    return f"the kernel trapped ({trap_message(code)}); the loop re-ran on the CPU"


def _merge(ranges) -> list[Span]:
    """Sorted, coalesced byte ranges (one covering span past 128 of them)."""
    from tensorwasm.runtime.mirror import Span, union

    merged = union([(r.lo, r.hi) for r in ranges], [])
    if len(merged) > 128:
        merged = [(merged[0][0], merged[-1][1])]
    return [Span(lo, hi) for lo, hi in merged]


# Thresholds the fuzzer's offload instances give their filters: mostly never skip, else
# skip only a loop with nowhere to go, a little, some, nearly all.
FILTER_DRAWS = (NEVER_SKIP, NEVER_SKIP, NEVER_SKIP, NEVER_SKIP, 0, 3, 16, 1 << 20)


class OffloadInstance:
    """An instance of the rewritten module on wasmtime, called with exact bit patterns, whose
    loops are offloaded: the differential oracle's "offload" backend. It answers the same
    calls as the executors (``call``, ``memory``, ``globals``)."""

    def __init__(self, wasm: bytes, device: str = "cpu", filters: bool = False, pin: bool = False,
                 offload: OffloadModule | None = None):  # fmt: skip
        """``filters``: give the Wasm-side filters thresholds drawn per module (a fixed draw,
        so a shrunk case keeps its own), as the fuzzer does: arrivals kept from the host
        must run as they would there. Otherwise every arrival asks the host. ``pin``: on the
        GPU, page-lock linear memory as ``tensorwasm run`` does (launches then replay from
        recorded graphs); :meth:`close` must then be called before the instance goes."""
        from tensorwasm.runtime.instance import initial_state
        from tensorwasm.runtime.reference import ReferenceInstance

        self.offload = offload or OffloadModule(wasm, device=device, mode="always", pin=pin)
        self.offload.NATIVE_AFTER = 1  # replays go native at once: the oracle compares them too
        self.wasm = self.offload.wasm
        self.state = initial_state(self.wasm)

        def host_funcs(store):
            return {(HOST_MODULE, name): f for name, f in self.offload.host_functions(store).items()}

        self._instance = ReferenceInstance(self.offload.rewritten, host_funcs)
        draws = None
        if filters:
            draw = random.Random(sha256(self.offload.rewritten).digest())
            draws = [draw.choice(FILTER_DRAWS) for _ in self.offload.loops]
        self.offload.bind(self._instance._store, self._instance._exports, draws)

    def call(self, export: str, args):
        return self._instance.call(export, args)

    def close(self) -> None:
        """Give back device memory and unpin linear memory (the oracle calls it per module)."""
        self.offload.close()

    def memory(self) -> bytes | None:
        names = self.wasm.export_names("memory", 0)
        return self._instance.memory(names[0]) if names else None

    def globals(self) -> list[int]:
        values = [0] * len(self.wasm.global_types())
        exported = self._instance.globals()
        for export in self.wasm.exports:
            if export.kind == "global" and export.name in exported:
                values[export.index] = exported[export.name][1]
        return values

    @property
    def offloaded(self) -> int:
        return sum(lp.stats.offloaded for lp in self.offload.loops)
