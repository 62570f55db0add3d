"""A GPU module's launches on the host's threads while its device starts
(runtime/while_starting.py), on the simulated device whose context the test makes."""

from __future__ import annotations

import threading

import pytest

from tensorwasm.dialect.types import I32
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.runtime import known_host, profit
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import NOT_STARTED, STARTING
from tensorwasm.runtime.reference import ReferenceInstance
from tensorwasm.runtime.while_starting import HostWhileStarting
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_gpu_start import SlowStartDevice, _saxpy_case, _saxpy_on_a_slow_start, described_gpu
from tests.runtime.test_regions import time_loop


def _host_side(offload) -> HostWhileStarting:
    assert offload._while_starting is not None  # made at the first launch kept from the GPU
    return offload._while_starting


def test_launches_the_start_keeps_from_the_gpu_run_on_the_host_then_on_the_device(monkeypatch, tmp_path) -> None:
    # ~100 ms of CPU time an arrival: a host launch pays; the context takes "100 s".
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))  # (the host kernel not compiled yet)
    device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, 5e-6, 100.0, 100.05, host_while_starting=True)
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    # The host kernel was not ready: wasmtime ran the loop, and its compile began on a worker.
    assert loop.stats.offloaded == 0 and loop.stats.declined == {NOT_STARTED: 1}
    host = _host_side(offload)
    host._kernels.wait()
    for _ in range(3):
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.on_host == loop.stats.offloaded == 3 and device.made is None
    device.starter.begin(device.make_context)  # the context made at last
    device.release.set()
    device.starter.thread.join()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.offloaded == 4 and loop.stats.on_host == 3  # on the device now
    offload.close()


def _first_arrival_short_of_the_start(monkeypatch, tmp_path):
    """saxpy on a GPU whose start is far off, its host kernel compiled nowhere yet; one
    arrival, gaining a few ms: (the module, the loop, its host side, a run of it again)."""
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    _device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, 2.5e-7, 100.0, 100.05, host_while_starting=True)
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)

    def again() -> None:
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected

    again()
    host = _host_side(offload)
    assert 0 < host.banked < profit.STARTUP_SECONDS["cpu"] / 2 and loop.stats.offloaded == 0
    return offload, loop, host, again


def test_without_a_linker_the_host_kernel_is_made_only_once_the_arrivals_would_gain_the_hosts_start(
    monkeypatch, tmp_path
) -> None:
    # A few ms gained an arrival: the host's start (LLVM's JIT, the kernel) is begun once their
    # gains reach what it costs, not at the first.
    from tests.runtime.test_known_host import _without_a_linker

    _without_a_linker(monkeypatch)
    offload, _, host, again = _first_arrival_short_of_the_start(monkeypatch, tmp_path)
    assert not host._kernels.pending and not host._kernels.units
    for _ in range(100):
        if host.banked >= profit.STARTUP_SECONDS["cpu"]:
            break
        assert not host._kernels.pending and not host._kernels.units
        again()
    assert host._kernels.pending or host._kernels.units  # begun by the arrival that paid for it
    host._kernels.wait()
    offload.close()


def test_a_host_kernel_whose_library_is_cached_launches_at_once_and_one_that_is_not_compiles_for_then(
    monkeypatch, tmp_path
) -> None:
    # A few ms gained an arrival, far short of the host's start through LLVM's JIT; but the
    # first arrival has the kernel compiled on a worker, with its shared library, and once
    # that is in the code cache the next arrival loads it (no LLVM) and launches.
    from tensorwasm.compiler.target.shared import SharedCode, find_linker

    if find_linker() is None:
        pytest.skip("no linker on this machine (ld.lld, ld or cc): covered by the test above")
    offload, loop, host, again = _first_arrival_short_of_the_start(monkeypatch, tmp_path)
    assert host._kernels.pending and not host._kernels.units  # compiling, for the next arrival or run
    host._kernels.wait()
    host._kernels.units.clear()  # (as the next run finds it: in the cache only)
    host._kernels.pending.clear()
    again()
    assert loop.stats.on_host == loop.stats.offloaded == 1 and host.banked < profit.STARTUP_SECONDS["cpu"]
    assert isinstance(host._kernels.units[loop.kernel_index].code, SharedCode)
    offload.close()


