"""The Wasm-side gate before a loop's host call: a loop that keeps declining stops leaving
Wasm (the host is asked again after waits that double, up to a limit), one that declines for
a reason that lasts never asks again, offload off never asks, and every arrival is counted
under a reason; the program computes what plain wasmtime computes."""

from __future__ import annotations

import itertools
import math

import pytest
import wasmtime

from benchmarks.declines import NEST
from tensorwasm.compiler.rewrite import NEVER_SKIP
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import FOREVER, LASTING, ArrivalGate, ArrivalPlanner

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _instance(mode: str, monkeypatch: pytest.MonkeyPatch | None = None, device: str = "cpu"):
    offload = OffloadModule(wasmtime.wat2wasm(NEST), device=device, mode=mode)
    store = wasmtime.Store()
    linker = wasmtime.Linker(store.engine)
    asked: list[int] = []
    if monkeypatch is not None:
        # Waits capped at WAIT_LIMIT whatever a question costs (see the tests of ASK_SHARE).
        monkeypatch.setattr(ArrivalGate, "ASK_SHARE", math.inf)
        real = ArrivalPlanner._arrive

        def counting(self, lp, *rest):
            asked.append(lp.stats.offset)
            return real(self, lp, *rest)

        monkeypatch.setattr(ArrivalPlanner, "_arrive", counting)
    offload.define(linker, store)
    instance = linker.instantiate(store, offload.compiled(store.engine))
    offload.bind(store, instance.exports(store))
    outer = min(offload.loops, key=lambda lp: lp.stats.offset)
    return offload, store, instance.exports(store), outer, asked


def _memory(store, exports) -> bytes:
    memory = exports["memory"]
    return bytes(memory.read(store, 0, memory.data_len(store)))


def _plain_memory(arrivals: int, n: int, m: int) -> bytes:
    store = wasmtime.Store()
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, wasmtime.wat2wasm(NEST)), [])
    instance.exports(store)["repeat"](store, arrivals, n, m)
    return _memory(store, instance.exports(store))


def _asks_expected(arrivals: int) -> int:
    """Host calls for ``arrivals`` declines in a row under the backoff."""
    asks, at, declines = 0, 0, 0
    while at < arrivals:
        asks += 1
        at += 1
        declines += 1
        if declines >= ArrivalGate.BACKOFF_AFTER:
            at += min((1 << (declines - ArrivalGate.BACKOFF_AFTER + 1)) - 1, ArrivalGate.WAIT_LIMIT)
    return asks


def test_a_nest_has_a_gate_and_no_filter() -> None:
    offload, store, exports, outer, _ = _instance("auto")
    assert outer.insertion.filter is None and outer.insertion.gate
    n = offload.loops.index(outer)
    assert exports[f"tensorwasm:wait_{n}"].value(store) == 0
    assert f"tensorwasm:min_{n}" not in exports


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arrivals", [3, 40, 1000])
def test_a_loop_that_keeps_declining_stops_asking_the_host(arrivals: int, device: str, monkeypatch) -> None:
    offload, store, exports, outer, asked = _instance("auto", monkeypatch, device)
    exports["repeat"](store, arrivals, 2, 2)  # too little work: every arrival declines
    assert asked.count(outer.stats.offset) == _asks_expected(arrivals)
    if arrivals >= 1000:
        assert asked.count(outer.stats.offset) <= math.ceil(arrivals / ArrivalGate.WAIT_LIMIT) + 10
    offload.close()
    assert outer.stats.arrivals == arrivals and outer.stats.offloaded == 0
    assert outer.stats.declined == {"too little work to pay for a launch": arrivals}
    assert _memory(store, exports) == _plain_memory(arrivals, 2, 2)


