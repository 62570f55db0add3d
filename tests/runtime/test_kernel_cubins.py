"""A GPU loop kernel's cubin is made where the kernel compiles (a worker thread in the
background), by ptxas in a process of its own, and filed in the code cache where the kernel's
first load looks: that load, on the launch's path, runs neither ptxas nor the driver's JIT.
A crash of ptxas is still a report, never the end of the process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tensorwasm.compiler import prepare
from tensorwasm.compiler.target import NVPTXTarget
from tensorwasm.runtime import assembler
from tensorwasm.runtime.cache import default_cache, device_cubin_key, load_kernels
from tensorwasm.runtime.cuda_device import CudaDevice
from tensorwasm.runtime.device_info import DeviceInfo
from tensorwasm.runtime.loop_kernels import LoopKernels
from tensorwasm.runtime.offload import OffloadModule
from tests.offload_cases import module_bytes
from tests.runtime.test_assembler import _fake_ptxas


def _device(driver_version: int = 13000) -> CudaDevice:
    """The CUDA device before its context exists, its target made for a remembered H100."""
    device = CudaDevice()
    device.assumed = DeviceInfo(0, "remembered", (9, 0), driver_version, 1 << 30, 132)
    return device


def _gpu_kernels(offload: OffloadModule, device) -> LoopKernels:
    """``offload``'s kernels as a GPU module compiles them (PTX for sm_90), on ``device``."""
    loops = [SimpleNamespace(kernel_index=lp.kernel_index, entry=lp.entry) for lp in offload.loops]
    module = SimpleNamespace(code_kind="gpu", key=offload.key, target=NVPTXTarget("sm_90", (7, 8)), loops=loops,
                             preparation=offload.preparation, mode="always", backend=device)  # fmt: skip
    return LoopKernels(module)


@pytest.fixture
def setting(ptxas: str, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TENSORWASM_PTXAS", ptxas)
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    default_cache().memory.clear()
    offload = OffloadModule(module_bytes("blas1", "O2"), device="cpu")
    return offload, offload.loops[0]


def _no_assembling(*args, **kwargs):
    raise AssertionError("ptxas ran again")


def test_a_kernel_compiled_for_the_gpu_has_its_cubin_made_and_cached_as_it_compiles(setting) -> None:
    offload, lp = setting
    device = _device()
    unit = _gpu_kernels(offload, device).unit(lp.kernel_index)
    cubin = default_cache().get("cubin", device_cubin_key(device.assumed, unit.ptx))
    assert cubin is not None and cubin[:4] == b"\x7fELF"  # before: only the load made it
    assert cubin == assembler.assemble(unit.ptx, "sm_90", 13000)  # what the load would make


def test_the_first_load_of_a_kernel_compiled_so_reads_its_cubin_and_assembles_nothing(
    setting, monkeypatch
) -> None:
    from cuda.bindings import driver as cu

    from tensorwasm.runtime.driver import Context, ptx_entries

    offload, lp = setting
    device = _device()
    unit = _gpu_kernels(offload, device).unit(lp.kernel_index)
    monkeypatch.setattr(cu, "cuCtxSetCurrent", lambda handle: (cu.CUresult.CUDA_SUCCESS,))
    context = Context(device.assumed, device=None, handle=None)  # the device the target assumed
    loaded: list[bytes] = []
    monkeypatch.setattr(assembler, "assemble", _no_assembling)
    monkeypatch.setattr(Context, "link_cubin", _no_assembling)
    monkeypatch.setattr(Context, "load_cubin", lambda self, cubin, entries: loaded.append(cubin) or entries)
    assert load_kernels(context, unit.ptx) == ptx_entries(unit.ptx) != ()
    assert len(loaded) == 1 and loaded[0][:4] == b"\x7fELF"


def test_a_second_compile_of_the_kernel_is_read_from_the_cache_ptx_and_cubin(setting, monkeypatch) -> None:
    offload, lp = setting
    device = _device()
    first = _gpu_kernels(offload, device)
    ptx = first.unit(lp.kernel_index).ptx
    assert first.counts.compiled == 1
    default_cache().memory.clear()  # as a new process: the cache's files
    monkeypatch.setattr(prepare, "compile_loop_kernels", _no_assembling)
    monkeypatch.setattr(assembler, "assemble", _no_assembling)
    again = _gpu_kernels(offload, device)
    assert again.unit(lp.kernel_index).ptx == ptx
    assert again.counts.cached == 1 and again.counts.compiled == 0
    assert default_cache().get("cubin", device_cubin_key(device.assumed, ptx)) is not None


def test_a_ptxas_crash_where_the_kernel_compiles_declines_its_loop_with_ptxas_report(
    setting, tmp_path, monkeypatch
) -> None:
    offload, lp = setting
    monkeypatch.setenv("TENSORWASM_PTXAS", _fake_ptxas(tmp_path, "kill -SEGV $$"))
    kernels = _gpu_kernels(offload, _device())
    why = kernels.compile(SimpleNamespace(kernel_index=lp.kernel_index, stats=lp.stats))
    assert why is not None and "ptxas crashed on the module" in why and "SIGSEGV" in why
    kept = why.rsplit("ptxas -arch=sm_90 ", 1)[1].strip()
    with open(kept, "rb") as f:
        assert b".entry" in f.read()  # the module kept, with the command that reproduces it
    assert not default_cache().has("ptx", kernels.key(lp.kernel_index))  # nothing cached
    assert kernels.compile(SimpleNamespace(kernel_index=lp.kernel_index, stats=lp.stats)) == why


def test_without_a_known_device_or_a_usable_ptxas_the_load_assembles_as_before(setting, monkeypatch) -> None:
    offload, lp = setting
    unknown = CudaDevice()  # no context, nothing remembered: its target came from elsewhere
    unit = _gpu_kernels(offload, unknown).unit(lp.kernel_index)
    older = _device(driver_version=12000)  # a driver older than ptxas: its cubins may not load
    assert older.assemble(unit.ptx) is False
    for info in (older.assumed, _device().assumed):
        assert default_cache().get("cubin", device_cubin_key(info, unit.ptx)) is None


@pytest.mark.gpu
def test_on_the_gpu_a_launched_kernel_was_assembled_once_where_it_compiled(tmp_path, monkeypatch) -> None:
    from tensorwasm.runtime.driver import Context
    from tests.runtime.test_loop_kernels import _saxpy

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    assembled: list[str] = []
    real = assembler.assemble
    monkeypatch.setattr(
        assembler, "assemble", lambda ptx, arch, driver: assembled.append(arch) or real(ptx, arch, driver)
    )
    monkeypatch.setattr(Context, "link_cubin", _no_assembling)  # the load neither assembles nor JITs
    wasm = module_bytes("blas1", "O2")
    default_cache().memory.clear()
    offload = OffloadModule(wasm, device="gpu")
    loop = _saxpy(offload, wasm)  # results equal wasmtime's
    assert loop.stats.offloaded == 1 and len(assembled) == len(offload.kernels.units) >= 1  # once a kernel
    offload.close()
