"""The GPU's start off the critical path: the CUDA context made on a thread of its own from
the first arrival whose launch would pay, and the start-up rule charging only what is left
of the start (on a simulated device whose context takes as long as the test says; on the
GPU with the marker gpu)."""

from __future__ import annotations

import threading
import time

import pytest

from tensorwasm.oracle.simulated import HostContext, SimulatedDevice
from tensorwasm.runtime import profit
from tensorwasm.runtime.cuda_device import CudaDevice
from tensorwasm.runtime.gpu_start import ContextStart, DriverOpen
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import NOT_STARTED, STARTING
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_offload import _saxpy_case


def test_a_start_runs_once_while_it_runs_and_counts_down() -> None:
    made, release, calls = [], threading.Event(), []
    starter = ContextStart(made=lambda: bool(made))
    assert starter.seconds_left(0.15) == 0.15 and not starter.running()  # nothing begun

    def make() -> None:
        calls.append(1)
        release.wait(10)
        made.append(1)

    thread = starter.begin(make)
    assert starter.begin(make) is thread and starter.running()
    time.sleep(0.02)
    left = starter.seconds_left(0.15)
    assert 0.0 <= left <= 0.15 - 0.02
    release.set()
    thread.join()
    assert starter.seconds_left(0.15) == 0.0 and starter.begin(make) is None  # made
    assert calls == [1]


def test_a_start_that_made_no_context_charges_all_and_begins_again() -> None:
    calls = []
    starter = ContextStart(made=lambda: False)
    starter.begin(lambda: calls.append(1)).join()
    assert starter.seconds_left(0.15) == 0.15  # no GPU after all: the launch meets the reason
    starter.begin(lambda: calls.append(1)).join()
    assert calls == [1, 1]


def test_the_cuda_device_begins_its_start_when_told_and_charges_the_rest(monkeypatch) -> None:
    made, release = [], threading.Event()
    device = CudaDevice()
    device.starter = ContextStart(made=lambda: bool(made))
    monkeypatch.setattr(device, "make_context", lambda: (release.wait(10), made.append(1)))
    rest = profit.STARTUP_SECONDS["gpu"] - profit.CONTEXT_SECONDS["gpu"]
    assert device.startup_seconds() == pytest.approx(profit.STARTUP_SECONDS["gpu"])
    assert device.starter.thread is None  # asking what the start costs begins nothing
    device.begin_start()
    first = device.startup_seconds()
    assert device.starter.running() and rest < first <= profit.STARTUP_SECONDS["gpu"]
    thread = device.starter.thread
    release.set()
    thread.join()
    assert device.startup_seconds() == pytest.approx(rest)  # the context is made: memory is left
    device.begin_start()
    assert device.starter.thread is thread  # begun once


class SlowStartDevice(SimulatedDevice):
    """The simulated device with a context made only once the test releases it, on the
    thread that starts the device (or where a launch needs it, after waiting for that one)."""

    def __init__(self) -> None:
        super().__init__()
        self._context = None
        self.made: HostContext | None = None
        self.release = threading.Event()
        self.starter = ContextStart(made=lambda: self.made is not None)

    def make_context(self) -> None:
        self.release.wait(10)
        self.made = HostContext()

    @property
    def context(self):
        if self._context is None:
            if self.starter.thread is not None:
                self.starter.thread.join()  # a launch waits for the rest of the start
            if self.made is None:
                self.make_context()
            self._context = self.made
        return self._context


def _saxpy_on_a_slow_start(
    monkeypatch, seconds_per_op: float, context: float, startup: float, host_while_starting: bool = False
):
    """saxpy offloaded in ``auto`` to a :class:`SlowStartDevice` whose context takes
    ``context`` seconds by the model (``startup`` with device memory and page-locking), with
    ``seconds_per_op`` of CPU time per op; nothing of the start begun. The arrivals the start
    keeps from the device stay on wasmtime unless ``host_while_starting``
    (:mod:`runtime.while_starting`)."""
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: seconds_per_op)
    monkeypatch.setenv("TENSORWASM_COMPILE", "sync")  # no arrival declined while compiling
    monkeypatch.setenv("TENSORWASM_HOST_WHILE_STARTING", "on" if host_while_starting else "off")
    monkeypatch.setitem(profit.CONTEXT_SECONDS, "gpu", context)
    monkeypatch.setitem(profit.STARTUP_SECONDS, "gpu", startup)
    device = SlowStartDevice()
    offload = OffloadModule(module_bytes("blas1", "O2"), device=device, mode="auto")
    loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
    return device, offload, loop


