"""Vectorised loops offloaded like scalar ones: a v128 accumulator combined by a lane-wise
integer operation runs as one reduction per lane and is folded back into the vector, a
v128 live-in (a local or a global) crosses as two halves, and the results equal wasmtime's
byte for byte, whether the loop runs as a kernel or declines. A float vector accumulator
keeps its loop on the CPU, by name."""

from __future__ import annotations

import random

import pytest
import wasmtime

from tensorwasm.runtime.api import instantiate, report
from tests.conftest import wat

# Every lane-wise operation the analysis takes as a vector reduction.
OPERATIONS = [
    "i8x16.add", "i16x8.add", "i32x4.add", "i64x2.add", "i16x8.mul", "i32x4.mul", "i64x2.mul",
    "v128.and", "v128.or", "v128.xor", "i8x16.min_s", "i8x16.min_u", "i8x16.max_s", "i8x16.max_u",
    "i16x8.min_s", "i16x8.max_u", "i32x4.min_u", "i32x4.max_s",
]  # fmt: skip


def reduction_module(operation: str) -> bytes:
    """``run(p, n, seed)``: acc = splat(seed); for n vectors at p: acc = OP(acc, v ^ k ^ g)
    with k a splat made before the loop and g a v128 global; acc stored at 0."""
    return wat(f"""(module (memory (export "memory") 2)
  (global $g (mut v128) (v128.const i32x4 0x01020304 0x05060708 0x090a0b0c 0x0d0e0f10))
  (func (export "run") (param $p i32) (param $n i32) (param $seed i32) (local $acc v128) (local $k v128)
    (local.set $acc (i32x4.splat (local.get $seed)))
    (local.set $k (i8x16.splat (local.get $n)))
    (block $done
      (br_if $done (i32.eqz (local.get $n)))
      (loop $top
        (local.set $acc ({operation} (local.get $acc)
          (v128.xor (v128.xor (v128.load (local.get $p)) (local.get $k)) (global.get $g))))
        (local.set $p (i32.add (local.get $p) (i32.const 16)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br_if $top (local.get $n))))
    (v128.store (i32.const 0) (local.get $acc))))""")


def _memory(instance, store) -> bytes:
    return bytes(instance.exports(store)["memory"].read(store, 0, 2 * 65536))


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_vector_reduction_runs_lane_by_lane_with_wasmtime_bits(operation: str, device: str) -> None:
    wasm = reduction_module(operation)
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    reference = wasmtime.Instance(store, wasmtime.Module(engine, wasm), [])
    instance = instantiate(store, wasm, [], device=device, offload="always")
    rng = random.Random(operation)
    data = bytes(rng.randrange(256) for _ in range(16 * 600))
    for n in (0, 1, 7, 600):
        seed = rng.randrange(-(2**31), 2**31)
        for inst in (reference, instance):
            inst.exports(store)["memory"].write(store, data, 16)
            inst.exports(store)["run"](store, 16, n, seed)
        assert _memory(instance, store) == _memory(reference, store), (operation, n)
    (loop,) = report(instance).loops
    assert loop.verdict == "offload" and operation in loop.reason, loop
    assert loop.offloaded == 3 and loop.iterations == 608, loop  # n = 0 never reaches the loop


def test_a_declined_vector_reduction_leaves_the_accumulator_to_the_loop() -> None:
    wasm = reduction_module("i16x8.min_s")
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    reference = wasmtime.Instance(store, wasmtime.Module(engine, wasm), [])
    instance = instantiate(store, wasm, [], device="cpu", offload="always")
    # Vectors running past the end of memory: the guards decline, wasmtime runs the loop
    # (and traps); the accumulator folded with the lanes' identities is unchanged.
    for inst in (reference, instance):
        inst.exports(store)["run"](store, 16, 40, -5)
        with pytest.raises(wasmtime.Trap):
            inst.exports(store)["run"](store, 2 * 65536 - 32, 4, 3)
    assert _memory(instance, store) == _memory(reference, store)
    (loop,) = report(instance).loops
    assert loop.offloaded == 1 and loop.arrivals == 2, loop


