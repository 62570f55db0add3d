"""tensorwasm run: WASI programs print exactly what they print on plain wasmtime, with their
loops offloaded (host backend in CI, the GPU with marker gpu); the report says where."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import wasmtime

from tests.conftest import ROOT

PROGRAMS = {
    "matmul": ["48"],
    "stencil": ["40", "6"],
    "reduce": ["5000"],
    "blur": ["64", "48", "2"],
    "histogram": ["3000"],  # its loop must stay on the CPU
    "nbody": ["48", "2"],
}


def wasi_store(path, args, out) -> tuple[wasmtime.Engine, wasmtime.Store, wasmtime.Linker]:
    """An engine, a store and a linker with WASI for the program ``path`` run with ``args``,
    its stdout written to the file ``out``."""
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    wasi = wasmtime.WasiConfig()
    wasi.argv = [str(path), *args]
    wasi.stdout_file = str(out)
    store.set_wasi(wasi)
    return engine, store, linker


def run_start(instance, store) -> int:
    """Call the instance's ``_start``: the exit status (0 where it returns)."""
    try:
        instance.exports(store)["_start"](store)
    except wasmtime.ExitTrap as exc:
        return exc.code
    return 0


def plain_wasmtime(path, args, tmp_path) -> tuple[int, str]:
    out = tmp_path / "stdout"
    engine, store, linker = wasi_store(path, args, out)
    instance = linker.instantiate(store, wasmtime.Module.from_file(engine, str(path)))
    return run_start(instance, store), out.read_text()


