"""A loop of SIMD128 code offloaded like scalar code: v128 loads, lane arithmetic (float NaN
rules, swizzle) and stores, one thread per iteration, memory equal to wasmtime's."""

from __future__ import annotations

import pytest
import wasmtime

from tensorwasm.runtime.api import instantiate, report
from tests.conftest import wat

N = 5000
# out[i] = swizzle(b[i], mask) and a[i] = a[i] * 1.5 + a[i], for i < n; the arrays do not
# overlap (a at 0, b at 80000, out at 160000), so the loop is parallel. The module's v128
# global must survive the rewrite around the loop.
LOOP = wat("""(module (memory (export "memory") 4)
  (global $kept (mut v128) (v128.const i64x2 1 2))
  (func (export "kept") (result i32) (i32x4.extract_lane 2 (global.get $kept)))
  (func (export "fill") (local $i i32)
    (loop $l
      (i32.store (i32.shl (local.get $i) (i32.const 2))
        (i32.mul (local.get $i) (i32.const 0x9E3779B1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 60000)))))
  (func (export "run") (param $n i32) (local $i i32) (local $p i32)
    (loop $l
      (local.set $p (i32.shl (local.get $i) (i32.const 4)))
      (v128.store (local.get $p)
        (f32x4.add (f32x4.mul (v128.load (local.get $p)) (f32x4.splat (f32.const 1.5)))
                   (v128.load (local.get $p))))
      (v128.store offset=160000 (local.get $p)
        (i8x16.swizzle (v128.load offset=80000 (local.get $p))
                       (v128.const i8x16 3 2 1 0 7 6 5 4 11 10 9 8 15 14 13 99)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))""")


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_simd_loop_is_offloaded_with_wasmtime_bits(device: str) -> None:
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    reference = wasmtime.Instance(store, wasmtime.Module(engine, LOOP), [])
    instance = instantiate(store, LOOP, [], device=device, offload="always")
    for inst in (reference, instance):
        inst.exports(store)["fill"](store)
        inst.exports(store)["run"](store, N)
    want = bytes(reference.exports(store)["memory"].read(store, 0, 4 * 65536))
    got = bytes(instance.exports(store)["memory"].read(store, 0, 4 * 65536))
    assert got == want, f"first differing byte {next(i for i in range(len(want)) if want[i] != got[i])}"
    assert instance.exports(store)["kept"](store) == 2
    (loop,) = [r for r in report(instance).loops if r.func == "run"]
    assert loop.offloaded == 1 and loop.iterations == N, loop


# A splat made before the loop is a v128 live-in: it crosses into the kernel as two i64
# halves; the module's v128 global, read before the loop and set after it, must survive the
# rewrite around the loop.
LIVE_IN = wat("""(module (memory (export "memory") 4)
  (global $g (mut v128) (v128.const i32x4 7 7 7 7))
  (func (export "run") (param $n i32) (local $i i32) (local $k v128)
    (local.set $k (i32x4.add (global.get $g) (i32x4.splat (local.get $n))))
    (loop $l
      (v128.store (i32.shl (local.get $i) (i32.const 4))
        (i32x4.mul (v128.load offset=80000 (i32.shl (local.get $i) (i32.const 4))) (local.get $k)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (global.set $g (local.get $k))))""")


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_v128_live_in_crosses_into_the_kernel(device: str) -> None:
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    reference = wasmtime.Instance(store, wasmtime.Module(engine, LIVE_IN), [])
    instance = instantiate(store, LIVE_IN, [], device=device, offload="always")
    for inst in (reference, instance):
        for n in (3000, 17):
            inst.exports(store)["run"](store, n)
    memories = [bytes(i.exports(store)["memory"].read(store, 0, 4 * 65536)) for i in (reference, instance)]
    assert memories[0] == memories[1]
    (loop,) = report(instance).loops
    assert loop.verdict == "offload" and loop.offloaded == 2, loop
