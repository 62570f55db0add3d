"""The CUDA device, and the same device reached through a GPU process of its own.

:class:`CudaDevice` runs an offloaded module's launches on the process's primary CUDA
context (:mod:`runtime.driver`), in device memory a :class:`~runtime.mirror.DeviceMirror`
holds. Its code's target comes from the context, or, before one is made, from the
description the last context on this machine left (:mod:`runtime.known_gpu`): the context
is then made at the first launch, and where its device is not the remembered one the module
is told to take code made for it. After a sticky fault the driver may refuse the process
any new context: the device then goes on in a GPU process of its own
(:class:`runtime.remote.WorkerContext`), which :class:`GpuProcessDevice` uses from the start.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from tensorwasm.compiler.target import nvptx_for_device
from tensorwasm.runtime import gpu_start
from tensorwasm.runtime.cache import assemble_ahead, cubin_ready, load_kernels
from tensorwasm.support import logs
from tensorwasm.support.lazy import LazyModule

driver = LazyModule("tensorwasm.runtime.driver", globals(), "driver")

log = logs.get_logger(__name__)


class CudaDevice:
    """A GPU through the process's primary CUDA context (made at first need)."""

    kind = "gpu"
    code = "gpu"
    label = "gpu"
    pin = False

    def __init__(self) -> None:
        self._context = None  # see the context property
        self.assumed = None  # the remembered device the target was made for (known_gpu)
        self.cu_modules: dict[str, Any] = {}  # the loaded kernels' modules, by an entry of each
        self._owner: weakref.ref | None = None  # the module whose launches run here (see runner)
        self.starter = gpu_start.STARTER  # the thread making the context (see startup_seconds)
        self.start_begun = False

    def target(self):
        """The code's target: the device's, from its context if one is made, else from the
        description its last context gave on this machine (a run waits for the context only
        at its first launch), else from a new context."""
        from tensorwasm.runtime import known_gpu
        from tensorwasm.runtime.device_info import context_made

        info = None
        if not context_made():
            info = self.assumed = known_gpu.remembered()
        if info is None:
            self._context = driver.Context.get()
            info = self._context.info
            known_gpu.remember(info)
        return nvptx_for_device(info.compute_capability, info.driver_version)

    @property
    def context(self):
        """The CUDA context, made (or waited for) at first need: a launch, a cold compile's
        load. Where the target came from a remembered description, the module is told the
        real device here (it takes the code made for it, or raises NoGPU)."""
        if self._context is None:
            context = driver.Context.get()
            if self.assumed is not None:
                owner = self._owner() if self._owner is not None else None
                if owner is not None:
                    owner.retarget(context.info)
                self.assumed = None
            self._context = context
        return self._context

    def begin_start(self) -> None:
        """Begin making the context on a thread of its own (:mod:`runtime.gpu_start`), once:
        asked where the arrivals that would have paid for a launch gain enough (see
        ``ArrivalPlanner._started``), so the launch that pays finds the context made, or
        waits only for the rest."""
        if self._context is None and not self.start_begun:
            self.start_begun = True
            self.starter.begin(self.make_context)

    def startup_seconds(self) -> float:
        """What a first launch pays before it runs, where it has no context yet: the device's
        start, less what a thread making the context (:mod:`runtime.gpu_start`) has done of
        it."""
        from tensorwasm.runtime.profit import CONTEXT_SECONDS, STARTUP_SECONDS

        if self._context is not None:
            return 0.0
        context = CONTEXT_SECONDS["gpu"]
        return STARTUP_SECONDS["gpu"] - context + self.starter.seconds_left(context)

    def startup_wait(self) -> float:
        """How long a launch now would wait for the thread making the context (0 once it is
        made, or where no thread is making it)."""
        from tensorwasm.runtime.profit import CONTEXT_SECONDS

        if self._context is not None:
            return 0.0
        return self.starter.seconds_to_wait(CONTEXT_SECONDS["gpu"])

    def make_context(self) -> None:
        """What the thread starting the device runs (:func:`runtime.gpu_start.make_context`)."""
        gpu_start.make_context()

    def runner(self, prepared: Any):
        from tensorwasm.runtime.device_launch import DeviceLaunches

        self._owner = weakref.ref(prepared)
        return DeviceLaunches(prepared, self)

    def assemble(self, ptx: bytes) -> bool:
        """Have ptxas assemble a kernel's PTX where it was compiled (a worker thread, maybe
        before the context exists), its cubin filed in the code cache where the kernel's first
        load finds it (:func:`runtime.cache.assemble_ahead`): that load, on the launch's path,
        is then the driver's load of a cubin alone. The device is the context's, else the one
        the target was made for; False where no cubin was filed (the load assembles). A crash
        of ptxas is the :class:`~runtime.driver.ModuleLoadError` the load would raise."""
        from tensorwasm.runtime.assembler import AssemblerCrash

        info = self._info()
        if info is None:
            return False
        try:
            return assemble_ahead(info, ptx)
        except AssemblerCrash as exc:
            invalid = int(driver.cu.CUresult.CUDA_ERROR_INVALID_PTX)
            raise driver.ModuleLoadError("ptxas", invalid, exc.detail, info.arch, str(exc.kept)) from None

    def load_kernels(self, unit: Any) -> dict[str, Any]:
        """One kernel's PTX (a :class:`~runtime.loop_kernels.KernelUnit`) loaded as a module of
        its own, through the cubin cache; its loops' entries in it."""
        module = load_kernels(self.context, unit.ptx)
        for lp in unit.loops:
            self.cu_modules[lp.entry] = module
        return {lp.entry: module.function(lp.entry) for lp in unit.loops}

    def code_ready(self, ptx: bytes) -> bool:
        """Whether a kernel's first load here finds its cubin made (see :meth:`assemble`)."""
        info = self._info()
        return info is None or cubin_ready(info, ptx)

    def _info(self):
        """The device's description: its context's, else the remembered one the target came
        from (None where neither is known yet)."""
        return self._context.info if self._context is not None else self.assumed

    def resident_blocks(self) -> int:
        """Blocks a launch may have that are all resident at once, whatever the kernel's
        resources (one per multiprocessor): a split loop's grid waits for all of them."""
        return self.context.info.multiprocessor_count

    def wave_blocks(self, kernel, threads: int) -> int | None:
        """Blocks of ``kernel``, ``threads`` threads each, that the device holds at once: one
        wave. None where the kernel cannot say (one loaded in the GPU's own process)."""
        per = getattr(kernel, "blocks_per_multiprocessor", None)
        return None if per is None else per(threads) * self.context.info.multiprocessor_count

    def allocate(self, limit: int | None):
        from tensorwasm.runtime.mirror import DeviceMirror

        return DeviceMirror(self.context, limit)

    def bind(self) -> None:
        self.context.bind()

    def native_calls(self) -> tuple[int, int, int, int] | None:
        return self.context.native_calls()

    def watch(self, listener: Any) -> None:
        self.context.watchers.add(listener)

    def reset(self) -> None:
        """Reset the context after a sticky fault, unless the driver already refused it; a
        GPU process that could not start again raises."""
        context = self.context
        if context.refused is None:
            try:
                context.reset()
            except driver.CudaError:
                if context.refused is None:  # (a GPU process that did not start again)
                    raise

    def renew(self, fault: Any = None) -> None:
        """Where the driver refused the reset (it refuses the process any new context after a
        sticky fault), the work goes on in a process of its own (:mod:`runtime.remote`), which
        a later fault there restarts."""
        from tensorwasm.runtime import remote

        refused = self.context.refused
        if refused is not None:
            log.warning(
                "%sthe driver refuses this process further GPU work (%s): the GPU's work goes on "
                "in a process of its own",
                f"the GPU faulted ({fault.call}: {fault.error_name}) and " if fault else "",
                refused.error_name,
            )  # fmt: skip
            self._context = remote.WorkerContext(self.context.info.ordinal)

    def close(self) -> None:
        """End the GPU process the work went to after a fault, if any (its context holds
        device memory until it ends)."""
        remote = sys.modules.get("tensorwasm.runtime.remote")
        if remote is not None and isinstance(self._context, remote.WorkerContext):
            self._context.close()


class GpuProcessDevice(CudaDevice):
    """A GPU reached through a process of its own from the first launch (as a module goes on
    after a sticky fault the driver would not recover from)."""

    def __init__(self, ordinal: int = 0) -> None:
        from tensorwasm.runtime import remote

        super().__init__()
        self._context = remote.WorkerContext(ordinal)

    def target(self):
        info = self._context.info
        return nvptx_for_device(info.compute_capability, info.driver_version)
