"""Device-resident regions: which loops around offloaded loops qualify, the host calls the
rewritten module makes where they end, and results exactly wasmtime's, a trap inside a
region included (on the host backend in CI, on the GPU with the marker gpu, where the data
stays on the device between launches)."""

from __future__ import annotations

import ctypes
import itertools
import random

import pytest
import wasmtime

from tensorwasm.compiler.analysis.regions import find_regions
from tensorwasm.compiler.frontend import load
from tensorwasm.dialect.types import I32
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.oracle.simulated import HostAllocator, HostContext, SimulatedDevice
from tensorwasm.runtime import profit
from tensorwasm.runtime.driver import KernelParams
from tensorwasm.runtime.mirror import DeviceMirror, Span, union
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.reference import ReferenceInstance
from tensorwasm.runtime.spans import SpanSet
from tests.conftest import wat

# A time loop around a parallel sweep over a[0:m) into b, then a pointer swap; the sweep
# grows by `grow` elements a step, so a large enough step runs out of memory and traps.
# `body` goes between the sweep and the swap.
TIME_LOOP = """(module (memory (export "memory") 1)
  (func (export "run") (param $n i32) (param $steps i32) (param $grow i32)
    (local $t i32) (local $i i32) (local $a i32) (local $b i32) (local $tmp i32) (local $m i32)
    (local.set $b (i32.const 32768))
    (block $done
      (br_if $done (i32.le_s (local.get $steps) (i32.const 0)))
      (loop $time
        (local.set $m (i32.add (local.get $n) (i32.mul (local.get $t) (local.get $grow))))
        (local.set $i (i32.const 0))
        (block $skip
          (br_if $skip (i32.le_s (local.get $m) (i32.const 0)))
          (loop $sweep
            (i32.store (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))
              (i32.add (i32.mul (i32.load (i32.add (local.get $a) (i32.shl (local.get $i) (i32.const 2))))
                                (i32.const 3))
                       (i32.add (local.get $t) (local.get $i))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $sweep (i32.lt_s (local.get $i) (local.get $m)))))
        BODY
        (local.set $tmp (local.get $a)) (local.set $a (local.get $b)) (local.set $b (local.get $tmp))
        (local.set $t (i32.add (local.get $t) (i32.const 1)))
        EXIT
        (br_if $time (i32.lt_s (local.get $t) (local.get $steps)))))))"""


def time_loop(body: str = "", exit: str = "") -> bytes:
    return wat(TIME_LOOP.replace("BODY", body).replace("EXIT", exit))


def regions_of(wasm: bytes) -> list:
    return OffloadModule(wasm, device="cpu").regions


def test_a_time_loop_around_a_parallel_sweep_is_a_region() -> None:
    offload = OffloadModule(time_loop(), device="cpu")
    (region,) = offload.regions
    assert region.children == (0,)
    assert offload.loops[0].region == 0
    body = load(time_loop()).codes[0].body
    assert body[region.start].op.name == "loop"
    assert region.exits == (region.end,)  # it ends only by falling off its end


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("(i32.store (i32.const 65532) (local.get $t))", "a store outside the sweep"),
        ("(drop (i32.load (i32.const 0)))", "a load outside the sweep"),
        ("(drop (memory.grow (i32.const 0)))", "memory.grow"),
        ("(local.set $tmp (i32.div_u (local.get $t) (local.get $n)))", "a division that may trap"),
        ("(if (i32.eq (local.get $t) (i32.const 99)) (then (return)))", "a return"),
    ],
)
def test_a_time_loop_that_touches_memory_or_may_stop_is_no_region(body: str, why: str) -> None:
    assert regions_of(time_loop(body)) == [], why


def test_a_division_by_a_constant_is_allowed() -> None:
    assert len(regions_of(time_loop("(local.set $tmp (i32.div_u (local.get $t) (i32.const 7)))"))) == 1


def test_a_branch_out_of_the_region_gets_the_host_call_where_it_lands() -> None:
    wasm = time_loop(exit="(br_if $done (i32.eq (local.get $t) (local.get $grow)))")
    (region,) = regions_of(wasm)
    body = load(wasm).codes[0].body
    done_end = next(i for i, ins in enumerate(body) if ins.op.name == "block" and ins.match > region.end)
    assert region.exits == (region.end, body[done_end].match)


