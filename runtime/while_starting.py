"""A GPU module's loops on the host's threads while its CUDA context is still being made.

A GPU's start takes ~0.3 s (:mod:`runtime.gpu_start`), which a program reaches its loops
well inside: PolyBench's time-step stencils run their first 50 to 170 steps on wasmtime
while the context is made, each arrival declining as "the device was still starting" or
"the work so far does not yet pay for starting the device". Those arrivals launch on the
host backend instead (:class:`runtime.host_device.HostLaunches`: the same loop's kernel
compiled for this CPU, run in wasmtime's linear memory on the host's threads), where its
cost model finds the launch faster than wasmtime, and once its kernel is ready. Where the
kernel's shared library is in the code cache (:mod:`compiler.target.shared`) it is loaded
at once, in about a millisecond and without LLVM; otherwise the host code is compiled (or
read from the code cache) and loaded through LLVM's JIT on a compile worker, never on
wasmtime's thread, once the arrivals it would have sped up gain what that start costs
(``profit.STARTUP_SECONDS["cpu"]``), and where this machine links libraries an arrival
short of that has the kernel compiled, with its library, for the next run. Kernels the
last run found slower here than on wasmtime are parked (:mod:`runtime.known_host`). Once
the context is made every launch goes to the GPU. A launch that would rather wait for the
context (it gains more than the wait) runs here instead where the host's estimate finishes
it before the rest of the start and the device's launch would, and its kernel is loaded or
in the code cache (else it is compiled, for the next run; PolyBench's doitgen: its one
launch arrives 130 to 180 ms before a context begun with the program is made, after the GPU
sat idle for two seconds). That estimate is the host's model at the kernel's pace measured
here by the last runs (:mod:`runtime.known_host`), where they launched it: the model alone
took PolyBench's 2mm's first kernel for 2.5x to 6x faster than it ran here (121 to 168 ms,
against 27 to 48 ms waiting for the device, on an H200), so a run launches it here at most
once before its pace is known. ``TENSORWASM_HOST_WHILE_STARTING``
(:func:`tensorwasm.support.config.host_while_starting`) leaves the loops of
device-resident regions out by default: their time steps gained nothing here on the H100's host,
and fdtd-2d's lost.

Nothing of the GPU's side changes: a launch in linear memory leaves it as wasmtime would
have, so a device-resident region whose first launches ran here copies in, at its first
GPU launch, what the device does not hold yet (all of it); a host launch that traps leaves
memory as it was (the host backend's undo), and wasmtime runs the loop. Kernels of
distributed schedules (phases, a GPU's) stay on wasmtime here: on the host, each thread of
a phase runs its whole inner loop in turn, reading rows down their columns (PolyBench LARGE
gemm 2.5 s and syrk 1.2-1.5 s against wasmtime's 0.8 and 0.5 s on the 2-core CPU machine);
the host backend's own modules are not distributed (``AnalysisOptions.distribute``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.target import HostTarget
from tensorwasm.compiler.target.shared import find_linker
from tensorwasm.runtime.host_device import HostDevice, HostLaunches
from tensorwasm.runtime.known_host import Gains
from tensorwasm.runtime.loop_kernels import LoopKernels
from tensorwasm.runtime.profit import SLOWER_LIMIT, STARTUP_SECONDS, Estimate
from tensorwasm.support import logs
from tensorwasm.support.records import replace

log = logs.get_logger(__name__)

if TYPE_CHECKING:
    from tensorwasm.runtime.offload import OffloadModule
    from tensorwasm.runtime.planning import LaunchArguments, OffloadedLoop, PreparedLaunch


class HostWhileStarting:
    """The host backend standing in for a GPU module (``module``) while its device starts:
    the module's loops with their host entries, their host kernels, and the host launches."""

    code_kind = "cpu"

    def __init__(
        self, module: OffloadModule, regions: bool = True, paces: dict[int, float] | None = None
    ) -> None:
        self.module = module
        self.regions = regions  # whether the loops of device-resident regions run here too
        self.mode = module.mode
        self.backend = HostDevice()
        self.target = HostTarget()
        # The module's loops (their statistics shared) under their host entries.
        self.loops = [replace(lp, entry=abi.loop_entry_name(lp.kernel_index, False)) for lp in module.loops]
        self._kernels = LoopKernels(self)
        self._host_entry = {lp.entry: host.entry for lp, host in zip(module.loops, self.loops, strict=True)}
        self._loop_of = {lp.kernel_index: lp for lp in self.loops}
        self.kernels = _ByGpuEntry(self._kernels, self._host_entry)
        self.launches = HostLaunches(self)
        self.estimates: dict[int, Estimate] = {}  # per kernel: the host's own measured correction
        self.banked = 0.0  # what the host launches would have gained before its kernels were ready
        self.gains = Gains()  # per kernel: what its arrivals gained here, or would have
        # Per kernel: its pace here in the last runs (known_host); the module's own dict, where
        # given, so that the paces it reads later land here too.
        self.paces: dict[int, float] = paces if paces is not None else {}

    @property
    def key(self) -> str:
        return self.module.key

    def preparation(self):
        return self.module.preparation()

    def run(
        self,
        lp: OffloadedLoop,
        ready: PreparedLaunch,
        arrival: LaunchArguments,
        base: int,
        size: int,
        beat: float | None = None,
    ) -> list[int] | None:
        """The reductions' partial results of ``lp``'s launch on the host's threads, or None
        where it does not run here (wasmtime runs it): a distributed schedule or a stepped
        loop (its iterations in order: one host thread would gain nothing), a kernel not
        ready yet (its compile is begun), a launch the host's cost model finds slower than
        wasmtime, or a kernel that trapped. With ``beat``, a launch that would rather wait
        for the device (for the rest of its start and its launch, ``beat`` seconds): it
        runs here only where the host's estimate (its model at the kernel's pace measured
        here, in this run or the last ones: :meth:`_pace`) is below that and its kernel is
        loaded or loads at once from the code cache (None: it waits; where this machine links
        libraries, the kernel is compiled on a worker meanwhile, for the next run)."""
        distributed = lp.plan.phases and not lp.plan.collapse and not lp.plan.fission
        if distributed or lp.plan.stepped or (lp.region is not None and not self.regions):
            return None
        index = lp.kernel_index
        estimate = self.estimates.setdefault(index, Estimate())
        go, _, model, cpu = estimate.decide("cpu", ready.ops, 0, False, ready.cells, touched=ready.moved)
        if not go:
            return None
        if beat is not None:
            pace = self._pace(index, estimate)
            here = model * pace
            log.info(
                "kernel %d: the host's threads in ~%.1f ms (pace %.2f) against ~%.1f ms waiting for the "
                "device and its launch: %s", index, here * 1e3, pace, beat * 1e3,
                "waits" if here >= beat else "runs here",
            )  # fmt: skip
            if here >= beat:
                return None
        if beat is not None and index not in self._kernels.units:
            loop = self._loop_of[index]
            if not self._kernels.loads_cheaply(index):
                if find_linker() is not None and index not in self._kernels.pending:
                    self._kernels.prefetch(loop)  # (its library, to load at once next time)
                return None
            if self._kernels.compile(loop, wait=True) is not None:
                return None
        elif index not in self._kernels.units:
            # The host's own start (LLVM's JIT loaded, the kernel read or compiled), paid only
            # once the arrivals it would have sped up gain as much: a program whose loops gain
            # less loads nothing, unless its last run here remembered the kernel (then it is
            # loading since the run began), or the kernel's shared library is in the code
            # cache (loaded now, in about a millisecond, without LLVM). Otherwise, where this
            # machine can link one, the kernel is compiled on a worker, for the next run (the
            # exit waits for it).
            self.banked += cpu - model
            self.gains.would_have(index, cpu - model)
            loop = self._loop_of[index]
            if self._kernels.loads_cheaply(index):
                if self._kernels.compile(loop, wait=True) is not None:
                    return None
            elif self.banked < STARTUP_SECONDS["cpu"] and index not in self._kernels.pending:
                if find_linker() is not None:  # (a library to load cheaply next time)
                    self._kernels.prefetch(loop)
                return None
            elif not self._kernels.ready_in_background(loop):
                return None
        started = time.perf_counter()
        partials = self.launches.run(lp, ready, arrival, base, size)
        if partials is not None:
            took = time.perf_counter() - started - self.launches.take_threads_seconds()  # (once per process)
            estimate.record(took, model, cpu)
            self.gains.launched(index, cpu - took)
            if model > 0.0:
                self.gains.paced(index, took / model)
            lp.stats.on_host += 1
        return partials

    def loads_cheaply(self, index: int) -> bool:
        """Whether kernel ``index``'s host code loads from its shared library in the code cache."""
        return self._kernels.loads_cheaply(index)

    def pace(self, paces: Mapping[int, float]) -> None:
        """Take the kernels' paces measured here in the last runs (``paces``: their last
        launch's time over the host's model, :meth:`runtime.known_host.Gains.paced`), for
        the choice between these threads and waiting for the device."""
        self.paces.update(paces)

    def _pace(self, index: int, estimate: Estimate) -> float:
        """Kernel ``index``'s pace here: its correction where this run measured it (a launch
        after its first), else its last launch's in the last runs (a first launch, as the
        one a launch that could wait is), else the model's own (1). Only the choice against
        waiting takes it: whether a launch here pays against wasmtime keeps the model,
        corrected by this run's launches (a first launch's pace, slowed by its warm-up, sent
        PolyBench's mvt back to wasmtime on an H200, 5.7 ms -> 22 ms)."""
        if estimate.launches >= 2:
            return estimate.correction
        return self.paces.get(index, 1.0)

    def park(self, indices: set[int]) -> None:
        """Leave the kernels ``indices`` to wasmtime from their first arrival, as if two of
        their launches here had run slower than wasmtime (retried now and then, as such)."""
        for index in indices:
            self.estimates[index] = Estimate(launches=SLOWER_LIMIT, slower=SLOWER_LIMIT)

    def load_early(self, indices: set[int]) -> bool:
        """Begin reading and loading the kernels ``indices`` before any of their arrivals
        (:meth:`runtime.loop_kernels.LoopKernels.load_early`, for
        :meth:`runtime.offload.OffloadModule.load_host_kernels_early`); whether any was begun
        (not where kernels compile at their launches)."""
        wanted = [
            lp for lp in self.loops if lp.kernel_index in indices and (self.regions or lp.region is None)
        ]
        return self._kernels.load_early(wanted)


class _ByGpuEntry(Mapping):
    """The host kernels by the GPU launch entries of the same loops (what the host launches
    look up, given the GPU module's loops)."""

    def __init__(self, kernels: LoopKernels, host_entry: dict[str, str]) -> None:
        self._kernels, self._host_entry = kernels, host_entry

    def __getitem__(self, entry: str) -> Any:
        return self._kernels[self._host_entry[entry]]

    def __iter__(self):
        return iter(self._host_entry)

    def __len__(self) -> int:
        return len(self._host_entry)
