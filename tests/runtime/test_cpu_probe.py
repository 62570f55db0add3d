"""``auto`` checks its CPU estimate against wasmtime: a loop whose launches gain little by
the model has one arrival timed on wasmtime (runtime.profit.PROBING), and where wasmtime
ran it faster than its launches take, the loop stays on the CPU."""

from __future__ import annotations

import struct
import time
from types import SimpleNamespace

import pytest

import tensorwasm.runtime.profit as profit
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import ArrivalPlanner
from tests.offload_cases import instantiate, module_bytes

N = 4096
SLOWER = "its launches ran slower than the CPU would"


def _saxpy_calls(wasm: bytes, calls: int, offload: OffloadModule | None = None, between=None) -> bytes:
    """``y = 1.5 * x + y`` over N floats, ``calls`` times in one instance: its memory after."""
    store, instance = instantiate(wasm, offload)
    exports = instance.exports(store)
    memory = exports["memory"]
    x = exports["scratch_base"](store)
    y = x + 4 * N
    memory.write(store, struct.pack(f"<{N}f", *(i % 17 * 0.25 for i in range(N))), x)
    memory.write(store, struct.pack(f"<{N}f", *(i % 5 * 0.5 for i in range(N))), y)
    for _ in range(calls):
        exports["saxpy"](store, N, 1.5, x, y)
        if between is not None:
            between()
    return bytes(memory.read(store, 0, memory.data_len(store)))


def _slow_launches(monkeypatch, launch_seconds: float) -> tuple[OffloadModule, object]:
    """The host backend in ``auto`` with launches of ``launch_seconds`` at least, which the
    model takes for half the CPU's time (a gain of about 2, below PROBE_MARGIN)."""
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")  # every arrival counted from the first
    offload = OffloadModule(module_bytes("blas1", "O2"), device="cpu", mode="auto")
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    ops = sum(n for n, _ in loop.plan.work) * N // abs(loop.plan.trip.step)  # (clang unrolls it)
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 2 * launch_seconds / ops)
    real_run = offload.planner.run

    def slow_run(*args):
        time.sleep(launch_seconds)
        return real_run(*args)

    monkeypatch.setattr(offload.planner, "run", slow_run)
    monkeypatch.setattr(offload.planner, "startup_seconds", lambda: 0.0)  # (a started device)
    monkeypatch.setattr(offload.planner, "startup_for", None)
    return offload, loop


def test_a_loop_wasmtime_runs_faster_than_its_launches_stays_on_the_cpu_once_timed(monkeypatch) -> None:
    """The model says ~40 ms on wasmtime against 20 ms launches; wasmtime takes
    microseconds. After PROBE_AFTER launches one arrival is timed on wasmtime, and from
    then on the loop declines, with memory exactly wasmtime's."""
    offload, loop = _slow_launches(monkeypatch, 0.02)
    calls = profit.PROBE_AFTER + 6
    expected = _saxpy_calls(module_bytes("blas1", "O2"), calls)
    assert _saxpy_calls(offload.rewritten, calls, offload) == expected
    assert loop.stats.offloaded == profit.PROBE_AFTER
    assert loop.stats.declined == {profit.PROBING: 1, SLOWER: 5}
    assert loop.estimate.probed and loop.estimate.cpu_scale < 0.25


def test_a_loop_whose_timed_arrival_took_longer_than_its_launches_keeps_launching(monkeypatch) -> None:
    """Where the time up to the next arrival (a bound on wasmtime's: here 60 ms of other
    work follow each call) is above the estimate, the estimate stands: the loop launches on."""
    offload, loop = _slow_launches(monkeypatch, 0.02)
    calls = profit.PROBE_AFTER + 3
    expected = _saxpy_calls(module_bytes("blas1", "O2"), calls)
    assert _saxpy_calls(offload.rewritten, calls, offload, between=lambda: time.sleep(0.06)) == expected
    assert loop.stats.offloaded == calls - 1
    assert loop.stats.declined == {profit.PROBING: 1}
    assert loop.estimate.probed and loop.estimate.cpu_scale > 1


def test_a_loop_whose_launches_gain_enough_is_never_timed(monkeypatch) -> None:
    """Launches well below PROBE_MARGIN of the estimate: every arrival launches."""
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    offload = OffloadModule(module_bytes("blas1", "O2"), device="cpu", mode="auto")
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 1e-6)  # ~0.1 s a call by the model
    monkeypatch.setattr(offload.planner, "startup_seconds", lambda: 0.0)
    monkeypatch.setattr(offload.planner, "startup_for", None)
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    calls = profit.PROBE_AFTER + 4
    expected = _saxpy_calls(module_bytes("blas1", "O2"), calls)
    assert _saxpy_calls(offload.rewritten, calls, offload) == expected
    assert loop.stats.offloaded == calls and not loop.stats.declined
    assert not loop.estimate.probed


def _loop(func: int, start: int, end: int) -> SimpleNamespace:
    return SimpleNamespace(
        insertion=SimpleNamespace(func_index=func, start=start, end=end), estimate=profit.Estimate()
    )


@pytest.mark.parametrize(
    ("next_loop", "measures"),
    [
        ("same", True),
        ((3, 40, 60), True),  # after it in the same function
        ((3, 2, 8), True),  # before it (the next iteration of a loop around both)
        ((3, 15, 25), False),  # inside it: it arrives while wasmtime runs the timed loop
        ((4, 40, 60), False),  # another function: the timed loop may call it
    ],
)
def test_the_timing_ends_only_at_an_arrival_outside_the_timed_loop(next_loop, measures) -> None:
    """An arrival inside the timed loop, or in another function, leaves the timing running
    (what declining the loop costs includes them); the next one outside it ends it."""
    runner = SimpleNamespace(run=None, transfer_estimate=None, record_replay=None)
    planner = ArrivalPlanner("auto", "cpu", runner)
    timed = _loop(3, 10, 30)
    other = timed if next_loop == "same" else _loop(*next_loop)
    planner.probing = (timed, 1.0, time.perf_counter() - 0.25)
    planner._timed(other)
    assert timed.estimate.probed is measures
    if not measures:
        assert planner.probing is not None and timed.estimate.cpu_scale == 1.0
        time.sleep(0.1)
        planner._timed(_loop(3, 31, 40))  # then one after it: the timing covers both
    assert planner.probing is None and timed.estimate.probed
    assert (0.35 if not measures else 0.25) <= timed.estimate.cpu_scale < 1.0
    *_, cpu = timed.estimate.decide("cpu", 1_000_000, 0)
    assert cpu == pytest.approx(1_000_000 * profit.cpu_seconds_per_op() * timed.estimate.cpu_scale)