def test_find_regions_leaves_out_loops_with_gathers() -> None:
    module = load(time_loop())
    sweep = next(i for i, ins in enumerate(module.codes[0].body) if ins.op.name == "loop" and i > 10)
    span = (module.num_imported_funcs, sweep, module.codes[0].body[sweep].match)
    assert len(find_regions(module, [(*span, False)])) == 1
    assert find_regions(module, [(*span, True)]) == []


def _compare(wasm: bytes, device: str, args: list[int]) -> OffloadInstance:
    expected_instance = ReferenceInstance(wasm)
    expected = expected_instance.call("run", [(I32, a) for a in args])
    actual = OffloadInstance(wasm, device=SimulatedDevice() if device == "simulated" else device)
    assert actual.call("run", [(I32, a) for a in args]) == expected
    assert actual.memory() == expected_instance.memory("memory"), "linear memory differs from wasmtime's"
    wasmtime.Module.validate(wasmtime.Engine(), actual.offload.rewritten)
    return actual


# "simulated": the GPU path's data movement on a device simulated in host memory.
DEVICES = ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("exit", ["", "(br_if $done (i32.eq (local.get $t) (i32.const 5)))"])
def test_a_region_leaves_memory_as_wasmtime_does(device: str, exit: str) -> None:
    actual = _compare(time_loop(exit=exit), device, [1000, 12, 0])
    (loop,) = actual.offload.loops
    assert loop.stats.offloaded == (5 if exit else 12)  # the exit test follows t += 1
    (region,) = actual.offload.region_stats
    assert region.exits >= 1
    if device != "cpu":  # each array crosses once each way, not once a step
        assert loop.stats.bytes_in == 2 * 4000
        assert loop.stats.bytes_out == 0
        assert region.bytes_out == 2 * 4000


@pytest.mark.parametrize("device", DEVICES)
def test_a_trap_in_a_region_leaves_memory_as_wasmtime_does(device: str) -> None:
    # Steps 0..7 offload (on the GPU their results stay there); step 8 reaches past memory:
    # the guard declines, the results come back, and wasmtime's loop traps part way.
    actual = _compare(time_loop(), device, [1000, 12, 1000])
    (loop,) = actual.offload.loops
    assert loop.stats.offloaded == 8
    assert any("bounds" in reason or "memory" in reason for reason in loop.stats.declined)


READING_REGION = """(module (memory (export "memory") 1)
  (func (export "run") (param $n i32) (result i32)
    (local $s i32) (local $i i32) (local $acc i32) (local $t i32)
    (loop $time
      (local.set $i (i32.const 0))
      (local.set $acc (i32.const 0))
      (loop $l
        (local.set $acc (i32.add (local.get $acc) (i32.load (i32.shl (local.get $i) (i32.const 2)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
      (local.set $t (i32.add (i32.mul (local.get $t) (i32.const 3)) (local.get $acc)))
      (local.set $s (i32.add (local.get $s) (i32.const 1)))
      (br_if $time (i32.lt_u (local.get $s) (i32.const 3))))
    (local.get $t)))"""


@pytest.mark.parametrize("device", DEVICES[1:])
def test_a_region_that_only_reads_sees_memory_written_between_its_calls(device: str) -> None:
    """A region whose loop only reduces writes nothing back, yet what the device held must go
    when it ends: the next call's data is new (the device once kept reading the first)."""
    import struct

    from tests.offload_cases import instantiate

    wasm = wat(READING_REGION)
    offload = OffloadModule(
        wasm, device=SimulatedDevice() if device == "simulated" else "gpu", pin=True, mode="always"
    )
    assert [lp.region for lp in offload.loops] == [0]
    runs = [instantiate(offload.rewritten, offload), instantiate(wasm)]
    try:
        for k in range(3):
            results = []
            for store, instance in runs:
                exports = instance.exports(store)
                exports["memory"].write(store, struct.pack("<256i", *([k + 1] * 256)), 0)
                results.append(exports["run"](store, 256))
            assert results[0] == results[1], k
        assert offload.loops[0].stats.offloaded == 9
    finally:
        offload.close()


