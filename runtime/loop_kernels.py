"""The offloaded loops' kernels: each one compiled, cached and loaded at its first launch.

A kernel is a compile unit of its own: the outlined loop function and the functions it
calls, lowered into one LLVM module and compiled for the module's target (PTX for a GPU,
object code for the host backend). Its code is cached under the prepared module's key, the
kernel's index and the target, and loaded on the device on its own (one CUDA module per
kernel on the GPU, one JIT engine per kernel on the host).

Nothing is compiled before a launch needs it: :class:`CompileFirst` stands in front of the
device's launches, so an arrival that the planner sends to the device has its kernel
compiled (or read from the cache) first; a kernel that cannot be compiled declines its
arrivals with the reason, and wasmtime runs the loop. A program whose loops all stay on
wasmtime compiles nothing and loads no LLVM; one whose loops launch pays for the kernels
it launches, not for every kernel the module has.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tensorwasm.compiler.target import describe
from tensorwasm.runtime.cache import default_cache, make_key
from tensorwasm.support import logs
from tensorwasm.support.errors import TensorWasmError
from tensorwasm.support.records import record

if TYPE_CHECKING:
    from tensorwasm.runtime.offload import OffloadModule
    from tensorwasm.runtime.planning import LaunchArguments, LaunchRunner, OffloadedLoop, PreparedLaunch

log = logs.get_logger(__name__)


@record
class KernelUnit:
    """One kernel's code, as a device loads it (``Device.load_kernels``): the loops whose
    launches run it, and its PTX (GPU) or host object code, with that object already loaded
    (``code``) where this process compiled it."""

    loops: tuple[OffloadedLoop, ...]
    ptx: bytes | None = None
    host_object: bytes | None = None
    code: Any = None  # compiler.target.HostCode, set by the host device's load


@record
class CompileCounts:
    """What the kernels of one module cost so far."""

    compiled: int = 0  # kernels compiled in this process
    cached: int = 0  # kernels read from the code cache
    seconds: float = 0.0  # spent compiling them (the cache's reads not included)


class LoopKernels(dict):
    """The kernels of an :class:`~runtime.offload.OffloadModule` by launch entry; an entry
    not loaded yet is compiled (or read from the cache) and loaded when first asked for."""

    def __init__(self, module: OffloadModule) -> None:
        super().__init__()
        self.module = module
        self.units: dict[int, KernelUnit] = {}  # kernel index -> its code
        self.failed: dict[int, str] = {}  # kernel index -> why it could not be compiled
        self.counts = CompileCounts()
        self._index_of: dict[str, int] | None = None  # entry -> kernel index
        self._target_changes = 0  # times forget_all ran

    def __missing__(self, entry: str) -> Any:
        if self._index_of is None:
            self._index_of = {lp.entry: lp.kernel_index for lp in self.module.loops}
        index = self._index_of.get(entry)
        if index is None:
            raise KeyError(entry)
        changes = self._target_changes
        loaded = self.module.backend.load_kernels(self.unit(index))
        if changes != self._target_changes:  # the load made the context, for another target
            return self[entry]
        self.update(loaded)
        return loaded[entry]

    def key(self, index: int) -> str:
        """The code cache's key of kernel ``index``: the module's key, the index, the target."""
        return make_key("kernel", self.module.key, index, describe(self.module.target))

    def unit(self, index: int) -> KernelUnit:
        """Kernel ``index``'s code, compiled or read from the cache at the first need."""
        unit = self.units.get(index)
        if unit is None:
            unit = self.units[index] = self._make(index)
        return unit

    def _make(self, index: int) -> KernelUnit:
        module = self.module
        gpu = module.code_kind == "gpu"
        kind, key = ("ptx" if gpu else "obj"), self.key(index)
        cache = default_cache()
        blob = cache.get(kind, key)
        loaded = None
        if blob is None:
            from tensorwasm.compiler.prepare import compile_loop_kernels

            start = time.perf_counter()
            code = compile_loop_kernels(module.preparation(), module.target, [index])
            seconds = time.perf_counter() - start
            self.counts.compiled += 1
            self.counts.seconds += seconds
            log.info("compiled kernel %d for %s in %.1f ms", index, describe(module.target), seconds * 1e3)
            if gpu:
                blob = code.text.encode("ascii")
            else:
                loaded, blob = code.code, code.obj
            cache.put(kind, key, blob)
        else:
            self.counts.cached += 1
        loops = tuple(lp for lp in module.loops if lp.kernel_index == index)
        if gpu:
            return KernelUnit(loops, ptx=blob)
        return KernelUnit(loops, host_object=blob, code=loaded)

    def compile(self, lp: OffloadedLoop) -> str | None:
        """Have ``lp``'s kernel compiled; None where it is, else why it cannot be."""
        index = lp.kernel_index
        if index in self.units:
            return None
        why = self.failed.get(index)
        if why is None:
            try:
                self.unit(index)
            except TensorWasmError as exc:
                why = self.failed[index] = f"the kernel could not be compiled: {exc}"
                log.warning("%s +0x%x: %s", lp.stats.func, lp.stats.offset, why)
        return why

    def load_all(self) -> None:
        """Compile and load every kernel now (what a measurement of the whole start wants)."""
        for lp in self.module.loops:
            if lp.entry not in self:
                self.__missing__(lp.entry)

    def forget_loaded(self) -> None:
        """After the device's context was reset: the kernels load again at their next launch
        (their code is kept)."""
        self.clear()

    def forget_all(self) -> None:
        """After the target changed: code and loaded kernels are made again as needed."""
        self.clear()
        self.units.clear()
        self.failed.clear()
        self._index_of = None
        self._target_changes += 1


def _no_startup() -> float:
    return 0.0


class CompileFirst:
    """The execution side of a module's launches (a :class:`runtime.planning.LaunchRunner`)
    behind one step: a launch's kernel is compiled before its first launch, and where it
    cannot be the arrival declines (wasmtime runs the loop)."""

    def __init__(self, runner: LaunchRunner, kernels: LoopKernels) -> None:
        self.runner, self.kernels = runner, kernels
        self.transfer_estimate = runner.transfer_estimate
        self.record_replay = runner.record_replay
        self.startup_seconds = getattr(runner, "startup_seconds", _no_startup)

    def run(
        self, lp: OffloadedLoop, ready: PreparedLaunch, arrival: LaunchArguments, base: int, size: int
    ) -> list[int] | None:
        if lp.kernel_index not in self.kernels.units and getattr(self.runner, "gpu_lost", None) is None:
            why = self.kernels.compile(lp)
            if why is not None:
                lp.stats.decline(why)
                return None
        return self.runner.run(lp, ready, arrival, base, size)
