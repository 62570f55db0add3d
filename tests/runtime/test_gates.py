"""The Wasm-side gate before a loop's host call: a loop that keeps declining stops leaving
Wasm (the host is asked again after waits that double, up to a limit), one that declines for
a reason that lasts never asks again, offload off never asks, and every arrival is counted
under a reason; the program computes what plain wasmtime computes."""

from __future__ import annotations

import math

import pytest
import wasmtime

from benchmarks.declines import NEST
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


def _region_instance(wasm: bytes, device: str, mode: str):
    from tensorwasm.oracle.simulated import SimulatedDevice

    offload = OffloadModule(wasm, device=SimulatedDevice() if device == "simulated" else device, mode=mode)
    store = wasmtime.Store()
    linker = wasmtime.Linker(store.engine)
    offload.define(linker, store)
    instance = linker.instantiate(store, offload.compiled(store.engine))
    offload.bind(store, instance.exports(store))
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
    offload, store, exports = _region_instance(wasm, device, "auto")
    (sweep,) = offload.loops
    assert sweep.region is not None and sweep.insertion.gate and sweep.insertion.filter is None
    asked = _asking(monkeypatch)
    exports["run"](store, 4, 1000, 0)  # too little work at every step
    offload.close()
    assert asked.count(sweep.stats.offset) == _asks_expected(1000)
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

    offload, store, exports = _region_instance(time_loop(), "cpu", "auto")
    (sweep,) = offload.loops
    exports["run"](store, 4, 12, 0)  # asks at 1, 2, 3, 4, 6 and 10: a wait of 7 has 5 to go
    n = offload.loops.index(sweep)
    assert exports[f"tensorwasm:wait_{n}"].value(store) == 5
    sweep.gate.reopen()  # as a launch in the region does
    assert exports[f"tensorwasm:wait_{n}"].value(store) == 0 and sweep.gate.declines == 0
    offload.collect_skipped()
    assert sweep.stats.arrivals == 12 and sum(sweep.stats.declined.values()) == 12