def test_the_mirror_copies_in_only_what_the_device_lacks_and_flushes_what_it_wrote() -> None:
    mirror = DeviceMirror(HostContext(), allocator=HostAllocator())
    host = ctypes.create_string_buffer(bytes(range(256)) * 16)
    base = ctypes.addressof(host)
    mirror.ensure(4096, 8)

    def copy_in_missing(spans: tuple[Span, ...]) -> int:
        missing = mirror.missing(spans)
        moved = mirror.copy_in(base, missing)
        mirror.now_valid(spans, missing)
        return moved

    assert copy_in_missing((Span(0, 1024),)) == 1024
    assert copy_in_missing((Span(512, 2048),)) == 1024  # only [1024, 2048)
    assert ctypes.string_at(mirror.memory.ptr, 2048) == host.raw[:2048]
    assert mirror.missing_bytes([Span(0, 2048)]) == 0
    assert copy_in_missing((Span(512, 2048),)) == 0  # the same spans again: nothing to test
    ctypes.memmove(mirror.memory.ptr + 2048, b"\xff" * 64, 64)  # a launch writes [2048, 2112)
    mirror.keep([Span(2048, 2112)])
    assert mirror.holds_results and mirror.missing_bytes([Span(2048, 2112)]) == 0
    assert mirror.flush(base) == 64
    assert host.raw[2048:2112] == b"\xff" * 64 and host.raw[2112] == 2112 % 256
    assert not mirror.holds_results and mirror.valid.ranges() == []
    assert mirror.missing((Span(0, 1024),)) == (Span(0, 1024),)


def test_launches_not_waited_for_each_read_their_own_arguments_past_the_ring_s_end() -> None:
    """More launches queued without a wait than the ring has slots, their arguments
    alternating: on a device whose queue runs only at the wait, each kernel still reads the
    arguments it was queued with (the ring waits before it reuses a slot)."""
    mirror = DeviceMirror(HostContext(lazy=True), allocator=HostAllocator())
    host = ctypes.create_string_buffer(4096)
    mirror.ensure(4096, 8)
    seen = []

    class Kernel:
        def run(self, values) -> None:
            seen.append(ctypes.string_at(mirror.scratch_ptr, 16))

    images = [bytes([k % 3]) * 16 for k in range(2 * DeviceMirror.RING_SLOTS + 5)]
    uploads = [mirror.launch_unwaited(ctypes.addressof(host), (), image, Kernel(), (1,), (1,), KernelParams([]))
               for image in images]  # fmt: skip
    assert mirror.queued and len(seen) < len(images)  # (the queue runs at the waits)
    mirror.drain()
    assert seen == images and not mirror.queued
    assert all(uploads)  # (each differs from the one before)
    assert (
        mirror.launch_unwaited(ctypes.addressof(host), (), images[-1], Kernel(), (1,), (1,), KernelParams([]))
        == 0
    )


def test_a_partial_flush_brings_back_only_what_the_loop_touches_and_forgets_what_it_writes() -> None:
    mirror = DeviceMirror(HostContext(), allocator=HostAllocator())
    host = ctypes.create_string_buffer(bytes(range(256)) * 16)
    base = ctypes.addressof(host)
    mirror.ensure(4096, 8)
    mirror.now_valid((Span(0, 4096),), (Span(0, 4096),))  # (as if copied in)
    ctypes.memmove(mirror.memory.ptr + 2048, b"\xaa" * 64, 64)  # launches wrote [2048, 2112) ...
    ctypes.memmove(mirror.memory.ptr + 3000, b"\xbb" * 100, 100)  # ... and [3000, 3100)
    mirror.keep([Span(2048, 2112), Span(3000, 3100)])
    # wasmtime's loop reads [2100, 2200) and writes [2150, 2200): the 12 dirty bytes it
    # reads come back, nothing else; what it writes is no longer the device's.
    assert mirror.flush_part(base, [Span(2100, 2200)], [Span(2150, 2200)]) == 12
    assert host.raw[2100:2112] == b"\xaa" * 12
    assert host.raw[2048:2100] == (bytes(range(256)) * 16)[2048:2100]  # not brought back
    assert host.raw[3000:3100] != b"\xbb" * 100  # still only on the device
    assert mirror.holds_results and mirror.dirty.ranges() == [(2048, 2100), (3000, 3100)]
    assert mirror.valid.ranges() == [(0, 2150), (2200, 4096)]
    assert mirror.missing((Span(2048, 2300),)) == (Span(2150, 2200),)
    assert mirror.flush(base) == 52 + 100  # the region's end: the rest comes back
    assert host.raw[2048:2112] == b"\xaa" * 64 and host.raw[3000:3100] == b"\xbb" * 100