FLOAT = wat("""(module (memory (export "memory") 1)
  (func (export "run") (param $p i32) (param $n i32) (local $acc v128)
    (loop $top
      (local.set $acc (f32x4.add (local.get $acc) (v128.load (local.get $p))))
      (local.set $p (i32.add (local.get $p) (i32.const 16)))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $top (local.get $n)))
    (v128.store (i32.const 0) (local.get $acc))))""")


def test_a_float_vector_reduction_stays_on_the_cpu_by_name() -> None:
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    instance = instantiate(store, FLOAT, [], device="cpu", offload="always", relaxed_float=True)
    instance.exports(store)["run"](store, 16, 8)
    (loop,) = report(instance).loops
    assert loop.verdict == "reject" and "float vector reduction (f32x4.add" in loop.reason, loop


def induction_module(shape: str, step_first: bool) -> bytes:
    """``run(p, n, seed, stride)``: v = splat(seed) + <lane numbers>, s = splat(stride); for
    n vectors at p: store (load ^ v), v = SHAPE.add(v, s) (or add(s, v)). clang's vector of
    ``<i, i+1, i+2, i+3>`` stepped by a splat, in every integer lane shape."""
    lanes = {"i8x16": 16, "i16x8": 8, "i32x4": 4, "i64x2": 2}[shape]
    numbers = " ".join(str(i * 3 + 1) for i in range(lanes))
    step = "(local.get $s) (local.get $v)" if step_first else "(local.get $v) (local.get $s)"
    widen = "(i64.extend_i32_s (local.get $seed))" if shape == "i64x2" else "(local.get $seed)"
    widen_stride = "(i64.extend_i32_s (local.get $stride))" if shape == "i64x2" else "(local.get $stride)"
    return wat(f"""(module (memory (export "memory") 2)
  (func (export "run") (param $p i32) (param $n i32) (param $seed i32) (param $stride i32)
    (local $v v128) (local $s v128)
    (local.set $v ({shape}.add ({shape}.splat {widen}) (v128.const {shape} {numbers})))
    (local.set $s ({shape}.splat {widen_stride}))
    (block $done
      (br_if $done (i32.eqz (local.get $n)))
      (loop $top
        (v128.store (local.get $p) (v128.xor (v128.load (local.get $p)) (local.get $v)))
        (local.set $v ({shape}.add {step}))
        (local.set $p (i32.add (local.get $p) (i32.const 16)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br_if $top (local.get $n))))))""")


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("shape", ["i8x16", "i16x8", "i32x4", "i64x2"])
@pytest.mark.parametrize("step_first", [False, True])
def test_a_vector_induction_variable_runs_in_the_kernel_with_wasmtime_bits(
    shape: str, step_first: bool, device: str
) -> None:
    wasm = induction_module(shape, step_first)
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    reference = wasmtime.Instance(store, wasmtime.Module(engine, wasm), [])
    instance = instantiate(store, wasm, [], device=device, offload="always")
    rng = random.Random(shape)
    data = bytes(rng.randrange(256) for _ in range(16 * 700))
    # Starts and strides near the lanes' limits: the lanes wrap within the run.
    for n, seed, stride in ((1, 5, 1), (700, 2**31 - 40, 77), (513, -129, -(2**31)), (300, 250, 65533)):
        for inst in (reference, instance):
            inst.exports(store)["memory"].write(store, data, 16)
            inst.exports(store)["run"](store, 16, n, seed, stride)
        assert _memory(instance, store) == _memory(reference, store), (shape, n, seed, stride)
    (loop,) = report(instance).loops
    assert loop.verdict == "offload", loop
    assert loop.offloaded == 4 and loop.iterations == 1514, loop