def test_the_longest_wait_makes_questions_a_small_share_of_the_arrivals_time() -> None:
    limit = ArrivalGate.wait_limit
    gate = ArrivalGate.__new__(ArrivalGate)
    assert limit(gate, 0.0, 1e-6) == limit(gate, 1e-4, 0.0) == ArrivalGate.WAIT_LIMIT  # nothing known
    assert limit(gate, 1e-5, 1e-3) == ArrivalGate.WAIT_LIMIT  # a cheap question: the usual cap
    # A 0.26 ms question before ~7 us arrivals (doitgen): a wait of ~3,700 keeps it at 1%.
    assert limit(gate, 2.6e-4, 7e-6) == math.ceil(2.6e-4 / (ArrivalGate.ASK_SHARE * 7e-6))
    assert limit(gate, 1.0, 1e-9) == ArrivalGate.WAIT_CAP


def test_a_loop_whose_questions_cost_more_than_its_arrivals_asks_far_less_often(monkeypatch) -> None:
    offload, store, exports, outer, asked = _instance("auto", monkeypatch)
    monkeypatch.setattr(ArrivalGate, "ASK_SHARE", 0.01)  # (the product's share, not the cap above)
    arrivals = 20_000
    exports["repeat"](store, arrivals, 2, 2)  # tiny arrivals: each question costs far more
    asks = asked.count(outer.stats.offset)
    assert asks < _asks_expected(arrivals) / 4  # the capped waits would ask ~320 times
    offload.close()
    assert outer.stats.arrivals == arrivals and outer.stats.offloaded == 0
    assert outer.stats.declined == {"too little work to pay for a launch": arrivals}
    assert _memory(store, exports) == _plain_memory(arrivals, 2, 2)


def test_the_counts_are_whole_while_a_wait_still_runs(monkeypatch) -> None:
    offload, store, exports, outer, asked = _instance("auto", monkeypatch)
    exports["repeat"](store, 12, 2, 2)  # asks at 1, 2, 3, 4, 6 and 10: a wait of 7 has 5 to go
    assert len(asked) == 6 and exports[f"tensorwasm:wait_{offload.loops.index(outer)}"].value(store) == 5
    offload.collect_skipped()
    assert outer.stats.arrivals == 12 and sum(outer.stats.declined.values()) == 12
    exports["repeat"](store, 5, 2, 2)
    offload.close()
    assert outer.stats.arrivals == 17 and sum(outer.stats.declined.values()) == 17


@pytest.mark.parametrize("device", DEVICES)
def test_launches_keep_the_gate_open(device: str, monkeypatch) -> None:
    offload, store, exports, outer, asked = _instance("always", monkeypatch, device)
    exports["repeat"](store, 30, 8, 8)
    assert exports[f"tensorwasm:wait_{offload.loops.index(outer)}"].value(store) == 0
    offload.close()
    assert outer.stats.offloaded == 30 and asked  # (on the GPU, later launches may replay without asking)
    assert _memory(store, exports) == _plain_memory(30, 8, 8)


@pytest.mark.parametrize("reason", sorted(LASTING))
def test_a_lasting_reason_closes_the_gate_for_good(reason: str, monkeypatch) -> None:
    offload, store, exports, outer, asked = _instance("always", monkeypatch)
    outer.gate.declined(reason)
    n = offload.loops.index(outer)
    assert exports[f"tensorwasm:wait_{n}"].value(store) == FOREVER
    exports["repeat"](store, 20, 8, 8)
    offload.close()
    assert asked.count(outer.stats.offset) == 0 and outer.stats.offloaded == 0
    assert outer.stats.declined == {reason: 20}
    assert _memory(store, exports) == _plain_memory(20, 8, 8)


def test_offload_off_never_asks(monkeypatch) -> None:
    offload, store, exports, outer, asked = _instance("off", monkeypatch)
    exports["repeat"](store, 20, 8, 8)
    offload.close()
    assert asked == []
    assert outer.stats.arrivals == 20 and outer.stats.declined == {"offload is off": 20}


# A second sweep inside the time loop of tests.runtime.test_regions: it adds one to what the
# first wrote, which the first reads again after the swap.
_BUMP = """(local.set $i (i32.const 0))
  (block $none (br_if $none (i32.le_s (local.get $m) (i32.const 0)))
    (loop $bump
      (i32.store (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))
        (i32.add (i32.load (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))) (i32.const 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $bump (i32.lt_s (local.get $i) (local.get $m)))))"""