def test_a_start_made_in_the_background_is_charged_only_for_what_is_left(monkeypatch) -> None:
    # ~10 ms gained an arrival; a context that takes a long while (the test ends it), and
    # 50 ms of start after it.
    device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, 5e-7, 100.0, 100.05)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    device.starter.begin(device.make_context)  # as the command line begins it, at its start
    rest = profit.STARTUP_SECONDS["gpu"] - profit.CONTEXT_SECONDS["gpu"]
    banked = []
    for _ in range(6):  # the context is being made: only the rest of the start is charged
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
        banked.append(offload.planner.banked)
    assert device.starter.running() and loop.stats.offloaded == 0
    # Declined for the start while the bank was short of the rest (not of the whole start,
    # 100 s), then for the wait: each arrival gains less than the context has left.
    short = sum(1 for gain in banked if gain < rest)
    assert 1 <= short < 6 and loop.stats.declined == {NOT_STARTED: short, STARTING: 6 - short}
    device.release.set()
    device.starter.thread.join()
    for _ in range(12):
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    offload.close()
    assert loop.stats.offloaded == 12 and loop.stats.declined == {NOT_STARTED: short, STARTING: 6 - short}
    # Only the rest of the start (device memory, page-locking) was banked, not the context's.
    assert rest <= offload.planner.banked < profit.STARTUP_SECONDS["gpu"]


def test_the_start_begins_once_the_gains_reach_a_share_of_it(monkeypatch) -> None:
    from tensorwasm.runtime.planning import ArrivalPlanner

    device, offload, _ = _saxpy_on_a_slow_start(monkeypatch, 2.5e-7, 0.5, 0.501)  # a few ms an arrival
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    share = ArrivalPlanner.START_SHARE * profit.STARTUP_SECONDS["gpu"]
    banked = [0.0]
    while device.starter.thread is None and len(banked) < 200:
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
        banked.append(offload.planner.banked)
    # Begun by the arrival whose gain took the bank past the share, not before.
    assert device.starter.thread is not None and len(banked) > 2
    assert banked[-2] < share <= banked[-1]
    device.release.set()
    device.starter.thread.join()
    offload.close()


def _slow_start_saxpy(monkeypatch, seconds_per_op: float):
    """saxpy offloaded in ``auto`` to a :class:`SlowStartDevice` whose context is being made
    (0.5 s estimated, begun half a second ago, ~1 ms of start after it), with
    ``seconds_per_op`` of CPU time per op."""
    device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, seconds_per_op, 0.5, 0.501)
    device.starter.begin(device.make_context)  # as the command line begins it, at its start
    time.sleep(0.5)  # past its estimate: a tenth of it (0.05 s) is taken as left
    return device, offload, loop


def test_an_arrival_does_not_wait_for_a_context_still_being_made_unless_it_gains_more(monkeypatch) -> None:
    # ~10 ms gained an arrival: the start is paid for after a few, but each would wait for
    # the thread longer than it gains, so wasmtime runs them until the context is made.
    device, offload, loop = _slow_start_saxpy(monkeypatch, 2.5e-7)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    for _ in range(12):  # (a launch would block here: the context is made only on release)
        assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert device.starter.running() and loop.stats.offloaded == 0
    # The context's start was begun before: only its rest (1 ms) is weighed, which the first
    # arrival's gain pays; then each waits on the CPU.
    assert loop.stats.declined == {STARTING: 12}, loop.stats.declined
    device.release.set()
    device.starter.thread.join()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.offloaded == 1  # made: the next arrival launches
    offload.close()