def test_a_partial_flush_keeps_what_it_knows_of_the_launches_it_does_not_touch() -> None:
    """After a partial flush, a launch whose spans meet nothing wasmtime's loop touches
    is still known to find the device holding them (no span arithmetic at its next
    arrival); one whose spans meet what the loop writes copies that part in again."""
    mirror = DeviceMirror(HostContext(), allocator=HostAllocator())
    host = ctypes.create_string_buffer(4096)
    base = ctypes.addressof(host)
    mirror.ensure(4096, 8)
    apart, meeting = (Span(0, 1024),), (Span(1024, 2048),)
    for spans in (apart, meeting):
        mirror.now_valid(spans, mirror.missing(spans))
        mirror.keep(spans)
    assert mirror.flush_part(base, [Span(1500, 1600)], [Span(1500, 1600)]) == 100
    assert apart in mirror._inside_valid and apart in mirror._inside_dirty
    assert meeting not in mirror._inside_valid and meeting not in mirror._inside_dirty
    assert mirror.missing(apart) == () and mirror.missing(meeting) == (Span(1500, 1600),)
    assert mirror.dirty.ranges() == [(0, 1500), (1600, 2048)]


# After the sweep, a loop of four iterations reads and writes b[0:4): in auto mode it stays on
# wasmtime while the sweep launches, inside the same region.
TOUCH_UP = """(local.set $i (i32.const 0))
        (loop $fix
          (i32.store (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))
            (i32.add (i32.load (i32.add (local.get $b) (i32.shl (local.get $i) (i32.const 2)))) (local.get $t)))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $fix (i32.lt_s (local.get $i) (i32.const 4))))"""


def _touch_up_instance(wasm: bytes, device: str, monkeypatch, touch_up_declines: bool = True):
    """The time loop with a touch-up loop after its sweep, in auto mode with the device
    started: the sweep always launches; the touch-up declines as too little work, or (not
    ``touch_up_declines``) decides by the cost model. Returns (instance, sweep, touch-up)."""
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    actual = OffloadInstance(wasm, device=SimulatedDevice() if device == "simulated" else device, mode="auto")
    sweep, touch_up = actual.offload.loops
    assert sweep.region == touch_up.region == 0
    monkeypatch.setattr(actual.offload.planner, "_started", lambda gain, lp=None: None)
    monkeypatch.setattr(sweep.estimate, "decide", lambda *a, **k: (True, "", 1e-6, 1e-3))
    if touch_up_declines:
        monkeypatch.setattr(
            touch_up.estimate, "decide", lambda *a, **k: (False, "too little work", 1e-3, 1e-6)
        )
    return actual, sweep, touch_up


@pytest.mark.parametrize("device", DEVICES[1:])
def test_a_loop_wasmtime_runs_inside_a_region_brings_back_only_what_it_touches(
    device: str, monkeypatch
) -> None:
    """PolyBench's fdtd-2d sets a row of ``ey`` on wasmtime each step between three launches:
    the region's results stay on the device but for what that loop reads and writes (each
    step brought back every array, and the next launches copied them in again)."""
    wasm = time_loop(body=TOUCH_UP)
    actual, sweep, touch_up = _touch_up_instance(wasm, device, monkeypatch)
    expected_instance = ReferenceInstance(wasm)
    args = [(I32, 1000), (I32, 12), (I32, 0)]
    assert actual.call("run", args) == expected_instance.call("run", args)
    assert actual.memory() == expected_instance.memory("memory"), "linear memory differs from wasmtime's"
    assert sweep.stats.offloaded == 12 and touch_up.stats.offloaded == 0
    assert touch_up.stats.arrivals == 12  # (its gate stays open while the device holds results)
    (region,) = actual.offload.region_stats
    # Each step brings back the 16 bytes wasmtime's loop touches, the region's end the rest;
    # each launch copies in the 16 bytes wasmtime wrote (the first: both arrays).
    assert region.bytes_out <= 12 * 16 + 2 * 4000
    assert sweep.stats.bytes_in <= 2 * 4000 + 11 * 16
    actual.close()