REGION_DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]


def _region_instance(wasm: bytes, device: str, mode: str, thresholds=None):
    """``thresholds``: the module to each of its loops' filter thresholds (the mode's if None)."""
    from tensorwasm.oracle.simulated import SimulatedDevice

    offload = OffloadModule(wasm, device=SimulatedDevice() if device == "simulated" else device, mode=mode)
    store = wasmtime.Store()
    linker = wasmtime.Linker(store.engine)
    offload.define(linker, store)
    instance = linker.instantiate(store, offload.compiled(store.engine))
    offload.bind(store, instance.exports(store), thresholds(offload) if thresholds else None)
    return offload, store, instance.exports(store)


def _plain_run(wasm: bytes, *args: int) -> bytes:
    store = wasmtime.Store()
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, wasm), [])
    instance.exports(store)["run"](store, *args)
    return _memory(store, instance.exports(store))


def _asking(monkeypatch, decline: set[int] | None = None) -> list[int]:
    """The offsets of the loops whose arrivals ask the host; those in ``decline`` decline."""
    asked: list[int] = []
    real = ArrivalPlanner._arrive
    monkeypatch.setattr(ArrivalGate, "ASK_SHARE", math.inf)  # waits capped at WAIT_LIMIT

    def counting(self, lp, caller, args, context):
        asked.append(lp.stats.offset)
        if decline is not None and lp.stats.offset in decline:
            lp.stats.arrivals += 1
            lp.stats.decline("declined by the test")
            return [0, *args[len(lp.plan.live_ins) :]]
        return real(self, lp, caller, args, context)

    monkeypatch.setattr(ArrivalPlanner, "_arrive", counting)
    return asked


@pytest.mark.parametrize("device", REGION_DEVICES)
def test_a_region_loop_that_keeps_declining_stops_asking_the_host(device: str, monkeypatch) -> None:
    from tests.runtime.test_regions import time_loop

    wasm = time_loop()
    monkeypatch.setattr(ArrivalPlanner, "threshold", lambda self, lp: NEVER_SKIP)  # the gate alone
    offload, store, exports = _region_instance(wasm, device, "auto")
    (sweep,) = offload.loops
    assert sweep.region is not None and sweep.insertion.gate
    asked = _asking(monkeypatch)
    exports["run"](store, 4, 1000, 0)  # too little work at every step
    offload.close()
    assert asked.count(sweep.stats.offset) == _asks_expected(1000)
    assert sweep.stats.arrivals == 1000 and sweep.stats.declined == {
        "too little work to pay for a launch": 1000
    }
    assert _memory(store, exports) == _plain_run(wasm, 4, 1000, 0)


@pytest.mark.parametrize("device", REGION_DEVICES)
def test_a_region_loop_s_filter_keeps_small_arrivals_in_wasm_while_the_device_holds_nothing(
    device: str, monkeypatch
) -> None:
    """A sweep of four elements in a time loop of 1,000 steps, far less work than a launch,
    on a device that never launches: no arrival asks the host (as PolyBench's jacobi-1d,
    whose two sweeps of 2,000 elements each asked 11 times a run, the first after 0.3 to
    0.75 ms of guards)."""
    from tests.runtime.test_regions import time_loop

    wasm = time_loop()
    offload, store, exports = _region_instance(wasm, device, "auto")
    (sweep,) = offload.loops
    assert sweep.region is not None and sweep.insertion.filter is not None
    asked = _asking(monkeypatch)
    exports["run"](store, 4, 1000, 0)
    offload.close()
    assert asked == []
    assert sweep.stats.arrivals == 1000 and sweep.stats.declined == {
        "too little work to pay for a launch": 1000
    }
    assert _memory(store, exports) == _plain_run(wasm, 4, 1000, 0)


