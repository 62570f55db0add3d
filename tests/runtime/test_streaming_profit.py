"""A loop streaming over more memory than the processor's caches hold costs wasmtime that
memory's time, however few ops it counts: clang's SIMD saxpy (13 ops per 4 elements) must
launch where its scalar build (10 ops an element) does.

On the H100's host the suite's SIMD saxpy at n=67M ran a pass in 60 ms on wasmtime, while
its op count estimated 18 ms, below the 18 ms of copies: all 10 arrivals declined ("too
little work"), 3 launches against the scalar build's 13.
"""

from __future__ import annotations

import pytest

from tensorwasm.oracle.simulated import SimulatedDevice
from tensorwasm.runtime import profit
from tensorwasm.runtime.offload import OffloadModule
from tests.conftest import ROOT
from tests.runtime.test_run import plain_wasmtime

# A per-op time at which the SIMD saxpy's ops estimate falls below its copies, as on the
# H100's host (its ops at 0.08 ns estimate 18 ms a pass, the copies 18 ms).
PER_OP = 0.08e-9


def test_a_small_loop_is_still_judged_by_its_ops(monkeypatch) -> None:
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: PER_OP)
    ops, moved = 13 * (1 << 20), 48 << 20  # SIMD saxpy at n=4M: in the caches
    go, why, _, cpu = profit.Estimate().decide("gpu", ops, moved, True, 1 << 20, touched=moved)
    assert not go and why == "too little work to pay for a launch"
    assert cpu == pytest.approx(ops * PER_OP)


def test_a_loop_streaming_from_memory_is_judged_by_its_bytes(monkeypatch) -> None:
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: PER_OP)
    n = 67_108_864
    ops, moved = 13 * n // 4, 12 * n  # SIMD saxpy at n=67M: x and y read, y written
    go, _, model, cpu = profit.Estimate().decide("gpu", ops, moved, True, n // 4, touched=moved)
    assert go and cpu == pytest.approx(moved / profit.CPU_STREAM_BYTES_PER_SECOND)
    assert model < cpu / 2
    go, why, _, _ = profit.Estimate().decide("gpu", ops, moved, True, n // 4)  # the ops alone
    assert not go and why == "too little work to pay for a launch"


def test_the_simd_saxpy_launches_every_pass_over_arrays_larger_than_the_caches(
    monkeypatch, tmp_path, capfd
) -> None:
    """auto mode, on the GPU's path (simulated): each pass of kernel_saxpy's vector loop,
    streaming 72 MB, launches; the output is wasmtime's. (Two passes: from the third the
    measured launches weigh in, and the simulated device's are the host's, not a GPU's.)"""
    from tensorwasm.runtime import run as run_module

    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: PER_OP)
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    made = []

    def simulated(wasm, **kwargs):
        made.append(OffloadModule(wasm, **{**kwargs, "device": SimulatedDevice()}))
        return made[-1]

    monkeypatch.setattr(run_module, "OffloadModule", simulated)
    path = ROOT / "benchmarks/suite/build/saxpy.simd.wasm"
    args = ["6000000", "2"]
    expected = plain_wasmtime(path, args, tmp_path)
    capfd.readouterr()
    status, offload, _ = run_module.run(path.read_bytes(), [str(path), *args], offload="auto", device="cpu")
    assert (status, capfd.readouterr().out) == expected
    (vector,) = [lp for lp in offload.loops if lp.stats.func == "kernel_saxpy" and lp.stats.arrivals]
    assert vector.stats.offloaded == 2 and not vector.stats.declined, vector.stats.declined


def test_one_launch_that_stalled_does_not_send_a_loop_back_to_the_cpu() -> None:
    # PolyBench's symm: launches of ~0.26 ms against a CPU estimate of ~0.78 ms, then one of
    # 6.5 ms (a stall); the smoothed correction jumped from 4 to 52 and the loop stayed on
    # wasmtime for most of the program's remaining arrivals.
    estimate = profit.Estimate()
    ops, cells = 6_500_000, 1200
    _, _, model, cpu = estimate.decide("gpu", ops, 21_000, True, cells)
    measured = [0.3 * cpu] * 6 + [8 * cpu]
    for seconds in measured:
        estimate.record(seconds, model, cpu)
    go, why, _, _ = estimate.decide("gpu", ops, 21_000, True, cells)
    assert go, why
    # Launches that stay slow are believed: the second in a row moves the median.
    estimate.record(8 * cpu, model, cpu)
    go, why, _, _ = estimate.decide("gpu", ops, 21_000, True, cells)
    assert not go and "slower" in why