def tensorwasm_run(path, args, device: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tensorwasm", "run", str(path), *args, "--device", device,
         "--offload", "always", "--report", "json"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_output_is_identical_to_wasmtime(name: str, device: str, tmp_path) -> None:
    path = ROOT / f"examples/wasi/build/{name}.O2.wasm"
    status, expected = plain_wasmtime(path, PROGRAMS[name], tmp_path)
    proc = tensorwasm_run(path, PROGRAMS[name], device)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout == expected
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["device"] == device
    mains = [row for row in report["loops"] if row["func"] == "main"]
    offloaded = sum(row.get("offloaded", 0) for row in mains)
    if name == "histogram":
        assert offloaded == 0
    elif name != "reduce":  # its sums are float reductions: they need --relaxed-float
        assert offloaded > 0, report


def test_run_invoke_and_bad_input(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tensorwasm", "run", str(ROOT / "examples/invoke/demo.wat"),
         "--invoke", "fib", "20", "--device", "cpu"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "6765"
    bad = tmp_path / "x.wasm"
    bad.write_bytes(b"\0asm\x01\0\0\0\x01")
    proc = subprocess.run(
        [sys.executable, "-m", "tensorwasm", "run", str(bad), "--device", "cpu"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


ENV_WAT = """(module
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $sizes (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "env") (result i32 i32)
    (drop (call $sizes (i32.const 0) (i32.const 4)))
    (i32.load (i32.const 0)) (i32.load (i32.const 4))))"""


def test_run_passes_environment_variables(tmp_path) -> None:
    path = tmp_path / "env.wat"
    path.write_text(ENV_WAT)

    def run(*options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tensorwasm", "run", str(path), "--invoke", "env", "--device", "cpu", *options],
            capture_output=True, text=True, cwd=ROOT, check=False,
        )  # fmt: skip

    assert run().stdout.strip() == "0 0"  # the host's environment is not the program's
    done = run("--env", "A=1", "--env", "BB=2=2")
    assert done.stdout.strip() == "2 11", done.stderr  # "A=1\\0" (4 bytes) and "BB=2=2\\0" (7)
    bad = run("--env", "NOVALUE")
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr


@pytest.mark.parametrize("name", ["stencil", "blur", "matmul", "nbody"])
def test_program_output_on_a_simulated_device_is_identical(name: str, tmp_path, capfd, monkeypatch) -> None:
    """The GPU path's data movement (per launch, and kept on the device inside the
    stencil's, the blur's and the N-body's regions) on a device simulated in host memory."""
    from tensorwasm.oracle.simulated import SimulatedDevice
    from tensorwasm.runtime import run as run_module
    from tensorwasm.runtime.offload import OffloadModule

    made = []

    def simulated(wasm, **kwargs):
        offload = OffloadModule(wasm, **{**kwargs, "device": SimulatedDevice(), "pin": False})
        made.append(offload)
        return offload

    monkeypatch.setattr(run_module, "OffloadModule", simulated)
    path = ROOT / f"examples/wasi/build/{name}.O2.wasm"
    status, expected = plain_wasmtime(path, PROGRAMS[name], tmp_path)
    capfd.readouterr()
    got, offload, _ = run_module.run(
        path.read_bytes(), [str(path), *PROGRAMS[name]], offload="always", device="cpu"
    )
    assert (got, capfd.readouterr().out) == (status, expected)
    (offload,) = made
    main = [lp for lp in offload.loops if lp.stats.func == "main" and lp.stats.offloaded]
    assert main
    if name == "matmul":
        assert offload.regions == [] and all(lp.stats.bytes_out > 0 for lp in main)
    else:  # results stay on the device until the region is left
        inside = [lp for lp in main if lp.region is not None]
        assert inside and all(lp.stats.bytes_out == 0 for lp in inside)
        assert sum(lp.stats.offloaded for lp in inside) > 1  # one launch a step or pass
        assert sum(r.bytes_out for r in offload.region_stats) > 0


@pytest.mark.parametrize("device", ["cpu", "simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_3d_stencil_runs_as_a_3d_launch_with_wasmtimes_output(
    device: str, tmp_path, capfd, monkeypatch
) -> None:
    """The benchmark's 7-point stencil: its x, y and z loops form one 3-D grid (x over z,
    the contiguous index), repeated over the time steps inside a device-resident region."""
    import tensorwasm.runtime.guards as guards_module
    from tensorwasm.oracle.simulated import SimulatedDevice
    from tensorwasm.runtime import run as run_module

    launches = []
    real_check = guards_module.check
    monkeypatch.setattr(
        guards_module, "check", lambda *a, **k: launches.append(real_check(*a, **k)) or launches[-1]
    )
    if device == "simulated":
        real_module = run_module.OffloadModule

        def simulated(wasm, **kwargs):
            return real_module(wasm, **{**kwargs, "device": SimulatedDevice(), "pin": False})

        monkeypatch.setattr(run_module, "OffloadModule", simulated)
    path = ROOT / "benchmarks/suite/build/stencil3d.wasm"
    args = ["23", "3"]
    status, expected = plain_wasmtime(path, args, tmp_path)
    capfd.readouterr()
    got, offload, _ = run_module.run(
        path.read_bytes(),
        [str(path), *args],
        offload="always",
        device="cpu" if device == "simulated" else device,
    )
    assert (got, capfd.readouterr().out) == (status, expected)
    loops = [lp for lp in offload.loops if lp.stats.func == "kernel_stencil3d"]
    (kernel,) = [lp for lp in loops if lp.stats.arrivals]  # its inner loops' host calls are skipped
    assert len(loops) == 3 and kernel.stats.offloaded == 3 and kernel.region is not None
    assert {(lc.trip, lc.nest) for lc in launches if lc.nest} == {(21, (21, 21))}


def test_auto_offload_on_the_host_backend_matches_wasmtime(tmp_path) -> None:
    """The default mode, where profitability decides each arrival (`tensorwasm run` page-
    locks memory only on a GPU: the host backend has no device mirror to ask)."""
    path = ROOT / "examples/wasi/build/stencil.O2.wasm"
    status, expected = plain_wasmtime(path, PROGRAMS["stencil"], tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "tensorwasm", "run", str(path), *PROGRAMS["stencil"], "--device", "cpu",
         "--offload", "auto", "--report", "json"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == status, proc.stderr
    assert proc.stdout == expected
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert sum(row.get("arrivals", 0) for row in report["loops"]) > 0


@pytest.mark.gpu
def test_a_run_that_made_a_cuda_context_ends_with_its_output_status_and_cache_counts_written(
    tmp_path,
) -> None:
    """A run that made a context ends without the driver's teardown (os._exit), after
    Python's exit work: the program's output, its exit status and the cache's hit and miss
    counts (written at exit) are all there."""
    import os

    path = ROOT / "examples/wasi/build/matmul.O2.wasm"
    status, expected = plain_wasmtime(path, ["64"], tmp_path)
    env = {**os.environ, "TENSORWASM_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "tensorwasm", "run", str(path), "64", "--device", "gpu", "--offload", "always"],
        capture_output=True, text=True, cwd=ROOT, check=False, env=env,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (status, expected), done.stderr
    counts = (tmp_path / "cache" / "counts").read_text().split()
    assert len(counts) == 2 and int(counts[0]) + int(counts[1]) > 0, counts