@pytest.mark.parametrize("device", DEVICES[1:])
def test_a_loop_wasmtime_runs_after_a_launch_not_waited_for_leaves_its_input_alone(
    device: str, monkeypatch
) -> None:
    """The sweep's launches inside the region are queued without a wait; the loop after it,
    on wasmtime, writes a[0:4), which the sweep's queued copy reads and no launch wrote (at
    the first step nothing comes back for it). The host waits for the queue before wasmtime
    runs that loop: on the simulated device, whose queue runs only at a wait, the sweep
    would otherwise read a[0:4) as wasmtime left it afterwards."""
    wasm = time_loop(body=TOUCH_UP.replace("$b", "$a").replace("(local.get $t)))", "(i32.const 7)))"))
    actual, sweep, touch_up = _touch_up_instance(wasm, device, monkeypatch)
    unwaited = []
    queue = DeviceMirror.launch_unwaited
    monkeypatch.setattr(
        DeviceMirror, "launch_unwaited", lambda self, *a: unwaited.append(1) or queue(self, *a)
    )
    expected_instance = ReferenceInstance(wasm)
    args = [(I32, 1000), (I32, 6), (I32, 0)]
    assert actual.call("run", args) == expected_instance.call("run", args)
    assert actual.memory() == expected_instance.memory("memory"), "linear memory differs from wasmtime's"
    assert sweep.stats.offloaded == 6 and touch_up.stats.offloaded == 0 and len(unwaited) == 6
    actual.close()


@pytest.mark.parametrize("device", DEVICES[1:])
def test_a_small_loop_inside_a_region_launches_where_declining_would_bring_results_back(
    device: str, monkeypatch
) -> None:
    """The touch-up loop (four iterations, far less work than a launch's fixed cost) arrives
    while the sweep's launch is queued and its results are on the device: running it on
    wasmtime would wait for the device and copy its bytes both ways, so the cost model
    counts that in and it launches too (PolyBench's fdtd-2d: one row of ``ey`` set at each of
    500 steps). Nothing comes back until the region ends."""
    wasm = time_loop(body=TOUCH_UP)
    actual, sweep, touch_up = _touch_up_instance(wasm, device, monkeypatch, touch_up_declines=False)
    expected_instance = ReferenceInstance(wasm)
    args = [(I32, 1000), (I32, 12), (I32, 0)]
    assert actual.call("run", args) == expected_instance.call("run", args)
    assert actual.memory() == expected_instance.memory("memory"), "linear memory differs from wasmtime's"
    assert sweep.stats.offloaded == 12 and touch_up.stats.offloaded == 12
    (region,) = actual.offload.region_stats
    assert region.bytes_out <= 2 * 4000  # (the region's end alone)
    assert sweep.stats.bytes_in <= 2 * 4000  # (the first launch's; nothing was written in Wasm)
    actual.close()


def test_a_region_s_decline_costs_nothing_extra_where_the_device_holds_nothing(monkeypatch) -> None:
    """Outside a region, or before the region's first launch, wasmtime's run of a loop
    costs only its own time: the cost model adds nothing, and the small loop declines."""
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    actual = OffloadInstance(time_loop(body=TOUCH_UP), device=SimulatedDevice(), mode="auto")
    _, touch_up = actual.offload.loops
    launches = actual.offload.launches
    assert launches.mirror is None
    ready = actual.offload.planner.guards(touch_up, (0, 4096), 65536)
    assert not isinstance(ready, str)
    assert launches.decline_seconds(touch_up, ready) == 0.0
    go, why, model, cpu = touch_up.estimate.decide("gpu", ready.ops, 0, True, ready.cells)
    assert not go and "too little work" in why
    declining = profit.region_decline_seconds(32)
    go, _, model2, cpu2 = touch_up.estimate.decide(
        "gpu", ready.ops, 0, True, ready.cells, declining=declining
    )
    assert go and cpu2 == pytest.approx(cpu + declining) and model2 == model
    actual.close()


def test_span_arithmetic() -> None:
    assert union([(0, 4), (8, 10)], [(4, 6), (20, 30)]) == [(0, 6), (8, 10), (20, 30)]
    held = SpanSet([(10, 20), (30, 40), (90, 120)])
    assert held.outside([(0, 100)]) == [(0, 10), (20, 30), (40, 90)]
    assert held.inside([(0, 100)]) == [(10, 20), (30, 40), (90, 100)]
    assert SpanSet([(5, 20)]).outside([(0, 10), (15, 25)]) == [(0, 5), (20, 25)]
    assert SpanSet([(0, 10)]).outside([(5, 8)]) == []
    held.add([(20, 30)])  # touching ranges merge
    assert held.ranges() == [(10, 40), (90, 120)]
    held.remove([(15, 16), (40, 95)])
    assert held.ranges() == [(10, 15), (16, 40), (95, 120)]