@pytest.mark.parametrize("device", REGION_DEVICES)
def test_a_launch_in_a_region_opens_the_gates_of_all_its_loops(device: str, monkeypatch) -> None:
    from tests.runtime.test_regions import time_loop

    wasm = time_loop(body=_BUMP)
    offload, store, exports = _region_instance(wasm, device, "always")
    sweep, bump = sorted(offload.loops, key=lambda lp: lp.stats.offset)
    assert sweep.region == bump.region is not None
    # The sweep declines at every step and the bump launches: the bump's results are on the
    # device when the sweep comes again, so the sweep must ask the host (which brings them
    # back) at every arrival; run in Wasm it would read stale memory.
    asked = _asking(monkeypatch, decline={sweep.stats.offset})
    exports["run"](store, 256, 40, 0)
    offload.close()
    assert bump.stats.offloaded == 40
    assert asked.count(sweep.stats.offset) == 40 and sweep.stats.arrivals == 40
    assert _memory(store, exports) == _plain_run(wasm, 256, 40, 0)


def test_without_launches_a_region_s_gates_stay_closed_and_reopen_counts_the_wait(monkeypatch) -> None:
    from tests.runtime.test_regions import time_loop

    monkeypatch.setattr(ArrivalPlanner, "threshold", lambda self, lp: NEVER_SKIP)  # the gate alone
    offload, store, exports = _region_instance(time_loop(), "cpu", "auto")
    (sweep,) = offload.loops
    exports["run"](store, 4, 12, 0)  # asks at 1, 2, 3, 4, 6 and 10: a wait of 7 has 5 to go
    n = offload.loops.index(sweep)
    assert exports[f"tensorwasm:wait_{n}"].value(store) == 5
    sweep.gate.reopen()  # as a launch in the region does
    assert exports[f"tensorwasm:wait_{n}"].value(store) == 0 and sweep.gate.declines == 0
    offload.collect_skipped()
    assert sweep.stats.arrivals == 12 and sum(sweep.stats.declined.values()) == 12


# A time loop whose sweep reads x[0:n) into one of two arrays (swapped at each step), and whose touch-up adds one to x[4t:4t+4):
# the touch-up's footprint moves with the step, over what the sweep's launches copied in.
_MOVING_TOUCH_UP = """(module (memory (export "memory") 1)
  (func (export "run") (param $n i32) (param $steps i32)
    (local $t i32) (local $i i32) (local $j i32) (local $a i32) (local $b i32) (local $tmp i32)
    (local.set $a (i32.const 32768)) (local.set $b (i32.const 49152))
    (block $done
      (br_if $done (i32.le_s (local.get $steps) (i32.const 0)))
      (loop $time
        (local.set $i (i32.const 0))
        (block $skip
          (br_if $skip (i32.le_s (local.get $n) (i32.const 0)))
          (loop $sweep
            (i32.store (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))
              (i32.add (i32.mul (i32.load (i32.shl (local.get $i) (i32.const 2))) (i32.const 3))
                       (local.get $t)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $sweep (i32.lt_s (local.get $i) (local.get $n)))))
        (local.set $j (i32.const 0))
        (loop $touch
          (i32.store (i32.shl (i32.add (i32.shl (local.get $t) (i32.const 2)) (local.get $j)) (i32.const 2))
            (i32.add (i32.load (i32.shl (i32.add (i32.shl (local.get $t) (i32.const 2)) (local.get $j))
                                        (i32.const 2)))
                     (i32.const 1)))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $touch (i32.lt_s (local.get $j) (i32.const 4))))
        (local.set $tmp (local.get $a)) (local.set $a (local.get $b)) (local.set $b (local.get $tmp))
        (local.set $t (i32.add (local.get $t) (i32.const 1)))
        (br_if $time (i32.lt_s (local.get $t) (local.get $steps)))))))"""


