"""A GPU kernel compiled in the background gets its cubin there too (ptxas on the compile
worker), so that its first launch only loads it.

On an H100 the first launch of every kernel whose cubin was not cached paid ptxas, 20 to
50 ms, inside the run: the SIMD stencil example's sweep, condmap's and stencil2d's SIMD
kernels (their cold runs never launched them, so never made their cubins) took 36 to 66 ms of
"kernel" time in warm runs where the GPU ran them for under 2 ms. Here the device is a GPU
this machine remembers (no CUDA call is made: the PTX and ptxas's cubin are all it needs).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tensorwasm.compiler.target import nvptx_for_device
from tensorwasm.runtime import loop_kernels
from tensorwasm.runtime.cache import default_cache, kernels_cubin_key
from tensorwasm.runtime.cuda_device import CudaDevice
from tensorwasm.runtime.device_info import DeviceInfo
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import COMPILING
from tests.offload_cases import module_bytes

H100 = DeviceInfo(0, "remembered H100", (9, 0), 13000, 80 << 30, 132)


class RememberedGpu(CudaDevice):
    """The CUDA device before its context is made: its target from the description this
    machine remembers. Nothing here may load code (a launch would make the context)."""

    def __init__(self) -> None:
        super().__init__()
        self.assumed = H100

    def target(self):
        return nvptx_for_device(H100.compute_capability, H100.driver_version)

    def load_kernels(self, unit):
        raise AssertionError("no kernel is loaded in these tests")


@pytest.fixture
def background(tmp_path, monkeypatch, ptxas):
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    monkeypatch.setenv("TENSORWASM_PTXAS", ptxas)
    monkeypatch.setattr(loop_kernels, "_POOL", None)
    return monkeypatch


def _module() -> tuple[OffloadModule, object]:
    """The module as a new process sees it (the cache's files, not its memory), and its
    saxpy loop."""
    default_cache().memory.clear()
    offload = OffloadModule(module_bytes("blas1", "O2"), device=RememberedGpu())
    return offload, next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")


def _cubin_key(offload: OffloadModule, lp) -> str:
    """Where the first load (``cache.load_kernels`` on the device's context) looks."""
    return kernels_cubin_key(SimpleNamespace(info=H100), offload.kernels.units[lp.kernel_index].ptx)


def test_a_kernel_compiled_in_the_background_has_its_cubin_made_there(background) -> None:
    offload, lp = _module()
    assert offload.kernels.compile(lp) == COMPILING
    offload.kernels.wait()
    assert offload.kernels.compile(lp) is None
    cubin = default_cache().get("cubin", _cubin_key(offload, lp))
    assert cubin is not None and cubin[:4] == b"\x7fELF"  # ptxas's, ready for cuModuleLoadData


def test_a_cached_kernel_without_its_cubin_gets_one_before_it_launches(background) -> None:
    cold, lp = _module()
    cold.kernels.compile(lp)
    cold.kernels.wait()
    key = _cubin_key(cold, lp)
    default_cache().drop("cubin", key)  # PTX cached, no cubin: a run that never launched it
    warm, lp = _module()
    assert warm.kernels.compile(lp) == COMPILING  # not read at once, to be assembled at the launch
    warm.kernels.wait()
    assert warm.kernels.counts.cached == 1 and warm.kernels.counts.compiled == 0
    assert default_cache().has("cubin", key)
    again, lp = _module()
    assert again.kernels.compile(lp) is None  # both in the cache: read at once, no worker
    assert not again.kernels.pending and again.kernels.counts.cached == 1


def test_without_a_usable_ptxas_a_cached_kernel_is_read_at_once(background) -> None:
    """The driver's JIT makes the cubin at the load then; waiting for a worker gains nothing."""
    cold, lp = _module()
    cold.kernels.compile(lp)
    cold.kernels.wait()
    default_cache().drop("cubin", _cubin_key(cold, lp))
    background.setenv("TENSORWASM_PTXAS", "off")
    warm, lp = _module()
    assert warm.kernels.compile(lp) is None and not warm.kernels.pending


@pytest.mark.gpu
def test_on_the_gpu_ptxas_runs_on_the_compile_worker_not_at_the_first_launch(background) -> None:
    """A kernel compiled in the background launches, with wasmtime's results, from the cubin
    its worker made: ptxas ran once, there."""
    import threading

    from tensorwasm.runtime import assembler
    from tests.runtime.test_loop_kernels import _saxpy

    calls = []
    real = assembler.assemble

    def counted(*args, **kwargs):
        calls.append(threading.current_thread().name)
        return real(*args, **kwargs)

    background.setattr(assembler, "assemble", counted)
    wasm = module_bytes("blas1", "O2")
    default_cache().memory.clear()
    offload = OffloadModule(wasm, device="gpu")
    loop = _saxpy(offload, wasm)  # compiling on a worker: wasmtime ran it
    offload.kernels.wait()
    _saxpy(offload, wasm)
    assert loop.stats.offloaded == 1 and loop.stats.declined == {COMPILING: 1}
    assert len(calls) == 1 and calls[0].startswith("tensorwasm-compile"), calls
    offload.close()
