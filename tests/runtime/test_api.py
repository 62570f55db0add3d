"""tensorwasm.instantiate: wasmtime's Instance with one call changed; tensorwasm.report."""

from __future__ import annotations

import json
import struct
import warnings

import pytest
import wasmtime

import tensorwasm
from tensorwasm.support.errors import TensorWasmError
from tests.conftest import wat

# An import before and after the memory, a parallel loop scaling n f32s in place and adding
# an imported value to each, the import called outside the loop: the imports must reach
# their own slots though the runtime adds its own.
MODULE = wat("""
(module
  (import "env" "offset" (func $offset (result f32)))
  (import "env" "memory" (memory 1))
  (import "env" "seen" (func $seen (param i32)))
  (func (export "scale") (param $p i32) (param $n i32) (param $k f32)
    (local $i i32) (local $c f32)
    (local.set $c (call $offset))
    (block $done
      (br_if $done (i32.le_s (local.get $n) (i32.const 0)))
      (loop $next
        (f32.store (local.get $p)
          (f32.add (f32.mul (f32.load (local.get $p)) (local.get $k)) (local.get $c)))
        (local.set $p (i32.add (local.get $p) (i32.const 4)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $next (i32.lt_s (local.get $i) (local.get $n)))))
    (call $seen (local.get $i))))
""")
N = 1000


def imports(store: wasmtime.Store, seen: list[int]):
    memory = wasmtime.Memory(store, wasmtime.MemoryType(wasmtime.Limits(1, None)))
    offset = wasmtime.Func(store, wasmtime.FuncType([], [wasmtime.ValType.f32()]), lambda: 0.25)
    record = wasmtime.Func(store, wasmtime.FuncType([wasmtime.ValType.i32()], []), seen.append)
    return memory, [offset, memory, record]


def run(make) -> tuple[bytes, list[int], wasmtime.Instance]:
    store = wasmtime.Store(wasmtime.Engine())
    seen: list[int] = []
    memory, externs = imports(store, seen)
    memory.write(store, struct.pack(f"<{N}f", *(i * 0.5 - 7 for i in range(N))), 64)
    instance = make(store, externs)
    for k in (1.5, -3.0):
        instance.exports(store)["scale"](store, 64, N, k)
    return memory.read(store, 0, 64 + 4 * N), seen, instance


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_instantiate_offloads_and_matches_wasmtime(device: str) -> None:
    expected, expected_seen, _ = run(
        lambda store, ext: wasmtime.Instance(store, wasmtime.Module(store.engine, MODULE), ext)
    )
    got, seen, instance = run(
        lambda store, ext: tensorwasm.instantiate(store, MODULE, ext, device=device, offload="always")
    )
    assert got == expected and seen == expected_seen == [N, N]
    found = tensorwasm.report(instance)
    assert found.device == device
    (loop,) = found.loops
    assert loop.verdict == "offload" and loop.device.startswith(device)
    assert (loop.arrivals, loop.offloaded, loop.iterations) == (2, 2, 2 * N)
    assert json.loads(found.json())["loops"][0]["offloaded"] == 2


def test_offload_off_runs_every_loop_on_wasmtime_and_says_why() -> None:
    got, _, instance = run(
        lambda store, ext: tensorwasm.instantiate(store, MODULE, ext, device="cpu", offload="off")
    )
    expected, _, _ = run(
        lambda store, ext: wasmtime.Instance(store, wasmtime.Module(store.engine, MODULE), ext)
    )
    assert got == expected
    (loop,) = tensorwasm.report(instance).loops
    assert loop.offloaded == 0 and loop.declined == {"offload is off": 2}


def test_wrong_imports_and_foreign_instances_are_refused() -> None:
    store = wasmtime.Store(wasmtime.Engine())
    _, externs = imports(store, [])
    with pytest.raises(TensorWasmError, match=r"missing import env\.seen: the module takes 3 imports"):
        tensorwasm.instantiate(store, MODULE, externs[:2], device="cpu")
    with pytest.raises(TensorWasmError, match="too many imports: the module takes 3"):
        tensorwasm.instantiate(store, MODULE, [*externs, externs[0]], device="cpu")
    with pytest.raises(TensorWasmError, match="offload must be auto, always or off"):
        tensorwasm.instantiate(store, MODULE, externs, device="cpu", offload="sometimes")
    plain = wasmtime.Instance(store, wasmtime.Module(store.engine, MODULE), externs)
    with pytest.raises(TensorWasmError, match=r"not made by tensorwasm\.instantiate"):
        tensorwasm.report(plain)