def test_it_is_auto_unless_asked_otherwise(monkeypatch) -> None:
    from tensorwasm.support import config
    from tensorwasm.support.errors import ConfigError

    monkeypatch.delenv("TENSORWASM_HOST_WHILE_STARTING", raising=False)
    assert config.host_while_starting() == "auto"
    for value in ("on", "off", "auto", " ON "):
        monkeypatch.setenv("TENSORWASM_HOST_WHILE_STARTING", value)
        assert config.host_while_starting() == value.strip().lower()
    monkeypatch.setenv("TENSORWASM_HOST_WHILE_STARTING", "yes")
    with pytest.raises(ConfigError, match="TENSORWASM_HOST_WHILE_STARTING='yes': say auto, on or off"):
        config.host_while_starting()


def test_no_launch_runs_on_the_host_where_that_is_turned_off(monkeypatch) -> None:
    _device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, 5e-6, 100.0, 100.05)  # (turned off)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    for _ in range(3):
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert offload._while_starting is None and loop.stats.offloaded == 0
    assert loop.stats.declined == {NOT_STARTED: 3}
    offload.close()


def test_a_launch_the_host_would_run_slower_than_wasmtime_stays_on_wasmtime(monkeypatch) -> None:
    # The GPU's model pays, the host's does not: its launch cost is above what the loop takes.
    device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, 5e-6, 100.0, 100.05, host_while_starting=True)
    monkeypatch.setitem(profit.FIXED_SECONDS, "cpu", 10.0)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    for _ in range(3):
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    _host_side(offload)._kernels.wait()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.offloaded == 0 and loop.stats.declined == {NOT_STARTED: 4}
    assert device.made is None
    offload.close()


def test_a_region_whose_first_steps_ran_on_the_host_leaves_memory_as_wasmtime_does(monkeypatch) -> None:
    # A time loop (a device-resident region on the GPU): its first steps launch on the host
    # while the context is made, the rest on the device, which copies in what the host wrote.
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 5e-4)
    monkeypatch.setitem(profit.CONTEXT_SECONDS, "gpu", 100.0)
    monkeypatch.setitem(profit.STARTUP_SECONDS, "gpu", 100.05)
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    monkeypatch.setenv("TENSORWASM_HOST_WHILE_STARTING", "on")
    wasm = time_loop()
    device = SlowStartDevice()
    device.starter.begin(device.make_context)  # as the command line begins it
    actual = OffloadInstance(wasm, device=device, mode="auto")
    (loop,) = actual.offload.loops
    host_run = HostWhileStarting.run

    def run_then_make_the_context(self, lp, ready, arrival, base, size, beat=None):
        partials = host_run(self, lp, ready, arrival, base, size, beat)
        if lp.stats.on_host == 3 and device.made is None:  # the context is made after 3 steps
            device.release.set()
            device.starter.thread.join()
        return partials

    monkeypatch.setattr(HostWhileStarting, "run", run_then_make_the_context)
    expected_instance = ReferenceInstance(wasm)
    args = [(I32, 1000), (I32, 12), (I32, 0)]
    expected = expected_instance.call("run", args)
    assert actual.call("run", args) == expected
    assert actual.memory() == expected_instance.memory("memory"), "linear memory differs from wasmtime's"
    assert loop.stats.on_host == 3 and loop.stats.offloaded == 12, loop.stats
    assert set(loop.stats.declined) <= {STARTING, NOT_STARTED}
    (region,) = actual.offload.region_stats
    assert region.exits >= 1 and loop.stats.bytes_in > 0  # the device copied in the host's results
    actual.close()


def test_in_auto_the_steps_of_a_region_stay_on_wasmtime_while_the_gpu_starts(monkeypatch) -> None:
    # As above, but TENSORWASM_HOST_WHILE_STARTING left to auto: a region's loops wait for the
    # GPU (their time steps lost on the host's threads), and wasmtime runs them meanwhile.
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 5e-4)
    monkeypatch.setitem(profit.CONTEXT_SECONDS, "gpu", 100.0)
    monkeypatch.setitem(profit.STARTUP_SECONDS, "gpu", 100.05)
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")
    monkeypatch.delenv("TENSORWASM_HOST_WHILE_STARTING", raising=False)
    wasm = time_loop()
    device = SlowStartDevice()
    device.starter.begin(device.make_context)
    actual = OffloadInstance(wasm, device=device, mode="auto")
    (loop,) = actual.offload.loops
    assert loop.region is not None
    expected_instance = ReferenceInstance(wasm)
    args = [(I32, 1000), (I32, 12), (I32, 0)]
    assert actual.call("run", args) == expected_instance.call("run", args)
    assert actual.memory() == expected_instance.memory("memory")
    assert loop.stats.on_host == loop.stats.offloaded == 0 and set(loop.stats.declined) <= {STARTING, NOT_STARTED}
    assert not actual.offload.launched_on_device()
    device.release.set()
    device.starter.thread.join()
    actual.close()