def test_a_span_set_agrees_with_the_bytes_it_stands_for() -> None:
    """Random adds and removes of ranges, each checked against the set of bytes covered."""
    rng = random.Random(20261127)
    for _ in range(200):
        held, covered = SpanSet(), set()
        for _ in range(40):
            ranges = []
            for _ in range(rng.randint(1, 4)):
                lo = rng.randrange(0, 200)
                ranges.append((lo, lo + rng.randrange(0, 30)))
            query = [(lo, lo + rng.randrange(1, 60)) for lo in (rng.randrange(0, 220) for _ in range(3))]
            wanted = set().union(*(range(lo, hi) for lo, hi in query))
            assert _bytes(held.outside(query)) == wanted - covered
            assert _bytes(held.inside(query)) == wanted & covered
            if rng.random() < 0.6:
                held.add(ranges)
                covered |= set().union(*(range(lo, hi) for lo, hi in ranges))
            else:
                held.remove(ranges)
                covered -= set().union(*(range(lo, hi) for lo, hi in ranges))
            listed = held.ranges()
            assert _bytes(listed) == covered
            # sorted, disjoint, none empty, none touching the next (touching ranges merge)
            assert all(lo < hi for lo, hi in listed)
            assert all(a[1] < b[0] for a, b in itertools.pairwise(listed))


def _bytes(ranges) -> set[int]:
    return set().union(*(range(lo, hi) for lo, hi in ranges))


# A time loop around a row loop whose body loads a value before its own parallel inner loop;
# with b one row past a, the row loop's guards decline and each inner loop launches alone,
# between wasmtime's loads: the inner loop must not keep its results on the device.
NESTED_IN_REGION = """(module (memory (export "memory") 2)
  (func (export "run") (param $a i32) (param $b i32) (param $m i32) (param $n i32) (param $steps i32)
    (local $i i32) (local $j i32) (local $k i32) (local $x i32) (local $t i32) (local $tmp i32)
    (block $done
      (br_if $done (i32.le_s (local.get $m) (i32.const 0)))
      (br_if $done (i32.le_s (local.get $n) (i32.const 0)))
      (br_if $done (i32.le_s (local.get $steps) (i32.const 0)))
      (loop $time
        (local.set $i (i32.const 0))
        (loop $rows
          (local.set $j (i32.const 0))
          (local.set $x (i32.load (i32.add (local.get $a)
            (i32.shl (i32.add (i32.mul (local.get $i) (local.get $n)) (i32.const 1)) (i32.const 2)))))
          (loop $cols
            (local.set $k (i32.shl (i32.add (i32.mul (local.get $i) (local.get $n)) (local.get $j)) (i32.const 2)))
            (i32.store (i32.add (local.get $b) (local.get $k))
              (i32.add (i32.add (i32.load (i32.add (local.get $a) (local.get $k))) (local.get $x)) (i32.const 1)))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br_if $cols (i32.lt_s (local.get $j) (local.get $n))))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $rows (i32.lt_s (local.get $i) (local.get $m))))
        (local.set $tmp (local.get $a)) (local.set $a (local.get $b)) (local.set $b (local.get $tmp))
        (local.set $t (i32.add (local.get $t) (i32.const 1)))
        (br_if $time (i32.lt_s (local.get $t) (local.get $steps)))))))"""


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("apart", [True, False])
def test_loops_inside_a_region_child_are_not_region_children(device: str, apart: bool) -> None:
    m, n = 6, 300
    b = 8192 + (4 * m * n + 64 if apart else 4 * n)
    actual = _compare(wat(NESTED_IN_REGION), device, [8192, b, m, n, 3])
    rows, cols = sorted(actual.offload.loops, key=lambda lp: lp.stats.offset)
    (region,) = actual.offload.regions
    assert region.children == (actual.offload.loops.index(rows),)
    assert rows.region == 0 and cols.region is None
    if apart:  # the row nest launches whole, each step
        assert rows.stats.offloaded == 3 and cols.stats.arrivals == 0
    else:  # it declines; each row's inner loop launches on its own
        assert rows.stats.offloaded == 0 and cols.stats.offloaded == 3 * m