def test_a_wasi_program_through_a_linker_prints_what_it_prints_on_wasmtime(tmp_path) -> None:
    from tests.conftest import ROOT

    wasm = (ROOT / "examples/wasi/build/matmul.O2.wasm").read_bytes()

    def run_program(make, name: str) -> tuple[str, wasmtime.Instance]:
        engine = wasmtime.Engine()
        store = wasmtime.Store(engine)
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        wasi = wasmtime.WasiConfig()
        wasi.argv = ["matmul", "40"]
        wasi.stdout_file = str(tmp_path / name)
        store.set_wasi(wasi)
        instance = make(store, linker)
        try:
            instance.exports(store)["_start"](store)
        except wasmtime.ExitTrap as exc:
            assert exc.code == 0
        return (tmp_path / name).read_text(), instance

    expected, _ = run_program(
        lambda store, linker: linker.instantiate(store, wasmtime.Module(store.engine, wasm)), "a"
    )
    got, instance = run_program(
        lambda store, linker: tensorwasm.instantiate(
            store, wasm, linker=linker, device="cpu", offload="always"
        ),
        "b",
    )
    assert got == expected and expected.startswith("matmul")
    assert sum(loop.offloaded for loop in tensorwasm.report(instance).loops if loop.func == "main") > 0
    engine = wasmtime.Engine()
    with pytest.raises(TensorWasmError, match=r"the linker defines no import wasi_snapshot_preview1\."):
        tensorwasm.instantiate(wasmtime.Store(engine), wasm, linker=wasmtime.Linker(engine), device="cpu")


def _no_gpu(monkeypatch) -> None:
    """No GPU (the same on a GPU machine), and no warning given yet in this process."""
    from tensorwasm.runtime import api, driver, known_gpu

    def no_gpu(*args):
        raise driver.NoGPU("no usable GPU (this test)")

    monkeypatch.setattr(driver.Context, "get", staticmethod(no_gpu))
    monkeypatch.setattr(known_gpu, "remembered", lambda: None)  # (a GPU machine remembers its own)
    monkeypatch.setattr(known_gpu, "remembered_absence", lambda: None)  # the driver is asked
    monkeypatch.setattr(api, "_warned_host_backend", False)


def test_without_a_gpu_auto_takes_the_host_backend_and_gpu_says_why(monkeypatch, capfd) -> None:
    from tensorwasm.runtime import driver
    from tensorwasm.runtime.api import HostBackendWarning

    _no_gpu(monkeypatch)
    with pytest.warns(
        HostBackendWarning, match=r"no usable GPU \(this test\); loops run on the host backend"
    ):
        got, _, instance = run(
            lambda store, ext: tensorwasm.instantiate(store, MODULE, ext, offload="always")
        )
    expected, _, _ = run(
        lambda store, ext: wasmtime.Instance(store, wasmtime.Module(store.engine, MODULE), ext)
    )
    assert got == expected and tensorwasm.report(instance).device == "cpu"
    assert capfd.readouterr().err == ""
    store = wasmtime.Store()
    with pytest.raises(driver.NoGPU, match="no usable GPU"):
        tensorwasm.instantiate(store, MODULE, imports(store, [])[1], device="gpu")


def test_auto_without_a_gpu_writes_nothing_to_stderr_and_warns_once_per_process(monkeypatch, capfd) -> None:
    from tensorwasm.runtime.api import HostBackendWarning

    _no_gpu(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning given is recorded: once is instantiate's doing
        for _ in range(3):
            store = wasmtime.Store()
            instance = tensorwasm.instantiate(store, MODULE, imports(store, [])[1])
            assert tensorwasm.report(instance).device == "cpu"
    said = [w for w in caught if issubclass(w.category, HostBackendWarning)]
    assert [str(w.message) for w in said] == [
        "no usable GPU (this test); loops run on the host backend (cpu)"
    ]
    assert said[0].filename == __file__  # it names the line that called instantiate
    assert capfd.readouterr().err == ""


def test_the_python_example_runs_a_wasi_program_with_its_loop_offloaded(tmp_path) -> None:
    """n=768: auto mode's estimate for the product (~450M inner iterations) is well above
    the host backend's start (loading LLVM's JIT) and launch cost on any machine, so the
    launch is not a timing race (n=128's ~6 ms no longer pays for that start)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.runtime.test_run import plain_wasmtime

    # Its one arrival waits for the kernel (in the background, wasmtime would run it).
    env = {**os.environ, "TENSORWASM_COMPILE": "sync"}
    done = subprocess.run(
        [sys.executable, "examples/python/offload_matmul.py", "768", "--device", "cpu"],
        capture_output=True, text=True, cwd=ROOT, check=True, env=env,
    )  # fmt: skip
    first, *loops = done.stdout.splitlines()
    _, expected = plain_wasmtime(ROOT / "examples/wasi/build/matmul.O2.wasm", ["768"], tmp_path)
    assert first == expected.strip()
    assert any(line.startswith("main +0x") and "ran 1 of 1 times on cpu" in line for line in loops)
