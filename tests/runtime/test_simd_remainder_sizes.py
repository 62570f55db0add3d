"""The SIMD builds of the blur example and of the suite's stencil3d at sizes where clang's
scalar remainder after the vector loop runs zero times (blur's row interior of width - 2,
stencil3d's n - 2, a multiple of the vector width: 16 bytes, 4 floats) and at their
neighbours, where it runs: the nest launches (its remainder counted zero, not a rotated
loop's wrapped 2^32) and the program prints exactly what it prints on wasmtime, on the
host backend, the simulated device and the GPU."""

from __future__ import annotations

import pytest

from tensorwasm.runtime.offload import OffloadModule
from tests.conftest import ROOT
from tests.runtime.test_run import plain_wasmtime, run_start, wasi_store

DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]
BLUR = ROOT / "examples/wasi/build/blur.O2.simd.wasm"
STENCIL3D = ROOT / "benchmarks/suite/build/stencil3d.simd.wasm"
# The loop of each program around the vector loop and its remainder: (function, offset).
BLUR_ROWS = ("main", 0x419)
STENCIL3D_ROWS = ("kernel_stencil3d", 0x2E3)


def offloaded_run(path, args: list[str], device: str, tmp_path) -> tuple[int, str, OffloadModule]:
    """The WASI program run offloaded on ``device`` (every arrival launched where the guards
    hold): exit status, what it printed, and the module with its loops' statistics."""
    from tensorwasm.oracle.simulated import SimulatedDevice

    offload = OffloadModule(
        path.read_bytes(), device=SimulatedDevice() if device == "simulated" else device, mode="always"
    )
    out = tmp_path / "offloaded"
    engine, store, linker = wasi_store(path, args, out)
    offload.define(linker, store)
    instance = linker.instantiate(store, offload.compiled(engine))
    offload.bind(store, instance.exports(store))
    try:
        status = run_start(instance, store)
    finally:
        offload.close()
    return status, out.read_text(), offload


def launches_of(offload: OffloadModule, where: tuple[str, int]) -> tuple[int, dict]:
    """(launches, declines by reason) of the loop at ``where``."""
    (lp,) = [lp for lp in offload.loops if (lp.plan.func.name, lp.plan.loop.offset) == where]
    return lp.stats.offloaded, lp.stats.declined


def check(path, args: list[str], where: tuple[str, int], device: str, tmp_path) -> None:
    expected = plain_wasmtime(path, args, tmp_path)
    status, printed, offload = offloaded_run(path, args, device, tmp_path)
    assert (status, printed) == expected
    launched, declined = launches_of(offload, where)
    assert launched >= 1 and not declined, declined


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [514, 515, 18, 19])
def test_blur_rows_launch_where_the_remainder_runs_zero_times(width: int, device: str, tmp_path) -> None:
    """514 - 2 = 512 and 18 - 2 = 16: the vector loop covers each row; 515, 19: one byte left."""
    check(BLUR, [str(width), "12", "2"], BLUR_ROWS, device, tmp_path)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [10, 14, 11, 12])
def test_stencil3d_rows_launch_where_the_remainder_runs_zero_times(n: int, device: str, tmp_path) -> None:
    """n - 2 = 8 and 12: the vector loop covers each row of the interior; 9, 10: it leaves
    one and two floats to the remainder."""
    check(STENCIL3D, [str(n), "3"], STENCIL3D_ROWS, device, tmp_path)