def test_launches_on_the_hosts_threads_are_not_launches_on_the_gpu(monkeypatch) -> None:
    # What the next run remembers (runtime.known_gpu): launched on the GPU itself or not.
    device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, 5e-6, 100.0, 100.05, host_while_starting=True)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    for _ in range(2):
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.on_host == loop.stats.offloaded >= 1 and not offload.launched_on_device()
    device.starter.begin(device.make_context)
    device.release.set()
    device.starter.thread.join()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.offloaded > loop.stats.on_host and offload.launched_on_device()
    offload.close()


@pytest.mark.gpu
def test_on_the_gpu_the_first_steps_of_a_region_run_on_the_host_while_the_context_is_made() -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    info = described_gpu()  # as a process before found it: preparing the module makes no context
    # (the host kernel made at the first step that pays for it)
    env = {**os.environ, "TENSORWASM_COMPILE": "sync", "TENSORWASM_HOST_WHILE_STARTING": "on"}
    done = subprocess.run(
        [sys.executable, "-c", _ON_THE_GPU, info], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = (line.split() for line in done.stdout.splitlines())
    assert first[2] == second[2] == "True"  # memory as wasmtime leaves it, both times
    on_host, offloaded = int(first[0]), int(first[1])
    assert 1 <= on_host <= offloaded <= 40  # the first steps at least on the host
    assert int(second[0]) == on_host and int(second[1]) == offloaded + 40  # then all on the GPU


# A fresh process (no context yet): the CUDA start begun as the command line begins it, a
# time loop of 40 steps its first call runs (on the host's threads while the context is
# made), then, the context made, once more (on the GPU).
_ON_THE_GPU = """
import json, sys, threading
from tensorwasm.dialect.types import I32
from tensorwasm.oracle.offload import OffloadInstance
from tensorwasm.runtime import gpu_start, known_gpu, profit
from tensorwasm.runtime.device_info import DeviceInfo
from tensorwasm.runtime.reference import ReferenceInstance
from tests.runtime.test_regions import time_loop

fields = json.loads(sys.argv[1])
known_gpu.remembered = lambda: DeviceInfo(**dict(fields, compute_capability=tuple(fields["compute_capability"])))
profit.cpu_seconds_per_op = lambda: 2e-7
wasm = time_loop()
# The context is made once the host ran a step: an H100's context can be made before the
# host's kernel is compiled, and then no step would run there.
from tensorwasm.runtime.while_starting import HostWhileStarting
host_ran = threading.Event()
host_run = HostWhileStarting.run
def run_and_tell(self, lp, *rest):
    partials = host_run(self, lp, *rest)
    if lp.stats.on_host:
        host_ran.set()
    return partials
HostWhileStarting.run = run_and_tell
def make_after_a_host_step():
    host_ran.wait(60)
    gpu_start.make_context()
gpu_start.STARTER.begin(make_after_a_host_step)
actual = OffloadInstance(wasm, device="gpu", mode="auto", pin=True)
expected_instance = ReferenceInstance(wasm)
(loop,) = actual.offload.loops
args = [(I32, 8000), (I32, 40), (I32, 0)]
for _ in range(2):
    assert actual.call("run", args) == expected_instance.call("run", args)
    same = actual.memory() == expected_instance.memory("memory")
    print(loop.stats.on_host, loop.stats.offloaded, same, flush=True)
    gpu_start.STARTER.thread.join()
actual.close()
"""


def _arrival_worth_waiting_for(monkeypatch, seconds_per_op: float):
    """saxpy (~20,000 ops an arrival at ``seconds_per_op``) on a GPU whose context a thread
    began making and has ~1 s left of: an arrival gains more than that wait on the device;
    its host kernel is loaded."""
    device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, seconds_per_op, 1.0, 1.05, host_while_starting=True)
    monkeypatch.setitem(profit.OP_SHARE, "cpu", 1 / 8)  # eight threads' worth, whatever this machine has
    host = offload._stand_in()
    assert host._kernels.compile(host._loop_of[loop.kernel_index], wait=True) is None
    device.starter.begin(device.make_context)  # as the command line begins it
    return device, offload, loop