def test_an_arrival_that_gains_more_than_the_wait_waits_for_the_context(monkeypatch) -> None:
    # ~10 s gained by one arrival: waiting for the rest of the context's start pays.
    device, offload, loop = _slow_start_saxpy(monkeypatch, 5e-4)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    threading.Timer(0.2, device.release.set).start()
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.offloaded == 1 and not loop.stats.declined
    offload.close()


_FIRST_ARRIVALS = """
import json, sys, time
from tensorwasm.runtime import gpu_start, known_gpu, profit
from tensorwasm.runtime.device_info import DeviceInfo
from tensorwasm.runtime.device_info import context_made
from tensorwasm.runtime.offload import OffloadModule
from tensorwasm.runtime.planning import NOT_STARTED
from tests.offload_cases import module_bytes, run_case
from tests.runtime.test_offload import _saxpy_case

profit.cpu_seconds_per_op = lambda: 5e-7  # ~10 ms gained an arrival
# The device as a process before described it (where the machine gives a fingerprint, the
# cache remembers it so; the test does not depend on the machine giving one).
fields = json.loads(sys.argv[1])
known_gpu.remembered = lambda: DeviceInfo(**dict(fields, compute_capability=tuple(fields["compute_capability"])))
offload = OffloadModule(module_bytes("blas1", "O2"), device="gpu", mode="auto", pin=True)
spec, case = _saxpy_case()
expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
loop = next(lp for lp in offload.loops if lp.plan.func.name == "saxpy")
assert not context_made()
arrivals = 0
while gpu_start.STARTER.thread is None and arrivals < 100:
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    arrivals += 1
assert set(loop.stats.declined) == {NOT_STARTED}, loop.stats.declined
# begun by the arrival whose gain took the bank to a share of the start
assert gpu_start.STARTER.thread is not None and arrivals > 1
gpu_start.STARTER.thread.join()
while not loop.stats.offloaded and arrivals < 100:
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    arrivals += 1
offload.close()
# Made in the background: only the rest of the start (~50 ms) was banked before a launch.
print(arrivals, loop.stats.offloaded, round(offload.planner.banked, 3), flush=True)
"""


