"""The cheap path of one offloaded call: the raw host function the guest calls, and the GPU
path's copies (one staging buffer, one wait) on the device simulated in host memory, with
results exactly wasmtime's when the kernel traps, for small written ranges (staged) and
large ones (copied once the kernel is known not to have trapped); on the GPU too, with the
marker gpu."""

from __future__ import annotations

import ctypes

import pytest
import wasmtime

from tensorwasm.dialect.types import I32, I64
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.oracle.simulated import SimulatedDevice
from tensorwasm.runtime import hostfunc
from tensorwasm.runtime.device_launch import STAGED_RESULT_BYTES
from tensorwasm.runtime.reference import ReferenceInstance
from tests.conftest import wat
from tests.offload_cases import SPECS, Case, module_bytes, run_case

HOST_CALL = """(module (import "h" "f" (func $f (param i32 i64) (result i32 i64)))
  (memory (export "memory") 2)
  (func (export "run") (param i32 i64) (result i32 i64) (call $f (local.get 0) (local.get 1))))"""


def _instance(text: str, body):
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define(store, "h", "f", hostfunc.func(store, [I32, I64], [I32, I64], body))
    instance = linker.instantiate(store, wasmtime.Module(engine, wat(text)))
    return store, instance.exports(store)


def test_a_raw_host_function_gets_and_returns_exact_values_and_finds_memory() -> None:
    seen = []

    context = []

    def body(caller: int, args: tuple[int, ...]) -> list[int]:
        # Told its store's context, the lookup finds the same memory as when it asks the caller.
        seen.append((args, hostfunc.memory(caller, b"memory"), hostfunc.memory(caller, b"memory", *context)))
        return [args[0] ^ 1, ~args[1]]

    store, exports = _instance(HOST_CALL, body)
    context.append(hostfunc.store_context(store))
    assert exports["run"](store, -(2**31), 2**63 - 1) == [-(2**31) + 1, -(2**63)]
    base = ctypes.cast(exports["memory"].data_ptr(store), ctypes.c_void_p).value
    assert seen == [((-(2**31), 2**63 - 1), (base, 2 << 16), (base, 2 << 16))]


def test_a_raw_host_function_without_memory_and_its_exception_reach_the_caller() -> None:
    class Stop(Exception):
        pass

    def body(caller: int, args: tuple[int, ...]) -> list[int]:
        if args[0] == 7:
            raise Stop("from the host")
        assert hostfunc.memory(caller, b"memory") is None
        return [args[0], args[1]]

    store, exports = _instance(HOST_CALL.replace('(memory (export "memory") 2)', ""), body)
    assert exports["run"](store, 3, -4) == [3, -4]
    with pytest.raises(Stop, match="from the host"):
        exports["run"](store, 7, 0)
    assert exports["run"](store, 5, 6) == [5, 6]  # the store goes on after the trap


def _on_the_simulated_device(func: str, n: int, calls: int = 1):
    mod = "blas1" if func == "saxpy" else "reductions"
    device = SimulatedDevice()
    context = device.context
    offload = OffloadInstance(module_bytes(mod, "O2"), device=device).offload
    spec = SPECS[mod][func]
    copies = []
    for seed in range(calls):
        case = Case({"n": n}, [1.5, 0.0], [0, 0], seed=seed)
        assert run_case(offload.rewritten, func, spec, case, offload) == run_case(
            module_bytes(mod, "O2"), func, spec, case
        )
        copies.append(list(context.copies))
        context.copies.clear()
    (loop,) = [lp for lp in offload.loops if lp.stats.offloaded]
    return copies, loop


def test_a_small_launch_moves_its_scratch_once_each_way_and_its_results_through_staging() -> None:
    (copies,), loop = _on_the_simulated_device("saxpy", 256)
    assert [direction for direction, _ in copies] == ["in", "in", "out", "out"]
    data_in, scratch_in, scratch_out, results = (nbytes for _, nbytes in copies)
    assert data_in == 2 * 4 * 256 and results == 4 * 256 <= STAGED_RESULT_BYTES
    assert scratch_out < scratch_in  # context, live-ins and reduction slots; not the ranges
    assert loop.stats.bytes_in == data_in and loop.stats.bytes_out == results


def test_the_scratch_goes_in_again_only_where_the_launch_changed_it() -> None:
    # The same arguments again: saxpy's kernel left its scratch as it was, isum's folded its
    # sum into the reduction slot, which must start from the identity again.
    same, _ = _on_the_simulated_device("saxpy", 256, calls=2)
    assert [direction for direction, _ in same[1]] == ["in", "out", "out"]
    summed, loop = _on_the_simulated_device("isum", 256, calls=2)
    assert [[direction for direction, _ in call] for call in summed] == [["in", "in", "out"]] * 2
    assert loop.stats.offloaded == 2


def test_large_results_come_back_after_the_wait_straight_into_linear_memory() -> None:
    n = STAGED_RESULT_BYTES // 4 + 100
    (copies,), loop = _on_the_simulated_device("saxpy", n)
    assert [direction for direction, _ in copies] == ["in", "in", "out", "out"]
    assert copies[-1] == ("out", 4 * n)
    assert loop.stats.bytes_out == 4 * n


# b[i] = 1000 / a[i] over n elements, with a[i] = i - k: the kernel traps at i = k.
DIVIDE = """(module (memory (export "memory") 8)
  (func (export "init") (param $n i32) (param $k i32) (local $i i32)
    (loop $l
      (i32.store (i32.shl (local.get $i) (i32.const 2)) (i32.sub (local.get $i) (local.get $k)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))
  (func (export "run") (param $n i32) (local $i i32)
    (loop $l
      (i32.store (i32.add (i32.const 0x40000) (i32.shl (local.get $i) (i32.const 2)))
        (i32.div_s (i32.const 1000) (i32.load (i32.shl (local.get $i) (i32.const 2)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))))"""


@pytest.mark.parametrize("n", [300, STAGED_RESULT_BYTES // 4 + 300], ids=["staged", "copied"])
@pytest.mark.parametrize("device", ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_kernel_that_traps_leaves_memory_as_wasmtime_does(n: int, device: str) -> None:
    wasm = wat(DIVIDE)
    expected = ReferenceInstance(wasm)
    actual = OffloadInstance(wasm, device=SimulatedDevice() if device == "simulated" else device)
    for k in (n + 5, n - 7):  # no zero divisor, then one near the end
        for export, args in (("init", [(I32, n), (I32, k)]), ("run", [(I32, n)])):
            assert actual.call(export, args) == expected.call(export, args)
        assert actual.memory() == expected.memory("memory"), "linear memory differs from wasmtime's"
    init, run = actual.offload.loops
    assert init.stats.offloaded == 2 and run.stats.offloaded == 1
    assert list(run.stats.declined) == [
        "the kernel trapped (integer divide by zero); the loop re-ran on the CPU"
    ]
