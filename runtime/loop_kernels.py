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

Where offload weighs what a launch pays (``tensorwasm run``'s auto mode; see
``TENSORWASM_COMPILE``), the compile does not hold the program up: the first arrival
that would launch starts it on a worker thread (:func:`compile_pool`, a few threads for
the whole process, so the kernels of several loops compile at once) and declines, and
wasmtime runs that arrival and the next ones (:data:`~runtime.planning.COMPILING`, counted
in the report) until the kernel is ready; one of the first few arrivals after that launches
it (the loop's gate keeps a few arrivals in Wasm after each such decline: while a compile
runs, a host call waits for Python's interpreter lock).
LLVM's work releases the GIL (llvmlite calls it through ctypes), so the guest runs on
meanwhile. A compile that fails there declines the loop's next arrivals with the reason,
as a synchronous one does.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import TYPE_CHECKING, Any

from tensorwasm.compiler.target import HostEngine, describe
from tensorwasm.compiler.target.shared import find_linker, load_shared
from tensorwasm.runtime.cache import TEMPORARY, default_cache, make_key
from tensorwasm.runtime.planning import COMPILING
from tensorwasm.support import config, logs
from tensorwasm.support.errors import TensorWasmError
from tensorwasm.support.records import record

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future, ThreadPoolExecutor

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
    background: int = 0  # of the compiled: on a worker thread, while wasmtime ran on


class LoopKernels(dict):
    """The kernels of an :class:`~runtime.offload.OffloadModule` by launch entry; an entry
    not loaded yet is compiled (or read from the cache) and loaded when first asked for."""

    def __init__(self, module: OffloadModule) -> None:
        super().__init__()
        self.module = module
        self.units: dict[int, KernelUnit] = {}  # kernel index -> its code
        self.failed: dict[int, str] = {}  # kernel index -> why it could not be compiled
        self.counts = CompileCounts()
        self.pending: dict[int, Future] = {}  # kernel index -> its compile on a worker thread
        self._index_of: dict[str, int] | None = None  # entry -> kernel index
        self._target_changes = 0  # times forget_all ran
        self._engine: HostEngine | None = None  # made at the first kernel read from the cache
        # Host code: kernel index -> its shared library, as the code cache had it (b"": this
        # machine could not link one), see _library.
        self._libraries: dict[int, bytes] = {}
        # Kernel index -> the thread loading its library ahead of its arrivals (load_early).
        self._loading: dict[int, threading.Thread] = {}
        # Taken by whoever prepares the module or files a compile's outcome: the main
        # thread and the compile workers.
        self._lock = threading.RLock()

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
        """Kernel ``index``'s code, compiled or read from the cache at the first need (a
        compile under way on a worker thread is waited for)."""
        loading = self._loading.get(index)
        if loading is not None and loading is not threading.current_thread():
            loading.join()
        unit = self.units.get(index)
        if unit is None:
            future = self.pending.get(index)
            if future is not None:
                future.result()
                unit = self.units.get(index)
        if unit is None:
            unit = self._make(index)
            with self._lock:
                unit = self.units.setdefault(index, unit)
        return unit

    def _make(self, index: int, background: bool = False) -> KernelUnit:
        module = self.module
        gpu = module.code_kind == "gpu"
        kind, key = self._cache_kind(), self.key(index)
        cache = default_cache()
        loops = tuple(lp for lp in module.loops if lp.kernel_index == index)
        blob = None
        if not gpu:  # a shared library of it loads without LLVM (compiler.target.shared)
            library = self._library(index)  # (empty: this machine could not link one)
            shared = load_shared(library, str(cache.directory / "lib"), TEMPORARY) if library else None
            if shared is not None:
                with self._lock:
                    self.counts.cached += 1
                return KernelUnit(loops, code=shared)
            if library is not None or find_linker() is None:  # (else compiled again, to link it)
                blob = cache.get(kind, key)
        else:
            blob = cache.get(kind, key)
        loaded = None
        if blob is None:
            from tensorwasm.compiler.prepare import compile_loop_kernels

            with self._lock:  # (a worker and the main thread may both need it)
                preparation = module.preparation()
            start = time.perf_counter()
            code = compile_loop_kernels(preparation, module.target, [index])
            compiled = time.perf_counter()
            if gpu:
                blob = code.text.encode("ascii")
                self._assemble(blob)
            else:
                loaded, blob = code.code, code.obj
                library = module.target.shared_library(loaded.module) or b""  # (empty: not linked again)
                cache.put("so", key, library)
                self._libraries[index] = library
            end = time.perf_counter()
            seconds = end - start  # (ptxas's cubin included)
            with self._lock:
                self.counts.compiled += 1
                self.counts.background += background
                self.counts.seconds += seconds
            log.info("compiled kernel %d for %s in %.1f ms, then %.1f ms assembling it", index,
                     describe(module.target), (compiled - start) * 1e3, (end - compiled) * 1e3)  # fmt: skip
            cache.put(kind, key, blob)
        else:
            if not gpu:  # loaded here, in the module's one engine (the device finds it loaded)
                loaded = self._host_engine().load(key, blob)
            with self._lock:
                self.counts.cached += 1
        if gpu:
            return KernelUnit(loops, ptx=blob)
        return KernelUnit(loops, host_object=blob, code=loaded)

    def _assemble(self, ptx: bytes) -> None:
        """A GPU kernel's cubin made where its PTX was (on a worker thread in the background:
        beside wasmtime's run and the context's start), by the device that will load it, so
        that its first load runs no assembler (:meth:`runtime.cuda_device.CudaDevice.assemble`).
        A ptxas crash fails the compile, with ptxas's report, before the PTX is cached."""
        assemble = getattr(self.module.backend, "assemble", None)  # (a device with an assembler)
        if assemble is not None:
            assemble(ptx)

    def _host_engine(self) -> HostEngine:
        """The engine that loads the host object code read from the cache: one for the
        module's kernels (their entries' names differ)."""
        with self._lock:
            if self._engine is None:
                self._engine = HostEngine()
            return self._engine

    def compile(self, lp: OffloadedLoop, wait: bool = False) -> str | None:
        """Have ``lp``'s kernel compiled; None where it is, else why it cannot be launched
        now: it could not be compiled, or (in the background, unless ``wait``) it is still
        compiling."""
        index = lp.kernel_index
        if index in self.units:
            return None
        why = self.failed.get(index)
        if why is not None:
            return why
        if self.background() and not wait and not self._in_cache(index):
            return self._compile_in_background(lp)
        try:
            self.unit(index)  # (a cached kernel is read at once: a warm run waits for nothing)
        except TensorWasmError as exc:
            why = self._failed(lp, index, exc)
        return why

    def prefetch(self, lp: OffloadedLoop) -> None:
        """Have ``lp``'s kernel compiled on a worker thread, unless the code cache has it (its
        launch reads it: a warm run's arrival that stays on the CPU does no more than look,
        on wasmtime's thread; reading the kernel and checking its machine code there cost
        ~10 ms of a warm run's first arrival, in the assembler's and code generator's
        modules, and a worker's pool kept the process from its quick exit)."""
        index = lp.kernel_index
        if index in self.units or index in self.failed or index in self.pending:
            return
        kind = self._cache_kind() if self.module.code_kind == "gpu" else "so"  # (host code: with its library)
        if not default_cache().has(kind, self.key(index)):
            self._compile_in_background(lp)

    def loads_cheaply(self, index: int) -> bool:
        """Whether kernel ``index`` is host code whose shared library is in the code cache:
        loading it takes about a millisecond, and no LLVM (see :meth:`_make`)."""
        return self.module.code_kind != "gpu" and bool(self._library(index))

    def _library(self, index: int) -> bytes | None:
        """Kernel ``index``'s shared library from the code cache (None: none there yet), read
        once found: an arrival asks before every launch until one loads it. One not found is
        looked for again, as another module's compile of the same code (or another
        process's) may file it meanwhile."""
        library = self._libraries.get(index)
        if library is None:
            library = default_cache().get("so", self.key(index))
            if library is not None:
                self._libraries[index] = library
        return library

    def _cache_kind(self) -> str:
        """The code cache's kind of the kernels' code: PTX for a GPU, object code for the host."""
        return "ptx" if self.module.code_kind == "gpu" else "obj"

    def ready_in_background(self, lp: OffloadedLoop) -> bool:
        """Whether ``lp``'s kernel is ready; where it is not, its compile (or its read from
        the code cache, and its load) is under way on a worker thread, begun here if need be
        (where kernels compile in the background: else it is made now). One that failed is
        never ready (nor tried again)."""
        index = lp.kernel_index
        if index in self.units:
            return True
        if index in self.failed:
            return False
        if not self.background():
            return self.compile(lp, wait=True) is None
        return self._compile_in_background(lp) is None and index in self.units

    def load_early(self, lps: list[OffloadedLoop]) -> bool:
        """Begin reading and loading the kernels of ``lps`` before any of their arrivals (where
        kernels compile in the background): those whose shared libraries are in the code
        cache on a thread of their own, about a millisecond each and no LLVM; the others on
        the compile workers, whose pool's import (:mod:`concurrent.futures`, with
        :mod:`logging`: ~9 ms holding Python's lock) a program's start would wait for.
        Whether any was begun. An arrival that needs one of them meanwhile waits for it."""
        if not lps or not self.background():
            return False
        cheap = [
            lp for lp in lps if lp.kernel_index not in self.units and self.loads_cheaply(lp.kernel_index)
        ]
        libraries = {lp.kernel_index for lp in cheap}
        for lp in lps:
            if lp.kernel_index not in libraries:
                self.ready_in_background(lp)
        if cheap:
            thread = threading.Thread(target=self._load_libraries, args=(cheap,), name="tensorwasm-load")
            thread.daemon = True
            self._loading.update((lp.kernel_index, thread) for lp in cheap)
            thread.start()
        return True

    def _load_libraries(self, lps: list[OffloadedLoop]) -> None:
        for lp in lps:
            try:
                self.unit(lp.kernel_index)
            except Exception as exc:  # (the launch that needs it compiles it, and says what fails)
                log.info("kernel %d: its library was not loaded ahead: %s", lp.kernel_index, exc)

    def _in_cache(self, index: int) -> bool:
        """Whether kernel ``index``'s code is in the code cache (its entry's file exists:
        reading and checking it is left to :meth:`_make`, which falls back to compiling); on
        a GPU, with the machine code its first load needs (else a worker makes that, as it
        does after a compile there: see :meth:`_compile_job`)."""
        cache = default_cache()
        if self.module.code_kind != "gpu":  # (its library, where this machine links one: see _make)
            key = self.key(index)
            return cache.has("so", key) if find_linker() is not None else cache.has("obj", key)
        if not cache.has("ptx", self.key(index)):
            return False
        ptx = cache.get("ptx", self.key(index))
        return ptx is None or self.module.backend.code_ready(ptx)

    def background(self) -> bool:
        """Whether kernels compile on worker threads (``TENSORWASM_COMPILE``; its default:
        where the module's offload mode weighs what a launch pays)."""
        chosen = config.compile_mode()
        if chosen == "auto":
            return getattr(self.module, "mode", None) == "auto"
        return chosen == "background"

    def _compile_in_background(self, lp: OffloadedLoop) -> str | None:
        index = lp.kernel_index
        future = self.pending.get(index)
        if future is None:
            changes = self._target_changes
            self.pending[index] = in_flight(
                (str(default_cache().directory), self.key(index)), lambda: self._compile_job(lp, changes)
            )
            return COMPILING
        if not future.done():
            return COMPILING
        del self.pending[index]
        if index in self.units:
            return None
        return self.failed.get(index) or self.compile(lp)  # (made for a target since forgotten)

    def _compile_job(self, lp: OffloadedLoop, changes: int) -> None:
        """A worker thread's compile of ``lp``'s kernel: its code, or why there is none,
        filed where the arrivals look (unless the target changed meanwhile)."""
        index = lp.kernel_index
        try:
            unit = self._make(index, background=True)
        except Exception as exc:  # whatever it is, the loop's arrivals say it
            with self._lock:
                if changes == self._target_changes:
                    self._failed(lp, index, exc)
            return
        if unit.ptx is not None:  # read from the cache without its cubin: ptxas here, not at the launch
            try:
                self._assemble(unit.ptx)
            except Exception as exc:  # the first load makes it, and says what fails
                log.info("kernel %d: its machine code was not made ahead: %s", index, exc)
        with self._lock:
            if changes == self._target_changes:
                self.units.setdefault(index, unit)

    def _failed(self, lp: OffloadedLoop, index: int, exc: Exception) -> str:
        detail = str(exc) if isinstance(exc, TensorWasmError) else f"{type(exc).__name__}: {exc}"
        why = self.failed[index] = f"the kernel could not be compiled: {detail}"
        log.warning("%s +0x%x: %s", lp.stats.func, lp.stats.offset, why)
        return why

    def wait(self) -> None:
        """Wait for the compiles under way on worker threads (their outcomes filed)."""
        for future in list(self.pending.values()):
            future.exception()

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
        with self._lock:
            self.clear()
            self.units.clear()
            self.failed.clear()
            self._libraries.clear()
            self.pending.clear()  # (their outcomes, for the old target, are not filed)
            self._index_of = None
            self._target_changes += 1


_POOL: ThreadPoolExecutor | None = None
COMPILE_THREADS = "tensorwasm-compile"  # the names of its threads begin so
_POOL_LOCK = threading.RLock()  # (in_flight takes it, then compile_pool)


def compile_pool() -> ThreadPoolExecutor:
    """The worker threads that compile kernels in the background, for the whole process
    (``TENSORWASM_COMPILE_THREADS`` of them): kernels that become ready to launch at about
    the same time compile side by side, a few at a time."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            # (imported here: a start that compiles nothing never needs it)
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(config.compile_threads(), thread_name_prefix=COMPILE_THREADS)
            atexit.unregister(finish_compiles)  # (once, whichever pool a test made before)
            atexit.register(finish_compiles)
        return _POOL


def finish_compiles() -> None:
    """Wait for the compiles under way (at the process's exit: their code lands in the cache
    for the next run). Python joins the worker threads at a normal exit; this also covers an
    exit that skips that, after running the ``atexit`` functions (``tensorwasm run`` where it
    made a CUDA context)."""
    with _POOL_LOCK:
        futures = list(_IN_FLIGHT.values())
    for future in futures:
        future.exception()


# The compiles under way on worker threads, by cache directory and kernel key, whichever
# module started them.
_IN_FLIGHT: dict[tuple[str, str], Future] = {}


def in_flight(key: tuple[str, str], job: Callable[[], None]) -> Future:
    """The compile of the kernel cached under ``key`` (the cache's directory, the kernel's
    key): one already under way for another module of the same code (the same program run
    again in this process, its last run's compile unfinished), else ``job`` on a worker
    thread. Joining it rather than compiling
    again matters: a module prepared from the cache would first run the whole module's
    analysis again, on a thread holding Python's interpreter lock most of the time. Once it
    is done the kernel's code is in the cache, where the joining module reads it."""
    with _POOL_LOCK:
        future = _IN_FLIGHT.get(key)
        if future is not None and not future.done():
            return future
        future = _IN_FLIGHT[key] = compile_pool().submit(job)
    future.add_done_callback(lambda done: _finished(key, done))
    return future


def _finished(key: tuple[str, str], future: Future) -> None:
    with _POOL_LOCK:
        if _IN_FLIGHT.get(key) is future:
            del _IN_FLIGHT[key]


def _no_startup() -> float:
    return 0.0


class CompileFirst:
    """The execution side of a module's launches (a :class:`runtime.planning.LaunchRunner`)
    behind one step: a launch's kernel is compiled before its first launch, and where it
    cannot be (or, compiling in the background, is not ready yet) the arrival declines
    (wasmtime runs the loop)."""

    def __init__(self, runner: LaunchRunner, kernels: LoopKernels) -> None:
        self.runner, self.kernels = runner, kernels
        self.transfer_estimate = runner.transfer_estimate
        self.decline_seconds = getattr(runner, "decline_seconds", None)
        self.record_replay = runner.record_replay
        self.startup_seconds = getattr(runner, "startup_seconds", _no_startup)
        self.startup_for = getattr(runner, "startup_for", None)
        self.startup_wait = getattr(runner, "startup_wait", _no_startup)
        self.begin_start = getattr(runner, "begin_start", None)
        self.take_threads_seconds = getattr(runner, "take_threads_seconds", _no_startup)

    # The CPU time of an arrival above which it waits for its kernel rather than run on
    # wasmtime while it compiles: a few cold compiles' worth (one that arrives once and
    # runs for seconds is launched, not left to the CPU).
    WAIT_SECONDS = 0.1

    def prefetch(self, lp: OffloadedLoop) -> None:
        """An arrival would have launched but for the device's start: have its kernel compiled
        on a worker thread meanwhile (where kernels compile in the background), so that it is
        ready when the device is, and in the cache for the program's next run. (A run too
        short to start the device would otherwise leave its kernels to the next run to
        compile, and a run whose module came from the cache must analyse the whole module
        again before it compiles one, on a thread holding Python's interpreter lock.)"""
        if (lp.kernel_index not in self.kernels.units and self.kernels.background()
                and getattr(self.runner, "gpu_lost", None) is None):  # fmt: skip
            self.kernels.prefetch(lp)

    def run(
        self, lp: OffloadedLoop, ready: PreparedLaunch, arrival: LaunchArguments, base: int, size: int
    ) -> list[int] | None:
        if lp.kernel_index not in self.kernels.units and getattr(self.runner, "gpu_lost", None) is None:
            from tensorwasm.runtime.profit import cpu_seconds_per_op

            wait = ready.ops * cpu_seconds_per_op() >= self.WAIT_SECONDS
            why = self.kernels.compile(lp, wait=wait)
            if why is not None:
                lp.stats.decline(why)
                return None
        return self.runner.run(lp, ready, arrival, base, size)
