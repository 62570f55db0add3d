"""Each loop kernel is compiled, cached and loaded on its own, at its first launch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tensorwasm.compiler import prepare
from tensorwasm.compiler.errors import CompileError
from tensorwasm.runtime.cache import default_cache
from tensorwasm.runtime.offload import OffloadModule
from tests.conftest import ROOT
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_offload import _saxpy_case


def _fresh(wasm: bytes, **options) -> OffloadModule:
    """The module as a new process sees it: the cache's files, not its memory."""
    default_cache().memory.clear()
    return OffloadModule(wasm, **options)


def _saxpy(offload: OffloadModule, wasm: bytes):
    spec, case = _saxpy_case()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == run_case(wasm, "saxpy", spec, case)
    return next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")


def test_a_launch_compiles_its_own_kernel_and_no_other(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    assert len(offload.loops) > 1 and not offload.kernels.units  # preparing compiles nothing
    loop = _saxpy(offload, wasm)
    assert loop.stats.offloaded == 1
    assert set(offload.kernels.units) == {loop.kernel_index}
    assert dict(offload.kernels) == {loop.entry: offload.kernels[loop.entry]}
    assert offload.kernels.counts.compiled == 1 and offload.kernels.counts.cached == 0


def test_a_kernel_compiled_once_is_read_from_the_cache_without_the_compiler(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    _saxpy(_fresh(wasm, device="cpu"), wasm)
    warm = _fresh(wasm, device="cpu")

    def no_compiling(*args, **kwargs):
        raise AssertionError("a cached kernel was compiled again")

    monkeypatch.setattr(prepare, "compile_loop_kernels", no_compiling)
    monkeypatch.setattr(prepare, "prepare_offload", no_compiling)
    loop = _saxpy(warm, wasm)
    assert loop.stats.offloaded == 1 and warm.kernels.counts.cached == 1
    assert warm._preparation is None  # no analysis ran


def test_kernels_are_cached_by_module_index_and_target(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    first, second = offload.loops[0].kernel_index, offload.loops[1].kernel_index
    keys = {offload.kernels.key(first), offload.kernels.key(second)}
    other = _fresh(module_bytes("stencil", "O2"), device="cpu")
    keys.add(other.kernels.key(other.loops[0].kernel_index))
    assert len(keys) == 3
    assert offload.kernels.key(first) == _fresh(wasm, device="cpu").kernels.key(first)


def test_a_kernel_that_cannot_be_compiled_declines_its_arrivals(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="cpu")
    tries = []

    def failing(*args, **kwargs):
        tries.append(args)
        raise CompileError("no lowering for this (planted)")

    monkeypatch.setattr(prepare, "compile_loop_kernels", failing)
    loop = _saxpy(offload, wasm)
    _saxpy(offload, wasm)
    assert loop.stats.offloaded == 0 and len(tries) == 1
    assert loop.stats.declined == {"the kernel could not be compiled: no lowering for this (planted)": 2}


def test_the_kernels_load_each_on_its_own_and_all_at_once_on_request(tmp_path, monkeypatch) -> None:
    from tensorwasm.runtime.host_device import HostDevice

    class Counting(HostDevice):
        def __init__(self) -> None:
            self.units = []

        def load_kernels(self, unit):
            self.units.append(unit)
            return super().load_kernels(unit)

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    device = Counting()
    offload = _fresh(module_bytes("blas1", "O2"), device=device)
    offload.kernels.load_all()
    assert set(offload.kernels) == {lp.entry for lp in offload.loops}
    assert sorted(len(unit.loops) for unit in device.units) == [1] * len(offload.loops)
    offload.reload_kernels()  # as after a context reset: loaded again at the next use, code kept
    assert not offload.kernels and len(offload.kernels.units) == len(offload.loops)
    entry = offload.loops[0].entry
    assert offload.kernels[entry] is not None and len(device.units) == len(offload.loops) + 1
    with pytest.raises(KeyError):
        offload.kernels["tw_kernel_none"]


DECLINED = """
import sys
from tensorwasm.runtime.offload import OffloadModule
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_offload import _saxpy_case

wasm = module_bytes("blas1", "O2")
offload = OffloadModule(wasm, device="cpu", mode=sys.argv[1])
spec, case = _saxpy_case(8)
assert run_case(offload.rewritten, "saxpy", spec, case, offload) == run_case(wasm, "saxpy", spec, case)
llvm = ("llvmlite.binding", "llvmlite.ir", "tensorwasm.compiler.lower.function")
loaded = sorted(m for m in sys.modules if m.startswith(llvm))
print(offload.kernels.counts.compiled, len(offload.kernels.units), ",".join(loaded))
"""


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_a_program_whose_loops_all_decline_compiles_nothing_and_loads_no_llvm(tmp_path, mode) -> None:
    import os

    env = {**os.environ, "TENSORWASM_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", DECLINED, mode], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["0", "0"], out  # cold: the module analysed, no kernel compiled, no LLVM


@pytest.mark.gpu
def test_on_the_gpu_each_launched_kernel_is_a_module_of_its_own(tmp_path, monkeypatch) -> None:
    from tests.offload_cases import SPECS, Case

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path))
    wasm = module_bytes("blas1", "O2")
    offload = _fresh(wasm, device="gpu")
    _saxpy(offload, wasm)
    spec = SPECS["blas1"]["sscal"]
    case = Case({"n": 4096}, [2.5], [0], seed=3)
    assert run_case(offload.rewritten, "sscal", spec, case, offload) == run_case(wasm, "sscal", spec, case)
    launched = [lp for lp in offload.loops if lp.stats.offloaded]
    assert {lp.plan.func.name for lp in launched} == {"saxpy", "sscal"}
    assert set(offload.kernels) == {lp.entry for lp in launched}  # nothing else compiled or loaded
    modules = [offload.backend.cu_modules[lp.entry] for lp in launched]
    assert modules[0] is not modules[1]
    assert [tuple(m.entries) for m in modules] == [(lp.entry,) for lp in launched]
    offload.close()
