"""Replays in native code (:mod:`runtime.replay`): a loop's host function that replays its
last launch without Python, on the simulated device (its driver calls are callbacks into
it) and on the GPU. Each test compares linear memory with plain wasmtime after every call
and checks that the calls it names went native, or back to Python."""

from __future__ import annotations

import random
import struct

import pytest
import wasmtime

from tensorwasm.runtime.device_replay import DeviceReplays
from tensorwasm.runtime.offload import OffloadModule
from tests.conftest import wat
from tests.offload_cases import instantiate, module_bytes
from tests.runtime.test_offload import DIVIDE_LOOP, divide

DEVICES = ["simulated", pytest.param("gpu", marks=pytest.mark.gpu)]


def _prepared(wasm: bytes, device: str, mode: str = "always") -> OffloadModule:
    """``wasm`` prepared to launch from page-locked memory, replays going native after one
    in Python."""
    from tensorwasm.oracle.simulated import SimulatedDevice

    on = SimulatedDevice() if device == "simulated" else "gpu"
    return OffloadModule(wasm, device=on, mode=mode, pin=True, native_after=1)


def _bound(offload: OffloadModule, wasm: bytes):
    """An instance of the rewritten module, bound as ``tensorwasm run`` binds it (its hooks
    table given to the host), every arrival asking the host, and one of the plain module."""
    store, instance = instantiate(offload.rewritten, offload)
    offload.bind(store, instance.exports(store), [0] * len(offload.loops))
    return (store, instance), instantiate(wasm)


