"""Declined arrivals that cost nothing while a kernel compiles or the device starts.

The SIMD build of the stencil example declined every arrival on the GPU, warm, and ran six
times slower than wasmtime: its cold run was too short to start the device (each arrival
declined until the gains paid for the start), so its kernel was never compiled; the warm
run (the module prepared from the cache) compiled it in the background, which first
analyses the whole module again, on a thread holding Python's interpreter lock, while every
arrival declined as compiling, bypassing the loop's gate, and waited for that lock in its
host call. Now an arrival held back by the device's start has its kernel compiled meanwhile,
a compile under way for the same kernel is joined rather than made again, and arrivals
declined while it compiles keep the next few in Wasm.
"""

from __future__ import annotations

import threading

import pytest
import wasmtime

from tensorwasm.oracle.simulated import SimulatedDevice
from tensorwasm.runtime import loop_kernels, profit
from tensorwasm.runtime.cache import default_cache
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import COMPILING, NOT_STARTED, ArrivalGate
from tests.conftest import ROOT
from tests.offload_cases import module_bytes
from tests.runtime.test_loop_kernels import _fresh, _held, _saxpy
from tests.runtime.test_run import plain_wasmtime


@pytest.fixture
def background(tmp_path, monkeypatch) -> pytest.MonkeyPatch:
    """Kernels compiled on worker threads, in a cache of the test's own; every launch pays."""
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    monkeypatch.setattr(loop_kernels, "_POOL", None)
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 1e-6)
    return monkeypatch


class NeverStarted(SimulatedDevice):
    """The GPU's path on a device whose start no run's gains pay for."""

    def startup_seconds(self) -> float:
        return 10.0


def _run(path, args, device, tmp_path, capfd, monkeypatch) -> OffloadModule:
    from tensorwasm.runtime import run as run_module

    real = OffloadModule
    monkeypatch.setattr(
        run_module, "OffloadModule", lambda wasm, **kw: real(wasm, **{**kw, "device": device})
    )
    expected = plain_wasmtime(path, args, tmp_path)
    capfd.readouterr()
    default_cache().memory.clear()  # the cache's files, as a new process finds them
    status, offload, _ = run_module.run(path.read_bytes(), [str(path), *args], offload="auto", device="cpu")
    assert (status, capfd.readouterr().out) == expected
    return offload


def test_a_run_too_short_to_start_the_device_leaves_its_kernels_compiled_for_the_next(
    background, tmp_path, capfd
) -> None:
    path, args = ROOT / "examples/wasi/build/stencil.O2.simd.wasm", ["45", "6"]
    cold = _run(path, args, NeverStarted(), tmp_path, capfd, background)
    (sweep,) = [lp for lp in cold.loops if lp.stats.func == "main" and lp.region is not None]
    assert sweep.stats.offloaded == 0 and sweep.stats.declined == {NOT_STARTED: 6}
    cold.kernels.wait()  # (a process's compile threads are joined at its exit)
    assert sweep.kernel_index in cold.kernels.units and cold.kernels.counts.background >= 1
    warm = _run(path, args, SimulatedDevice(), tmp_path, capfd, background)
    (sweep,) = [lp for lp in warm.loops if lp.stats.func == "main" and lp.region is not None]
    assert sweep.stats.offloaded == 6 and sweep.stats.declined == {}  # from its first arrival
    assert warm.kernels.counts.compiled == 0 and warm.kernels.counts.cached >= 1


def test_a_compile_under_way_for_another_module_of_the_same_code_is_joined(background) -> None:
    release, started = threading.Event(), []
    _held(background, release, started)
    wasm = module_bytes("blas1", "O2")
    first = _fresh(wasm, device="cpu")
    _saxpy(first, wasm)  # its compile starts, held
    again = _fresh(wasm, device="cpu")  # the same program again, prepared from the cache
    loop = _saxpy(again, wasm)
    assert loop.stats.declined == {COMPILING: 1} and len(started) == 1  # joined, not compiled again
    release.set()
    again.kernels.wait()
    loop = _saxpy(again, wasm)
    assert loop.stats.offloaded == 1 and len(started) == 1
    assert again.kernels.counts.cached == 1 and again.kernels.counts.compiled == 0


def test_arrivals_declined_while_the_kernel_compiles_keep_the_next_few_in_wasm(background) -> None:
    """A bounded wait: few host calls while it compiles, a launch soon after it is ready."""
    from benchmarks.declines import NEST
    from tensorwasm.runtime.planning import ArrivalPlanner

    background.setattr(profit, "cpu_seconds_per_op", lambda: 1e-4)  # the first arrival starts the device
    release, started = threading.Event(), []
    _held(background, release, started)
    wasm = wasmtime.wat2wasm(NEST)
    offload = OffloadModule(wasm, device="cpu", mode="auto")
    asked = []
    real = ArrivalPlanner._arrive

    def counting(self, lp, *rest):
        asked.append(lp.stats.offset)
        return real(self, lp, *rest)

    background.setattr(ArrivalPlanner, "_arrive", counting)
    store = wasmtime.Store()
    linker = wasmtime.Linker(store.engine)
    offload.define(linker, store)
    exports = linker.instantiate(store, offload.compiled(store.engine)).exports(store)
    offload.bind(store, exports)
    outer = min(offload.loops, key=lambda lp: lp.stats.offset)
    exports["repeat"](store, 40, 8, 8)  # 40 arrivals while the kernel compiles
    limit = ArrivalGate.COMPILING_WAIT_LIMIT
    assert asked.count(outer.stats.offset) == _asks_while_compiling(40) < 40 // 2
    release.set()
    offload.kernels.wait()
    exports["repeat"](store, limit + 1, 8, 8)  # one of these launches
    offload.collect_skipped()
    assert outer.stats.offloaded >= 1 and outer.stats.arrivals == 40 + limit + 1
    assert outer.stats.declined.get(COMPILING, 0) >= 40
    offload.close()


def _asks_while_compiling(arrivals: int) -> int:
    """Host calls for ``arrivals`` while the kernel compiles: each asks, then waits that double
    from 1 up to the limit pass in Wasm."""
    asks = at = 0
    while at < arrivals:
        asks += 1
        at += 1 + min(1 << (asks - 1), ArrivalGate.COMPILING_WAIT_LIMIT)
    return asks


def test_compiles_under_way_are_finished_at_exit(background) -> None:
    """``tensorwasm run`` that made a CUDA context ends after the ``atexit`` functions without
    Python's joining of threads: the compile still under way then lands in the cache anyway."""
    import atexit

    registered = []
    background.setattr(atexit, "register", registered.append)
    release, started = threading.Event(), []
    _held(background, release, started)
    wasm = module_bytes("blas1", "O2")
    first = _fresh(wasm, device="cpu")
    loop = _saxpy(first, wasm)  # its compile starts, held, on the pool made for it
    assert loop_kernels.finish_compiles in registered
    assert loop.kernel_index in first.kernels.pending and not first.kernels.units
    threading.Timer(0.2, release.set).start()
    loop_kernels.finish_compiles()  # what runs at exit
    assert loop.kernel_index in first.kernels.units
    assert default_cache().has("obj", first.kernels.key(loop.kernel_index))
