"""v128 accesses of loop kernels at any address on a strict-alignment device (the GPU).

A vectorised loop over bytes (the blur example's ``in[x - 1]``, ``in[x + 1]``) loads 16
bytes at every offset. The guards used to ask a v128 access for 4-byte alignment on a GPU,
so such a loop declined at every arrival there; a kernel now loads a proven v128 as the
aligned words around it, funnel-shifted, and stores it as aligned words or bytes. Here the
strict lowering runs on this CPU: a device that takes the GPU's path (guards with strict
alignment, copies to device memory) with host code compiled as for a strict target.
"""

from __future__ import annotations

import random
import re
import subprocess

import pytest
import wasmtime

from tensorwasm.compiler.target import HostTarget
from tensorwasm.oracle.simulated import SimulatedDevice
from tensorwasm.runtime.offload import OffloadModule
from tests.conftest import ROOT
from tests.runtime.test_run import plain_wasmtime
from tests.runtime.test_vector_loops import vector_stencil_module


class StrictHostTarget(HostTarget):
    """The host, lowered as a GPU is: a misaligned access is assumed to fault."""

    strict_alignment = True


class StrictSimulatedDevice(SimulatedDevice):
    """The simulated GPU path, its kernels lowered for a strict-alignment target."""

    def target(self) -> HostTarget:
        return StrictHostTarget()


def byte_stencil_module() -> bytes:
    """``run(p, q, n)``: for n vectors of 16 bytes, ``q[x] = avgr(p[x - 1], p[x + 1])`` lane
    by lane (i8x16.avgr_u), the loads one byte either side of the line clang's vectorised
    byte loop reads."""
    return vector_stencil_module("i8x16.avgr_u", 15, 17)


def run_both(wasm: bytes, device, calls: list[tuple[int, int, int]]) -> OffloadModule:
    """``run(*args)`` for each of ``calls`` on wasmtime and offloaded (always) on ``device``,
    from the same random memory; the memories must end identical."""
    offload = OffloadModule(wasm, device=device, mode="always")
    store = wasmtime.Store()
    linker = wasmtime.Linker(store.engine)
    offload.define(linker, store)
    exports = linker.instantiate(store, offload.compiled(store.engine)).exports(store)
    offload.bind(store, exports)
    reference = wasmtime.Instance(store, wasmtime.Module(store.engine, wasm), []).exports(store)
    rng = random.Random(21)
    data = bytes(rng.randrange(256) for _ in range(65536))
    for args in calls:
        for ex in (reference, exports):
            ex["memory"].write(store, data, 0)
            ex["run"](store, *args)
        assert bytes(exports["memory"].read(store, 0, 131072)) == bytes(
            reference["memory"].read(store, 0, 131072)
        ), args
    offload.close()
    return offload


# Loads 1, 2 and 3 bytes off a 4-byte boundary and 16-aligned; stores aligned, 4-aligned and
# at odd addresses.
CALLS = [(32, 8192, 257), (34, 16384, 40), (33, 24577, 31), (35, 40962, 9), (1, 49156, 100)]