@pytest.mark.parametrize("device", REGION_DEVICES[1:])
def test_a_region_loop_kept_in_wasm_never_leaves_the_device_a_stale_copy(device: str, monkeypatch) -> None:
    """The sweep launches at the first step, declines at the next five (wasmtime runs it:
    its results come back), then launches again; the touch-up declines at every step. At
    the seventh step both gates keep their loops in Wasm, and the touch-up writes x[24:28),
    which the device still holds from the first launch: the sweep's launch at the eighth
    step must read what wasmtime wrote there."""
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    monkeypatch.setattr(ArrivalGate, "ASK_SHARE", math.inf)
    monkeypatch.setattr(ArrivalPlanner, "threshold", lambda self, lp: NEVER_SKIP)  # the gates alone
    wasm = wasmtime.wat2wasm(_MOVING_TOUCH_UP)
    offload, store, exports = _region_instance(wasm, device, "auto")
    sweep, touch = sorted(offload.loops, key=lambda lp: lp.stats.offset)
    assert sweep.region == touch.region is not None
    monkeypatch.setattr(offload.planner, "_started", lambda gain, lp=None: None)
    decided = itertools.count()

    def sweep_decides(*args, **kwargs):
        if next(decided) in (1, 2, 3, 4, 5):
            return False, "too little work to pay for a launch", 1e-3, 1e-6
        return True, "", 1e-6, 1e-3

    monkeypatch.setattr(sweep.estimate, "decide", sweep_decides)
    monkeypatch.setattr(touch.estimate, "decide", lambda *a, **k: (False, "too little work", 1e-3, 1e-6))
    exports["run"](store, 64, 8)
    offload.close()
    assert sweep.stats.offloaded >= 2 and touch.stats.offloaded == 0
    plain = wasmtime.Store()
    instance = wasmtime.Instance(plain, wasmtime.Module(plain.engine, wasm), [])
    instance.exports(plain)["run"](plain, 64, 8)
    assert _memory(store, exports) == _memory(plain, instance.exports(plain))


@pytest.mark.parametrize("device", REGION_DEVICES)
def test_a_launch_in_a_region_holds_its_loops_filters_open_until_the_region_ends(
    device: str, monkeypatch
) -> None:
    """The touch-up (four iterations, below its filter's threshold) asks the host at every
    step once the sweep launched: the device holds the region's data, which a run in Wasm
    must not leave stale. The region's end brings it back, and the filter applies again: a
    call whose sweep declines at every step asks the host for no touch-up."""
    from tests.runtime.test_regions import TOUCH_UP, time_loop

    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    wasm = time_loop(body=TOUCH_UP)

    def thresholds(offload) -> list[int]:  # the sweep asks at every arrival: the test decides it
        first = min(offload.loops, key=lambda lp: lp.stats.offset)
        return [NEVER_SKIP if lp is first else offload.planner.threshold(lp) for lp in offload.loops]

    offload, store, exports = _region_instance(wasm, device, "auto", thresholds)
    sweep, touch = sorted(offload.loops, key=lambda lp: lp.stats.offset)
    assert touch.insertion.filter is not None and touch.region == sweep.region is not None
    monkeypatch.setattr(offload.planner, "_started", lambda gain, lp=None: None)
    launching = [True]
    monkeypatch.setattr(
        sweep.estimate, "decide",
        lambda *a, **k: (True, "", 1e-6, 1e-3) if launching[0] else (False, "too little work", 1e-3, 1e-6),
    )  # fmt: skip
    asked = _asking(monkeypatch)
    n = offload.loops.index(touch)
    least = exports[f"tensorwasm:min_{n}"].value(store)
    assert least == offload.planner.threshold(touch) > 16
    exports["run"](store, 1000, 12, 0)
    assert sweep.stats.offloaded == 12 and asked.count(touch.stats.offset) == 12
    assert exports[f"tensorwasm:min_{n}"].value(store) == least  # released at the region's end
    launching[0] = False
    exports["run"](store, 1000, 12, 0)
    assert asked.count(touch.stats.offset) == 12 and sweep.stats.offloaded == 12
    offload.close()
    plain = wasmtime.Store()
    instance = wasmtime.Instance(plain, wasmtime.Module(plain.engine, wasm), [])
    for _ in range(2):
        instance.exports(plain)["run"](plain, 1000, 12, 0)
    assert _memory(store, exports) == _memory(plain, instance.exports(plain))
    assert touch.stats.arrivals == 24