def described_gpu() -> str:
    """The GPU's description (:class:`~runtime.device_info.DeviceInfo` as JSON) as a process
    of its own finds it, making a context: what a later process may take as remembered."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    describe = (
        "import json; from tensorwasm.runtime import driver; from tensorwasm.support import records; "
        "print(json.dumps(records.asdict(driver.Context.get().info)))"
    )
    return subprocess.run([sys.executable, "-c", describe], cwd=ROOT, timeout=300, check=True,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip


@pytest.mark.gpu
def test_on_the_gpu_the_first_paying_arrival_starts_the_context_in_the_background() -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    # A warm start: the GPU is known from a process before (which made a context), so
    # preparing the module needs no context and the first paying arrival begins one.
    info = described_gpu()
    env = {**os.environ, "TENSORWASM_COMPILE": "sync"}  # no arrival declined while compiling
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_ARRIVALS, info],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )  # fmt: skip  (a process of its own: no context yet)
    assert done.returncode == 0, done.stderr
    arrivals, offloaded, banked = done.stdout.split()
    rest = profit.STARTUP_SECONDS["gpu"] - profit.CONTEXT_SECONDS["gpu"]
    assert int(offloaded) == 1 and rest <= float(banked) < profit.STARTUP_SECONDS["gpu"]
    assert int(arrivals) < profit.STARTUP_SECONDS["gpu"] / 0.01  # fewer than the whole start would take


class FakeDriver:
    """The driver's C library as :class:`DriverOpen` calls it: each call recorded, answering
    ``failing`` (a CUresult) for the call named so, and device 3 for ordinal 0."""

    def __init__(self, failing: str | None = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self.failing = failing

    def _answer(self, name: str, value: object) -> int:
        self.calls.append((name, value))
        return 100 if name == self.failing else 0  # (100: CUDA_ERROR_NO_DEVICE)

    def cuInit(self, flags: int) -> int:
        return self._answer("cuInit", flags)

    def cuDeviceGet(self, device, ordinal: int) -> int:
        device._obj.value = 3  # (the argument is a byref: its _obj is the c_int)
        return self._answer("cuDeviceGet", ordinal)

    def cuDevicePrimaryCtxRetain(self, context, device) -> int:
        return self._answer("cuDevicePrimaryCtxRetain", device.value)

    def cuDevicePrimaryCtxRelease_v2(self, device: int) -> int:
        return self._answer("cuDevicePrimaryCtxRelease_v2", device)


def test_the_driver_is_opened_through_its_library_and_its_reference_given_back() -> None:
    driver = FakeDriver()
    opening = DriverOpen("libcuda.so.1", load=lambda name: driver)
    opening.thread.join()
    assert [name for name, _ in driver.calls] == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"]
    assert driver.calls[2] == ("cuDevicePrimaryCtxRetain", 3)  # the device cuDeviceGet gave
    opening.release()
    opening.release()  # (once only)
    assert driver.calls[3:] == [("cuDevicePrimaryCtxRelease_v2", 3)]


@pytest.mark.parametrize("failing", ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"])
def test_a_driver_that_fails_to_open_holds_nothing_and_stops(failing: str) -> None:
    driver = FakeDriver(failing)
    opening = DriverOpen("libcuda.so.1", load=lambda name: driver)
    opening.release()
    names = [name for name, _ in driver.calls]
    assert names[-1] == failing and "cuDevicePrimaryCtxRelease_v2" not in names


def test_without_the_driver_library_nothing_is_opened() -> None:
    def missing(name: str):
        raise OSError(f"{name}: cannot open shared object file")

    DriverOpen("libcuda.so.1", load=missing).release()  # no exception: the bindings say why
    DriverOpen(None).release()  # (a system without a known library name)


def test_the_context_is_made_after_the_driver_is_opened_and_the_reference_given_back_after(
    monkeypatch,
) -> None:
    from tensorwasm.runtime import driver as bindings
    from tensorwasm.runtime import gpu_start

    events: list[str] = []
    fake = FakeDriver()

    class Opening(DriverOpen):
        def __init__(self) -> None:
            super().__init__("libcuda.so.1", load=lambda name: fake)

        def release(self) -> None:
            events.append("released")
            super().release()

    monkeypatch.setattr(gpu_start, "DriverOpen", Opening)
    monkeypatch.setattr(
        bindings.Context, "get", classmethod(lambda cls, ordinal=0: events.append(f"get {len(fake.calls)}"))
    )
    gpu_start.make_context()
    assert events == ["get 3", "released"]  # the bindings came after the driver's three calls
    assert fake.calls[-1] == ("cuDevicePrimaryCtxRelease_v2", 3)


def test_the_bindings_and_ptxas_are_readied_while_the_driver_starts(monkeypatch) -> None:
    # The driver's start (~0.17 s) blocks until the bindings are loaded and ptxas has said its
    # release: make_context must do both before it waits for that start, not after it.
    import threading

    from tensorwasm.runtime import assembler, gpu_start
    from tensorwasm.runtime import driver as bindings

    readied = threading.Event()
    events: list[str] = []

    class SlowDriver(FakeDriver):
        def cuInit(self, flags: int) -> int:
            readied.wait(10)
            return super().cuInit(flags)

    fake = SlowDriver()

    class Opening(DriverOpen):
        def __init__(self) -> None:
            super().__init__("libcuda.so.1", load=lambda name: fake)

    def ptxas():
        events.append(f"ptxas {len(fake.calls)}")
        readied.set()

    monkeypatch.setattr(gpu_start, "DriverOpen", Opening)
    monkeypatch.setattr(bindings, "load_bindings", lambda: events.append(f"bindings {len(fake.calls)}"))
    monkeypatch.setattr(assembler, "ptxas", ptxas)
    monkeypatch.setattr(
        bindings.Context, "get", classmethod(lambda cls, ordinal=0: events.append(f"get {len(fake.calls)}"))
    )
    gpu_start.make_context(launch_expected=True)
    assert events == ["bindings 0", "ptxas 0", "get 3"]


def test_a_start_begun_mid_run_leaves_the_bindings_until_the_driver_has_started(monkeypatch) -> None:
    # Arrivals whose launch may never come began it: loading the bindings now would hold
    # Python's lock while the program's arrivals need it.
    from tensorwasm.runtime import assembler, gpu_start
    from tensorwasm.runtime import driver as bindings

    events: list[str] = []
    fake = FakeDriver()

    class Opening(DriverOpen):
        def __init__(self) -> None:
            super().__init__("libcuda.so.1", load=lambda name: fake)

    monkeypatch.setattr(gpu_start, "DriverOpen", Opening)
    monkeypatch.setattr(bindings, "load_bindings", lambda: events.append("bindings"))
    monkeypatch.setattr(assembler, "ptxas", lambda: events.append("ptxas"))
    monkeypatch.setattr(
        bindings.Context, "get", classmethod(lambda cls, ordinal=0: events.append(f"get {len(fake.calls)}"))
    )
    gpu_start.make_context()
    assert events == ["get 3"]


_OPENED_FIRST = r"""
import ctypes
from tensorwasm.runtime import gpu_start
from tensorwasm.runtime.driver import Context