class Saxpy:
    """blas1's saxpy over 256 floats, new data each call, on our instance and on plain
    wasmtime; each call asserts the memory both leave is the same."""

    def __init__(self, device: str, mode: str = "always") -> None:
        self.wasm = module_bytes("blas1", "O2")
        self.offload = _prepared(self.wasm, device, mode)
        self.runs = _bound(self.offload, self.wasm)
        self.rng = random.Random(17)
        self.loop = next(lp for lp in self.offload.loops if lp.plan.func.name == "saxpy")

    def __call__(self, a: float = 1.5) -> None:
        data = struct.pack("<512f", *(self.rng.uniform(-4, 4) for _ in range(512)))
        left = []
        for store, instance in self.runs:
            exports = instance.exports(store)
            base = exports["scratch_base"](store)
            exports["memory"].write(store, data, base)
            exports["saxpy"](store, 256, a, base, base + 1024)
            left.append(bytes(exports["memory"].read(store, base, base + 2048)))
        assert left[0] == left[1]

    def stats(self):
        self.offload.collect_skipped()
        return self.loop.stats

    def grow(self) -> None:
        for store, instance in self.runs:
            instance.exports(store)["memory"].grow(store, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_replays_run_in_native_code_with_exact_results(device: str) -> None:
    saxpy = Saxpy(device)
    try:
        saxpy()
        iterations = saxpy.stats().iterations
        for _ in range(39):
            saxpy()
        stats = saxpy.stats()
        # The first two take the whole path (the second records the replayable launch), the
        # third replays it in Python and arms the native function, which replays the rest.
        assert stats.arrivals == stats.offloaded == 40 and not stats.declined
        assert stats.replayed == 38 and stats.native == 37
        assert stats.iterations == 40 * iterations and stats.bytes_out == 40 * 1024
        assert stats.kernel_seconds > 0 and stats.transfer_seconds > 0
    finally:
        saxpy.offload.close()


@pytest.mark.parametrize("device", DEVICES)
def test_new_live_ins_or_a_grown_memory_go_through_python_and_native_replays_resume(device: str) -> None:
    saxpy = Saxpy(device)
    try:
        for _ in range(4):
            saxpy()
        assert saxpy.stats().native == 1
        saxpy(-2.0)  # other live-ins: the native function hands it over, the whole path
        saxpy(-2.0)  # the whole path again (the scratch held the last one's), armed after it
        assert saxpy.stats().native == 1
        saxpy(-2.0)
        assert saxpy.stats().native == 2
        saxpy.grow()  # the same live-ins, a larger memory: handed over, and page-locked anew
        saxpy(-2.0)
        saxpy(-2.0)
        assert saxpy.stats().native == 2
        saxpy(-2.0)
        saxpy(-2.0)
        stats = saxpy.stats()
        assert stats.native == 4 and stats.arrivals == stats.offloaded == 11 and not stats.declined
    finally:
        saxpy.offload.close()


@pytest.mark.parametrize("device", DEVICES)
def test_a_native_replay_that_traps_leaves_the_loop_to_wasmtime_and_its_trap(device: str) -> None:
    wasm = wat(DIVIDE_LOOP)
    offload = _prepared(wasm, device)
    runs = _bound(offload, wasm)
    (loop,) = offload.loops

    def call(divisors: list[int]) -> list[tuple[bytes, wasmtime.TrapCode | None]]:
        return divide(runs, divisors)

    try:
        divisors = list(range(1, 513))
        for _ in range(4):
            ours, plain = call(divisors)
            assert ours == plain and ours[1] is None
        offload.collect_skipped()
        assert loop.stats.native == 1
        divisors[300] = 0  # the same live-ins: the native replay launches, and the kernel traps
        ours, plain = call(divisors)
        assert ours == plain and ours[1] == wasmtime.TrapCode.INTEGER_DIVISION_BY_ZERO
        assert not loop.again
        divisors[300] = 7
        for _ in range(3):
            ours, plain = call(divisors)
            assert ours == plain and ours[1] is None
        offload.collect_skipped()
        assert loop.stats.offloaded == 7 and sum(loop.stats.declined.values()) == 1
        # Twice the whole path (the first uploads the scratch the trap changed, the second
        # records its launch and arms the native function), then native again.
        assert loop.stats.native == 2
    finally:
        offload.close()


def test_a_native_replay_whose_launch_fails_runs_the_loop_on_the_cpu(monkeypatch) -> None:
    from tensorwasm.oracle.simulated import HostGraph
    from tensorwasm.runtime.driver import CudaError

    launch = HostGraph.launch
    failures = {"left": 0}

    def flaky(graph: HostGraph, stream: int = 0) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise CudaError("cuGraphLaunch", 1)  # CUDA_ERROR_INVALID_VALUE: nothing sticky
        launch(graph, stream)

    monkeypatch.setattr(HostGraph, "launch", flaky)
    saxpy = Saxpy("simulated")
    try:
        for call in range(10):
            failures["left"] = int(call == 5)  # a native replay: call 3 was the first
            saxpy()
        stats = saxpy.stats()
        assert stats.offloaded == 9 and stats.arrivals == 10
        ((reason, count),) = stats.declined.items()
        assert "cuGraphLaunch" in reason and count == 1
        # After the failure: the whole path records the launch again (its graph was
        # dropped), one replay in Python arms the native function, which does the last two.
        assert stats.native == 2 + 2
    finally:
        saxpy.offload.close()


def test_in_auto_mode_native_replays_are_timed_and_every_so_many_decided_again(monkeypatch) -> None:
    from tensorwasm.runtime.profit import Estimate

    decisions = []
    decide = Estimate.decide

    def always(self, *args, **kwargs):  # 256 elements would not pay: take the launch anyway
        decisions.append(args)
        _, _, model, cpu = decide(self, *args, **kwargs)
        return True, "", model, cpu

    monkeypatch.setattr(Estimate, "decide", always)
    monkeypatch.setattr(DeviceReplays, "NATIVE_BUDGET", 4)
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")  # every arrival counted from the first
    saxpy = Saxpy("simulated", mode="auto")
    try:
        for _ in range(22):
            saxpy()
        stats = saxpy.stats()
        assert stats.offloaded == 22 and stats.native == 16
        # Decided: the two arrivals of the whole path, and each replay in Python (whose
        # decision arms the native function). Native replays run in fours between them, each
        # four recorded as one launch against that decision.
        python_replays = stats.replayed - stats.native
        assert python_replays == 4
        assert len(decisions) == 2 + python_replays
        assert saxpy.loop.estimate.launches == 2 + python_replays + 4
    finally:
        saxpy.offload.close()


def test_an_unbound_instance_keeps_its_replays_in_python() -> None:
    wasm = module_bytes("blas1", "O2")
    offload = _prepared(wasm, "simulated")
    store, instance = instantiate(offload.rewritten, offload)
    exports = instance.exports(store)
    base = exports["scratch_base"](store)
    try:
        for _ in range(5):
            exports["saxpy"](store, 256, 1.5, base, base + 1024)
        offload.collect_skipped()
        loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
        assert loop.stats.replayed == 3 and loop.stats.native == 0
    finally:
        offload.close()