def test_a_launch_worth_waiting_for_runs_on_the_host_where_its_threads_finish_before_the_wait_ends(
    monkeypatch,
) -> None:
    # ~2 s on wasmtime an arrival: the device would gain that less its 1 s wait, but the
    # host's threads take ~2/8 s, less than the wait alone.
    device, offload, loop = _arrival_worth_waiting_for(monkeypatch, 1e-4)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.on_host == loop.stats.offloaded == 1 and not loop.stats.declined
    assert device.starter.running() and device.made is None  # nothing waited for the context
    # The launch was worth waiting for: the next run begins the device's start with the program.
    assert offload.planner.worth_waiting and offload.planner.start_would_pay()
    # The launch's pace here (its time over the host's model) is kept for the next run, whose
    # stand-in starts from it.
    pace = _host_side(offload).gains.paces[loop.kernel_index]
    assert pace > 0.0
    offload.remember_host_kernels()
    assert known_host.paces_last_time(offload.key)[loop.kernel_index] == pace
    device.release.set()
    device.starter.thread.join()
    offload.close()
    following = OffloadModule(module_bytes("blas1", "O2"), device=SlowStartDevice(), mode="auto")
    following.load_host_kernels_early()
    assert _stand_in_of(following).paces[loop.kernel_index] == pace
    following.close()


def _stand_in_of(offload) -> HostWhileStarting:
    return offload._stand_in()


def test_a_launch_worth_waiting_for_waits_where_the_last_run_measured_the_host_slower_than_its_model(
    monkeypatch, tmp_path
) -> None:
    # As above (the host's model: ~2/8 s, less than the 1 s wait), but the last run measured
    # the kernel's launch on the host's threads at 10 times its model (~2.5 s, PolyBench's
    # 2mm's first kernel on an H200's host was 2.5 to 6 times): the launch waits for the
    # device, which the test makes while it waits.
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    device, offload, loop = _arrival_worth_waiting_for(monkeypatch, 1e-4)
    gains = known_host.Gains()
    gains.launched(loop.kernel_index, 1e-3)  # (it gained, a little: not parked, not loaded early)
    gains.paced(loop.kernel_index, 10.0)
    known_host.remember_kernels(offload.key, gains)
    offload.load_host_kernels_early()
    _launches_once_the_device_is_made(device, offload, loop)


def _launches_once_the_device_is_made(device, offload, loop) -> None:
    """One arrival of saxpy, whose launch waits for the device (made 0.2 s in): on the
    device, results as wasmtime's."""
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    threading.Timer(0.2, device.release.set).start()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.offloaded == 1 and loop.stats.on_host == 0 and not loop.stats.declined
    assert device.made is not None
    offload.close()


def test_a_launch_the_host_would_take_longer_over_than_the_wait_waits_for_the_device(monkeypatch) -> None:
    # ~20 s on wasmtime an arrival: the host's threads would take ~2.5 s, the device ~1 s of
    # wait and its launch. The context is made (released here) while the launch waits for it.
    device, offload, loop = _arrival_worth_waiting_for(monkeypatch, 1e-3)
    _launches_once_the_device_is_made(device, offload, loop)


def test_a_launch_worth_waiting_for_whose_host_kernel_is_not_ready_waits_and_has_it_compiled(
    monkeypatch, tmp_path
) -> None:
    # As two tests above, but the host kernel neither loaded nor in the code cache: the launch
    # waits for the device, and where this machine links libraries the kernel is compiled on
    # a worker meanwhile (its library for the next run).
    from tensorwasm.compiler.target.shared import find_linker

    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, 1e-4, 1.0, 1.05, host_while_starting=True)
    monkeypatch.setitem(profit.OP_SHARE, "cpu", 1 / 8)
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    device.starter.begin(device.make_context)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    threading.Timer(0.2, device.release.set).start()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.offloaded == 1 and loop.stats.on_host == 0 and device.made is not None
    host = _host_side(offload)
    assert bool(host._kernels.pending or host._kernels.units) == (find_linker() is not None)
    host._kernels.wait()
    offload.close()


def test_a_remembered_pace_leaves_the_choice_against_wasmtime_to_the_model(monkeypatch, tmp_path) -> None:
    # ~100 ms of CPU time an arrival, the context "100 s" off: the host's model finds its
    # threads faster than wasmtime. A pace of 10 remembered (a first launch slowed by its
    # warm-up) would find them slower; it weighs only against waiting for the device, and
    # the launch runs here.
    monkeypatch.setenv("TENSORWASM_CACHE_DIR", str(tmp_path / "cache"))
    device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, 5e-6, 100.0, 100.05, host_while_starting=True)
    host = offload._stand_in()
    assert host._kernels.compile(host._loop_of[loop.kernel_index], wait=True) is None
    host.pace({loop.kernel_index: 10.0})
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.on_host == loop.stats.offloaded == 1 and device.made is None
    offload.close()
