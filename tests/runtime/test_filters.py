"""The Wasm-side filter before a loop's host call: in auto mode an arrival whose counter has
too little to go never reaches the host (it would decline it), is counted, and runs on
wasmtime exactly as before; always mode asks the host every time, offload off never."""

from __future__ import annotations

import pytest
import wasmtime

from tensorwasm.compiler.rewrite import NEVER_SKIP
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import ArrivalPlanner
from tests.conftest import wat
from tests.offload_cases import instantiate, module_bytes

# Loops of the four counter shapes the filter reads: up to an exclusive signed bound, up
# to an inclusive unsigned one, down to a signed bound, and a rotated loop tested with ne
# (a module without globals of its own, and one whose globals come first, imported too).
SHAPES = """(module
  (import "env" "g0" (global $g0 i32))
  (global $g1 (mut i32) (i32.const 7))
  (memory (export "memory") 1)
  (func (export "up_lt") (param $lo i32) (param $hi i32) (local $i i32)
    (local.set $i (local.get $lo))
    (block $out (loop $l
      (br_if $out (i32.ge_s (local.get $i) (local.get $hi)))
      (i32.store (i32.shl (local.get $i) (i32.const 2)) (local.get $i))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l))))
  (func (export "up_le") (param $hi i32) (local $i i32)
    (block $out (loop $l
      (br_if $out (i32.gt_u (local.get $i) (local.get $hi)))
      (i32.store offset=4096 (i32.shl (local.get $i) (i32.const 2)) (i32.const 9))
      (local.set $i (i32.add (local.get $i) (i32.const 2)))
      (br $l))))
  (func (export "down_gt") (param $top i32) (local $i i32)
    (local.set $i (local.get $top))
    (block $out (loop $l
      (br_if $out (i32.le_s (local.get $i) (i32.const 3)))
      (i32.store offset=8192 (i32.shl (local.get $i) (i32.const 2)) (local.get $i))
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (br $l))))
  (func (export "rotated_ne") (param $n i32) (local $i i32)
    (block $out
      (br_if $out (i32.eqz (local.get $n)))
      (loop $l
        (i32.store offset=16384 (i32.shl (local.get $i) (i32.const 2)) (i32.add (local.get $i) (global.get $g1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.ne (local.get $i) (local.get $n)))))))"""

# (export, arguments, the counter's distance to go as the filter computes it)
CALLS = [
    ("up_lt", [3, 10], 7), ("up_lt", [10, 3], -7), ("up_lt", [0, 2], 2),
    ("up_le", [10], 11), ("up_le", [0], 1),
    ("down_gt", [20], 17), ("down_gt", [1], -2),
    ("rotated_ne", [12], 11), ("rotated_ne", [1], 0),  # tested after its body: from 1
]  # fmt: skip


def _instance(wasm: bytes, offload: OffloadModule | None):
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    g0 = wasmtime.Global(store, wasmtime.GlobalType(wasmtime.ValType.i32(), False), wasmtime.Val.i32(5))
    linker.define(store, "env", "g0", g0)
    if offload is not None:
        offload.define(linker, store)
    module = wasmtime.Module(engine, offload.rewritten if offload is not None else wasm)
    return store, linker.instantiate(store, module)


def _arrivals(monkeypatch) -> list:
    seen = []
    real = ArrivalPlanner.arrive

    def counting(self, lp, *rest):
        seen.append(lp.stats.func)
        return real(self, lp, *rest)

    monkeypatch.setattr(ArrivalPlanner, "arrive", counting)
    return seen


def test_every_counter_shape_gets_a_filter_and_the_rewritten_module_exports_its_globals() -> None:
    offload = OffloadModule(wat(SHAPES), device="cpu")
    assert {lp.stats.func for lp in offload.loops if lp.insertion.filter is not None} == {
        "up_lt", "up_le", "down_gt", "rotated_ne",
    }  # fmt: skip
    store, instance = _instance(wat(SHAPES), offload)
    exports = instance.exports(store)
    for n in range(len(offload.loops)):
        assert exports[f"tensorwasm:min_{n}"].value(store) == NEVER_SKIP  # unbound: always ask
        assert exports[f"tensorwasm:skipped_{n}"].value(store) == 0


@pytest.mark.parametrize(("export", "args", "distance"), CALLS)
def test_the_host_is_asked_exactly_from_the_threshold_on(export, args, distance, monkeypatch) -> None:
    wasm = wat(SHAPES)
    store, plain = _instance(wasm, None)
    plain.exports(store)[export](store, *args)
    expected = plain.exports(store)["memory"].read(store, 0, 1 << 16)
    for threshold, asked in ((distance, True), (distance + 1, False)):
        seen = _arrivals(monkeypatch)
        offload = OffloadModule(wasm, device="cpu", mode="always")
        store, instance = _instance(wasm, offload)
        offload.bind(store, instance.exports(store), [threshold] * len(offload.loops))
        instance.exports(store)[export](store, *args)
        assert instance.exports(store)["memory"].read(store, 0, 1 << 16) == expected
        assert seen == ([export] if asked else [])
        offload.collect_skipped()
        loop = next(lp for lp in offload.loops if lp.stats.func == export)
        assert loop.stats.arrivals == 1
        assert loop.stats.offloaded == (1 if asked and distance > 0 else loop.stats.offloaded)
        if not asked:
            assert loop.stats.declined == {"too little work to pay for a launch": 1}


def test_auto_mode_keeps_small_arrivals_from_the_host_and_counts_them(monkeypatch) -> None:
    import tensorwasm

    seen = _arrivals(monkeypatch)
    wasm = module_bytes("blas1", "O2")
    store = wasmtime.Store()
    instance = tensorwasm.instantiate(store, wasm, device="cpu")
    exports = instance.exports(store)
    base = exports["scratch_base"](store)
    for _ in range(5):
        exports["saxpy"](store, 8, 1.5, base, base + 4096)
    exports["saxpy"](store, 1 << 16, 1.5, base, base + (1 << 18))
    assert seen == ["saxpy"]  # only the large call asked the host
    (record,) = [r for r in tensorwasm.report(instance).loops if r.func == "saxpy" and r.arrivals]
    assert record.arrivals == 6
    assert record.declined.get("too little work to pay for a launch", 0) >= 5


@pytest.mark.parametrize(("mode", "asked"), [("always", 3), ("off", 0)])
def test_always_asks_the_host_every_time_and_off_never(mode: str, asked: int, monkeypatch) -> None:
    seen = _arrivals(monkeypatch)
    wasm = module_bytes("blas1", "O2")
    offload = OffloadModule(wasm, device="cpu", mode=mode)
    store, instance = instantiate(offload.rewritten, offload)
    exports = instance.exports(store)
    offload.bind(store, exports)
    base = exports["scratch_base"](store)
    for _ in range(3):
        exports["saxpy"](store, 8, 1.5, base, base + 4096)
    assert len(seen) == asked
    offload.close()  # counts what the filters kept from the host
    loop = next(lp for lp in offload.loops if lp.stats.func == "saxpy")
    assert loop.stats.arrivals == 3
    if mode == "off":
        assert loop.stats.declined == {"offload is off": 3}


def test_a_region_s_loops_have_filters_too() -> None:
    """Held open while the device holds any of the region (tests.runtime.test_gates)."""
    from tests.runtime.test_regions import time_loop

    offload = OffloadModule(time_loop(), device="cpu")
    inside = [lp for lp in offload.loops if lp.region is not None]
    assert inside and all(lp.insertion.filter is not None for lp in inside)