gpu_start.make_context()  # the driver opened through its library, then the bindings' context
context = Context.made()
assert context is not None
driver = ctypes.CDLL(gpu_start.DRIVER_LIBRARY)
flags, active = ctypes.c_uint(), ctypes.c_int()
assert driver.cuDevicePrimaryCtxGetState(int(context._device), ctypes.byref(flags), ctypes.byref(active)) == 0
context.synchronize()  # the context lives on after the early reference was given back
context.mem_alloc(1 << 20).free()
print(active.value, flush=True)
"""


@pytest.mark.gpu
def test_on_the_gpu_the_driver_opened_through_its_library_leaves_a_working_context() -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run(
        [sys.executable, "-c", _OPENED_FIRST],
        cwd=ROOT,
        timeout=300,
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip  (a process of its own)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]  # the primary context is active


@pytest.mark.parametrize("cached", [False, True])
def test_an_arrival_left_to_the_cpu_for_the_start_has_its_kernel_made_on_a_worker(
    monkeypatch, cached
) -> None:
    # The arrival declines for the device's start; its kernel is compiled for the launch that
    # follows it on a compile worker, nothing of it on wasmtime's thread; one the code cache
    # holds is left for its launch to read.
    from tensorwasm.runtime.cache import default_cache

    _device, offload, loop = _saxpy_on_a_slow_start(monkeypatch, 2.5e-7, 100.0, 100.05)
    monkeypatch.setenv("TENSORWASM_COMPILE", "background")
    kernels = offload._kernels
    key, kind = kernels.key(loop.kernel_index), ("ptx" if offload.code_kind == "gpu" else "obj")
    if cached:
        kernels.unit(loop.kernel_index)  # in the code cache, as in a warm run
        kernels.units.clear()
    else:
        default_cache().drop(kind, key)
        default_cache().drop("so", key)  # (host code: its shared library too)
    made_on: list[str] = []
    make = type(kernels)._make

    def recording_make(self, index, background=False):
        made_on.append(threading.current_thread().name)
        return make(self, index, background)

    monkeypatch.setattr(type(kernels), "_make", recording_make)
    spec, case = _saxpy_case()
    expected = run_case(module_bytes("blas1", "O2"), "saxpy", spec, case)
    assert run_case(offload.rewritten, "saxpy", spec, case, offload) == expected
    assert loop.stats.declined == {NOT_STARTED: 1} and loop.stats.offloaded == 0
    kernels.wait()
    if cached:
        assert made_on == [] and not kernels.pending
    else:
        assert loop.kernel_index in kernels.units and default_cache().has(kind, key)
        assert made_on and threading.main_thread().name not in made_on
    offload.close()


def test_the_command_lines_start_expects_a_launch(monkeypatch) -> None:
    # It is begun only for a module that launched the last time it ran here.
    from tensorwasm.runtime import cli, gpu_start

    calls: list[dict] = []
    monkeypatch.setattr(gpu_start, "make_context", lambda **kw: calls.append(kw))
    cli._start_cuda()
    assert calls == [{"launch_expected": True}]