@pytest.mark.parametrize("device", ["strict", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_byte_vectors_at_every_offset_launch_with_wasmtimes_bytes(device: str, monkeypatch) -> None:
    if device == "strict":
        monkeypatch.setenv("TENSORWASM_CACHE", "off")  # (its code is not the host's, under the host's key)
    chosen = {"strict": StrictSimulatedDevice(), "simulated": SimulatedDevice(), "gpu": "gpu"}[device]
    offload = run_both(byte_stencil_module(), chosen, CALLS)
    (loop,) = offload.loops
    assert loop.stats.offloaded == len(CALLS) and not loop.stats.declined, loop.stats.declined


def test_the_gpu_kernel_funnel_shifts_its_v128_loads_and_assembles(ptxas: str, tmp_path) -> None:
    """What the GPU's kernel does (the tests above check what it computes): aligned 32-bit
    loads funnel-shifted (``shf`` or ``prmt``'s funnel mode), never a misaligned wide access;
    stores tested, bytes out of line."""
    from tensorwasm.compiler.prepare import compile_loop_kernels, prepare_offload
    from tensorwasm.compiler.target import ARCH_PTX, NVPTXTarget

    preparation = prepare_offload(byte_stencil_module())
    (lp,) = preparation.prepared.loops
    ptx = compile_loop_kernels(preparation, NVPTXTarget("sm_90", ARCH_PTX["sm_90"]), [lp.kernel_index]).text
    assert not re.search(r"ld\.global(?:\.nc)?\.(?:v2|v4|b8)", ptx)  # no wide load, no byte loop
    assert re.search(r"shf\.r|prmt\.b32\.f4e", ptx) and "tw_store128_bytes" in ptx  # a funnel shift
    source = tmp_path / "k.ptx"
    source.write_text(ptx)
    done = subprocess.run([ptxas, "-arch=sm_90", str(source), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name,args", [("blur", ["67", "21", "2"]), ("stencil", ["45", "3"])])
def test_simd_builds_of_blur_and_stencil_launch_on_the_gpu_path(name: str, args: list[str], tmp_path,
                                                                  capfd, monkeypatch) -> None:  # fmt: skip
    """The ``-msimd128`` builds on the GPU's path (strict guards, device memory, regions),
    lowered for a strict target: their sweeps launch and the output is wasmtime's. The blur's
    declined at every arrival, its byte vectors 1 to 3 bytes off a 4-byte boundary."""
    from tensorwasm.runtime import run as run_module

    monkeypatch.setenv("TENSORWASM_CACHE", "off")
    made = []

    def strict(wasm, **kwargs):
        made.append(OffloadModule(wasm, **{**kwargs, "device": StrictSimulatedDevice(), "pin": False}))
        return made[-1]

    monkeypatch.setattr(run_module, "OffloadModule", strict)
    path = ROOT / f"examples/wasi/build/{name}.O2.simd.wasm"
    expected = plain_wasmtime(path, args, tmp_path)
    capfd.readouterr()
    got, offload, _ = run_module.run(path.read_bytes(), [str(path), *args], offload="always", device="cpu")
    assert (got, capfd.readouterr().out) == expected
    main = [lp for lp in offload.loops if lp.stats.func == "main" and lp.region is not None]
    assert main and sum(lp.stats.offloaded for lp in main) == int(args[-1])  # one launch a pass or step
    assert not any(lp.stats.declined for lp in main), [lp.stats.declined for lp in main]


@pytest.mark.gpu
@pytest.mark.parametrize("name,args", [("blur", ["67", "21", "2"]), ("stencil", ["45", "3"])])
def test_simd_builds_of_blur_and_stencil_launch_on_the_gpu(
    name: str, args: list[str], tmp_path, capfd
) -> None:
    from tensorwasm.runtime import run as run_module

    path = ROOT / f"examples/wasi/build/{name}.O2.simd.wasm"
    expected = plain_wasmtime(path, args, tmp_path)
    capfd.readouterr()
    got, offload, _ = run_module.run(path.read_bytes(), [str(path), *args], offload="always", device="gpu")
    assert (got, capfd.readouterr().out) == expected
    main = [lp for lp in offload.loops if lp.stats.func == "main" and lp.region is not None]
    assert main and sum(lp.stats.offloaded for lp in main) == int(args[-1])
    assert not any(lp.stats.declined for lp in main), [lp.stats.declined for lp in main]


@pytest.mark.gpu
@pytest.mark.parametrize("name,args", [("blur", ["2048", "2048", "4"]), ("stencil", ["1024", "50"])])
def test_simd_builds_launch_warm_in_auto_mode_on_the_gpu(name: str, args: list[str], tmp_path, capfd,
                                                         monkeypatch) -> None:  # fmt: skip
    """The benchmark's sizes (benchmarks.offload, large), cold then warm in one process with
    a cache of the test's own: the warm run launches the sweep from the cache, with
    wasmtime's output, and no arrival of it waits for a compile or the device's start."""
    from tensorwasm.runtime import run as run_module
    from tensorwasm.runtime.cache import default_cache
    from tensorwasm.runtime.planning import COMPILING, NOT_STARTED

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    path = ROOT / f"examples/wasi/build/{name}.O2.simd.wasm"
    expected = plain_wasmtime(path, args, tmp_path)
    for phase in ("cold", "warm"):
        default_cache().memory.clear()
        capfd.readouterr()
        got, offload, _ = run_module.run(path.read_bytes(), [str(path), *args], offload="auto", device="gpu")
        assert (got, capfd.readouterr().out) == expected, phase
        offload.kernels.wait()
    (sweep,) = [lp for lp in offload.loops if lp.stats.func == "main" and lp.region is not None]
    assert sweep.stats.offloaded >= 1, sweep.stats.declined
    assert COMPILING not in sweep.stats.declined and NOT_STARTED not in sweep.stats.declined