def test_a_vector_induction_variable_read_after_the_loop_keeps_it_on_the_cpu() -> None:
    wasm = wat("""(module (memory (export "memory") 1)
  (func (export "run") (param $p i32) (param $n i32) (local $v v128)
    (local.set $v (v128.const i32x4 0 1 2 3))
    (loop $top
      (v128.store (local.get $p) (local.get $v))
      (local.set $v (i32x4.add (local.get $v) (v128.const i32x4 4 4 4 4)))
      (local.set $p (i32.add (local.get $p) (i32.const 16)))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $top (local.get $n)))
    (v128.store (i32.const 0) (local.get $v))))""")
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    reference = wasmtime.Instance(store, wasmtime.Module(engine, wasm), [])
    instance = instantiate(store, wasm, [], device="cpu", offload="always")
    for inst in (reference, instance):
        inst.exports(store)["run"](store, 32, 100)
    assert bytes(instance.exports(store)["memory"].read(store, 0, 65536)) == bytes(
        reference.exports(store)["memory"].read(store, 0, 65536)
    )
    (loop,) = report(instance).loops
    assert loop.verdict == "reject" and "used after the loop" in loop.reason, loop


def vector_stencil_module(op: str, left: int, right: int) -> bytes:
    """``run(p, q, n)``: for n vectors of 16 bytes, ``q = op(p[left], p[right])`` (byte
    offsets from the vector's line) lane by lane, p and q stepping 16 bytes a vector."""
    return wat(f"""(module (memory (export "memory") 2)
  (func (export "run") (param $p i32) (param $q i32) (param $n i32)
    (block $done
      (br_if $done (i32.eqz (local.get $n)))
      (loop $top
        (v128.store (local.get $q)
          ({op} (v128.load offset={left} (local.get $p)) (v128.load offset={right} (local.get $p))))
        (local.set $p (i32.add (local.get $p) (i32.const 16)))
        (local.set $q (i32.add (local.get $q) (i32.const 16)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br_if $top (local.get $n))))))""")


def neighbour_module() -> bytes:
    """``run(p, q, n)``: for n vectors, q[i] = p[i-1] + p[i+1] lane-wise (f32x4), the loads
    4 bytes either side of a 16-byte line: clang's vectorised 1-D stencil."""
    return vector_stencil_module("f32x4.add", 12, 20)


@pytest.mark.parametrize("device", ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_vector_loads_off_their_16_byte_lines_launch_on_a_strictly_aligned_device(device: str) -> None:
    """A v128 access needs no alignment on a GPU (it is done as aligned 32-bit pieces,
    funnel-shifted): the neighbour loads of a vectorised stencil launch with wasmtime's
    bytes, 4-byte aligned or only 2-byte aligned (see test_simd_alignment)."""
    from tensorwasm.oracle.simulated import SimulatedDevice
    from tensorwasm.runtime.offload import OffloadModule

    wasm = neighbour_module()
    offload = OffloadModule(
        wasm, device=SimulatedDevice() if device == "simulated" else device, mode="always"
    )
    store = wasmtime.Store()
    linker = wasmtime.Linker(store.engine)
    offload.define(linker, store)
    exports = linker.instantiate(store, offload.compiled(store.engine)).exports(store)
    offload.bind(store, exports)
    reference = wasmtime.Instance(store, wasmtime.Module(store.engine, wasm), []).exports(store)
    rng = random.Random(4)
    data = bytes(rng.randrange(256) for _ in range(16 * 300))
    for p, q, n in ((32, 8192, 257), (34, 16384, 40)):  # p+12 is 4-aligned, then 2-aligned
        for ex in (reference, exports):
            ex["memory"].write(store, data, 0)
            ex["run"](store, p, q, n)
        assert bytes(exports["memory"].read(store, 0, 65536)) == bytes(
            reference["memory"].read(store, 0, 65536)
        )
    (loop,) = offload.loops
    offload.close()
    assert loop.stats.offloaded == 2 and not loop.stats.declined, loop.stats.declined
